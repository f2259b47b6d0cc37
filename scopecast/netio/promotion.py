"""Light and regular members (thesis 3.2.14), a part of the member runtime (see `member_parts`).

A member is *light* from its first subscription (before any datagram of a channel to it can
come) until it has caught up, and meanwhile:

- its acknowledgements say so: a sender's window does not wait for a light receiver, nor for one
  its scope added mid-stream until that one says it is regular (`feed.Feed`);
- its summaries say so: its agents leave it out of stability (the built-in protocols count only
  regular members: `agents.token_ring`, `agents.ack_tree`);
- nothing is delivered to its application yet (`Delivery.hold`).

A member whose subscription gives it no reliable topic has nothing to catch up with: it is
regular once the subscription is in place. Otherwise it is promoted at its first report after
that in which it is not catching up with a stream it met mid-way (`Joins.light`: it knows where
each stream it met starts for it and holds everything from there up to its join point). A member
that subscribed before a stream began is regular before the stream's first message; a joiner, a
round trip or two after its first datagrams (or, with `history="cached"`, once it has replayed
what it started from). A light member that falls behind what becomes stable meanwhile (stopped
at once, or too slow) starts those streams later instead, past what the others let go: what it
gives its application never has a gap (`light_skipped` counts the messages it started past)."""

from __future__ import annotations

import logging
import time
from collections import Counter

from scopecast.netio.delivery import Delivery
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

LIGHT_PERIOD = TIMING.light_period


class Promotion:
    """Whether this member is light, and when it turns regular (see module docstring)."""

    def __init__(self, stats: Counter, delivery: Delivery) -> None:
        self._stats, self._delivery = stats, delivery
        self.light = False
        self._joined = False
        self._since = 0.0     # when it turned light
        self._placed = False  # its subscription is in place

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
        if self.light:
            self._placed = True
            if not takes_reliable:
                self._promote()

    def check(self, catching_up: bool) -> None:
        """Every report: `catching_up`, whether some stream it met mid-way has a start not
        known or not reached yet (`Joins.light`)."""
        if self.light and self._placed and not catching_up:
            self._promote()

    def _promote(self) -> None:
        """Regular from now on (what waited for it is delivered)."""
        self.light = False
        self._stats["promotions"] += 1
        log.info("caught up after %.3fs: regular now", time.monotonic() - self._since)
        self._delivery.release()
