"""The token_ring protocol as pure logic: agents wired to each other in memory (no sockets)."""

from __future__ import annotations

import pytest

from scopecast.agents.api import DomainContext, PeerView
from scopecast.agents.token_ring import TokenRing


def _group(n: int, has_upper: bool = False, **options) -> list[TokenRing]:
    options.setdefault("idle_period", 0.06)  # every period of the harness is a round
    agents = [TokenRing(DomainContext(f"d|{i}", 1, options)) for i in range(n)]
    for i, a in enumerate(agents):
        a.on_view(PeerView(1, tuple(f"m{j}" for j in range(n)), i, has_upper))
    return agents


CLOCK = [0.0]


def _run(agents: list[TokenRing], periods: int = 6, lose=lambda src, dst, body: False) -> None:
    """Tick every agent each period and deliver what they send (unless `lose` says so)."""
    for _ in range(periods):
        CLOCK[0] += 0.06
        now = CLOCK[0]
        queue = [(i, dst, body) for i, a in enumerate(agents) for dst, body in a.on_tick(now)]
        while queue:
            src, dst, body = queue.pop(0)
            if not lose(src, dst, body):
                queue += [(dst, d, b) for d, b in agents[dst].on_peer(src, body, now)]


def _summary(acks: dict, naks=(), recs=None) -> dict:
    return {"acks": acks, "naks": list(naks), "recs": recs or {}}


REC = [1000, [[7, 1, 1, 1, 1000, 1000]]]  # sender 9 has messages 1..1000 of topic 7 unstable


@pytest.mark.parametrize("n", [1, 3, 5, 12])
def test_stability_is_the_minimum_over_every_member_and_reaches_all(n):
    agents = _group(n)
    for i, a in enumerate(agents):
        a.on_summary(_summary({9: 500 + i}, recs={9: REC} if i == n - 1 else None), 0.0)
    _run(agents)
    for a in agents:
        assert a.on_summary(a.bottom, 1.0)["down"] == {9: [500, REC]}


def test_a_member_that_has_not_reported_a_stream_holds_it_back():
    agents = _group(7)
    for i, a in enumerate(agents):
        if i != 6:
            a.on_summary(_summary({9: 900}, recs={9: REC}), 0.0)
    _run(agents)
    assert agents[0].down == {9: [0, REC]}


def test_stability_never_goes_back():
    agents = _group(3)
    for a in agents:
        a.on_summary(_summary({9: 800}, recs={9: REC}), 0.0)
    _run(agents)
    agents[1].on_summary(_summary({9: 10}, recs={9: REC}), 0.0)  # a newcomer, far behind
    _run(agents)
    assert agents[2].down[9][0] == 800


def test_a_nak_is_pushed_by_a_caching_neighbour_that_holds_the_range():
    agents = _group(4)
    nak = [9, 7, 1, 40, 45, 40, 45, 3, "127.0.0.1", 5000]
    agents[0].on_summary(_summary({9: 100}, recs={9: REC}), 0.0)  # caches (first two cache)
    for a in agents[1:3]:
        a.on_summary(_summary({9: 100}), 0.0)
    agents[3].on_summary(_summary({9: 39}, naks=[nak]), 0.0)
    _run(agents, periods=3)
    pushed = [a.on_summary(a.bottom, 1.0)["push"] for a in agents]
    # the first caching agent serves it (each round, while the requester still asks)
    assert pushed[0] and all(p == nak for p in pushed[0])
    assert pushed[1:] == [[], [], []]


def test_the_group_leader_hands_the_aggregate_up_and_takes_stability_from_above():
    agents = _group(6, has_upper=True)
    for a in agents:
        a.on_summary(_summary({9: 700}, recs={9: REC}), 0.0)
    _run(agents)
    up = agents[0].upward()
    assert up["acks"] == {9: 700} and up["recs"] == {9: REC}
    assert agents[0].down == {}  # not the top: it does not decide
    agents[0].on_down({"down": {9: [650, REC]}})
    _run(agents)
    assert all(a.down == {9: [650, REC]} for a in agents)


def test_a_lost_token_is_released_again():
    agents = _group(3)
    for a in agents:
        a.on_summary(_summary({9: 300}, recs={9: REC}), 0.0)
    lost = []

    def lose_first(src, dst, body):
        if not lost:
            lost.append(body)
            return True
        return False

    _run(agents, periods=12, lose=lose_first)
    assert lost and agents[0].stats["tokens_lost"] >= 1
    assert agents[0].down == {9: [300, REC]}


def test_the_period_is_the_configured_active_one_while_a_sender_is_unstable_else_the_idle_one():
    (agent,) = _group(1, active_period=0.02, idle_period=0.5)
    agent.on_summary(_summary({9: 10}, recs={9: REC}), 0.0)
    _run([agent])
    assert agent.period == 0.02
    agent.on_summary(_summary({9: 1000}, recs={9: [1000, []]}), 1.0)
    _run([agent], periods=20)
    assert agent.period == 0.5


def test_nothing_is_stable_while_a_member_of_the_domain_has_no_agent_in_the_group_yet():
    agents = [TokenRing(DomainContext(f"d|{i}", 1, {"idle_period": 0.06})) for i in range(3)]
    for i, a in enumerate(agents):
        a.on_view(PeerView(1, ("m0", "m1", "m2"), i, False, missing=1))
        a.on_summary(_summary({9: 900}, recs={9: REC}), 0.0)
    _run(agents)
    assert agents[0].down == {9: [0, REC]}
    for i, a in enumerate(agents):  # its agent is placed: the same group, nothing missing
        a.on_view(PeerView(2, ("m0", "m1", "m2"), i, False))
    _run(agents)
    assert agents[0].down == {9: [900, REC]}


def test_an_idle_ring_starts_a_round_at_once_when_a_member_that_does_not_lead_turns_active():
    agents = _group(5, active_period=0.01, idle_period=100.0)
    for a in agents:
        a.on_summary(_summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    _run(agents, periods=3)
    assert agents[0].period == 100.0  # idle: the next round would be 100 s away
    agents[3].on_summary(_summary({9: 1000}, recs={9: [2000, [[7, 1, 1001, 1001, 2000, 2000]]]}), 0.0)
    for i, a in enumerate(agents):
        if i != 3:
            a.on_summary(_summary({9: 2000}), 0.0)
    _run(agents, periods=2)
    assert agents[0].down[9][0] == 1000 and agents[0].period == 0.01
