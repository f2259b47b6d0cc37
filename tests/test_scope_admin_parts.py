"""Per-scope administration, the pure parts (thesis 3.2.3, 3.2.9-3.2.10): precedence of the
scopes' settings over a topic's own, recovery chains and how a heterogeneous child's domains join
its parent's, the settings handed down, kept in the state database, and read back typed."""

from __future__ import annotations

import asyncio

import pytest

from scopecast.actors.errors import InvalidConfig
from scopecast.scopes.agent_placement import AgentPlacement
from scopecast.scopes.delegation import Delegation, MalformedDelegation, Part
from scopecast.scopes.membership import ChildScope
from scopecast.scopes.recovery_domain import AgentRecord, RecoveryDomains
from scopecast.scopes.scope_admin import (
    Choice,
    ScopeAdmin,
    ScopeChoices,
    chain_key,
    domain_member,
    protocol_of,
    upper_key,
)
from scopecast.scopes.state import SCHEMA_VERSION, ScopeStore
from scopecast.scopes.topics import TopicInfo
from tests.test_scope_parts import Handle, Remote, _member, _no_object_store, _scope  # noqa: F401

PRICES = TopicInfo("prices/eu", 1)                       # tree, token_ring
NEWS = TopicInfo("news", 2, policy="chain", recovery="ack_tree")
LOOSE = TopicInfo("loose", 3, recovery="none")


def _choices(path: str, admins: dict[str, ScopeAdmin]) -> ScopeChoices:
    choices = ScopeChoices(path)
    choices.set(admins)
    return choices


def test_without_settings_every_topic_keeps_its_own_choices():
    choices = ScopeChoices("X/Q")
    assert choices.keys(PRICES) == ("tree", "token_ring")
    assert choices.keys(NEWS) == ("chain", "ack_tree")
    assert choices.keys(TopicInfo("p", 4, policy="ring@1", plugin="ab" * 32)) == (
        "sha256:" + "ab" * 32, "token_ring")


def test_the_nearest_scope_that_sets_a_choice_wins_over_its_ancestors_and_the_topic():
    admins = {"": ScopeAdmin(Choice(policy="star")),
              "X": ScopeAdmin(Choice(recovery="ack_tree"),
                              (("prices/*", Choice(policy="chain")),)),
              "X/Q": ScopeAdmin(Choice(policy="lan_multicast"),
                                (("news", Choice(recovery="token_ring")),))}
    q, x, r, root = (_choices(p, admins) for p in ("X/Q", "X", "X/R", ""))
    # X/Q's own default policy wins over X's override; X's recovery is inherited
    assert q.keys(PRICES) == ("lan_multicast", "token_ring>ack_tree>ack_tree")
    # an override of X/Q wins over its ancestors' defaults and the topic's own
    assert q.keys(NEWS) == ("lan_multicast", "ack_tree>ack_tree>token_ring")
    # X: its override first, then its default; the root's default for the rest
    assert x.keys(PRICES) == ("chain", "token_ring>ack_tree")
    assert x.keys(NEWS) == ("star", "ack_tree")       # the chain (ack_tree, ack_tree)
    # X/R sets nothing: X's choices, the root's default policy
    assert r.keys(NEWS) == ("star", "ack_tree")
    assert root.keys(PRICES) == ("star", "token_ring")
    # a scope decides how reliable topics are recovered, not whether
    assert q.recovery_key(LOOSE) == "none"
    # a child's chain always extends its parent's: the domains nest
    for topic in (PRICES, NEWS):
        assert upper_key(q.recovery_key(topic)) == x.recovery_key(topic)
        assert upper_key(x.recovery_key(topic)) == root.recovery_key(topic)


def test_chain_keys_name_homogeneous_domains_by_their_protocol():
    assert chain_key(["token_ring"] * 3) == "token_ring"
    key = chain_key(["token_ring", "token_ring", "ack_tree"])
    assert key == "token_ring>token_ring>ack_tree" and protocol_of(key) == "ack_tree"
    assert upper_key(key) == "token_ring" and upper_key("token_ring") == "token_ring"
    assert upper_key("a>b>b") == "a>b"
    # a child's domain that runs its parent's protocol is the child itself in the parent's
    # domain; one of another protocol is named with it
    assert domain_member("Q", "token_ring") == "Q"
    assert domain_member("Q", "token_ring>ack_tree") == "Q~ack_tree"
    assert domain_member("R", "token_ring>sha256:" + "c" * 64) == "R~sha256:" + "c" * 16


def test_a_scope_hands_down_the_settings_of_its_childs_ancestry_and_subtree_only():
    admins = {"": ScopeAdmin(Choice(policy="star")), "X": ScopeAdmin(Choice(policy="chain")),
              "X/Q": ScopeAdmin(Choice(policy="tree")), "X/R": ScopeAdmin(Choice(policy="tree")),
              "Y": ScopeAdmin(Choice(policy="tree"))}
    root = _choices("", admins)
    assert set(root.subtree("X")) == {"", "X", "X/Q", "X/R"}
    x = _choices("X", root.subtree("X"))
    assert set(x.subtree("X/Q")) == {"", "X", "X/Q"}
    # a change in a sibling's subtree is handed on but changes nothing here
    q = _choices("X/Q", x.subtree("X/Q"))
    assert q.set({**x.subtree("X/Q"), "X/R": ScopeAdmin(Choice(policy="star"))}) is False
    assert q.set({**x.subtree("X/Q"), "X": ScopeAdmin(Choice(policy="star"))}) is True


@pytest.mark.parametrize("body", [
    {"v": 2, "default": {}, "overrides": []},
    {"v": 1, "default": {"recovery": "none"}, "overrides": []},
    {"v": 1, "default": {"policy": 3}, "overrides": []},
    {"v": 1, "default": {"colour": "red"}, "overrides": []},
    {"v": 1, "default": {}, "overrides": [["a/[", {"policy": "tree"}]]},
    {"v": 1, "default": {}, "overrides": [["a", {"policy": "tree"}]] * 65},
])
def test_scope_settings_of_another_version_or_malformed_are_a_typed_error(body):
    with pytest.raises(InvalidConfig):
        ScopeAdmin.from_wire(body)
    wire = Delegation({}, {}, Part(), {}).to_wire(1, None)
    with pytest.raises(MalformedDelegation):
        Delegation.from_wire({**wire, "admins": {"X": body}})


def test_a_delegation_carries_the_settings_typed():
    admin = ScopeAdmin(Choice("ring@1.0", "ack_tree", plugin="ab" * 32),
                       (("prices/*", Choice(recovery="gossip@1", recovery_plugin="cd" * 32)),))
    assert ScopeAdmin.from_wire(admin.to_wire()) == admin
    sent = Delegation({"port": 1}, {}, Part(), {"token_ring>ack_tree": ["h", 1]}, {"X": admin})
    assert Delegation.from_wire(sent.to_wire(7, None)) == (7, sent, None)
    assert admin.describe() == {"default": {"policy": "ring@1.0", "recovery": "ack_tree"},
                                "overrides": [{"pattern": "prices/*", "recovery": "gossip@1"}]}


def test_the_settings_are_kept_in_the_state_database(tmp_path):
    store = ScopeStore(tmp_path / "state.db")
    assert SCHEMA_VERSION >= 3 and store.scope_admins() == {}
    admin = ScopeAdmin(Choice(policy="star", recovery="ack_tree"))
    store.put_scope_admin("X/Q", admin.to_wire())
    store.close()
    again = ScopeStore(tmp_path / "state.db")
    assert {p: ScopeAdmin.from_wire(b) for p, b in again.scope_admins().items()} == {"X/Q": admin}
    again.put_scope_admin("X/Q", None)
    assert again.scope_admins() == {}


def test_a_heterogeneous_childs_domains_join_the_parents_under_their_own_names():
    """Q recovers t/a by ack_tree and t/b by token_ring, both under this scope's token_ring
    domain: two members of it, each placed along Q's chain to the leader of its own domain, and
    each told (`upper`) where the agent standing for it runs."""
    settings, members, _k, _c, planner, _ = _scope([TopicInfo("t/a", 1), TopicInfo("t/b", 2)])
    place = Remote(lambda spec: [f"host-of-{spec['protocol']}", ["q", f"lead-{spec['below']}"]])
    members.children["q"] = ChildScope(
        "q", handle=Handle(place_agent=place), depth=2,
        recovering={"token_ring>ack_tree": ("m1",), "token_ring": ("m2",)})
    members.children["m"] = _member("m", 3, subs=[1])
    domains = planner.domain_members()
    assert sorted(n for n, _r in domains["token_ring"]) == ["m", "q", "q~ack_tree"]
    assert planner.belongs("token_ring", "q~ack_tree") == ("m1",)
    assert planner.belongs("token_ring", "q") == ("m2",) and planner.belongs("token_ring", "m") \
        is None

    async def hello() -> dict:
        return {"key": b"k", "mac": "gmac", "interface": None}
    recovery = RecoveryDomains(planner.path, top=False)
    placement = AgentPlacement(planner.path, members, planner, recovery, settings, hello, None,
                               lambda: False, lambda: None)
    record = asyncio.run(placement.place_for("token_ring", "q~ack_tree"))
    ((spec,),) = place.calls
    # the agent runs this scope's protocol and stands for q's ack_tree domain
    assert (spec["protocol"], spec["domain_key"], spec["below"]) == (
        "token_ring", "token_ring", "token_ring>ack_tree")
    assert record.chain == [planner.path, "q", "lead-token_ring>ack_tree"]
    addresses = {("token_ring", "q~ack_tree"): ["10.0.0.5", 9], ("token_ring", "q"): ["h", 8]}
    assert planner.upper_addresses("q", lambda k, n: addresses.get((k, n))) == {
        "token_ring>ack_tree": ["10.0.0.5", 9], "token_ring": ["h", 8]}
    # the chain to the domain's leader names children, not domain members
    assert planner.lead_chain("token_ring") == ("q", "m2")


def test_caching_is_set_per_scope_inherited_and_checked():
    admins = {"X": ScopeAdmin(caching=(("cachers", 1), ("partition", 4))),
              "X/Q": ScopeAdmin(caching=(("partition", 2),))}
    assert _choices("X/Q", admins).caching() == {"cachers": 1, "partition": 2}
    assert _choices("X/R", admins).caching() == {"cachers": 1, "partition": 4}
    assert _choices("Y", admins).caching() == {}
    assert ScopeAdmin.from_wire(admins["X"].to_wire()) == admins["X"]
    for bad in ({"cachers": 0}, {"partition": 1}, {"cachers": True}, {"cache": 2}):
        with pytest.raises(InvalidConfig):
            ScopeAdmin.from_wire({"v": 1, "default": {}, "overrides": [], **bad})


def test_a_domain_makes_its_agents_again_when_the_administrator_changes_their_options():
    dropped: list[str] = []
    host = Handle(drop=Remote(dropped.append), ensure_all=Remote(lambda specs: [
        ["10.0.0.1", 7000 + i, 1, 1, 0] for i, _ in enumerate(specs)]),
        view=Remote(lambda *a: None), _actor_id="h")
    made: list[str] = []

    async def place(name):
        made.append(name)
        return AgentRecord(host, {"name": name}, ["p", name])

    domains = RecoveryDomains("p", top=False)
    members = {"token_ring": [("a", 0), ("b", 0)]}
    asyncio.run(domains.update(members, lambda _p, n: place(n), lambda _p, _n: None,
                               options={"cachers": 5}))
    asyncio.run(domains.update(members, lambda _p, n: place(n), lambda _p, _n: None,
                               options={"cachers": 5}))
    assert made == ["a", "b"] and dropped == []
    asyncio.run(domains.update(members, lambda _p, n: place(n), lambda _p, _n: None,
                               options={"cachers": 1}))
    assert made == ["a", "b", "a", "b"] and sorted(dropped) == ["a", "b"]


def test_a_failed_recovery_plugin_is_replaced_in_every_chain_and_handed_down():
    plug = "sha256:" + "e" * 64
    topic = TopicInfo("g", 9, recovery="gossip@1", recovery_plugin="e" * 64)
    admins = {"X/Q": ScopeAdmin(Choice(recovery="ack_tree"))}
    q, x = _choices("X/Q", admins), _choices("X", admins)
    assert q.recovery_key(topic) == f"{plug}>{plug}>ack_tree"
    assert q.set_failed({plug}) and not q.set_failed({plug})
    x.set_failed({plug})
    assert q.recovery_key(topic) == "token_ring>token_ring>ack_tree"
    assert upper_key(q.recovery_key(topic)) == x.recovery_key(topic) == "token_ring"
    assert q.describe()["failed_recovery"] == [plug]
    sent = Delegation({}, {}, Part(), {}, admins, (plug,))
    assert Delegation.from_wire(sent.to_wire(2, None)) == (2, sent, None)


def test_a_domain_records_its_agents_fault_and_a_host_that_keeps_restarting():
    process = iter(range(100, 200))
    faults = {"a": "", "b": "faulty: RuntimeError('x')"}

    def answer(specs):  # every answer from a new process: the host restarted each time
        pid = next(process)
        return [["10.0.0.1", 7000, pid, pid, 0, faults[s["name"]]] for s in specs]
    host = Handle(drop=Remote(lambda n: None), view=Remote(lambda *a: None), _actor_id="h",
                  ensure_all=Remote(answer))

    async def place(name):
        return AgentRecord(host, {"name": name}, ["p", name])

    domain = RecoveryDomains("p", top=False)
    members = {"sha256:" + "e" * 64: [("a", 0), ("b", 0)]}
    asyncio.run(domain.update(members, lambda _p, n: place(n), lambda _p, _n: None))
    (d,) = domain.domains.values()
    assert d.fault.startswith("agent of b: faulty: RuntimeError")
    faults["b"] = ""
    quiet = RecoveryDomains("p", top=False)
    for restarts in range(3):  # (two agents of one host: one restart each time, not two)
        asyncio.run(quiet.update(members, lambda _p, n: place(n), lambda _p, _n: None))
        (q,) = quiet.domains.values()
        assert q.fault == "", restarts
    asyncio.run(quiet.update(members, lambda _p, n: place(n), lambda _p, _n: None))
    assert q.fault.startswith("its agents' host restarted 3 times")
