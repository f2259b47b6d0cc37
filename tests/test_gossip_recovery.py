"""The `gossip` example recovery plug-in as pure logic: agents wired to each other in memory."""

from __future__ import annotations

import random

import msgpack
import pytest

from tests.protocol_harness import CLOCK, REC, group, load_example, run, summary

gossip_recovery = load_example("gossip_recovery")
GossipRecovery = gossip_recovery.GossipRecovery

NAK = [9, 7, 1, 40, 45, 40, 45, 3, "127.0.0.1", 5000]


def _group(n: int, has_upper: bool = False, **options) -> list:
    return group(GossipRecovery, n, has_upper, **options)


def test_the_module_declares_itself_a_recovery_plugin():
    assert gossip_recovery.__scopecast_plugin__ == {
        "kind": "recovery", "name": "gossip", "version": "1.0", "api_version": 1,
        "classes": ["GossipRecovery"]}
    assert GossipRecovery.name == "gossip" and GossipRecovery.api_version == 1


def test_a_nak_is_pushed_by_a_caching_member_that_holds_the_range():
    agents = _group(4)
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)  # holds 40..45
    for a in agents[1:3]:
        a.on_summary(summary({9: 30}), 0.0)  # does not
    agents[3].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    run(agents, periods=3)
    pushed = [a.on_summary(a.bottom, 1.0)["push"] for a in agents]
    assert pushed[0] and all(p == NAK for p in pushed[0])
    assert len(pushed[0]) <= 3 and agents[0].stats["naks_served"] == len(pushed[0])
    assert pushed[1:] == [[], [], []]


def test_the_same_nak_is_served_once_a_period():
    agents = _group(3)
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)
    push = {"k": "push", "v": 1, "t": {}, "n": [NAK]}
    agents[0].on_tick(1.0)
    agents[0].on_peer(1, push, 1.0)
    agents[0].on_peer(2, {**push, "k": "pull"}, 1.01)  # the same NAK, through another peer
    assert agents[0].on_summary(agents[0].bottom, 1.02)["push"] == [NAK]
    agents[0].on_tick(2.0)  # the next period: still asked for, served again
    agents[0].on_peer(1, push, 2.0)
    assert agents[0].on_summary(agents[0].bottom, 2.01)["push"] == [NAK]
    assert agents[0].stats["naks_served"] == 2


def test_a_member_that_does_not_cache_pushes_nothing():
    agents = _group(2, cache_all=False)
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)
    agents[1].on_summary(summary({9: 39}, naks=[NAK]), 0.0)
    run(agents, periods=3)
    assert agents[0].on_summary(agents[0].bottom, 1.0)["push"] == []
    assert agents[0].stats["naks_served"] == 0


def test_the_group_leader_hands_the_aggregate_up_and_everyone_takes_stability_from_above():
    agents = _group(6, has_upper=True)
    for a in agents:
        a.on_summary(summary({9: 700 + (a.view.index == 4)}, recs={9: REC}), 0.0)
    run(agents, periods=10)
    up = agents[0].upward()
    assert up == {"acks": {9: 700}, "recs": {9: REC}, "seen": {}, "naks": []}
    assert agents[0].upward() is None  # once a period
    assert all(a.upward() is None for a in agents[1:])  # only agent 0 hands up
    assert all(a.down == {} for a in agents)  # not the top: nobody decides
    agents[0].on_down({"down": {9: [650, REC]}, "hi": {9: 800}})
    run(agents, periods=10)
    assert all(a.down == {9: [650, REC]} and a.hi == {9: 800} for a in agents)
    agents[0].on_down({"down": {9: [690, REC]}, "hi": {9: 800}})  # a newer decision wins
    run(agents, periods=10)
    assert all(a.down == {9: [690, REC]} for a in agents)


def test_stability_is_reached_when_30_percent_of_the_gossip_is_lost():
    agents = _group(8)
    for i, a in enumerate(agents):
        a.on_summary(summary({9: 400 + 10 * i}, recs={9: REC} if i == 0 else None), 0.0)
    rng = random.Random(3)
    lost = []

    def lose(src, dst, body):
        if rng.random() < 0.3:
            lost.append(body)
            return True
        return False

    run(agents, periods=30, lose=lose)
    assert len(lost) > 30
    assert all(a.down == {9: [400, REC]} for a in agents)


def test_an_idle_agent_that_turns_active_gossips_at_the_next_tick():
    agents = _group(5, active_period=0.01, idle_period=100.0)
    for a in agents:
        a.on_summary(summary({9: 1000}, recs={9: [1000, []]}), 0.0)
    run(agents, periods=3)
    assert all(a.period == 100.0 for a in agents)  # idle: the next gossip is 100 s away
    rec = [2000, [[7, 1, 1001, 1001, 2000, 2000]]]
    agents[3].on_summary(summary({9: 2000}, recs={9: rec}), 0.0)
    for i, a in enumerate(agents):
        if i != 3:
            a.on_summary(summary({9: 1500}), 0.0)
    run(agents, periods=6)
    assert all(a.down == {9: [1500, rec]} and a.period == 0.01 for a in agents)


def test_what_it_sends_survives_msgpack():
    def wire(value):
        return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), strict_map_key=False)

    agents = _group(3, has_upper=True)
    for a in agents:
        a.on_summary({**summary({9: 700}, naks=[NAK], recs={9: REC}), "seen": {9: 710}}, 0.0)
    run(agents, periods=5)
    agents[0].on_down({"down": {9: [650, REC]}, "hi": {9: 800}})
    now = CLOCK[0] + 1.0
    (dst, push), *_ = agents[0].on_tick(now)
    assert wire(push) == push and push["d"] == [1, {9: [650, REC]}, {9: 800}]
    (back, pull), = agents[dst].on_peer(0, wire(push), now)
    assert back == 0 and wire(pull) == pull and pull["k"] == "pull"
    assert agents[0].on_peer(dst, wire(pull), now) == []
    assert agents[0].stats["bad_messages"] == agents[dst].stats["bad_messages"] == 0
    assert wire(agents[0].upward())["acks"] == {9: 700}
    instructions = agents[0].on_summary(agents[0].bottom, now)
    assert wire(instructions) == instructions


@pytest.mark.parametrize("body", [
    None, 5, "push", [], {},
    {"k": "push", "v": 2, "t": {}, "n": []},                       # another view
    {"k": "tok", "v": 1, "t": {}, "n": []},
    {"k": "push", "v": 1, "t": [], "n": []},
    {"k": "push", "v": 1, "t": {0: "x"}, "n": []},
    {"k": "push", "v": 1, "t": {7: [{}, {}, 1, {}]}, "n": []},      # no such peer
    {"k": "push", "v": 1, "t": {1: [{9: "x"}, {}, 1, {}]}, "n": []},
    {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1.5, {}]}, "n": []},
    {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1, {9: [5]}]}, "n": []},
    {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1, {}]}, "n": [[1, 2]]},
    {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1, {}]}, "n": [[[]] * 10]},
    {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1, {}]}, "n": [], "d": [1, {9: 5}, {}]},
])
def test_bad_peer_input_is_ignored(body):
    agents = _group(3)
    agents[0].on_summary(summary({9: 100}, recs={9: REC}), 0.0)
    before = dict(agents[0].state)
    assert agents[0].on_peer(1, body, 1.0) == []
    assert agents[0].state == before and agents[0].pushes == []
    good = {"k": "push", "v": 1, "t": {1: [{9: 5}, {}, 1, {}]}, "n": []}
    assert agents[0].on_peer(1, good, 1.0)[0][1]["k"] == "pull"  # a good one is answered
    assert agents[0].state[1] == [{9: 5}, {}, 1, {}]
