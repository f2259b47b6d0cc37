"""What every recovery protocol must do, checked on each as pure logic (in-memory harness): the
built-ins `token_ring` and `ack_tree` and the `gossip` plug-in of examples/. Each protocol's own file
tests how it gets there (tokens, trees, gossip)."""

from __future__ import annotations

import pytest

from scopecast.agents.ack_tree import AckTree
from scopecast.agents.api import DomainContext, PeerView
from scopecast.agents.token_ring import TokenRing
from tests.protocol_harness import REC, group, load_example, run, summary

PROTOCOLS = [TokenRing, AckTree, load_example("gossip_recovery").GossipRecovery]
ROUNDS = 20  # enough periods for the slowest (gossip) to spread a change to everyone

each_protocol = pytest.mark.parametrize("cls", PROTOCOLS, ids=lambda c: c.name)


def _downs(agents: list) -> list[dict]:
    return [a.on_summary(a.bottom, 1.0)["down"] for a in agents]


@each_protocol
@pytest.mark.parametrize("n", [1, 3, 5, 12])
def test_stability_is_the_minimum_over_every_member_and_reaches_all(cls, n):
    agents = group(cls, n)
    for i, a in enumerate(agents):  # the last agent (the deepest, the furthest) holds the least
        s = summary({9: 600 - i}, recs={9: REC} if i == n - 1 else None)
        a.on_summary({**s, "seen": {9: 700 + i}}, 0.0)
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [600 - (n - 1), REC]}] * n
    # and the furthest any member delivered (what survivors of a sender's crash catch up to)
    assert [a.on_summary(a.bottom, 2.0)["hi"] for a in agents] == [{9: 700 + n - 1}] * n


@each_protocol
def test_a_member_that_has_not_reported_a_stream_holds_it_back(cls):
    agents = group(cls, 7)
    for i, a in enumerate(agents):
        if i != 6:
            a.on_summary(summary({9: 900}, recs={9: REC}), 0.0)
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [0, REC]}] * 7
    agents[6].on_summary(summary({9: 800}), 0.0)  # it reports: the group holds what it holds
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [800, REC]}] * 7


@each_protocol
def test_stability_never_goes_back(cls):
    agents = group(cls, 3)
    for a in agents:
        a.on_summary(summary({9: 800}, recs={9: REC}), 0.0)
    run(agents, periods=ROUNDS)
    agents[1].on_summary(summary({9: 10}, recs={9: REC}), 0.0)  # a newcomer, far behind
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [800, REC]}] * 3


@each_protocol
def test_nothing_is_stable_while_a_member_of_the_domain_has_no_agent_in_the_group_yet(cls):
    agents = [cls(DomainContext(f"d|{i}", 1, {"idle_period": 0.06})) for i in range(3)]
    for i, a in enumerate(agents):
        a.on_view(PeerView(1, ("m0", "m1", "m2"), i, False, missing=1))
        a.on_summary(summary({9: 900}, recs={9: REC}), 0.0)
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [0, REC]}] * 3
    for i, a in enumerate(agents):  # its agent is placed: the same group, nothing missing
        a.on_view(PeerView(2, ("m0", "m1", "m2"), i, False))
    run(agents, periods=ROUNDS)
    assert _downs(agents) == [{9: [900, REC]}] * 3


@each_protocol
def test_the_period_is_the_configured_active_one_while_a_sender_is_unstable_else_the_idle_one(cls):
    agents = group(cls, 2, active_period=0.02, idle_period=0.5)
    agents[0].on_summary(summary({9: 10}, recs={9: REC}), 0.0)
    run(agents, periods=3)
    assert [a.period for a in agents] == [0.02, 0.02]
    agents[0].on_summary(summary({9: 1000}, recs={9: [1000, []]}), 1.0)
    run(agents, periods=ROUNDS)
    assert [a.period for a in agents] == [0.5, 0.5]
