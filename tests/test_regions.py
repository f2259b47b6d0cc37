"""QSM regions in a scope's multicast (scopes/regions): members alike in the covered topics they
take share an IP multicast group of their own, and a publisher sends once per region its topic
spans. Pure tests of the plan and of the planner's views; the integration test runs real members
on real multicast sockets."""

from __future__ import annotations

import pytest

from scopecast.policies.api import MULTICAST
from scopecast.scopes.container import Channel, TopicLayout
from scopecast.scopes.delegation import Delegation, MalformedDelegation, Obligation, Part
from scopecast.scopes.regions import Regions
from scopecast.scopes.topics import TopicInfo
from tests.test_scope_parts import _member, _no_object_store, _scope  # noqa: F401 (fixture)

GROUP = ("239.192.7.7", 40000)
PREFIX = (239, 192, 0)


def test_children_alike_in_what_they_take_share_a_region_and_the_first_keeps_the_scope_group():
    plan = Regions.plan("lan", GROUP, PREFIX, {1: {"a", "c"}, 2: {"a", "c"}, 3: {"b", "d"},
                                               4: {"a", "b", "c", "d"}})
    a, b = plan.of_child["a"], plan.of_child["b"]
    assert a.members == ("a", "c") and b.members == ("b", "d")
    assert a.group == GROUP and b.group != GROUP and b.group[1] == GROUP[1]
    assert plan.spans[1] == (a,) and plan.spans[3] == (b,) and plan.spans[4] == (a, b)
    # one region (every child takes the same): the scope's own group, as without regions
    (only,) = set(Regions.plan("lan", GROUP, PREFIX, {1: {"a", "b"}}).of_child.values())
    assert only.group == GROUP


def test_a_region_keeps_its_group_while_members_join_it_and_topics_come_that_it_takes():
    before = Regions.plan("lan", GROUP, PREFIX, {1: {"a"}, 2: {"b"}})
    after = Regions.plan("lan", GROUP, PREFIX, {1: {"a"}, 2: {"b", "e"}, 5: {"b", "e"}})
    assert after.of_child["e"].group == before.of_child["b"].group
    assert after.of_child["a"].group == before.of_child["a"].group == GROUP
    # a child that changes what it takes moves to the group of the region it is now alike with
    moved = Regions.plan("lan", GROUP, PREFIX, {1: {"a", "b"}, 2: {"b"}})
    assert moved.of_child["a"].group == GROUP and moved.of_child["b"].group != GROUP


def _two_halves():
    topics = [TopicInfo(f"r/t{i}", i, policy="lan_multicast") for i in (1, 2, 3)]
    _s, members, _k, container, planner, _ = _scope(topics)
    container.multicast = True
    members.children.update(a=_member("a", 1, subs=[1, 3]), b=_member("b", 2, subs=[2, 3]),
                            c=_member("c", 3, subs=[1, 3]), p=_member("p", 4, pubs=[1, 2, 3]))
    for t, takers in ((1, {"a", "c"}), (2, {"b"}), (3, {"a", "b", "c"})):
        container.topics[t] = TopicLayout(
            "lan_multicast", {}, members=takers, sources={"p"},
            channels={("p", MULTICAST, "p"): Channel("p", MULTICAST, "p")})
    return members, planner


def test_each_member_joins_its_regions_group_and_a_publisher_sends_once_per_region_spanned():
    members, planner = _two_halves()
    parts = planner.delegate()
    regions = planner.last_regions
    ga, gb = regions.of_child["a"].group, regions.of_child["b"].group
    assert ga != gb and regions.of_child["c"].group == ga
    view = planner.member_view
    assert view(members.children["a"], parts["a"], {}).groups == (ga,)
    assert view(members.children["b"], parts["b"], {}).groups == (gb,)
    routes = view(members.children["p"], parts["p"], {}).routes
    sent = {t: set() for t in (1, 2, 3)}
    for r in routes:
        for t in r.topics:
            sent[t].add(r.endpoint[1:])
    assert sent == {1: {ga}, 2: {gb}, 3: {ga, gb}}
    assert [r["members"] for r in regions.describe()] == [["a", "c"], ["b"]]
    # the regions a scope offers its parent for traffic entering it: one offer per region
    offers = planner.offers({3: "member"})
    assert {o.endpoint[1:] for o in offers[3]} == {ga, gb}


def test_a_coverage_travels_with_its_regions_and_a_bad_one_is_refused():
    cov = Obligation(3, "p", ("*",), ("g", *GROUP), (1,), scope="lan",
                     regions=((("g", *GROUP), (1,)), (("g", "239.192.9.9", 40000), (2,))))
    assert [o.endpoint for o in cov.spread()] == [("g", *GROUP), ("g", "239.192.9.9", 40000)]
    delegation = Delegation({}, {}, Part((), {3: cov, 4: cov}), {})
    body = delegation.to_wire(1, None)
    assert len(body["covered"]) == 1  # one coverage for the topics it covers alike
    _v, back, _t = Delegation.from_wire(body)
    assert back.part.covered[3] == cov and back.part.covered[4] is back.part.covered[3]
    (_topics, wire_cov), = body["covered"]
    wire_cov[9][0][0] = ["u", "10.0.0.1", 5000, 1]
    with pytest.raises(MalformedDelegation):
        Delegation.from_wire(body)


# ------------------------------------------------------------------- real members, real groups

HALF = 50  # topics of each half (100 in the LAN)
EACH = 30  # messages per topic: 3,000 of 1 KB, a third of them after a member joins region B


def test_two_halves_of_subscribers_get_only_their_topics_and_a_joiner_moves_a_region_losslessly(
        cluster):
    """100 lan_multicast topics in one scope, two subscribers on each half of them, and the
    publisher beside them: each subscriber's socket receives no datagram of the other half's
    topics (one group per half: was 50% of its datagrams), and every message of its own, in
    order. Mid-stream a third subscriber of the second half joins under a name that sorts first,
    so that region's group changes under its members (a region is named after its first member):
    they still get every message, once and in order."""
    import ray

    from scopecast.ray_cluster.consumers import TopicConsumer
    from scopecast.scopes.status import members, scope
    from tests.test_scopes import wait_for

    names = [f"regions/{h}{i}" for h in "ab" for i in range(HALF)]
    cluster.create_topics(names, policy="lan_multicast")
    halves = {"a": names[:HALF], "b": names[HALF:]}
    consumer = ray.remote(num_cpus=0)(TopicConsumer)
    subs = {n: consumer.remote(halves[n[0]], scope="regions", name=n)
            for n in ("a2", "a3", "b2", "b3")}
    ray.get([s.ready.remote() for s in subs.values()])
    pubs = cluster.publishers(names, scope="regions")
    try:
        def regions():
            return [r["members"] for r in scope(cluster.status(), "regions")["regions"]]

        wait_for(lambda: regions() == [["a2", "a3"], ["b2", "b3"]], "two regions")
        pending = {n: s.consume.remote(HALF * EACH, 240.0) for n, s in subs.items()}
        payload = b"x" * 1000
        for k in range(EACH):
            if k == EACH * 2 // 3:
                for p in pubs:
                    p.flush(timeout=120)
                subs["b1"] = consumer.remote(halves["b"], scope="regions", name="b1")
                ray.get(subs["b1"].ready.remote())
                wait_for(lambda: regions() == [["a2", "a3"], ["b1", "b2", "b3"]], "b1 in b")
            for p in pubs:
                p.publish(payload)
        for p in pubs:
            p.flush(timeout=120)
        status = cluster.status()
        groups = {m["name"]: m["groups"] for m in members(scope(status, "regions"))}
        assert groups["a2"] == groups["a3"] and groups["b1"] == groups["b2"] == groups["b3"]
        assert groups["a2"] != groups["b2"]
        for n, ref in pending.items():
            got = ray.get(ref, timeout=300)
            assert (got["count"], got["gaps"], got["out_of_order"]) == (HALF * EACH, 0, 0), n
        for n, s in subs.items():
            stats = ray.get(s.counters.remote())["stats"]
            # (a datagram carries one 1 KB message: messages of other topics = their datagrams)
            assert stats.get("not_taken", 0) <= 0.05 * stats.get("delivered", HALF * EACH), (
                n, stats.get("not_taken"), stats.get("delivered"))
    finally:
        for p in pubs:
            p.close()
        ray.get([s.close.remote() for s in subs.values()], timeout=120)
