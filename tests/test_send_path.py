"""The send path on real sockets without a control plane: what it looks up once per topic (the
plan, the subscribers in this process, whether the topic is reliable) follows changes made while
a publisher is publishing."""

from __future__ import annotations

from member_pair import TOPIC, member_pair, received, wait_for

from scopecast.netio.delivery import Subscription


def test_a_subscriber_and_reliability_added_while_publishing_apply_from_the_next_message():
    with member_pair() as (a, _b, inbox):
        a.publish(TOPIC, 1, 1, 0, b"1")
        wait_for(lambda: inbox.queue, "the first message at B")
        local = Subscription(frozenset([TOPIC]))
        a.call_wait(a.add_subscription, local)
        a.publish(TOPIC, 1, 2, 0, b"2")
        wait_for(lambda: local.queue, "the second message at the subscriber in A's process")
        assert [m.seq for m in received(local)] == [2]

        a.call_wait(a.install_recovery, {"token_ring": ("127.0.0.1", 9)}, {TOPIC: "token_ring"})
        a.publish(TOPIC, 1, 3, 0, b"3")
        wait_for(lambda: a.sender.handed >= 3, "the third message sent")
        # reliable now: kept until stable (no agent here, so for good)
        assert a.call_wait(lambda: [e[3] for e in a.own.cache if e is not None]) == [3]
        at_b: list = []
        wait_for(lambda: at_b.extend(received(inbox)) or len(at_b) == 3, "all three at B")
        assert [m.seq for m in at_b] == [1, 2, 3]


class _CountingEvent:
    """An Event stand-in that counts `set` calls."""

    def __init__(self) -> None:
        self.sets = 0

    def set(self) -> None:
        self.sets += 1

    def wait(self, timeout: float) -> bool:
        return False

    def clear(self) -> None:
        pass


def test_a_blocked_publisher_is_woken_once_what_it_waits_for_holds_not_at_every_step():
    """A publisher blocked on a full queue was woken after every I/O step, and a saturating one
    then took the GIL thousands of times a second only to find its queue still full."""
    with member_pair() as (a, _b, _inbox):
        event = a._space = _CountingEvent()
        ready = [False]
        a._waiting_for.append(lambda: ready[0])
        for _ in range(20):  # each runs in a step of the I/O thread, then the step ends
            a.call_wait(lambda: None)
        assert event.sets == 0
        ready[0] = True
        a.call_wait(lambda: None)
        a.call_wait(lambda: None)
        assert event.sets >= 1
        a._waiting_for.clear()


def test_two_sessions_of_one_topic_taken_together_keep_their_own_numbers():
    """Two publishers in A's process on one topic, each its own session, taken by the I/O thread
    in one step: session 1's seq 2 follows session 2's seq 1 in seq and stream seq, yet it is not
    session 2's message. B knows session 1 (`member_pair`): it gets session 1's messages, all."""
    with member_pair() as (a, _b, inbox):
        order = [(1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3)]
        a.call_wait(lambda: [a.publish(TOPIC, session, seq, 0, b"%d.%d" % (session, seq))
                             for session, seq in order])
        at_b: list = []
        wait_for(lambda: at_b.extend(received(inbox)) or len(at_b) == 3, "session 1 at B")
        assert [(m.session, m.seq, m.payload) for m in at_b] == [(1, 1, b"1.1"), (1, 2, b"1.2"),
                                                                  (1, 3, b"1.3")]


def test_a_member_given_its_id_after_it_was_made_takes_its_peers_datagrams_and_its_own_locally():
    """A member's runtime exists before its scope registers it (its socket is its address), so
    its id comes afterwards: every part of it must go by the id it was given, not the 0 it was
    made with (else a peer's datagrams, sent by member 0's id, are taken for its own)."""
    with member_pair(registered=True) as (a, b, inbox):
        assert (a.member_id, b.member_id) == (1, 2)
        local = Subscription(frozenset([TOPIC]))
        a.call_wait(a.add_subscription, local)
        for seq in (1, 2, 3):
            a.publish(TOPIC, 1, seq, 0, b"%d" % seq)
        at_b: list = []
        wait_for(lambda: at_b.extend(received(inbox)) or len(at_b) == 3, "all three at B")
        assert [(m.seq, m.source) for m in at_b] == [(1, "A"), (2, "A"), (3, "A")]
        wait_for(lambda: len(local.queue) > 0, "A's own messages in A's process")
        assert b.stats["own_datagrams"] == 0
