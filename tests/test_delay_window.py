"""Unit tests of the send window's delay control (scopecast/netio/delay_window.py): a window
that only ever fills a queue stays at its ceiling; one whose round trips grow by more than the
target beyond the least shrinks towards the floor, and grows back once the queue drains."""

from __future__ import annotations

from scopecast.netio.delay_window import EPOCH, DelayWindow

MIB = 1 << 20


class Link:
    """Acks to a window: `per_round` datagrams in flight, each acknowledged `rtt` after it was
    sent, the clock moving on by a round trip per round."""

    def __init__(self, window: DelayWindow, per_round: int = 10) -> None:
        self.window, self.per_round = window, per_round
        self.now = 0.0
        self.dseq = 0

    def rounds(self, rtts: list[float]) -> None:
        for rtt in rtts:
            for _ in range(self.per_round):
                self.dseq += 1
                self.now += rtt / self.per_round
                self.window.sample(self.dseq, rtt, self.now, self.dseq + self.per_round)


def test_no_standing_queue_keeps_the_ceiling():
    w = DelayWindow(4 * MIB, 0.005)
    Link(w).rounds([0.001] * 50)
    assert w.size == 4 * MIB


def test_a_standing_queue_shrinks_the_window_to_the_floor_and_a_drained_one_grows_it_back():
    w = DelayWindow(4 * MIB, 0.005, floor=128 << 10)
    link = Link(w)
    link.rounds([0.001] * 5)  # the least round trip: 1 ms
    link.rounds([0.2] * 20)  # 200 ms of queue: far beyond 5 ms
    assert w.size == 128 << 10
    link.rounds([0.0015] * 40)  # drained (0.5 ms above the least): back up
    assert w.size == 4 * MIB


def test_the_shrink_is_in_proportion_to_the_queue_and_at_most_a_half_per_round():
    w = DelayWindow(4 * MIB, 0.005)
    link = Link(w)
    link.rounds([0.001] * 3)
    link.rounds([0.011] * 2)  # a round of 10 ms of queue, twice the target: halved once
    assert w.size == 2 * MIB
    link.rounds([0.0085])  # 7.5 ms: to two thirds
    assert w.size == int(2 * MIB * 0.005 / 0.0075)


def test_the_least_round_trip_is_forgotten_after_two_epochs():
    """A route that became slower for good (a longer path) is not a queue for ever."""
    w = DelayWindow(4 * MIB, 0.005)
    link = Link(w)
    link.rounds([0.001] * 3)
    link.rounds([0.05] * 5)
    assert w.size < MIB
    link.rounds([0.05] * int(3 * EPOCH / 0.05))
    assert w.size == 4 * MIB
