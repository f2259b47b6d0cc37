"""The reorder buffer, a part of the member runtime (see `member_parts`): runs that come ahead of
their predecessors (channels replicated modulo n, a path changed by a re-layout, a datagram lost)
wait here, within `reorder_bytes`, until the runs before them come (a repair) or are given up on.
On a reliable topic a run held opens a hole that recovery NAKs at once; on another topic what is
missing is given up after `reorder_timeout`."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable
from operator import itemgetter
from typing import NamedTuple

from scopecast.netio.delivery import Delivery
from scopecast.netio.joins import Joins
from scopecast.netio.key_table import KeyTable
from scopecast.netio.member_parts import Recovering
from scopecast.netio.wire import WireRun

_first = itemgetter(0)  # (an EarlyRun's first seq: its bisect key)


class EarlyRun(NamedTuple):
    """A run held because it came ahead of its predecessors."""
    first: int      # its first seq (the list of a key's held runs is ordered by it)
    at: float       # when it came (time.monotonic())
    data: bytes     # the datagram it is in
    routes: list    # the datagram's routing table
    run: WireRun


class ReorderBuffer:
    """Runs held per (topic, source, session) until they are next in order."""

    def __init__(self, config, stats: Counter, drops: Counter, next_seq: KeyTable,
                 take_run: Callable, recovery: Recovering, joins: Joins,
                 delivery: Delivery) -> None:
        """`next_seq` and `take_run` are the receive path's: where each stream stands, and how
        a run next in order is taken."""
        self._config, self._stats, self._drops = config, stats, drops
        self._next_seq, self._take_run = next_seq, take_run
        self._recovery, self._joins, self._delivery = recovery, joins, delivery
        self.held: dict[tuple, list[EarlyRun]] = {}  # (topic, source, session) -> in order
        self.bytes = 0
        self.releasing = False  # taking held runs now (a run taken then does not release more)

    def hold(self, key: tuple, data: bytes, routes: list, run: WireRun) -> bool:
        """Keep a run that arrived ahead of its predecessors (channels replicated modulo n, or a
        path changed by a re-layout) until they come, within a byte budget; False when full."""
        size, first = sum(run.lengths), run.first
        recovery = self._recovery
        reliable = key[0] in recovery.reliable
        if self.bytes + size > self._config.reorder_bytes:
            if reliable:
                self._drops["reorder_full"] += len(run.lengths)  # not acknowledged: NAKed later
                recovery.loss_seen_at = time.monotonic()  # (a tail dropped here shows no other gap)
                return True
            if key in self.held:  # out of room: what is held goes first, with its gaps
                self.release(key, give_up=True)
            return False
        held = self.held.setdefault(key, [])
        # (runs mostly come in order: found from the end, so thousands held stay cheap)
        at = len(held) if not held or held[-1].first < first \
            else bisect.bisect(held, first, key=_first)
        if reliable:  # a new hole ends just before this run: when did it open
            before = held[at - 1] if at else None
            if before is None or before.first + len(before.run.lengths) != first:
                recovery.gap_at.setdefault(key, []).append((first - 1, time.monotonic()))
                recovery.hole_opened = True
        held.insert(at, EarlyRun(first, time.monotonic(), data, routes, run))
        if reliable:  # taken, for the stream position (held till delivered)
            recovery.positions.mark(key[1], run.first_sseq, run.first_sseq + len(run.lengths) - 1)
        self.bytes += size
        self._stats["held_early"] += 1
        return True

    def release(self, key: tuple, give_up: bool = False) -> None:
        """Take the held runs of `key` that are now next in order (all of them if `give_up`:
        the runs missing before them are not coming, which is counted as a gap)."""
        held = self.held.get(key)
        if not held:
            return
        taken = 0
        self.releasing = True
        try:
            for early in held:
                expected = self._next_seq.get(key)
                if expected is None or early.first > expected:
                    if not give_up:
                        break
                    if expected is not None:  # else it is where this member joined the stream
                        self._stats["gaps"] += 1
                    self._next_seq[key] = early.first
                taken += 1
                self.bytes -= sum(early.run.lengths)
                self._take_run(early.data, early.routes, *early.run)
                if key in self._recovery.gap_at:
                    self._recovery.note_filled(key, give_up)
        finally:
            self.releasing = False
            del held[:taken]  # (at once: one pop per run made long releases quadratic)
            if not held:
                del self.held[key]

    def expire(self, now: float) -> None:
        """Give up waiting for what is missing before held runs — on reliable topics only where
        the member joins the stream and neither a record nor its sender said where it starts
        (`join_timeout`): it starts at the first run it holds, and NAKs the holes after it."""
        for key in [k for k, held in self.held.items() if self._given_up(k, held, now)]:
            if key[0] in self._recovery.reliable:
                self._next_seq[key] = self.held[key][0].first
                self._stats["started_unasked"] += 1
                self.release(key)
            else:
                self.release(key, give_up=True)
        self._delivery.deliver()

    def _given_up(self, key: tuple, held: list, now: float) -> bool:
        age = now - min(h.at for h in held)
        if key[0] not in self._recovery.reliable:
            return age > self._config.reorder_timeout
        return key not in self._next_seq and not self._joins.pending(key) \
            and age > self._config.join_timeout
