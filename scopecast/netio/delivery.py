"""Delivery to the application: one queue of message batches per subscriber.

The I/O thread appends whole batches (one per datagram) and the application pops them, so the hand
over costs one deque operation per datagram, not per message. Byte counters are each written by one
thread only, which is what lets the I/O thread withhold acknowledgements while an application lags.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import TYPE_CHECKING

from scopecast.netio.message import Message

if TYPE_CHECKING:
    from scopecast.netio.member_parts import MemberTables

MAX_MARKS = 4096  # end markers a subscription remembers (see Subscriber.ended)


class Wakeup(threading.Event):
    """What a waiting receiver sleeps on. A receiver in an asyncio event loop cannot sleep on it:
    it sets `notify` (called from the I/O thread, so it must only schedule work on its loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.notify = None

    def set(self) -> None:
        super().set()
        notify = self.notify
        if notify is not None:
            notify()


class Subscription:
    """The delivery queue of one subscriber: batches appended by the I/O thread, read by the app."""

    __slots__ = ("topics", "patterns", "queue", "event", "waiting", "delivered_bytes",
                 "consumed_bytes", "inbox", "inbox_bytes", "ends", "marks", "_marked", "wake")

    def __init__(self, topics: frozenset[int] | set[int], patterns: tuple = ()) -> None:
        self.topics = set(topics)   # grows as topics matching `patterns` appear (I/O thread)
        self.patterns = patterns    # compiled topic patterns (`scopes.topics.topic_matcher`)
        self.queue: deque[tuple[list[Message], int]] = deque()
        self.event = Wakeup()
        self.waiting = False
        self.delivered_bytes = 0  # written by the I/O thread only
        self.consumed_bytes = 0   # written by the application thread only
        self.inbox: list[Message] = []
        self.inbox_bytes = 0
        self.ends: dict[tuple[str, str, int], int] = {}
        self.marks: set[tuple] = set()  # (topic, source, session, last seq) of the latest
        self._marked: deque[tuple] = deque()  # MAX_MARKS end markers; and them in arrival order
        self.wake = False  # queued for a wake-up at the end of the I/O thread's current burst

    def backlog(self) -> int:
        return self.delivered_bytes - self.consumed_bytes

    def end(self, key: tuple[str, str, int], last_seq: int) -> None:
        """A stream's end marker came after message `last_seq` (I/O thread)."""
        self.ends[key] = last_seq
        mark = (*key, last_seq)
        if mark not in self.marks:  # (a deque, not a dict's first key: deleting a dict's first
            self.marks.add(mark)    # keys one by one makes finding the next one ever slower)
            self._marked.append(mark)
            if len(self._marked) > MAX_MARKS:
                self.marks.discard(self._marked.popleft())


class Delivery:
    """The I/O thread's side of delivery, a part of the member runtime (see `member_parts`):
    messages taken are offered to their subscribers' inboxes, each inbox is handed to its
    application as one batch per receive call (`deliver`), and waiting applications are woken
    once per drained burst (`wake_subscribers`)."""

    def __init__(self, member_id: int, name: str, tables: MemberTables, stats: Counter,
                 max_backlog_bytes: int) -> None:
        self.member_id, self._name = member_id, name  # (the runtime sets the id it registers)
        self._tables = tables
        self._stats = stats
        self._cap = 2 * max_backlog_bytes  # see deliver
        self.touched: list[Subscription] = []  # subscribers with messages in their inbox
        self.to_wake: list[Subscription] = []
        self.hold = False  # a light member: inboxes wait for its promotion (`promotion`)
        self._held_ends: list[tuple[int, int, int, int]] = []  # end markers that wait with them
        self._forgotten: dict[tuple, int] = {}  # (topic, source, session) -> its start (forget)

    def offer(self, subs: tuple[Subscription, ...], msgs: list[Message], nbytes: int) -> None:
        """Put messages in the inboxes of `subs`; `deliver` hands the inboxes over."""
        for sub in subs:
            if not sub.inbox:
                self.touched.append(sub)
            sub.inbox.extend(msgs)
            sub.inbox_bytes += nbytes

    def deliver(self) -> None:
        """Hand every filled inbox to its application as one batch."""
        if not self.touched or self.hold:
            return
        if self._forgotten:
            self._forget_before_starts()
        touched, self.touched = self.touched, []
        cap = self._cap
        for sub in touched:
            batch, nbytes = sub.inbox, sub.inbox_bytes
            sub.inbox = []
            sub.inbox_bytes = 0
            if sub.backlog() > cap:
                # memory stays bounded whatever the application does: a member that lags this far
                # already holds its senders back (acknowledgements withheld), so only a client,
                # whom nobody waits for, gets here; it misses these messages (a gap in its seqs)
                self._stats["delivery_overflow"] += len(batch)
                continue
            sub.delivered_bytes += nbytes
            self._stats["delivered"] += len(batch)
            sub.queue.append((batch, nbytes))
            self._wake_later(sub)

    def on_end_of_stream(self, source: int, topic: int, session: int, last_seq: int) -> None:
        """`source`'s stream of `topic` ended after `last_seq`: what came before goes to the
        applications first, so one that finds its queue empty and the marker there has it all."""
        if self.hold:
            self._held_ends.append((source, topic, session, last_seq))
            return
        self.deliver()
        tables = self._tables
        name = self._name if source == self.member_id else tables.names.get(source) or str(source)
        for sub in tables.subs.get(topic, ()):
            sub.end((tables.topic_names.get(topic, str(topic)), name, session), last_seq)
            self._wake_later(sub)

    def release(self) -> None:
        """The member was promoted: what its inboxes and end markers held goes out."""
        self.hold = False
        self.deliver()
        ends, self._held_ends = self._held_ends, []
        for end in ends:
            self.on_end_of_stream(*end)

    def forget(self, topic_id: int, source_id: int, session: int, start: int) -> None:
        """A light member starts a stream later, at `start`: the messages of it before that
        which wait in the inboxes are not delivered (counted as `light_skipped`). Recorded, and
        done in one pass when the inboxes go out: a pass over every inbox a stream was quadratic
        in the topics of a light member (100,000 streams started at once)."""
        tables = self._tables
        key = (tables.topic_names.get(topic_id) or str(topic_id),
               tables.names.get(source_id) or str(source_id), session)
        self._forgotten[key] = max(start, self._forgotten.get(key, start))

    def _forget_before_starts(self) -> None:
        forgotten, self._forgotten = self._forgotten, {}
        gone = 0
        for sub in self.touched:
            kept = [m for m in sub.inbox
                    if m.seq >= forgotten.get((m.topic, m.source, m.session), 0)]
            if len(kept) < len(sub.inbox):
                gone += len(sub.inbox) - len(kept)
                sub.inbox = kept
                sub.inbox_bytes = sum(len(m.payload) for m in kept)
        self.touched = [sub for sub in self.touched if sub.inbox]
        self._stats["light_skipped"] += gone

    def _wake_later(self, sub: Subscription) -> None:
        if sub.waiting and not sub.wake:
            sub.wake = True
            self.to_wake.append(sub)

    def wake_subscribers(self) -> None:
        """Wake waiting applications once per drained burst, not once per datagram (or per end
        marker: the markers of thousands of topics closed together come in a few datagrams)."""
        for sub in self.to_wake:
            sub.wake = False
            sub.event.set()
        self.to_wake.clear()
