"""A receiving scope splits the channel into it into sub-channels (thesis 3.2.4, Figs 3.10-3.11;
issue 44 item 2), for real: members in Ray actors, a publisher in a sibling scope, UDP.

* By topic set, with a plug-in policy: two members of the receiving scope take every topic, yet
  the publisher sends the first half of the topics to one and the second half to the other
  (the topic-set filters of its split); inside the scope each passes on what it took, so both
  get everything, once and in order.
* Modulo 2, with a built-in policy's `{"split": 2}`: the publisher sends even-numbered messages
  to one member, odd ones to the other, and both get the whole stream.
"""

from __future__ import annotations

import time

import pytest
import ray

from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import members, scope

pytestmark = pytest.mark.ray

Consumer = ray.remote(num_cpus=0)(TopicConsumer)

PLUGIN = '''
from scopecast.policies.api import API_VERSION, Connect, LayoutPolicy, topic_set

__scopecast_plugin__ = {"kind": "policy", "name": "halves", "version": "1.0",
                        "api_version": API_VERSION, "classes": ["Halves"]}


class Halves(LayoutPolicy):
    """Star inside a scope; traffic into a scope of two or more takers splits by topic set."""

    name = "halves"

    def layout(self, members, sources):
        return [Connect(o, m, o) for o in sources for m in members if m != o]

    def split(self, members):
        if len(members) < 2:
            return None
        return [(members[0], topic_set("split/a/*")), (members[1], topic_set("split/b/*"))]
'''


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f}s"
        time.sleep(0.2)
    return value


def routes_into(cluster, sender_scope: str, sender: str, ids: dict[str, int]):
    """The publisher's channels into the members `ids` (name -> id): per member, the topic ids
    and filters of the channels that end there; None until every member has one."""
    status = cluster.status()
    inside = {m["name"]: m for m in members(scope(status, sender_scope))}
    if sender not in inside:
        return None
    got: dict[str, set] = {name: set() for name in ids}
    by_id = {i: name for name, i in ids.items()}
    for c in inside[sender]["channels"]:
        name = by_id.get(c["endpoint"][3]) if c["endpoint"][0] == "u" else None
        if name is not None:
            got[name].add((int(c["label"].rsplit(", ", 1)[1].split(":")[0]),
                           tuple(c.get("filter") or ())))
    return got if all(got.values()) else None


def member_ids(cluster, path: str, names) -> dict[str, int]:
    inside = {m["name"]: m["id"] for m in members(scope(cluster.status(), path))}
    return {n: inside[n] for n in names}


def consumers(topics, path: str, names) -> dict:
    actors = {n: Consumer.remote(topics, scope=path, name=n) for n in names}
    ray.get([a.ready.remote() for a in actors.values()])
    return actors


def test_a_receiving_scope_splits_the_channel_into_it_by_topic_set(cluster, tmp_path):
    plugin = tmp_path / "halves.py"
    plugin.write_text(PLUGIN)
    ref = cluster.submit_plugin(str(plugin))
    names = [f"split/{half}/{i}" for half in "ab" for i in range(3)]
    infos = cluster.create_topics(names, policy=f"sha256:{ref.sha256}")
    ids_a = {i.id for i in infos if i.name.startswith("split/a/")}
    ids_b = {i.id for i in infos if i.name.startswith("split/b/")}
    actors = consumers("split/*/*", "split-t/dst", ["q1", "q2"])
    pubs = [cluster.publisher(n, scope="split-t/src") for n in names]
    try:
        who = member_ids(cluster, "split-t/dst", ["q1", "q2"])
        sender = next(m["name"] for m in members(scope(cluster.status(), "split-t/src")))
        got = wait_for(lambda: routes_into(cluster, "split-t/src", sender, who),
                       "the publisher's sub-channels into both members")
        # each member's sub-channel carries its half of the topics, and no topic filter is left
        # on the wire: a topic's channel carries that topic only, so the set was decided when laid
        assert {t for t, _f in got["q1"]} == ids_a and {t for t, _f in got["q2"]} == ids_b
        assert all(f == () for routes in got.values() for _t, f in routes)
        n = 300
        pending = {name: a.consume.remote(n * len(names), 120.0) for name, a in actors.items()}
        for k in range(n):
            for pub in pubs:
                pub.publish(b"m %d" % k)
        for pub in pubs:
            pub.flush(timeout=120.0)
        for name, r in pending.items():
            out = ray.get(r, timeout=240)
            assert (out["count"], out["gaps"], out["out_of_order"]) == (n * len(names), 0, 0), name
            assert sorted(out["last_seq"].values()) == [n] * len(names), name
    finally:
        for pub in pubs:
            pub.close()
        ray.get([a.close.remote() for a in actors.values()], timeout=60)


def test_a_receiving_scope_splits_the_channel_into_it_modulo_two(cluster):
    info = cluster.create_topic("split/mod", options={"split": 2})
    actors = consumers(info.name, "split-m/dst", ["m1", "m2"])
    with cluster.publisher(info.name, scope="split-m/src") as pub:
        who = member_ids(cluster, "split-m/dst", ["m1", "m2"])
        sender = next(m["name"] for m in members(scope(cluster.status(), "split-m/src")))
        got = wait_for(lambda: routes_into(cluster, "split-m/src", sender, who),
                       "the publisher's sub-channels into both members")
        assert got == {"m1": {(info.id, ("modulo", 2, 0))}, "m2": {(info.id, ("modulo", 2, 1))}}
        n = 3_000
        pending = {name: a.consume.remote(n, 120.0) for name, a in actors.items()}
        for k in range(n):
            pub.publish(b"m %d" % k)
        pub.flush(timeout=120.0)
        for name, r in pending.items():
            out = ray.get(r, timeout=240)
            assert (out["count"], out["gaps"], out["out_of_order"]) == (n, 0, 0), name
    ray.get([a.close.remote() for a in actors.values()], timeout=60)
