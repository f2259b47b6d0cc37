"""The policy API, the built-in policies and the policy container, as pure logic: events in,
operations out; the container refuses operations that name non-members; label paths."""

from __future__ import annotations

import pytest

from scopecast.actors.errors import InvalidConfig
from scopecast.policies.api import MULTICAST, Connect, Disconnect, PolicyContext
from scopecast.policies.builtin import BUILTIN_POLICIES
from scopecast.policies.host import PolicyHost
from scopecast.scopes.container import PolicyContainer
from scopecast.scopes.layout import Offer, pad, sending_path
from scopecast.scopes.paths import check_scope_path, parent_path


def policy(name: str, multicast: bool = False, **options):
    return BUILTIN_POLICIES[name](PolicyContext("X", "T", 7, multicast, options))


def laid(p, members, sources) -> set[tuple]:
    ops = []
    for m in members:
        ops += p.member_added(m)
    for s in sources:
        ops += p.source_added(s)
    channels: dict = {}
    for op in ops:
        if isinstance(op, Connect):
            channels[(op.src, op.dst, op.origin)] = op
        else:
            channels.pop((op.src, op.dst, op.origin), None)
    return set(channels)


def test_chain_orders_members_by_name_from_the_origin():
    assert laid(policy("chain"), ["R", "Q", "P"], ["P"]) == {("P", "Q", "P"), ("Q", "R", "P")}
    p = policy("chain")
    assert p.entry(["C", "D"]) == "C" and p.exits(["C", "D"], 1) == ["D"]


def test_tree_has_the_configured_fanout():
    chans = laid(policy("tree", fanout=2), ["a", "b", "c", "d", "e"], ["a"])
    assert chans == {("a", "b", "a"), ("a", "c", "a"), ("b", "d", "a"), ("b", "e", "a")}


def test_star_and_replicated():
    assert laid(policy("star"), ["a", "b", "c"], ["b"]) == {("b", "a", "b"), ("b", "c", "b")}
    ops = policy("replicated", replicas=3).source_added("a")
    assert ops == []  # nobody to reach yet
    p = policy("replicated", replicas=3)
    p.source_added("a")
    assert p.member_added("b") == [Connect("a", "b", "a", replicas=3)]


def test_lan_multicast_uses_the_group_only_where_the_scope_allows_it():
    assert laid(policy("lan_multicast", multicast=True), ["a", "b", "c"], ["a"]) == \
        {("a", MULTICAST, "a")}
    assert laid(policy("lan_multicast", multicast=False), ["a", "b", "c"], ["a"]) == \
        {("a", "b", "a"), ("a", "c", "a")}


def test_removing_a_member_disconnects_and_relays():
    p = policy("chain")
    laid(p, ["A", "B", "C"], ["A"])
    ops = p.member_removed("B")
    assert Disconnect("A", "B", "A") in ops and Disconnect("B", "C", "A") in ops
    assert Connect("A", "C", "A") in ops


def wanted(members, sources, policy_name="chain", candidates=None):
    return {7: {"policy": policy_name,
                "context": {"scope": "X", "topic": "T", "topic_id": 7, "multicast": False,
                            "options": {}},
                "members": set(members), "sources": set(sources),
                "candidates": sorted(candidates or members), "replicas": {1}}}


def run(container: PolicyContainer, host: PolicyHost, w: dict) -> None:
    for phase in ("choices", "events"):
        for policy, items in container.requests(w, phase).items():
            public = [{k: v for k, v in it.items() if not k.startswith("_")} for it in items]
            for item, result in zip(items, host.apply("X", policy, public), strict=True):
                container.apply(item, result)


def test_container_lays_what_the_policy_asks_and_follows_events():
    container, host = PolicyContainer("X", False), PolicyHost()
    run(container, host, wanted(["P", "Q", "R"], ["P"]))
    lay = container.topics[7]
    assert set(lay.channels) == {("P", "Q", "P"), ("Q", "R", "P")}
    assert lay.entry == "P" and lay.exits == {1: ["R"]}
    run(container, host, wanted(["P", "R"], ["P"]))
    assert set(container.topics[7].channels) == {("P", "R", "P")}


def test_one_host_runs_every_builtin_and_a_topic_that_changes_policy_starts_afresh():
    """The built-ins share a scope's policy actor: a topic moved from chain to star is laid by a
    new star instance (the chain one is dropped), not by the chain instance's leftovers."""
    container, host = PolicyContainer("X", False), PolicyHost()
    run(container, host, wanted(["P", "Q", "R"], ["P"]))
    assert set(container.topics[7].channels) == {("P", "Q", "P"), ("Q", "R", "P")}
    run(container, host, wanted(["P", "Q", "R"], ["P"], policy_name="star"))
    assert set(container.topics[7].channels) == {("P", "Q", "P"), ("P", "R", "P")}
    assert list(host._instances) == [("X", "star", 7)]


def test_a_replaced_policy_actor_gets_each_of_its_topics_whole_state_again():
    container, host = PolicyContainer("X", False), PolicyHost()
    run(container, host, wanted(["P", "Q"], ["P"]))
    assert container.requests(wanted(["P", "Q"], ["P"]), "events") == {}
    container.host_lost(lambda policy: policy == "chain")
    (item,) = container.requests(wanted(["P", "Q"], ["P"]), "events")["chain"]
    assert item["reset"] is True and item["events"] == [("member_added", "P"), ("member_added", "Q"),
                                                        ("source_added", "P")]
    run(container, PolicyHost(), wanted(["P", "Q"], ["P"]))  # the new actor rebuilds it
    assert set(container.topics[7].channels) == {("P", "Q", "P")}


def test_a_restarted_policy_actor_answers_lost_and_is_sent_the_whole_state():
    """Ray restarts a dead policy actor empty: changes to an instance it no longer has are not
    applied to a fresh one (its earlier events would be missing) but answered `lost`."""
    container, host = PolicyContainer("X", False), PolicyHost()
    run(container, host, wanted(["P", "Q"], ["P"]))
    restarted = PolicyHost()
    (choice,) = container.requests(wanted(["P", "Q", "R"], ["P"]), "choices")["chain"]
    restarted.apply("X", "chain", [choice])  # a choice asked of it keeps no instance
    (item,) = container.requests(wanted(["P", "Q", "R"], ["P"]), "events")["chain"]
    assert "reset" not in item
    (result,) = restarted.apply("X", "chain", [item])
    assert result.get("lost") is True and not restarted._instances
    container.apply(item, result)
    run(container, restarted, wanted(["P", "Q", "R"], ["P"]))
    assert set(container.topics[7].channels) == {("P", "Q", "P"), ("Q", "R", "P")}


def test_scopes_sharing_the_builtin_actor_keep_apart_instances():
    host = PolicyHost()
    a, b = PolicyContainer("A", False), PolicyContainer("B", False)
    for container, scope, members in ((a, "A", ["P", "Q", "R"]), (b, "B", ["P", "R"])):
        for phase in ("choices", "events"):
            for policy, items in container.requests(wanted(members, ["P"]), phase).items():
                for item, result in zip(items, host.apply(scope, policy, items), strict=True):
                    container.apply(item, result)
    assert set(a.topics[7].channels) == {("P", "Q", "P"), ("Q", "R", "P")}
    assert set(b.topics[7].channels) == {("P", "R", "P")}


def test_container_ignores_operations_naming_non_members():
    container = PolicyContainer("X", False)
    w = wanted(["a", "b"], ["a"])
    (item,) = container.requests(w, "events")["chain"]
    container.apply(item, {"topic": 7, "ops": [
        ("connect", "a", "b", "a", None, 1),        # fine
        ("connect", "a", "zz", "a", None, 1),       # zz is not a member
        ("connect", "a", "b", "nobody", None, 1),   # nobody is not a source
        ("connect", "a", MULTICAST, "a", None, 1),  # no multicast in this scope
        ("connect", "a", "b", "a", ["modulo", 0, 5], 1),  # malformed filter
        ("connect", "a", "b"),                      # malformed
        "garbage",
    ]})
    assert set(container.topics[7].channels) == {("a", "b", "a")}
    assert sum(container.rejected.values()) == 6


def test_a_policy_that_raises_is_reported_and_changes_nothing():
    container = PolicyContainer("X", False)
    (item,) = container.requests(wanted(["a", "b"], ["a"]), "events")["chain"]
    container.apply(item, {"topic": 7, "ops": [], "error": "ZeroDivisionError: boom"})
    assert container.topics[7].channels == {} and "boom" in container.topics[7].error
    # next time the whole state is sent again
    (again,) = container.requests(wanted(["a", "b"], ["a"]), "events")["chain"]
    assert again.get("reset") is True


def test_label_paths_are_padded_at_the_top():
    assert pad(["C"], 3) == ["C", "C", "C"]
    assert sending_path([["P", 2], ["B", 1]]) == ["P", "B"]
    assert sending_path([["U", 3], ["u1", 1]]) == ["U", "U", "u1"]
    offer = Offer(("C",), ("u", "h", 1, 3), (3,))
    assert offer.into("Q", 2) == ["Q", "C"] and offer.into("Q", 3) == ["Q", "Q", "C"]
    assert Offer.from_wire(offer.to_wire()) == offer


@pytest.mark.parametrize("bad", ["a/../b", "a//b", "x" * 65, "a/b/a", "-a", "a b",
                                 "/".join("abcdefghij"), 5])
def test_bad_scope_paths_are_typed_errors(bad):
    with pytest.raises(InvalidConfig):
        check_scope_path(bad)


def test_scope_paths():
    assert check_scope_path("/X/Q/") == "X/Q" and check_scope_path("") == ""
    assert parent_path("X/Q") == "X" and parent_path("X") == "" and parent_path("") is None
