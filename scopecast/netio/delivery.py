"""Delivery to the application: one queue of message batches per subscriber.

The I/O thread appends whole batches (one per datagram) and the application pops them, so the hand
over costs one deque operation per datagram, not per message. Byte counters are each written by one
thread only, which is what lets the I/O thread withhold acknowledgements while an application lags.
"""

from __future__ import annotations

import threading
from collections import deque

from scopecast.netio.message import Message

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
                 "consumed_bytes", "inbox", "inbox_bytes", "ends", "marks", "wake")

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
        self.marks: dict[tuple, None] = {}  # (topic, source, session, last seq) of the latest
                                            # MAX_MARKS end markers, in arrival order
        self.wake = False  # queued for a wake-up at the end of the I/O thread's current burst

    def backlog(self) -> int:
        return self.delivered_bytes - self.consumed_bytes

    def end(self, key: tuple[str, str, int], last_seq: int) -> None:
        """A stream's end marker came after message `last_seq` (I/O thread)."""
        self.ends[key] = last_seq
        self.marks[(*key, last_seq)] = None
        if len(self.marks) > MAX_MARKS:
            del self.marks[next(iter(self.marks))]
