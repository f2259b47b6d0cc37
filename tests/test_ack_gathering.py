"""A multicast channel's acknowledgements gathered up a tree of its receivers (`ack_gathering`):
the tree's shape (pure), a subtree's report (pure), and, on real sockets, a sender that hears
only the root while its window still waits for a receiver two levels down."""

from __future__ import annotations

import os
import random
import socket
import threading
from collections import Counter
from types import SimpleNamespace

from member_pair import received, wait_for

from scopecast.netio.ack_gathering import (
    FANIN,
    GROUP_CHANNELS,
    Subtree,
    group_channel,
    group_receivers,
    is_multicast,
    place,
    root,
    tree_order,
)
from scopecast.netio.channel import MulticastGroup
from scopecast.netio.channel_acks import ChannelAcks
from scopecast.netio.control_messages import Ack, GroupAck
from scopecast.netio.delivery import Subscription
from scopecast.netio.member_parts import MemberTables
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig

TOPIC = 7


def _walk(source: int, member: int, orders: list[list[int]], rng: random.Random) -> int:
    """Hops from `member` up to `source`, each hop by the tree of a view picked at random."""
    hops = 0
    while member != source:
        placed = [p for o in orders if (p := place(source, member, o)) is not None]
        assert placed, f"{member} has no place in any view"
        member = rng.choice(placed)[0]
        hops += 1
        assert hops <= 64, "a cycle"
    return hops


def test_every_receiver_reaches_the_sender_through_at_most_fanin_children_each():
    rng = random.Random(5)
    for n in (1, 2, 7, 8, 9, 40, 300):
        receivers = rng.sample(range(1, 10_000), n + 1)  # (a sender's view lists it too)
        source = rng.choice(receivers)
        order = tree_order(source, receivers)
        assert sorted(order) == sorted(set(receivers) - {source})
        assert root(source, receivers) == order[0]
        depth = 0
        for m in order:
            parent, children = place(source, m, order)
            assert len(children) <= FANIN
            for c in children:
                assert place(source, c, order)[0] == m
            depth = max(depth, _walk(source, m, [order], rng))
        # a FANIN-ary heap: levels of 1, FANIN, FANIN**2 ... receivers, each one hop more
        levels, room = 0, 0
        while room < len(order):
            room += FANIN ** levels
            levels += 1
        assert depth == levels
        assert place(source, source, order) is None  # the sender is not in its own tree


def test_members_whose_views_differ_still_make_no_cycle():
    rng = random.Random(11)
    for _ in range(50):
        everyone = rng.sample(range(1, 1000), 60)
        source = everyone[0]
        views = [tree_order(source, rng.sample(everyone, 45)) for _ in range(4)]
        for m in set().union(*views):
            _walk(source, m, [v for v in views if m in v] or views, rng)


def test_trees_of_different_senders_put_different_receivers_on_top():
    members = list(range(100, 132))
    assert len({root(s, members) for s in members}) > 8


def test_group_channels_are_above_the_unicast_ones_and_a_clash_is_left_out():
    assert is_multicast("239.255.1.2") and is_multicast("224.0.0.1")
    assert not is_multicast("127.0.0.1") and not is_multicast("240.0.0.1")
    assert not is_multicast("host.example")
    seen = {}
    clash = None
    for port in range(20_000, 60_000):
        c = group_channel("239.1.2.3", port)
        assert GROUP_CHANNELS <= c <= 0xFFFF
        if c in seen:
            clash = (seen[c], port)
            break
        seen[c] = port
    assert clash is not None
    both = group_receivers({("239.1.2.3", clash[0]): (1, 2), ("239.1.2.3", clash[1]): (3,),
                            ("239.9.9.9", 5000): (4, 5)})
    assert both == {group_channel("239.9.9.9", 5000): (4, 5)}


def test_a_report_is_the_lowest_of_the_regular_members_of_the_subtree():
    tree = Subtree(parent=1)
    tree.lay(1, [10, 11, 12], streaming=False, now=0.0)
    assert tree.report(50, False, 0.0, 1.0)[:3:2] == (0, 0)  # children heard of yet: from 0
    assert tree.on_child(10, 40, 0.002, 0, 1.0) is True
    assert tree.on_child(11, 45, 0.001, 0, 1.0) is True
    assert tree.on_child(12, 10, 0.0, 1, 1.0) is True  # light: it leaves the report
    dseq, held, light = tree.report(50, False, 0.5, 1.004)
    assert (dseq, light) == (40, 0) and abs(held - 0.006) < 1e-9  # its news waited 2 + 4 ms
    assert tree.report(50, True, 0.0, 1.0)[::2] == (40, 0)  # this one light: its children count
    assert tree.on_child(10, 30, 0.0, 0, 1.1) is False  # (never backwards)
    assert tree.on_child(99, 60, 0.0, 0, 1.1) is None   # not a child here
    assert tree.on_child(12, 20, 0.0, 0, 1.2) is True   # promoted: it holds from now on
    assert tree.report(50, False, 0.0, 1.2)[::2] == (20, 0)


def test_a_subtree_of_light_members_holds_nothing():
    tree = Subtree(parent=1)
    tree.lay(1, [10], streaming=True, now=0.0)  # laid mid-stream: light until it says otherwise
    assert tree.report(70, True, 0.0, 1.0) == (70, 0.0, 1)
    tree.on_child(10, 65, 0.0, 1, 1.0)
    assert tree.report(70, True, 0.0, 1.0)[2] == 1
    tree.on_child(10, 66, 0.0, 0, 1.1)
    assert tree.report(70, True, 0.0, 1.1)[::2] == (66, 0)


def test_a_silent_child_behind_stops_holding_until_it_reports_and_a_layout_drops_the_unlisted():
    tree = Subtree(parent=1)
    tree.lay(1, [10, 11], streaming=False, now=0.0)
    tree.on_child(10, 50, 0.0, 0, 0.0)
    tree.on_child(11, 50, 0.0, 0, 0.0)
    tree.on_child(10, 90, 0.0, 0, 8.0)
    assert tree.expire(90, 9.0, 5.0) == [11]  # behind and silent for 9 s
    assert tree.expire(90, 20.0, 5.0) == []   # (10 is not behind)
    assert tree.report(95, False, 0.0, 20.0)[0] == 90
    assert tree.on_child(11, 60, 0.0, 0, 20.5) is True  # back: it holds the report again
    assert tree.report(95, False, 0.0, 20.5)[0] == 60
    tree.lay(2, [11, 12], streaming=True, now=21.0)
    assert tree.parent == 2 and tree.children() == 2
    assert 10 not in tree.regular and 12 in tree.light  # 12, new: light until it reports
    assert tree.report(95, False, 0.0, 21.0)[0] == 60  # 11 listed still: it holds as it did


# ------------------------------------------------------------------------ on real sockets

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_childs_report_before_the_parents_first_datagram_is_kept():
    """A parent whose I/O thread is behind its child's hears the child's report before any
    datagram of the channel: its place comes from the view, and the report counts once data
    comes (it was ignored, and the parent reported its own position alone)."""
    sender, ids = 1, tuple(range(2, 12))  # 10 receivers: the root's children have children
    order = tree_order(sender, ids)
    child = order[FANIN + 1]
    parent = place(sender, child, order)[0]
    stats: Counter = Counter()
    sent: list = []
    tables = MemberTables(members={m: MemberInfo(m, f"M{m}", "127.0.0.1", 9000 + m)
                                   for m in (sender, *ids)})
    recovery = SimpleNamespace(promotion=SimpleNamespace(light=False), loss_seen_at=0.0,
                               data_seen_at=0.0)
    acks = ChannelAcks(_basics(parent, stats), tables, lambda message, address: sent.append(
        message), recovery)
    acks.groups_changed({("239.1.2.3", 5000): ids})
    channel = group_channel("239.1.2.3", 5000)
    acks.on_group_ack(child, GroupAck(sender, channel, 3, 0, 0, 1))
    acks.note(sender, channel, 1, 5, 5, 0)  # this member's own first datagrams: 1..5
    acks._send(10.0)
    assert stats["acks_ignored"] == 0 and stats["group_acks_in"] == 1
    (report,) = sent
    assert isinstance(report, GroupAck | Ack) and report.dseq == 3  # the child's, not 5


def _basics(member: int, stats: Counter) -> SimpleNamespace:
    """What ChannelAcks takes of a runtime's MemberBasics."""
    return SimpleNamespace(config=RuntimeConfig(), stats=stats, member_id=member,
                           unknown_sender=threading.Event())


def test_a_child_without_its_parents_address_has_it_looked_up_and_then_reports():
    """A group's receivers come from the view as ids; a parent on another host is in no table
    of its child's (its host scope lists its own members). The child asks the control thread to
    look the parent up (the runtime's unknown_sender event, held_senders), and reports once the
    parent is known: before, it never reported, and the sender's window stayed full."""
    sender, ids = 1, tuple(range(2, 6))
    order = tree_order(sender, ids)
    child = order[1]
    parent = place(sender, child, order)[0]
    sent: list = []
    tables = MemberTables(members={m: MemberInfo(m, f"M{m}", "127.0.0.1", 9000 + m)
                                   for m in (sender, child)})  # its host's: not the parent
    basics = _basics(child, Counter())
    recovery = SimpleNamespace(promotion=SimpleNamespace(light=False), loss_seen_at=0.0,
                               data_seen_at=0.0)
    acks = ChannelAcks(basics, tables, lambda message, address: sent.append((message, address)),
                       recovery)
    acks.groups_changed({("239.1.2.3", 5000): ids})
    channel = group_channel("239.1.2.3", 5000)
    acks.note(sender, channel, 1, 5, 5, 0)
    acks._send(10.0)
    assert sent == [] and basics.unknown_sender.is_set() and acks.to_look_up() == {parent}
    tables.members[parent] = MemberInfo(parent, f"M{parent}", "127.0.0.1", 9000 + parent)
    acks.members_changed()
    assert acks.to_look_up() == set()
    acks._send(11.0)
    ((report, address),) = sent
    assert address == ("127.0.0.1", 9000 + parent) and report.dseq == 5


def test_the_sender_hears_the_root_and_its_window_waits_for_a_receiver_two_levels_down():
    key = os.urandom(32)
    config = RuntimeConfig(ack_timeout=600.0)  # (nobody stops holding the window)
    made = [MemberRuntime(i, f"M{i}", key, config) for i in range(1, 14)]
    try:
        pub, subs = made[0], made[1:]
        group = MulticastGroup(f"239.254.{random.randint(1, 254)}.{random.randint(1, 254)}",
                               _free_port())
        ids = tuple(rt.member_id for rt in subs)
        members = [MemberInfo(rt.member_id, rt.name, *rt.address) for rt in made]
        inboxes = {}
        for rt in made:
            rt.call_wait(rt.install_members, members)
            rt.call_wait(rt.install_topics, {TOPIC: "T"})
        for rt in subs:
            rt.call_wait(rt.install_groups, {group.address}, {group.address: ids})
            inboxes[rt.member_id] = Subscription(frozenset([TOPIC]))
            rt.call_wait(rt.add_subscription, inboxes[rt.member_id])
        pub.call_wait(pub.install_routes,
                      {TOPIC: [Route(RoutingLabel(("M1",), ("*",), "M1"), group)]},
                      {group.address: set(ids)})
        order = tree_order(pub.member_id, ids)
        deep = order[FANIN + 1]  # a child of a child of the root
        assert place(pub.member_id, place(pub.member_id, deep, order)[0], order)[0] == order[0]
        got = {m: [] for m in ids}

        def everyone_but(skip: int, n: int):
            def done() -> bool:
                for m, inbox in inboxes.items():
                    if m != skip:
                        got[m].extend(x.seq for x in received(inbox))
                return all(len(got[m]) == n for m in ids if m != skip)
            return done

        def feed() -> dict:
            (f,) = pub.call_wait(pub.snapshot)["feeds"].values()
            return f

        held = threading.Event()
        subs[deep - 2].call(held.wait, 60.0)  # the deep one's I/O thread stands still
        try:
            for seq in range(1, 201):
                pub.publish(TOPIC, 1, seq, 0, b"x" * 1000)
            wait_for(everyone_but(deep, 200), "every other receiver has it all")
            assert feed()["receivers"] == [order[0]]  # the sender waits for the root only ...
            acks = pub.stats["control_in"]
            wait_for(lambda: pub.stats["control_in"] >= acks + 5, "the root reports on")
            assert feed()["in_flight"] > 0  # ... whose report still waits for the deep one
        finally:
            held.set()
        for m in ids:
            assert got[m] == list(range(1, 201)) or m == deep
        wait_for(everyone_but(-1, 200), "the deep receiver takes it all")
        wait_for(lambda: feed()["in_flight"] == 0, "every datagram acknowledged up the tree")
        assert got[deep] == list(range(1, 201))
        # every report reached the sender through the root: it heard no other receiver, and
        # only parents heard reports (other control datagrams, NAKs of the held receiver to a
        # peer that caches, say, may reach anyone)
        assert pub.stats["acks_ignored"] == 0
        assert all(rt.stats["acks_ignored"] == 0 for rt in subs)
        parents = {place(pub.member_id, m, order)[0] for m in ids} - {pub.member_id}
        for rt in subs:
            assert (rt.stats["group_acks_in"] > 0) == (rt.member_id in parents), rt.stats
    finally:
        for rt in made:
            rt.close()
