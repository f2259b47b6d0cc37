"""Issue 45 item 2: the root's state survives the loss of its node. Three hosts, each with a disk
(a SCOPECAST_HOME) of its own; the root is deployed from host 2, so it runs there, with its
state file there. Host 2 is killed (every process, -9) halfway through a stream from host 1: Ray
restarts the root on a surviving host, where no state file is, and the root comes back from its
image in Ray's GCS with the same cluster key, topics and sessions, while the publisher on host 1
streams the second half to the subscribers on hosts 1 and 3, who lose nothing."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from scopecast.ray_cluster.local_hosts import LocalHosts
from tests.conftest import is_root
from tests.test_local_hosts import REPO, HaltingDriver, _complete, lose, status_json

pytestmark = pytest.mark.skipif(not is_root(), reason="network namespaces need root")

# run inside a host: deploys scopecast if it is not yet, its root placed on that host's node
# (Ray's choice would be the head's, whose loss is Ray's own: soft, so that Ray may restart it
# elsewhere), and prints what identifies the cluster: its key's digest and id
IDENTITY = """
import hashlib, json, time, ray, scopecast
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from scopecast.actors import declare
from scopecast.ray_cluster.cluster import attach_ray
from scopecast.scopes.cluster_manager import ClusterScopeManager
attach_ray("auto")
here = ray.get_runtime_context().get_node_id()
# (a soft affinity is a wish: on a loaded machine Ray places it elsewhere now and then)
for attempt in range(20):
    root = declare.get_or_create(
        ClusterScopeManager, declare.CLUSTER_SCOPE_MANAGER, trusted_keys=[],
        ray_options={{"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=True)}})
    if "{topic}" == "" or ray.get(root.status.remote(topics=False))["scopes"]["node"] == here:
        break
    ray.kill(root, no_restart=True)
    while declare.lookup(declare.CLUSTER_SCOPE_MANAGER) is not None:
        time.sleep(0.2)
else:
    raise SystemExit("Ray placed the root on another node than this host's 20 times")
cluster = scopecast.connect(address="auto")
if "{topic}":
    cluster.create_topic("{topic}")
hello = ray.get(declare.find(declare.CLUSTER_SCOPE_MANAGER).hello.remote())
print(json.dumps({{"key": hashlib.sha256(bytes(hello["key"])).hexdigest(),
                   "cluster_id": hello["cluster_id"]}}))
"""


@pytest.fixture(scope="module")
def hosts():
    cluster = LocalHosts(hosts=3, lans=1, prefix="scroot", net=81)
    cluster.down(quiet=True)
    cluster.up(progress=lambda line: None)
    yield cluster
    cluster.down(quiet=True)


def _identity(hosts: LocalHosts, host, topic: str = "") -> dict:
    out = hosts.run(host, [sys.executable, "-c", IDENTITY.format(topic=topic)], capture=True,
                    extra_env={"PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _root(hosts: LocalHosts) -> tuple[dict, dict]:
    """(the status, the root scope's entry in it)."""
    status = status_json(hosts)
    return status, status["scopes"]


def _topics(status: dict) -> dict:
    return {t["name"]: (t["id"], t["session"]) for t in status["topics"]}


@pytest.mark.timeout(600)  # (HaltingDriver.finish reports first)
def test_the_root_node_killed_the_root_comes_back_elsewhere_with_its_state_nothing_lost(hosts):
    h1, h2, h3 = hosts.hosts
    before = _identity(hosts, h2, topic="rootloss/kept")  # the root runs on h2
    status, root = _root(hosts)
    ip_of = {n["node_id"]: n["address"] for n in _nodes(hosts)}
    assert ip_of[root["node"]] == h2.address
    n = 20_000
    with HaltingDriver(hosts, "rootloss/T", n, "--pace", "6") as driver:
        status, root = _root(hosts)
        topics = _topics(status)
        assert {"rootloss/kept", "rootloss/T"} <= set(topics)
        generation = status["manager"]["state_generation"]
        assert generation > 0 and status["manager"]["state_mirror_failures"] == 0
        lose(hosts, h2, "killed")
        r = driver.finish()
    # the publisher on h1 went on through the root's loss; h1's and h3's subscribers got it all
    assert _complete(r["got"], n) == {h1.address, h3.address}
    after, root_after = _root(hosts)
    assert ip_of.get(root_after["node"]) in (h1.address, h3.address)
    assert after["manager"]["pid"] != status["manager"]["pid"]
    assert after["manager"]["state_restored_from_gcs"] >= generation
    assert after["cluster_id"] == status["cluster_id"]
    assert _topics(after) == topics  # the same ids, and sessions
    again = _identity(hosts, h3)
    assert again == before  # the same cluster key: every member's MAC still checks
    assert hashlib.sha256(b"").hexdigest() not in again.values()


def _nodes(hosts: LocalHosts) -> list[dict]:
    out = hosts.run(hosts.head, [sys.executable, "-c", NODES], capture=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


NODES = """
import json, ray
ray.init()
print(json.dumps([{"node_id": n["NodeID"], "address": n["NodeManagerAddress"]}
                  for n in ray.nodes() if n["Alive"]]))
"""
