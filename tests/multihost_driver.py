"""A driver run inside a host of a `LocalHosts` cluster (`python -m tests.multihost_driver TOPIC
N [--fail]`): deploys scopecast, streams N messages of a `lan_multicast` topic from this host to one
subscriber actor on every Ray node, and prints one JSON line: what each subscriber got, where every
scope manager and recovery agent runs, and the channels status shows.

With --fail it prints "halfway" after N/2 messages and waits for a line on stdin (the test cuts
off or kills a host meanwhile), streams the rest, waits until the status no longer shows the lost
host's scope, and reports what the surviving subscribers got (a lost host's subscriber reports
nothing), and how many reports each took from its children in the channel's tree of receivers
(`ack_gathering`). With --pace S the second half is spread over S seconds (to overlap what the test
started at halfway)."""

from __future__ import annotations

import json
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import scopecast
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import walk


def _agents_placed(status: dict) -> bool:
    """Whether every recovery agent the status names has reported its address (an agent being
    placed shows address None for a moment)."""
    return all(a.get("address") for s in walk(status)
               for d in s.get("recovery", {}).values() for a in d.get("agents", {}).values())


def _placed_status(cluster, timeout: float = 60.0) -> dict:
    """The cluster's status once every recovery agent in it has its address."""
    deadline = time.monotonic() + timeout
    while True:
        status = cluster.status()
        if _agents_placed(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def _converged(cluster, timeout: float = 120.0) -> dict:
    """The status once every host scope it shows is on a node Ray still has alive and every
    recovery agent has its address."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        status = cluster.status()
        # (a scope that does not answer shows only its path and the error: not converged yet)
        if _agents_placed(status) and all(
                "error" not in s and (s["kind"] != "host" or s.get("node") in alive)
                for s in walk(status)):
            return status
        if time.monotonic() > deadline:
            raise SystemExit("the scope tree did not converge: " + json.dumps(
                [[s["path"], s.get("node", "")[:8]] for s in walk(status)]))
        time.sleep(0.5)


def _probed(cluster, timeout: float = 120.0) -> None:
    """Wait until every LAN scope knows whether multicast passes among its hosts (a LAN probes
    when its hosts change: here, when the subscribers made their host scopes)."""
    def settled(lan: dict) -> bool:
        hosts = sum(1 for s in lan.get("scopes", []) if s.get("kind") == "host")
        return lan["multicast_probe"]["state"] in (
            ("passes", "unicast-only") if hosts > 1 else ("single host",))

    deadline = time.monotonic() + timeout
    while not all(settled(s) for s in walk(cluster.status(topics=False))
                  if "multicast_probe" in s):
        if time.monotonic() > deadline:
            raise SystemExit("a LAN's multicast probe did not end")
        time.sleep(0.5)


def main(topic: str, n: int, fail: bool = False, pace: float = 0.0) -> None:
    cluster = scopecast.connect(address="auto")  # deploys onto the namespaces' Ray
    nodes = {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}
    cluster.create_topic(topic, policy="lan_multicast")
    actors = {nid: ray.remote(num_cpus=0)(TopicConsumer).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote(topic)
        for nid in nodes}
    ray.get([a.ready.remote() for a in actors.values()], timeout=120)
    _probed(cluster)
    pending = {nid: a.consume.remote(n, 300.0) for nid, a in actors.items()}
    with cluster.publisher(topic) as pub:
        gap = 0.0
        for i in range(n):
            pub.publish(b"m%08d" % i)
            if fail and i == n // 2:
                pub.flush(timeout=120)
                print("halfway", flush=True)
                sys.stdin.readline()
                gap = 100 * pace / (n - i)
            if gap and i % 100 == 0:
                time.sleep(gap)
        pub.flush(timeout=240)  # stable at every member still alive
        status = _placed_status(cluster)  # while the publisher is there: its channels are laid
        if fail:
            status = _converged(cluster)
    got = {}
    for nid, ref in pending.items():
        try:
            got[nodes[nid]["NodeManagerAddress"]] = ray.get(ref, timeout=300)
        except ray.exceptions.RayError:
            pass  # the subscriber on the lost host
    ip_of = {nid: node["NodeManagerAddress"] for nid, node in nodes.items()}
    # each subscriber's reports taken from its children in the channels' trees of receivers
    reports_in = {ip_of[nid]: ray.get(a.counters.remote(), timeout=60)["stats"].get(
        "group_acks_in", 0) for nid, a in actors.items() if ip_of[nid] in got}
    scopes = []
    for s in walk(status):
        agents = [a for d in s.get("recovery", {}).values() for a in d.get("agents", {}).values()]
        scopes.append({"path": s["path"], "kind": s["kind"], "ip": ip_of.get(s.get("node")),
                       "multicast": s.get("multicast"), "probe": s.get("multicast_probe"),
                       "channels": [c for t in s.get("topics", {}).values() for c in t["channels"]],
                       "endpoints": [d["endpoint"] for d in s.get("delegated_here", [])],
                       "agents": [{"chain": a["chain"], "ip": (a["address"] or "").rsplit(":", 1)[0] or None}
                                  for a in agents]})
    members = {m["name"]: m["address"].rsplit(":", 1)[0]
               for s in walk(status) for m in s.get("members", [])}
    print(json.dumps({"got": {ip: [r["count"], r["gaps"], r["out_of_order"], r["digest"]]
                              for ip, r in got.items()},
                      "labels": {node["NodeManagerAddress"]: node["Labels"].get("scopecast-lan")
                                 for node in nodes.values()},
                      "scopes": scopes, "members": members, "reports_in": reports_in}))
    for nid, a in actors.items():
        if ip_of[nid] in got:
            ray.get(a.close.remote(), timeout=60)
    cluster.shutdown()


if __name__ == "__main__":
    args = sys.argv[3:]
    main(sys.argv[1], int(sys.argv[2]), "--fail" in args,
         float(args[args.index("--pace") + 1]) if "--pace" in args else 0.0)
