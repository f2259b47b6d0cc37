"""Light and regular members (thesis 3.2.14), a part of the member runtime (see `member_parts`).

A member is *light* from its first subscription (before any datagram of a channel to it can
come) and joins its recovery domains so:

- its acknowledgements say so, and a sender's window does not wait for a light receiver
  (`feed.Feed`);
- its summaries say so, and its agents leave it out of stability (the built-in protocols count
  only regular members: `agents.token_ring`, `agents.ack_tree`);
- nothing is delivered to its application yet (`Delivery.hold`).

A member whose subscription gives it no reliable topic has nothing to catch up with: it is
regular once the subscription is in place. Otherwise it is promoted once it has caught up: it knows where
each stream starts for it and
holds everything from there to its join point (`joins`), every agent of its has answered since it
joined, it holds everything already stable, and what is stable has since reached what it held
then (the regular members are where it is). From then on it counts, and its application gets
what it took. A light member that falls behind what becomes stable (stopped, or too slow) starts
those streams later instead, past what the others let go: what it gives its application never
has a gap (`light_skipped` counts the messages it started past)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from scopecast.netio.delivery import Delivery
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

LIGHT_PERIOD = TIMING.light_period
REPLY_WAIT = TIMING.light_reply_wait


class Promotion:
    """Whether this member is light, and when it turns regular (see module docstring)."""

    def __init__(self, stats: Counter, delivery: Delivery) -> None:
        self._stats, self._delivery = stats, delivery
        self.light = False
        self._joined = False
        self._since = 0.0                     # when it turned light
        self._target: dict[int, int] | None = None  # what it held when it had caught up

    def join(self, now: float) -> None:
        """The member subscribes: light, the first time."""
        if not self._joined:
            self._joined = self.light = True
            self._since = now
            self._delivery.hold = True
            self._stats["joined_light"] += 1

    def subscribed(self, takes_reliable: bool) -> None:
        """Its subscription is in place (the tables its scope sent since are installed): one
        that gives it no reliable topic to take leaves it nothing to catch up with."""
        if self.light and not takes_reliable:
            self._stats["promotions"] += 1
            self.promote()

    def check(self, now: float, acks: dict[int, int], stable_of: Callable[[int], int | None],
              catching_up: bool, replied_at: Iterable[float]) -> None:
        """Every report: `acks` are how far this member holds each peer's stream, `stable_of`
        how far a stream is stable (None: no agent knows it yet), `catching_up` whether some
        stream's start is not known or not reached yet (`Joins.light`), `replied_at` when each
        of its agents last answered."""
        if not self.light or catching_up:
            return
        if now - self._since < REPLY_WAIT and any(at < self._since for at in replied_at):
            return
        stable = {s: st for s in acks if (st := stable_of(s)) is not None}
        if any(acks[s] < st for s, st in stable.items()):
            self._target = None  # behind what is stable: the start moves past it first
            return
        if self._target is None:
            self._target = dict(acks)
            return
        if any(stable.get(s, p) < p for s, p in self._target.items() if s in acks):
            return
        self._stats["promotions"] += 1
        log.info("caught up after %.2fs: regular now", now - self._since)
        self.promote()

    def promote(self) -> None:
        """Regular from now on (what waited for it is delivered)."""
        self._joined, self.light, self._target = True, False, None
        self._delivery.release()
