"""A destination's flow window in bytes, sized by the queueing delay it causes.

A fixed window of bytes is a fixed queue of *time* only at one rate: 4 MiB in flight is 30 ms at
130 MB/s but 270 ms at 15 MB/s, and a hole found behind such a queue waits as long for its
repair (measured on three hosts at 1% loss: repair p50 160 ms with 4 MiB, 22 ms with 512 KiB).
So the window adapts, as delay-based congestion control does (TCP Vegas, LEDBAT): once per round
trip (when the datagram last sent as the round began is acknowledged by the slowest receiver),
the least round-trip time of the round less the least seen lately is the standing queue; above
`target` the window shrinks in proportion, below it grows by up to a quarter, between a floor and
the configured ceiling.
"""

from __future__ import annotations

from scopecast.timing import TIMING

INF = float("inf")
EPOCH = TIMING.delay_epoch
FLOOR = 128 << 10


class DelayWindow:
    __slots__ = ("size", "floor", "ceiling", "target", "_round_end", "_round_min", "_mins",
                 "_epoch_end")

    def __init__(self, ceiling: int, target: float, floor: int = FLOOR) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.size = ceiling
        self.target = target
        self._round_end = 0
        self._round_min = INF
        self._mins = [INF, INF]  # least round trip of the previous epoch and of this one
        self._epoch_end = 0.0

    def sample(self, acked: int, rtt: float, now: float, sent: int) -> None:
        """The slowest receiver acknowledged datagram `acked`, sent `rtt` seconds ago; `sent` is
        the last datagram sent so far."""
        if rtt < self._round_min:
            self._round_min = rtt
        if now >= self._epoch_end:
            self._mins = [self._mins[1], INF]
            self._epoch_end = now + EPOCH
        if rtt < self._mins[1]:
            self._mins[1] = rtt
        if acked < self._round_end:
            return
        queue = self._round_min - min(self._mins)
        if queue > self.target:
            self.size = max(self.floor, int(self.size * max(0.5, self.target / queue)))
        else:
            self.size = min(self.ceiling, int(self.size * (1.25 - 0.25 * queue / self.target)))
        self._round_end = sent
        self._round_min = INF
