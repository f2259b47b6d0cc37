"""Recovery protocols other than the default: the built-in `ack_tree` and the `gossip` plug-in of
examples/, each recovering a topic under real random loss beside a token_ring topic published by the
same member (one stream, two recovery domains)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from benchmarks.loss import dropped, udp_loss
from scopecast.scopes.status import walk
from tests.test_reliability import _consumers, needs_iptables

pytestmark = pytest.mark.ray

GOSSIP = Path(__file__).resolve().parent.parent / "examples" / "gossip_recovery.py"
N = 20_000  # per topic


def _recovery(cluster, protocol: str) -> str:
    if protocol != "gossip":
        return protocol
    ref = cluster.submit_plugin(str(GOSSIP))
    assert (ref.kind, ref.name) == ("recovery", "gossip")
    return f"{ref.name}@{ref.version}"


def _protocols_running(status: dict) -> set[str]:
    """The protocol names the recovery agents of every scope report."""
    return {agent.get("protocol") for s in walk(status) for domain in s.get("recovery", {}).values()
            for agent in domain["agents"].values()}


@needs_iptables
@pytest.mark.parametrize("protocol", ["ack_tree", "gossip"])
def test_a_topic_recovered_by_another_protocol_loses_nothing_under_five_percent_loss(
        cluster, topic_name, protocol):
    other, ring = f"{topic_name}/other", f"{topic_name}/ring"
    cluster.create_topic(other, policy="lan_multicast", recovery=_recovery(cluster, protocol))
    cluster.create_topic(ring, policy="lan_multicast")
    both = _consumers([other, ring], 2)
    alone = _consumers(other, 2)
    pending = [a.consume.remote(2 * N, 300.0) for a in both] \
        + [a.consume.remote(N, 300.0) for a in alone]
    with udp_loss(0.05):
        with cluster.publisher(other) as p_other, cluster.publisher(ring) as p_ring:
            for i in range(N):
                p_other.publish(b"o%08d" % i)
                p_ring.publish(b"r%08d" % i)
            p_other.flush(timeout=180)
            p_ring.flush(timeout=180)
            running = _protocols_running(cluster.status())
        results = ray.get(pending, timeout=300)
        assert dropped() > 0
    for r, topics in zip(results, [2, 2, 1, 1], strict=True):
        assert (r["count"], r["gaps"], r["out_of_order"]) == (topics * N, 0, 0), r
        assert sorted(r["last_seq"].values()) == [N] * topics
    assert {protocol, "token_ring"} <= running
    ray.get([a.close.remote() for a in both + alone])


def test_closing_a_token_ring_topic_does_not_hold_back_stability_of_an_ack_tree_one(
        cluster, topic_name):
    """A process publishing topics of two protocols closes one: its later messages on the other
    become stable (the closed topic's agent, still listed for it, once held its stream at that
    topic's last message for good, so every later flush timed out)."""
    other, ring = f"{topic_name}/other", f"{topic_name}/ring"
    cluster.create_topic(other, policy="lan_multicast", recovery="ack_tree")
    cluster.create_topic(ring, policy="lan_multicast")
    both = _consumers([other, ring], 2)
    pending = [a.consume.remote(2 * 200 + 200, 120.0) for a in both]
    p_other, p_ring = cluster.publisher(other), cluster.publisher(ring)
    for i in range(200):
        p_other.publish(b"o%08d" % i)
        p_ring.publish(b"r%08d" % i)
    p_ring.close(timeout=60)
    for i in range(200, 400):
        p_other.publish(b"o%08d" % i)
    p_other.flush(timeout=60)  # FlushTimeout before
    p_other.close(timeout=60)
    assert [r["count"] for r in ray.get(pending, timeout=180)] == [600, 600]
    ray.get([a.close.remote() for a in both])
