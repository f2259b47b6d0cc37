"""A full send window whose slowest receiver lost everything sent after its last acknowledgement:
that receiver can only repeat the old acknowledgement, so the sender probes (re-announces its last
datagram number) and the window opens again. Without the probe such a window stayed full for good
(a 20% loss test stalled on stability for minutes, in CI)."""

from __future__ import annotations

import time

import pytest
from member_pair import TOPIC, member_pair, received, wait_for

from benchmarks.loss import available, udp_loss
from scopecast.netio.delay_window import DelayWindow
from scopecast.netio.feed import PROBE_AFTER, TAIL_PROBE_AFTER, Feed
from scopecast.netio.runtime import RuntimeConfig

KIB = 1 << 10


class Samples(DelayWindow):
    """A window that records the round trips it is given (pure logic under test: the feed)."""

    def __init__(self) -> None:
        super().__init__(64 * KIB, 0.005)
        self.taken: list[int] = []

    def sample(self, acked: int, rtt: float, now: float, sent: int) -> None:
        self.taken.append(acked)


def _sent(feed: Feed, n: int, size: int, now: float) -> None:
    for _ in range(n):
        feed.dseq += 1
        feed.sent_bytes += size
        feed.history.append((feed.dseq, feed.sent_bytes, now))


def test_only_a_full_window_whose_slowest_receiver_is_quiet_is_probed():
    feed = Feed(("127.0.0.1", 9), 1, Samples())
    feed.set_receivers({1, 2}, 0.0)
    _sent(feed, 2, 16 * KIB, 0.0)
    assert not feed.probe_due(1.0)  # 32 KiB in flight: not full
    _sent(feed, 2, 16 * KIB, 0.0)
    assert not feed.probe_due(PROBE_AFTER / 2)  # full, but not quiet for long
    assert feed.probe_due(PROBE_AFTER)
    assert not feed.probe_due(PROBE_AFTER * 1.5)  # one probe per quiet PROBE_AFTER
    feed.acknowledge(1, 4, PROBE_AFTER * 1.6)  # not the slowest: the window stays full
    assert feed.probe_due(PROBE_AFTER * 2)
    feed.acknowledge(2, 4, PROBE_AFTER * 2.1)
    _sent(feed, 3, 16 * KIB, PROBE_AFTER * 2.1)
    assert not feed.probe_due(PROBE_AFTER * 10)  # open again


def test_an_acknowledgement_a_probe_may_have_caused_is_no_round_trip_sample():
    window = Samples()
    feed = Feed(("127.0.0.1", 9), 1, window)
    feed.set_receivers({1}, 0.0)
    _sent(feed, 5, 16 * KIB, 0.0)
    feed.acknowledge(1, 1, 0.001)
    assert window.taken == [1]
    assert feed.probe_due(1.0)
    feed.acknowledge(1, 5, 1.001)  # 2..5 were re-announced: their ack may answer the probe
    _sent(feed, 1, 16 * KIB, 1.001)
    feed.acknowledge(1, 6, 1.002)
    assert window.taken == [1, 6]


@pytest.mark.skipif(not available(), reason="needs root and iptables")
def test_a_window_full_of_datagrams_its_receiver_lost_opens_again():
    config = RuntimeConfig(window_bytes=64 * KIB, ack_timeout=600.0)  # never "gone": it acks
    with member_pair(config, window=True) as (pub, sub, inbox):
        got: list[int] = []

        def delivered() -> bool:
            got.extend(m.seq for m in received(inbox))
            return bool(got) and got[-1] == seq

        def window_full() -> bool:
            feed = pub.sender._feeds[sub.address]
            return feed.pending() and feed.in_flight() >= feed.window.size

        seq = 0
        for seq in range(1, 11):
            pub.publish(TOPIC, 1, seq, 0, b"x" * 1000)
        wait_for(delivered, "the first messages")
        with udp_loss(1.0):  # every datagram from here on is lost, until the window is full
            while not pub.call_wait(window_full):
                seq += 1
                pub.publish(TOPIC, 1, seq, 0, b"y" * 1000)
        # the receiver heard nothing of what fills the window: it repeats its last ack
        wait_for(delivered, "the messages queued behind the full window")
        assert pub.stats["window_probes"] > 0
        assert got[:10] == list(range(1, 11)) and got == sorted(set(got))
        assert sub.stats["gaps"] > 0  # what was sent into the loss is gone (no recovery here)


def test_a_drained_feed_is_probed_once_when_its_last_datagram_is_not_acknowledged():
    feed = Feed(("127.0.0.1", 9), 1, Samples())
    feed.set_receivers({1}, 0.0)
    _sent(feed, 3, KIB, 0.0)
    assert not feed.tail_probe_due(TAIL_PROBE_AFTER / 2)  # acks are still on their way
    assert feed.tail_probe_due(TAIL_PROBE_AFTER)
    assert not feed.tail_probe_due(TAIL_PROBE_AFTER * 10)  # once per tail
    _sent(feed, 1, KIB, 1.0)
    feed.acknowledge(1, 4, 1.001)
    assert not feed.tail_probe_due(2.0) and not feed.unprobed_tail()  # all acknowledged


def test_a_receiver_that_lost_a_bursts_last_datagram_learns_it_from_the_tail_probe():
    """The datagram after a lost one shows the gap in the channel's numbers; a burst's last
    one has none after it, so the sender probes a drained feed that is not acknowledged: the
    receiver then sees the gap (its evidence of loss for asking for a stream's tail, see
    test_recovery_path), and acknowledges the number the probe announced."""
    config = RuntimeConfig(ack_timeout=600.0)
    with member_pair(config, window=True) as (pub, sub, inbox):
        got: list[int] = []
        for seq in range(1, 11):
            pub.publish(TOPIC, 1, seq, 0, b"x" * 100)
        wait_for(lambda: got.extend(m.seq for m in received(inbox)) or len(got) == 10, "10")
        assert sub.stats["channel_gaps"] == 0  # nothing was lost

        def lose_a_datagram():  # numbered and on its way, as far as the sender knows: never sent
            feed = pub.sender._feeds[sub.address]
            feed.dseq += 1
            feed.sent_bytes += 100
            feed.history.append((feed.dseq, feed.sent_bytes, time.monotonic()))
            pub._tails_open = True
        pub.call_wait(lose_a_datagram)
        wait_for(lambda: sub.stats["channel_gaps"] == 1, "the gap the probe reveals")
        assert pub.stats["tail_probes"] >= 1
        assert sub.recovery.loss_seen_at > 0
        wait_for(lambda: pub.call_wait(lambda: not pub.sender._feeds[sub.address].history),
                 "the probed number acknowledged")
