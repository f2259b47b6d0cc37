"""Replayed control datagrams refused: every control datagram (token, NAK, ack and the other
control messages) carries its sender's epoch and a counter in the header's datagram-number field,
and its send time in the stamp field; a receiver refuses one that is older than it has seen from
that sender, or too old by the clock.

An authenticated datagram recorded off the network is still authentic later: replayed, an old ack
or token would speak for a state that has moved on, and a NAK would make a sender repair again.
Data datagrams need nothing of this (their sequence numbers make a replay a duplicate). So:

* `ControlNumbers` numbers a sender's control datagrams: the 64-bit datagram number is the
  sender's epoch (its start, in wall-clock seconds, 32 bits) then a 32-bit counter; a counter that
  would wrap starts the next epoch.
* `ReplayGuard` keeps, per sender id, the newest epoch and the counters seen in a window of
  WINDOW below the highest (as IPsec's and WireGuard's anti-replay windows: a datagram out of
  order must still pass once). The window is wide because a member reads its sockets (its
  unicast port, each group) a batch at a time in turn: one sender's datagrams to two of them
  arrive far out of order when the member is busy, and a 64-counter window refused fresh ones.
  Refused and counted: an older epoch (`stale_epoch`), a counter seen already or below the
  window (`replayed`), and a datagram whose stamp is more than
  `max_age` seconds from the receiver's clock either way (`stale_control`: the sender state a
  receiver forgets after `idle` seconds without one is then no opening for old recordings). A
  sender's state is forgotten after `idle` seconds, and the oldest beyond `limit` senders.

Clocks: the age check needs the hosts' wall clocks within `max_age` of each other (NTP does far
better); a clock stepped back by more than that stalls a sender's control traffic until it has
caught up. Member ids are never reused, so a restarted process never meets its own old epoch."""

from __future__ import annotations

import time

from scopecast.netio import wire

WINDOW = 2048
EPOCH_SHIFT = 32
COUNTER_MASK = (1 << EPOCH_SHIFT) - 1
HALF_WRAP = wire.STAMP_WRAP >> 1


class ControlNumbers:
    """The datagram numbers of one sender's control datagrams."""

    __slots__ = ("epoch", "counter")

    def __init__(self, epoch: int | None = None) -> None:
        self.epoch = (int(time.time()) if epoch is None else epoch) & COUNTER_MASK
        self.counter = 0

    def next(self) -> int:
        self.counter += 1
        if self.counter > COUNTER_MASK:
            self.epoch = (self.epoch + 1) & COUNTER_MASK
            self.counter = 1
        return self.epoch << EPOCH_SHIFT | self.counter


class ReplayGuard:
    """Admits each control datagram of a sender once, and none that is stale."""

    def __init__(self, max_age: float = 30.0, idle: float = 60.0, limit: int = 65536) -> None:
        self._max_age_us = int(max_age * 1e6)
        self._idle = idle
        self._limit = limit
        # sender -> [epoch, highest counter, bitmap of the WINDOW counters below it, last seen]
        self._senders: dict[int, list] = {}
        self._next_expiry = 0.0

    def admit(self, sender: int, dseq: int, stamp: int, now_stamp: int, now: float) -> str | None:
        """None if the datagram passes (and is remembered); else the reason it is refused."""
        age = (now_stamp - stamp) % wire.STAMP_WRAP
        if age >= HALF_WRAP:
            age -= wire.STAMP_WRAP  # (a stamp ahead of this clock: the other side of the wrap)
        if not stamp or abs(age) > self._max_age_us:
            return "stale_control"
        epoch, counter = dseq >> EPOCH_SHIFT, dseq & COUNTER_MASK
        state = self._senders.get(sender)
        if state is None or _newer(epoch, state[0]):
            if state is None and len(self._senders) >= self._limit:
                self._forget_oldest()
            self._senders[sender] = [epoch, counter, 0, now]
            return None
        if epoch != state[0]:
            return "stale_epoch"
        highest = state[1]
        if counter > highest:
            shift = counter - highest
            state[2] = ((state[2] << shift) | (1 << (shift - 1))) & ((1 << WINDOW) - 1) \
                if shift <= WINDOW else 0
            state[1] = counter
        else:
            back = highest - counter  # 0: the highest itself
            if back == 0 or back > WINDOW or state[2] >> (back - 1) & 1:
                return "replayed"
            state[2] |= 1 << (back - 1)
        state[3] = now
        return None

    def expire(self, now: float) -> None:
        """Forget senders not heard from for `idle` seconds (housekeeping; callers may call it
        every tick, the scan runs at most once a second)."""
        if now < self._next_expiry:
            return
        self._next_expiry = now + 1.0
        gone = [s for s, st in self._senders.items() if now - st[3] > self._idle]
        for s in gone:
            del self._senders[s]

    def _forget_oldest(self) -> None:
        oldest = min(self._senders, key=lambda s: self._senders[s][3])
        del self._senders[oldest]

    def __len__(self) -> int:
        return len(self._senders)


def _newer(a: int, b: int) -> bool:
    """Epoch `a` after `b`, in 32-bit serial-number arithmetic (RFC 1982)."""
    return a != b and (a - b) & COUNTER_MASK < (1 << (EPOCH_SHIFT - 1))
