"""The token_ring protocol as pure logic: agents wired to each other in memory (no sockets)."""

from __future__ import annotations

from scopecast.agents import token_ring
from scopecast.agents.token_ring import TokenRing, partitions
from tests.protocol_harness import REC, group, run, summary


def _group(n: int, has_upper: bool = False, **options) -> list[TokenRing]:
    return group(TokenRing, n, has_upper, **options)


def test_partitions_follow_regions_and_never_cross_one():
    assert partitions(8, (0, 0, 0, 1, 1, 1, 1, 2), 3) == [[0, 1, 2], [3, 4, 5, 6], [7]]
    # about `size` each, as even as they go: no tail of one peer caching for nobody
    assert [len(p) for p in partitions(16, (), 5)] == [5, 5, 6]
    assert [len(p) for p in partitions(13, (), 5)] == [4, 4, 5]
    assert [len(p) for p in partitions(7, (), 5)] == [7]
    assert [len(p) for p in partitions(8, (), 5)] == [4, 4]
    assert sum(partitions(40, (), 5), []) == list(range(40))
    assert partitions(4, (), 5) == [[0, 1, 2, 3]]
    assert partitions(3, (0, 1), 5) == [[0, 1, 2]]  # not one per peer: taken as one region
    agents = _group(5, regions=(0, 0, 1, 1, 1))
    assert [a.rings["p"].members for a in agents] == [[0, 1], [0, 1], [2, 3, 4], [2, 3, 4],
                                                      [2, 3, 4]]
    assert agents[0].rings["g"].members == [0, 2] and "g" not in agents[1].rings


def test_a_nak_is_served_in_its_region_not_by_a_peer_that_does_not_take_the_topic():
    """Peers of region 0 take other topics of sender 9: they acknowledge its stream as held
    (owed nothing of topic 7), and without regions the first of them took the NAK off the token
    and its member had nothing to send."""
    nak = [9, 7, 1, 40, 45, 40, 45, 4, "127.0.0.1", 5000]

    def pushed(regions: tuple, acks: list[int]) -> list[bool]:
        agents = _group(5, regions=regions)
        for a, ack in zip(agents[:4], acks, strict=True):
            a.on_summary(summary({9: ack}, recs={9: REC} if a is agents[0] else None), 0.0)
        agents[4].on_summary(summary({9: 39}, naks=[nak]), 0.0)
        run(agents, periods=3)
        return [bool(a.on_summary(a.bottom, 1.0)["push"]) for a in agents]

    assert pushed((), [100] * 4) == [True, False, False, False, False]  # m0 takes it
    assert pushed((0, 0, 1, 1, 1), [100] * 4) == [False, False, True, False, False]
    # nobody in its region holds it: the regional token passes it by region 0 (the member
    # pulls from the sender)
    assert pushed((0, 0, 1, 1, 1), [100, 100, 39, 39]) == [False] * 5


def test_a_nak_is_pushed_by_a_caching_neighbour_that_holds_the_range():
    agents = _group(4)
    nak = [9, 7, 1, 40, 45, 40, 45, 3, "127.0.0.1", 5000]
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)  # caches (first two cache)
    for a in agents[1:3]:
        a.on_summary(summary({9: 100}), 0.0)
    agents[3].on_summary(summary({9: 39}, naks=[nak]), 0.0)
    run(agents, periods=3)
    pushed = [a.on_summary(a.bottom, 1.0)["push"] for a in agents]
    # the first caching agent serves it (each round, while the requester still asks)
    assert pushed[0] and all(p == nak for p in pushed[0])
    assert pushed[1:] == [[], [], []]


def test_the_group_leader_hands_the_aggregate_up_and_takes_stability_from_above():
    agents = _group(10, has_upper=True)
    for a in agents:
        a.on_summary(summary({9: 700}, recs={9: REC}), 0.0)
    run(agents)
    up = agents[0].upward()
    assert up["acks"] == {9: 700} and up["recs"] == {9: REC}
    assert agents[0].down == {}  # not the top: it does not decide
    agents[0].on_down({"down": {9: [650, REC]}})
    run(agents)
    assert all(a.down == {9: [650, REC]} for a in agents)
    # what status shows of each: its rings (the leader leads both, partitions of 5), how far
    # its word from above and its bottom take the stream
    lead, last = agents[0].describe(), agents[4].describe()
    assert lead["rings"]["p"]["members"] == [0, 1, 2, 3, 4]
    assert lead["rings"]["g"]["members"] == [0, 5] and "g" not in last["rings"]
    assert lead["rings"]["p"]["round"] > 0 and lead["rings"]["p"]["lost_in_a_row"] == 0
    assert lead["down"] == last["down"] == {"9": 650} and last["acks"] == {"9": 700}
    assert (lead["down_streams"], lead["ack_streams"]) == (1, 1)


def test_a_lost_token_is_released_again_within_a_few_periods():
    """Stability waits for the round: at 1% loss a ring of five loses a token every twenty
    rounds, and a 200 ms wait for each (as before) held a publisher's window full."""
    agents = _group(3, active_period=0.01)
    for a in agents:
        a.on_summary(summary({9: 300}, recs={9: REC}), 0.0)
    dropped = []
    run(agents, periods=3, lose=lambda src, dst, body: not dropped and not dropped.append(body))
    assert dropped and agents[0].stats["tokens_lost"] == 1
    assert agents[0].down == {9: [300, REC]}  # decided by the round after the lost one


def test_rounds_slower_than_the_loss_timeout_still_complete():
    """Every token comes back after 100 ms, ten periods: taken as lost and started over, the
    round still counts when its token comes back (and each loss in a row doubles the wait)."""
    agents = _group(2, active_period=0.01)
    for a in agents:
        a.on_summary(summary({9: 300}, recs={9: REC}), 0.0)
    in_flight = []  # (due, token)
    now = 0.0
    while now < 1.0 and not agents[0].stats["rounds"]:
        now += 0.01
        for due, body in [f for f in in_flight if f[0] <= now]:
            in_flight.remove((due, body))
            agents[0].on_peer(1, body, now)
        for _dst, body in agents[0].on_tick(now):
            for _back, token in agents[1].on_peer(0, body, now):
                in_flight.append((now + 0.1, token))
    assert agents[0].stats["rounds"] == 1 and agents[0].stats["tokens_lost"] >= 1
    assert agents[0].down == {9: [300, REC]}


def test_a_ring_whose_round_trip_outgrew_the_longest_loss_wait_still_decides():
    """An agents' host seconds behind its sockets (a loaded node): every token comes back after
    more than LOST_MAX. Dropped as overtaken, no round ever completed again and stability
    stopped for good (a flush waited 240 s); taken late, each decides."""
    agents = group(TokenRing, 2, regions=(0, 1), active_period=0.04)  # a regional ring [0, 1]
    for a, held in zip(agents, (2000, 2001), strict=True):
        a.on_summary(summary({38: held}, recs={38: REC}), 0.0)
    lag = 4.0  # one way: a round trip of 8 s against LOST_MAX
    assert 2 * lag > token_ring.LOST_MAX
    now, in_flight = 0.0, []  # (due, src, dst, body)
    while now < 30.0 and 38 not in agents[0].down:
        now += 0.005
        for i, a in enumerate(agents):
            in_flight += [(now + lag, i, dst, body) for dst, body in a.on_tick(now)]
        for m in [m for m in in_flight if m[0] <= now]:
            in_flight.remove(m)
            in_flight += [(now + lag, m[2], d, b) for d, b in agents[m[2]].on_peer(m[1], m[3], now)]
    assert agents[0].down[38][0] == 2000 and agents[0].stats["tokens_lost"] >= 1
    assert len(in_flight) <= 2 * token_ring.MAX_OPEN_ROUNDS  # rounds out at once stay bounded


def test_an_idle_ring_starts_a_round_at_once_when_a_member_that_does_not_lead_turns_active():
    agents = _group(5, active_period=0.01, idle_period=100.0)
    for a in agents:
        a.on_summary(summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    run(agents, periods=3)
    assert agents[0].period == 100.0  # idle: the next round would be 100 s away
    agents[3].on_summary(summary({9: 1000}, recs={9: [2000, [[7, 1, 1001, 1001, 2000, 2000]]]}), 0.0)
    for i, a in enumerate(agents):
        if i != 3:
            a.on_summary(summary({9: 2000}), 0.0)
    run(agents, periods=2)
    assert agents[0].down[9][0] == 1000 and agents[0].period == 0.01


def test_every_partition_runs_at_the_active_period_while_a_sender_in_another_is_unstable():
    """9 agents: partitions 0-4 and 5-8. Only agent 0's bottom has an unstable record; the second
    partition (no sender of its own) must still go at the active period, or its members report
    once per idle period and the sender's window turns over that seldom."""
    agents = _group(9, active_period=0.01, idle_period=1.0)
    agents[0].on_summary(summary({9: 10}, recs={9: REC}), 0.0)
    for a in agents[1:]:
        a.on_summary(summary({9: 10}), 0.0)
    run(agents, periods=8)
    assert [a.period for a in agents] == [0.01] * 9
    agents[0].on_summary(summary({9: 1000}, recs={9: [1000, []]}), 1.0)  # all stable now
    for a in agents[1:]:
        a.on_summary(summary({9: 1000}), 1.0)
    run(agents, periods=12)
    assert [a.period for a in agents] == [1.0] * 9


def test_a_group_whose_own_members_send_nothing_goes_at_the_active_period_while_above_is_active():
    agents = _group(9, has_upper=True, active_period=0.01, idle_period=1.0)
    for a in agents:
        a.on_summary(summary({9: 10}), 0.0)
    run(agents, periods=20)
    assert [a.period for a in agents] == [1.0] * 9
    agents[0].on_down({"down": {}, "period": 0.01})  # a sender elsewhere in the domain is unstable
    run(agents, periods=20)
    assert [a.period for a in agents] == [0.01] * 9
    agents[0].on_down({"down": {}, "period": 1.0})
    run(agents, periods=40)
    assert [a.period for a in agents] == [1.0] * 9


def test_an_idle_group_starts_a_round_at_once_when_a_partition_it_does_not_lead_turns_active():
    """Agent 1 leads a partition of its own (its region differs) and is a member of the regional
    ring agent 0 leads. Its bottom turning active woke agent 0 once; that round carried agent
    1's partition aggregate from before, so the group went idle again and the sender's messages
    waited out the idle period (a flush took 0.6-0.8 s, 45 ms with the sender leading)."""
    agents = _group(2, regions=(0, 1), active_period=0.01, idle_period=100.0)
    for a in agents:
        a.on_summary(summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    run(agents, periods=3)
    assert [a.period for a in agents] == [100.0, 100.0]  # idle
    unstable = [2000, [[7, 1, 1001, 1001, 2000, 2000]]]
    agents[1].on_summary(summary({9: 2000}, recs={9: unstable}), 0.0)
    agents[0].on_summary(summary({9: 2000}), 0.0)
    run(agents, periods=4)
    assert agents[0].down[9] == [2000, unstable]  # the top has the record, and both hold it
    assert agents[0].period == 0.01
