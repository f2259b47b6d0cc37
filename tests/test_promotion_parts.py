"""Light and regular members (thesis 3.2.14) as pure logic: the sender's window, the agents'
stability, the member's promotion and what its application is given meanwhile. The real case (a
joiner stopped with SIGSTOP) is test_light_members."""

from __future__ import annotations

from collections import Counter

from scopecast.agents.ack_tree import AckTree
from scopecast.agents.token_ring import TokenRing
from scopecast.netio.control_messages import Ack, MemberSummary, decode, encode
from scopecast.netio.delay_window import DelayWindow
from scopecast.netio.delivery import Delivery, Subscription
from scopecast.netio.feed import Feed
from scopecast.netio.member_parts import MemberTables
from scopecast.netio.message import Message
from scopecast.netio.promotion import Promotion
from tests.protocol_harness import REC, group, run, summary

KIB = 1 << 10


def _sent(feed: Feed, n: int, now: float) -> None:
    for _ in range(n):
        feed.dseq += 1
        feed.sent_bytes += KIB
        feed.history.append((feed.dseq, feed.sent_bytes, now))


def _feed() -> Feed:
    feed = Feed(("127.0.0.1", 9), 1, DelayWindow(64 * KIB, 0.005))
    feed.set_receivers({1}, 0.0)
    feed.acknowledge(1, 0, 0.0)  # a regular receiver, heard from
    return feed


def test_a_receiver_announced_mid_stream_holds_no_window_until_it_says_it_is_regular():
    feed = _feed()
    _sent(feed, 4, 0.0)
    feed.set_receivers({1, 2}, 0.1, streaming=True)  # 2 joins mid-stream: light until it says
    assert sorted(feed.acks) == [1] and sorted(feed.light) == [2]
    _sent(feed, 4, 0.3)
    feed.acknowledge(1, 8, 0.35)
    assert feed.in_flight() == 0
    assert feed.acknowledge(2, 4, 0.4, light=1)  # light: however far behind, nobody waits
    _sent(feed, 2, 0.6)
    feed.acknowledge(2, 9, 0.7, light=1)
    assert feed.in_flight() == 2 * KIB  # (receiver 1's)
    feed.acknowledge(1, 10, 0.8)
    assert feed.in_flight() == 0
    feed.acknowledge(2, 9, 0.9)  # promoted: it holds the window from now on
    assert sorted(feed.acks) == [1, 2] and not feed.light
    _sent(feed, 2, 0.95)
    feed.acknowledge(1, 12, 0.96)
    assert feed.in_flight() == 2 * KIB
    # a light receiver that goes away is forgotten like any other
    feed.acknowledge(2, 12, 1.0, light=1)
    feed.set_receivers({1}, 1.1, streaming=True)
    assert not feed.light and not feed.acknowledge(2, 12, 1.2, light=1)


def test_a_joiner_stopped_before_its_first_acknowledgement_holds_nothing_and_never_times_out():
    feed = _feed()
    _sent(feed, 1, 0.5)
    feed.acknowledge(1, 1, 0.6)
    feed.set_receivers({1, 2}, 1.0, streaming=True)
    _sent(feed, 3, 1.0)
    feed.acknowledge(1, 4, 1.1)
    assert feed.in_flight() == 0 and sorted(feed.light) == [2]
    assert feed.expire(100.0, 5.0) == []  # not waited for: never timed out
    # one announced before its sender sent anything holds it at once, as a stream's first
    # receivers do
    fresh = Feed(("127.0.0.1", 9), 1, DelayWindow(64 * KIB, 0.005))
    fresh.set_receivers({1, 2}, 0.0)
    _sent(fresh, 2, 0.0)
    fresh.acknowledge(1, 2, 0.1)
    assert sorted(fresh.acks) == [1, 2] and fresh.in_flight() == 2 * KIB


def test_acknowledgements_carry_the_light_flag_on_the_wire():
    for ack in (Ack(3, 99, 12, 1), Ack(3, 99, 12, 0)):
        assert decode(*encode(ack)) == ack
    body = MemberSummary({9: 5}, {}, [], None, light=True).to_wire(1, ("127.0.0.1", 5))
    assert body["light"] is True
    assert "light" not in MemberSummary({9: 5}, {}, [], None).to_wire(1, ("127.0.0.1", 5))


def _stable_with(cls, light: list[bool], acks: list[int]) -> dict:
    """The top's stability of stream 9 over a group whose members report `acks`, each light
    or not."""
    agents = group(cls, len(acks))
    for a, ack, is_light in zip(agents, acks, light, strict=True):
        s = summary({9: ack}, recs={9: REC} if a is agents[0] else None)
        a.on_summary({**s, "light": True} if is_light else s, 0.0)
    run(agents, periods=8)
    return agents[0].down.get(9, [0])[0]


def test_stability_leaves_light_members_out_in_both_built_in_protocols():
    for cls in (TokenRing, AckTree):
        assert _stable_with(cls, [False] * 4, [700, 700, 700, 30]) == 30, cls
        assert _stable_with(cls, [False, False, False, True], [700, 700, 700, 30]) == 700, cls
        # (a light member that has not named the stream at all holds it no more)
        assert _stable_with(cls, [False, False, True, True], [700, 700, 0, 0]) == 700, cls


def test_a_group_of_light_members_is_light_to_the_level_above():
    for cls in (TokenRing, AckTree):
        agents = group(cls, 7, has_upper=True)  # (token_ring: partitions of 5 and 2)
        for a in agents:
            a.on_summary({**summary({9: 50}, recs={9: REC}), "light": True}, 0.0)
        run(agents, periods=8)
        up = agents[0].upward()
        assert up["light"] is True and up["acks"] == {}, cls


def _delivery() -> tuple[Delivery, Subscription, MemberTables]:
    tables = MemberTables(topic_names={3: "T"}, names={9: "src"})
    sub = Subscription({3})
    tables.subscribe(sub)
    return Delivery(1, "m", tables, Counter(), 1 << 20), sub, tables


def _offer(delivery: Delivery, sub: Subscription, seqs, session: int = 1) -> None:
    delivery.offer((sub,), [Message("T", "src", session, s, b"x") for s in seqs], len(seqs))


def test_a_light_members_application_gets_nothing_until_it_is_promoted():
    delivery, sub, _ = _delivery()
    delivery.hold = True
    _offer(delivery, sub, [5, 6, 7])
    delivery.deliver()
    delivery.on_end_of_stream(9, 3, 1, 7)
    assert not sub.queue and not sub.ends  # (the end marker waits with the messages)
    delivery.release()
    assert [m.seq for m in sub.queue[0][0]] == [5, 6, 7]
    assert sub.ends == {("T", "src", 1): 7}


def test_a_light_member_that_starts_a_stream_later_forgets_what_waited_before_the_start():
    delivery, sub, _ = _delivery()
    delivery.hold = True
    _offer(delivery, sub, [5, 6])
    _offer(delivery, sub, [1, 2], session=2)  # another stream: kept
    delivery.forget(3, 9, 1, 40)  # (recorded: done in one pass as the inboxes go out)
    _offer(delivery, sub, [40, 41])
    delivery.release()
    assert [(m.session, m.seq) for m in sub.queue[0][0]] == [(2, 1), (2, 2), (1, 40), (1, 41)]
    assert delivery._stats["light_skipped"] == 2


def _promotion() -> tuple[Promotion, Delivery, Subscription, Counter]:
    delivery, sub, _ = _delivery()
    stats: Counter = Counter()
    return Promotion(stats, delivery), delivery, sub, stats


def test_a_joiner_is_light_until_its_subscription_is_in_place_and_it_caught_up_with_its_streams():
    p, delivery, sub, stats = _promotion()
    p.join(0.0)
    assert p.light and delivery.hold and stats["joined_light"] == 1
    _offer(delivery, sub, [5, 6])
    delivery.deliver()
    p.check(catching_up=False)
    assert p.light and not sub.queue  # its subscription is not in place yet
    p.subscribed(True)  # it takes a reliable topic
    p.check(catching_up=True)  # a stream's start is not known or not reached yet
    assert p.light
    p.check(catching_up=False)
    assert not p.light and stats["promotions"] == 1 and not delivery.hold
    assert [m.seq for m in sub.queue[0][0]] == [5, 6]  # what waited for it, in order
    p.join(1.0)  # regular for good: a later subscription does not make it light again
    assert not p.light


def test_a_subscriber_is_light_until_its_subscription_shows_it_takes_no_reliable_topic():
    p, delivery, _, _ = _promotion()
    assert not p.light  # a publisher only: never light
    p.join(0.0)
    assert p.light and delivery.hold
    p.subscribed(False)
    assert not p.light and not delivery.hold
