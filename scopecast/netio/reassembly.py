"""Reassembly of fragmented messages with bounded memory and timeouts.

Fragments are untrusted: a message larger than `max_message`, fragment fields that disagree, or a
message whose buffer would exceed the memory budget is refused with a reason; incomplete messages
expire after `timeout` seconds. Callers count the reasons.

One message may arrive cut two ways: the data path cuts it to fit its channel's routing table, a
repair to fit the repair table. Each cut is assembled on its own (a *variant*, keyed by its chunk
size); the first variant to complete yields the message and ends the others, so a repair completes
a message whose original fragments were lost."""

from __future__ import annotations

import time
from collections import OrderedDict

from scopecast.netio.wire import Fragment, WireMessage


class ReassemblyError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Partial:
    __slots__ = ("buf", "total", "count", "have", "received", "first")

    def __init__(self, total: int, count: int) -> None:
        self.buf = bytearray(total)
        self.total, self.count = total, count
        self.have = bytearray(count)
        self.received = 0
        self.first: WireMessage | None = None


class _Message:
    """The variants of one message being assembled, and when they expire."""

    __slots__ = ("variants", "deadline", "total")

    def __init__(self, total: int, deadline: float) -> None:
        self.variants: dict[int, _Partial] = {}  # by chunk size
        self.deadline = deadline
        self.total = total


class Reassembler:
    def __init__(self, max_message: int = 16 << 20, budget_bytes: int = 64 << 20,
                 timeout: float = 10.0, clock=time.monotonic) -> None:
        self.max_message = max_message
        self.budget_bytes = budget_bytes
        self.timeout = timeout
        self._clock = clock
        self._messages: OrderedDict[tuple, _Message] = OrderedDict()
        self.bytes_held = 0
        self._expired_unreported = 0

    def __len__(self) -> int:
        return len(self._messages)

    def add(self, sender: int, frag: Fragment) -> WireMessage | None:
        """Add one fragment; return the whole message once every fragment of one cut arrived."""
        msg = frag.message
        total, index, count, chunk = frag.total, frag.index, frag.count, frag.chunk
        if total > self.max_message:
            raise ReassemblyError("oversized")
        if chunk <= 0 or count != max(1, -(-total // chunk)) or not 0 <= index < count:
            raise ReassemblyError("bad_fragment")
        expected = min(chunk, total - index * chunk)
        if len(msg.payload) != expected:
            raise ReassemblyError("bad_fragment")
        key = (sender, msg.source, msg.stream, msg.stream_seq)
        whole = self._messages.get(key)
        if whole is None:
            expired = self.expire()
            self._expired_unreported += expired
            whole = _Message(total, self._clock() + self.timeout)
        elif whole.total != total:
            raise ReassemblyError("bad_fragment")
        part = whole.variants.get(chunk)
        if part is None:
            if self.bytes_held + total > self.budget_bytes:
                raise ReassemblyError("reassembly_budget")
            part = whole.variants[chunk] = _Partial(total, count)
            self._messages[key] = whole
            self.bytes_held += total
        if part.have[index]:
            return None  # duplicate fragment
        part.have[index] = 1
        part.received += 1
        start = index * chunk
        part.buf[start:start + expected] = msg.payload
        if part.first is None:
            part.first = msg
        if part.received < count:
            return None
        del self._messages[key]
        self.bytes_held -= total * len(whole.variants)
        m = part.first
        return WireMessage(m.topic_id, m.source, m.session, m.seq, m.stream, m.stream_seq,
                           m.content_type, m.route, bytes(part.buf))

    def expire(self) -> int:
        """Drop messages past their deadline; return how many (each reported once)."""
        now = self._clock()
        dropped, self._expired_unreported = self._expired_unreported, 0
        while self._messages:
            key, whole = next(iter(self._messages.items()))
            if whole.deadline > now:
                break
            del self._messages[key]
            self.bytes_held -= whole.total * len(whole.variants)
            dropped += 1
        return dropped
