"""Per-scope administration on a real cluster (thesis 3.2.3, 3.2.9-3.2.10; "in each department, a
different protocol could be used locally"): the campus of Figures 3.14-3.17 with a forwarding
policy and a recovery protocol of its own in each of X/P, X/Q and X/R, composed into one structure
and recovering one topic together under real loss, across a change of settings (a new session);
settings shown by status and the CLI, kept by a scope manager that Ray restarted."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
import ray

from benchmarks.loss import dropped, udp_loss
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import scope, walk
from tests.test_cli import scopecast
from tests.test_reliability import needs_iptables
from tests.test_scopes import wait_for

pytestmark = pytest.mark.ray

GOSSIP = Path(__file__).resolve().parent.parent / "examples" / "gossip_recovery.py"
Consumer = ray.remote(num_cpus=0)(TopicConsumer)
N = 3_000  # per phase


def _campus() -> str:
    """A campus of its own (scope settings outlive a test: they are the cluster's)."""
    return "C" + uuid.uuid4().hex[:8]


def _protocols(status: dict, path: str) -> dict[str, set[str]]:
    """Scope `path`'s recovery domains: key -> the protocols its agents run."""
    return {key: {a.get("protocol") for a in d["agents"].values()}
            for key, d in scope(status, path).get("recovery", {}).items()}


@needs_iptables
def test_a_campus_of_three_administrations_loses_nothing_under_five_percent_loss(
        cluster, topic_name):
    """P lays the topic by `chain` and recovers it by `token_ring`, Q by `star` and `ack_tree`,
    R by `lan_multicast` and the gossip plug-in (set mid-stream: a new session). X in between
    keeps the topic's own `tree` and `token_ring`, its agents standing for Q's and R's domains
    through their aggregates. A publishes in X/P; B in X/P, C and D in X/Q, E in X/R take it."""
    x = _campus()
    ref = cluster.submit_plugin(str(GOSSIP))
    gossip = f"{ref.name}@{ref.version}"
    cluster.configure_scope(f"{x}/P", policy="chain", recovery="token_ring")
    cluster.configure_scope(f"{x}/Q", policy="star", recovery="ack_tree")
    info = cluster.create_topic(topic_name, policy="tree")
    where = {"B": "P", "C": "Q", "D": "Q", "E": "R"}
    actors = {n: Consumer.remote(topic_name, scope=f"{x}/{s}", name=n) for n, s in where.items()}
    ray.get([a.ready.remote() for a in actors.values()])
    pub = cluster.publisher(topic_name, scope=f"{x}/P")
    pending = {n: a.consume.remote(None, 240.0, 20.0) for n, a in actors.items()}
    with udp_loss(0.05):
        for i in range(N):
            pub.publish(b"one %d" % i)
        settings = cluster.configure_scope(f"{x}/R", policy="lan_multicast", recovery=gossip)
        total, deadline = N, time.monotonic() + 120
        while pub.session == info.session:  # until every member knows the new session
            assert time.monotonic() < deadline, "the publisher never moved to the new session"
            pub.publish(b"more")
            total += 1
            time.sleep(0.002)
        for i in range(N):
            pub.publish(b"two %d" % i)
        total += N
        pub.flush(timeout=180)
        status = cluster.status()
        results = {n: ray.get(ref, timeout=300) for n, ref in pending.items()}
        assert dropped() > 0
    for name, got in results.items():
        assert (got["count"], got["gaps"], got["out_of_order"]) == (total, 0, 0), (name, got)
        assert len(got["last_seq"]) == 2, got["last_seq"]  # both sessions, each whole
    assert settings[f"{x}/R"] == {"default": {"policy": "lan_multicast", "recovery": gossip},
                                  "overrides": []}
    # each scope laid the topic by its own policy, X by the topic's
    laid = {p: scope(status, f"{x}/{p}" if p else x)["topics"][str(info.id)]
            for p in ("P", "Q", "R", "")}
    assert {p: t["policy"] for p, t in laid.items()} == {
        "P": "chain", "Q": "star", "R": "lan_multicast", "": "tree"}
    assert scope(status, f"{x}/Q")["administration"]["settings"]["default"] == {
        "policy": "star", "recovery": "ack_tree"}
    # the agents: each scope's domain runs its own protocol; X's token ring holds P's domain and
    # stands for Q's and R's
    assert _protocols(status, f"{x}/P") == {"token_ring": {"token_ring"}}
    assert _protocols(status, f"{x}/Q") == {"token_ring>token_ring>ack_tree": {"ack_tree"}}
    (r_key, r_protocols), = _protocols(status, f"{x}/R").items()
    assert r_key.startswith("token_ring>token_ring>sha256:") and r_protocols == {"gossip"}
    x_domain = scope(status, x)["recovery"]["token_ring"]
    assert sorted(x_domain["members"]) == ["P", "Q~ack_tree", f"R~{r_key.split('>')[-1][:23]}"]
    assert {a["protocol"] for a in x_domain["agents"].values()} == {"token_ring"}
    pub.close()
    ray.get([a.close.remote() for a in actors.values()])
    for p in ("P", "Q", "R"):
        cluster.configure_scope(f"{x}/{p}")  # (nothing set: cleared)


def test_settings_from_the_cli_show_in_status_and_survive_the_scope_managers_restart(
        cluster, ray_address, topic_name):
    x = _campus()
    path = f"{x}/Q"
    out = scopecast("scope", "configure", path, "--policy", "star",
                    "--override", f"{topic_name}=,ack_tree", "--json", address=ray_address)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[path] == {
        "default": {"policy": "star"}, "overrides": [{"pattern": topic_name,
                                                      "recovery": "ack_tree"}]}
    bad = scopecast("scope", "configure", path, "--recovery", "none", address=ray_address)
    assert bad.returncode == 1 and "InvalidConfig" in bad.stderr
    listed = scopecast("scope", "settings", address=ray_address).stdout
    assert path in listed and "ack_tree" in listed
    info = cluster.create_topic(topic_name)
    consumer = Consumer.remote(topic_name, scope=path, name="Q1")
    ray.get(consumer.ready.remote())

    def laid_here() -> dict | None:
        q = next((s for s in walk(cluster.status()) if s.get("path") == path), None)
        return q if q and q.get("topics", {}).get(str(info.id), {}).get("policy") == "star" \
            else None
    # (the settings go down with the scopes' next delegations: Q, there from the test before,
    # may lay the new topic with what it had until they come, then again with them)
    before = wait_for(laid_here, f"{topic_name} laid in {path} with its settings")
    assert before["topics"][str(info.id)]["recovery"] == "token_ring>token_ring>ack_tree"
    os.kill(before["pid"], signal.SIGKILL)
    # Ray restarts it empty: its parent's next delegation brings its settings back
    after = wait_for(lambda: (lambda q: q if q and q["pid"] != before["pid"]
                              and q["administration"] == before["administration"] else None)(
        laid_here()), "the restarted scope manager with its settings", timeout=120)
    assert after["administration"]["settings"]["overrides"][0]["recovery"] == "ack_tree"
    with cluster.publisher(topic_name, scope=path) as pub:
        pending = consumer.consume.remote(100, 60.0)
        for i in range(100):
            pub.publish(b"%d" % i)
        pub.flush(timeout=60)
    got = ray.get(pending, timeout=120)
    assert (got["count"], got["gaps"], got["out_of_order"]) == (100, 0, 0)
    ray.get(consumer.close.remote())
    assert scopecast("scope", "configure", path, address=ray_address).returncode == 0
    assert path not in cluster.scope_settings()


@needs_iptables
def test_only_each_partitions_cachers_keep_peers_messages_where_a_scope_says_so(
        cluster, topic_name):
    """A scope sets cooperative caching (QSM): partitions of 2 agents, 1 cacher each. Of its 4
    subscribers 2 keep peers' messages to repair the others; under 5% loss every one still gets
    everything in order."""
    path = f"{_campus()}/S"
    cluster.configure_scope(path, cachers=1, partition=2)
    cluster.create_topic(topic_name, policy="lan_multicast")
    actors = [Consumer.remote(topic_name, scope=path, name=f"S{i}") for i in range(4)]
    ray.get([a.ready.remote() for a in actors])

    def recovery():
        return [next(iter(ray.get(a.__ray_call__.remote(
            lambda self: self._cluster.counters())).values()))["recovery"] for a in actors]

    # a member learns it caches from its agent's first answer: the stream starts after that
    wait_for(lambda: sorted(r["cacher"] for r in recovery()) == [False, False, True, True],
             "two of four subscribers told they cache")
    pending = [a.consume.remote(N, 180.0) for a in actors]
    with udp_loss(0.05):
        with cluster.publisher(topic_name) as pub:
            for i in range(N):
                pub.publish(b"%d" % i)
            pub.flush(timeout=120)
        results = ray.get(pending, timeout=240)
        assert dropped() > 0
    for got in results:
        assert (got["count"], got["gaps"], got["out_of_order"]) == (N, 0, 0), got
    roles = recovery()
    assert sorted(r["cacher"] for r in roles) == [False, False, True, True]
    assert all((r["peer_runs_kept"] > 0) == r["cacher"] for r in roles), roles
    agents = scope(cluster.status(), path)["recovery"]["token_ring"]["agents"]
    assert {a["options"]["cachers"] for a in agents.values()} == {1}
    ray.get([a.close.remote() for a in actors])
    cluster.configure_scope(path)
