"""This member's own messages until they are stable: the sender's side of recovery (thesis
3.2.12), a part of the member runtime (see `member_parts`).

Every message of a reliable topic stays in `cache` until stable: the send path keeps it there as
it takes it, the recovery path serves NAKs from it and releases it when the agents say it is
stable. The window is the bytes held there (`RuntimeConfig.stable_window_bytes`): the
application's `publish()` blocks or raises `WindowFull` beyond it, and `stable_sseq` is what
`flush()` waits for. Each topic's unstable tail (in C, `TailTable`) makes the sender's record
that receivers learn of tail losses from."""

from __future__ import annotations

import bisect
import threading
from collections import Counter

from scopecast.netio.control_messages import SenderRecordWire
from scopecast.netio.feed import MESSAGE_COST
from scopecast.netio.native import TailTable
from scopecast.netio.recovery_records import MAX_RECORD_TOPICS
from scopecast.netio.repair_server import entry_sseq
from scopecast.netio.stream_position import KeyDigest

RECORD_SCAN = 4096   # own unstable messages looked at for the record's horizon


class OwnStream:
    """The cache of own unstable messages, their tails per topic, and the window's count."""

    def __init__(self, stats: Counter, space: threading.Event) -> None:
        self._stats = stats
        self._space = space  # set when messages become stable (publishers wait on it)
        self.cache: list[tuple] = []  # own unstable: (sseq, topic, session, seq, ctype, payload)
        self.head = 0                 # ... from here on (what went before is stable)
        # (topic, session) -> [fs, fss, ls, lss] while any of its messages is unstable, else
        # its last seq (compact, in C: a publisher going round thousands of topics moves each
        # between the two states every few messages)
        self.tails = TailTable()
        self.published = KeyDigest()  # own (topic, session) keys sent, all reliable
        self.sent_unreliable = False  # (if not: no stream is dense)
        self._beat = 0                # records made (the sender's heartbeat)
        self.stable_sseq = 0     # everything up to here is stable (read by the app)
        self.released_bytes = 0  # bytes no longer held for the window (read by the app)

    def unstable(self) -> bool:
        return len(self.cache) > self.head

    def release(self, stable: int) -> None:
        """Everything of this member's stream up to `stable` is held by every regular member."""
        if stable <= self.stable_sseq:
            return
        cache, head = self.cache, self.head
        stop = bisect.bisect_right(cache, stable, lo=head, key=entry_sseq)
        freed = self.tails.release(cache, head, stop) + MESSAGE_COST * (stop - head)
        cache[head:stop] = [None] * (stop - head)
        head = stop
        if head > 4096 and head * 2 > len(cache):
            del cache[:head]
            head = 0
        self.head = head
        self.released_bytes += freed
        self.stable_sseq = stable
        self._stats["stable_sseq"] = stable
        self._space.set()

    def record(self, handed: int) -> SenderRecordWire:
        """What is on the wire (`handed`), the unstable runs per topic, a heartbeat, the horizon,
        the keys sent (count, digest): a receiver NAKs a tail only up to the first (what is still
        queued here is not lost, only not sent yet); the heartbeat moves with every record, so
        receivers tell a sender that waits (on its window) from one that is gone; a receiver
        whose stream is not dense acknowledges no further than the horizon (topics it does not
        name may have lost tails there)."""
        self._beat += 1
        named, horizon = self.tails.record(self.cache, self.head, handed, RECORD_SCAN,
                                           MAX_RECORD_TOPICS)
        keys = (0, 0) if self.sent_unreliable else (self.published.count, self.published.digest)
        return SenderRecordWire(handed, named, self._beat, horizon, *keys)
