"""Routing records (thesis 3.2.5): the matching and rewriting rule, and the campus example of
Figures 3.14-3.18 replayed over real member runtimes and real UDP sockets."""

from __future__ import annotations

import os
import time

import pytest

from scopecast.netio.channel import UnicastEndpoint
from scopecast.netio.delivery import Subscription
from scopecast.netio.routing import RoutingLabel, forward, matches, origin_record
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route

T = 7  # topic id of topic T

# The channels the text lists, with their labels "P_L:..:P_1-Q_L:..:Q_1, T:R" (Fig. 3.15-3.17).
CAMPUS = {
    "A": RoutingLabel(("A",), ("B",), "A"),             # in P, messages originating at A
    "B": RoutingLabel(("P", "B"), ("Q", "C"), "P"),     # in X, delegated by P to B
    "C": RoutingLabel(("C",), ("D",), "C"),             # in Q, from its entry point C
    "D": RoutingLabel(("Q", "D"), ("R", "E"), "P"),     # in X, delegated by Q to D
}
DESTINATION = {"A": "B", "B": "C", "C": "D", "D": "E"}

# The record the message carries when it arrives at each laptop, as the text gives it.
RECORD_AT = {
    "A": (("A", "A"),),
    "B": (("A", "B"),),
    "C": (("P", "Q"), ("C", "C")),
    "D": (("P", "Q"), ("C", "D")),
    "E": (("P", "R"), ("E", "E")),
}


def test_rule_replays_the_campus_hops():
    record = origin_record("A")
    assert record == RECORD_AT["A"]
    for node in "ABCD":
        label = CAMPUS[node]
        assert matches(record, label), f"{record} should match {label} at {node}"
        record = forward(record, label)
        assert record == RECORD_AT[DESTINATION[node]]


def test_channels_of_other_origins_do_not_match():
    # at D, a message that originated in Q (record (Q-Q)) must not take the channel labelled T:P
    assert not matches((("Q", "Q"), ("C", "D")), CAMPUS["D"])
    # at B, a record without a level-2 entry matches only if the channel's source scope is R
    assert not matches((("A", "B"),), RoutingLabel(("P", "B"), ("Q", "C"), "Q"))
    # at A, a message that originated at B does not go back along A-B, T:A
    assert not matches((("B", "A"),), CAMPUS["A"])


def test_extension_fills_every_missing_level():
    # a level-3 channel on a message with only a member-level record: levels 2 and 3 are filled
    label = RoutingLabel(("X", "P", "B"), ("Y", "Q", "C"), "X")
    out = forward((("A", "B"),), label)
    assert out == (("X", "Y"), ("Q", "Q"), ("C", "C"))


def test_entries_above_the_channel_level_are_kept():
    record = (("U", "V"), ("P", "Q"), ("C", "C"))
    out = forward(record, CAMPUS["C"])
    assert out == (("U", "V"), ("P", "Q"), ("C", "D"))


def test_label_paths_must_have_equal_length():
    with pytest.raises(ValueError):
        RoutingLabel(("P", "B"), ("Q",), "P")


@pytest.fixture
def campus():
    key = os.urandom(32)
    nodes = {n: MemberRuntime(i + 1, n, key) for i, n in enumerate("ABCDE")}
    try:
        yield nodes
    finally:
        for rt in nodes.values():
            rt.close()


def test_campus_example_over_udp(campus):
    """A publishes; B, C, D, E receive every message exactly once, each with the text's record."""
    members = [MemberInfo(rt.member_id, n, *rt.address) for n, rt in campus.items()]
    subs = {}
    for name, rt in campus.items():
        rt.call_wait(rt.install_members, members)
        rt.call_wait(rt.install_topics, {T: "T"})
        if name != "A":
            subs[name] = Subscription(frozenset([T]))
            rt.call_wait(rt.add_subscription, subs[name])
    for name, label in CAMPUS.items():
        dst = campus[DESTINATION[name]]
        endpoint = UnicastEndpoint(*dst.address, member=dst.member_id)
        campus[name].call_wait(campus[name].install_routes, {T: [Route(label, endpoint)]},
                               {dst.address: {dst.member_id}})

    n = 200
    for i in range(1, n + 1):
        last = campus["A"].publish(T, 1, i, 0, b"lecture %d" % i)
    assert campus["A"].wait_sent(last, 10.0)

    received = {name: [] for name in subs}
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline and any(len(v) < n for v in received.values()):
        for name, sub in subs.items():
            while sub.queue:
                batch, nbytes = sub.queue.popleft()
                sub.consumed_bytes += nbytes
                received[name].extend(batch)
        time.sleep(0.01)

    for name, msgs in received.items():
        assert [m.seq for m in msgs] == list(range(1, n + 1)), f"{name} got {len(msgs)}"
        assert {m.route for m in msgs} == {RECORD_AT[name]}, name
        assert all(m.source == "A" and m.payload == b"lecture %d" % m.seq for m in msgs)
    for name in "BCD":
        assert campus[name].stats["forwarded"] == n
    assert campus["E"].stats["forwarded"] == 0
    assert all(rt.stats["duplicates"] == 0 for rt in campus.values())
