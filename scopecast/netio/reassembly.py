"""Reassembly of fragmented messages with bounded memory and timeouts.

Fragments are untrusted: a message larger than `max_message`, fragment fields that disagree, or a
message whose buffer would exceed the memory budget is refused with a reason; incomplete messages
expire after `timeout` seconds. Callers count the reasons."""

from __future__ import annotations

import time
from collections import OrderedDict

from scopecast.netio.wire import Fragment, WireMessage


class ReassemblyError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Partial:
    __slots__ = ("buf", "total", "count", "chunk", "have", "received", "deadline", "first")

    def __init__(self, total: int, count: int, chunk: int, deadline: float) -> None:
        self.buf = bytearray(total)
        self.total, self.count, self.chunk = total, count, chunk
        self.have = bytearray(count)
        self.received = 0
        self.deadline = deadline
        self.first: WireMessage | None = None


class Reassembler:
    def __init__(self, max_message: int = 16 << 20, budget_bytes: int = 64 << 20,
                 timeout: float = 10.0, clock=time.monotonic) -> None:
        self.max_message = max_message
        self.budget_bytes = budget_bytes
        self.timeout = timeout
        self._clock = clock
        self._partials: OrderedDict[tuple, _Partial] = OrderedDict()
        self.bytes_held = 0
        self._expired_unreported = 0

    def __len__(self) -> int:
        return len(self._partials)

    def add(self, sender: int, frag: Fragment) -> WireMessage | None:
        """Add one fragment; return the whole message once every fragment has arrived."""
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
        part = self._partials.get(key)
        if part is None:
            self._expired_unreported += self.expire()
            if self.bytes_held + total > self.budget_bytes:
                raise ReassemblyError("reassembly_budget")
            part = _Partial(total, count, chunk, self._clock() + self.timeout)
            self._partials[key] = part
            self.bytes_held += total
        elif (part.total, part.count, part.chunk) != (total, count, chunk):
            raise ReassemblyError("bad_fragment")
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
        del self._partials[key]
        self.bytes_held -= total
        m = part.first
        return WireMessage(m.topic_id, m.source, m.session, m.seq, m.stream, m.stream_seq,
                           m.content_type, m.route, bytes(part.buf))

    def expire(self) -> int:
        """Drop partial messages past their deadline; return how many (each reported once)."""
        now = self._clock()
        dropped, self._expired_unreported = self._expired_unreported, 0
        while self._partials:
            key, part = next(iter(self._partials.items()))
            if part.deadline > now:
                break
            del self._partials[key]
            self.bytes_held -= part.total
            dropped += 1
        return dropped
