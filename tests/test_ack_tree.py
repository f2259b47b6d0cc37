"""The ack_tree protocol as pure logic: agents wired to each other in memory (no sockets)."""

from __future__ import annotations

import pytest

from scopecast.agents.ack_tree import AckTree
from tests.protocol_harness import REC, group, run, summary

NAK = [9, 7, 1, 40, 45, 40, 45, 3, "127.0.0.1", 5000]


def _group(n: int, has_upper: bool = False, **options) -> list[AckTree]:
    return group(AckTree, n, has_upper, **options)


def _pushed(agents: list[AckTree]) -> list[list]:
    return [a.on_summary(a.bottom, 1.0)["push"] for a in agents]


def test_the_tree_is_k_ary_by_index():
    agents = _group(12, fanout=3)
    assert agents[0].parent is None and agents[0].children == [1, 2, 3]
    assert agents[3].parent == 0 and agents[3].children == [10, 11]
    assert agents[11].parent == 3 and agents[11].children == []


def test_a_child_that_has_sent_no_ack_holds_nothing():
    agents = _group(5, fanout=2)
    for a in agents:
        a.on_summary(summary({9: 900}, recs={9: REC}), 0.0)
    run(agents, lose=lambda src, dst, body: src == 2 and body["k"] == "ack")
    assert agents[0].down == {9: [0, REC]}
    run(agents)
    assert agents[0].down == {9: [900, REC]}


def test_a_nak_is_pushed_by_a_caching_member_on_the_requesters_path_that_holds_the_range():
    agents = _group(4)  # agent 0 is the parent of 1, 2 and 3
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)
    for a in agents[1:3]:
        a.on_summary(summary({9: 100}), 0.0)  # they hold it too, but are not on the path
    agents[3].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    run(agents, periods=3)
    pushed = _pushed(agents)
    assert pushed[0] == [NAK] and agents[0].stats["naks_served"] >= 1
    assert pushed[1:] == [[], [], []]


@pytest.mark.parametrize("holder", [1, 0])
def test_the_nearest_holder_up_the_path_repairs_and_the_nak_goes_no_further(holder):
    agents = _group(6, fanout=2)  # 0 -> 1, 2; 1 -> 3, 4; 2 -> 5
    for i, a in enumerate(agents):
        held = 100 if i in (holder, 0, 3, 5) else 39  # 3 and 5 hold it, off the path
        a.on_summary(summary({9: held}, recs={9: REC} if i == 0 else None), 0.0)
    agents[4].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    run(agents, periods=4)
    assert _pushed(agents) == [[NAK] if i == holder else [] for i in range(6)]


def test_without_cache_all_only_the_designated_receivers_cache_and_serve():
    agents = _group(3, fanout=1, cache_all=False)  # a chain: 0 -> 1 -> 2
    for a in agents[:2]:
        a.on_summary(summary({9: 100}), 0.0)
    agents[2].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    assert [a.cacher for a in agents] == [True, True, False]
    run(agents, periods=3)
    assert _pushed(agents) == [[], [NAK], []]


def test_the_group_root_hands_the_aggregate_up_and_takes_stability_from_above():
    agents = _group(6, has_upper=True)
    for i, a in enumerate(agents):
        a.on_summary(summary({9: 700 + i}, recs={9: REC}), 0.0)
    run(agents)
    up = agents[0].upward()
    assert up == {"acks": {9: 700}, "recs": {9: REC}, "seen": {}, "naks": []}
    assert agents[0].upward() is None  # handed up once
    assert agents[0].down == {}  # not the top: it does not decide
    agents[0].on_down({"down": {9: [650, REC]}})
    run(agents, periods=1)
    assert all(a.down == {9: [650, REC]} for a in agents)


def test_the_top_hands_nothing_up():
    agents = _group(3)
    run(agents)
    assert agents[0].upward() is None and agents[0].stats["rounds"] >= 1


def test_a_lost_message_is_made_up_for_by_the_next_period():
    agents = _group(3)  # agent 0 is the parent of 1 and 2
    for a in agents:
        a.on_summary(summary({9: 300}, recs={9: REC}), 0.0)
    lost = []

    def lose_the_first_two_of_each_kind(src, dst, body):
        if sum(b["k"] == body["k"] for b in lost) < 2:
            lost.append(body)
            return True
        return False

    run(agents, periods=2, lose=lose_the_first_two_of_each_kind)
    assert {b["k"] for b in lost} == {"ack", "down"}
    assert agents[0].down == {9: [0, REC]}  # decided before any ACK came through
    run(agents, periods=3)
    assert all(a.down == {9: [300, REC]} for a in agents)


def test_a_nak_keeps_the_tree_active():
    agents = _group(5, fanout=2, active_period=0.02, idle_period=0.5)
    for a in agents:
        a.on_summary(summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    run(agents, periods=3)
    assert [a.period for a in agents] == [0.5] * 5
    agents[4].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    run(agents, periods=1)
    assert [a.period for a in agents] == [0.02] * 5


def test_an_idle_tree_reacts_at_once_when_a_deep_member_turns_active():
    agents = _group(12, active_period=0.01, idle_period=100.0)  # 11 is a child of 2, 2 of 0
    for a in agents:
        a.on_summary(summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    run(agents, periods=3)
    assert [a.period for a in agents] == [100.0] * 12  # idle: the next ACK would be 100 s away
    assert agents[0].down == {9: [1000, [1000, []]]}
    rec = [2000, [[7, 1, 1001, 1001, 2000, 2000]]]
    agents[11].on_summary(summary({9: 1000}, recs={9: rec}), 0.0)
    for a in agents[:11]:
        a.on_summary(summary({9: 2000}), 0.0)
    run(agents, periods=1)
    assert all(a.down == {9: [1000, rec]} and a.period == 0.01 for a in agents)


def test_bad_peer_input_is_ignored():
    agents = _group(3)
    a = agents[0]
    for body in [None, 7, [], {"k": "ack"}, {"k": "ack", "v": 2, "acks": {9: 1}},
                 {"k": "ack", "v": 1, "acks": {9: "x"}}, {"k": "ack", "v": 1, "naks": [[9, 1]]},
                 {"k": "ack", "v": 1, "recs": {9: 5}},
                 {"k": "ack", "v": 1, "naks": [[[9], 0, 0, 0, 0, 0, 1]]},
                 {"k": "down", "v": 1, "r": 1, "down": {9: 5}}, {"k": "what", "v": 1}]:
        assert a.on_peer(1, body, 1.0) == []
        assert agents[1].on_peer(0, body, 1.0) == []
    assert a.kids == {} and agents[1].down == {}
    a.on_peer(2, {"k": "ack", "v": 1, "acks": {9: 5}, "cnt": {9: 1}}, 1.0)
    assert list(a.kids) == [2]  # a well-formed one counts
    assert agents[1].on_peer(2, {"k": "down", "v": 1, "r": 1, "down": {}}, 1.0) == []  # not its parent
