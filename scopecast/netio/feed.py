"""A destination's send queue and its bytes-bounded flow window.

Queued messages are kept as *chunks*: runs of encoded entries that share a routing record and fit
one datagram. The I/O thread appends to the open chunk as messages are taken from publishers (or
forwarded), and the socket pulls whole chunks when the window allows, so the datagram is assembled
only when it can be sent, and the per-message work is one list append.

Receivers acknowledge the highest datagram number they took from this destination's channel; the
window is the bytes sent after the slowest live receiver's acknowledgement. A receiver the control
plane announced holds the window from the moment it is announced; one silent for `ack_timeout`
while data is outstanding stops holding it (it will lose data until recovery exists for it).
"""

from __future__ import annotations

from collections import deque


class Chunk:
    """Entries for one datagram (or one end-of-stream marker, or one message to fragment)."""

    __slots__ = ("record", "table", "parts", "size", "room", "first_own", "end_of_stream",
                 "oversized")

    def __init__(self, record: tuple | None, table: bytes, room: int) -> None:
        self.record = record
        self.table = table            # the encoded one-record routing table
        self.parts: list[bytes] = []  # fixed part, payload, fixed part, payload, ...
        self.size = 0
        self.room = room              # entry bytes that fit one datagram with this table
        self.first_own = 0            # stream seq of the first of this member's own messages
        self.end_of_stream: tuple | None = None
        self.oversized = False        # one entry larger than a datagram: sent as fragments


class Feed:
    """Messages queued for one destination, and that destination's flow window."""

    __slots__ = ("address", "channel", "chunks", "open", "dseq", "sent_bytes", "history",
                 "base_bytes", "acks", "frag")

    def __init__(self, address: tuple[str, int], channel: int) -> None:
        self.address = address
        self.channel = channel
        self.chunks: deque[Chunk] = deque()
        self.open: Chunk | None = None
        self.dseq = 0
        self.sent_bytes = 0
        self.history: deque[tuple[int, int]] = deque()  # (dseq, sent_bytes after it)
        self.base_bytes = 0                              # sent_bytes at the slowest receiver's ack
        self.acks: dict[int, list] = {}                  # member -> [dseq, last heard]
        self.frag = None                                 # (first own seq, fragments) in progress

    # ------------------------------------------------------------------------------- queue

    def pending(self) -> bool:
        return self.frag is not None or self.open is not None or bool(self.chunks)

    def put(self, record: tuple, table: bytes, head: bytes, payload: bytes, sseq: int,
            capacity: int) -> None:
        """Queue one message (its encoded fixed part and its payload) carrying `record`; `sseq` > 0
        marks this member's own messages."""
        c = self.open
        n = len(head) + len(payload)
        if c is None or (c.record is not record and c.record != record) or c.size + n > c.room:
            c = self._start(record, table, capacity, n)
        c.parts.append(head)
        c.parts.append(payload)
        c.size += n
        if sseq and not c.first_own:
            c.first_own = sseq

    def _start(self, record: tuple, table: bytes, capacity: int, n: int) -> Chunk:
        if self.open is not None:
            self.chunks.append(self.open)
        c = Chunk(record, table, capacity - len(table))
        if n > c.room:
            c.oversized = True
            self.chunks.append(c)
            self.open = None
        else:
            self.open = c
        return c

    def put_end_of_stream(self, marker: tuple) -> None:
        if self.open is not None:
            self.chunks.append(self.open)
            self.open = None
        c = Chunk(None, b"", 0)
        c.end_of_stream = marker
        self.chunks.append(c)

    def take(self) -> Chunk:
        """The next chunk to send (the open one last: it keeps filling until it is pulled)."""
        if self.chunks:
            return self.chunks.popleft()
        c, self.open = self.open, None
        return c

    def first_own(self) -> int:
        """Stream seq of the first own message not yet handed to the socket (0: none queued)."""
        if self.frag is not None:
            return self.frag[0]
        for c in self.chunks:
            if c.first_own:
                return c.first_own
        return self.open.first_own if self.open is not None else 0

    def queued_chunks(self) -> int:
        return len(self.chunks) + (self.open is not None)

    # ------------------------------------------------------------------------------ window

    def in_flight(self) -> int:
        return self.sent_bytes - self.base_bytes

    def expect(self, member: int, now: float) -> None:
        """A receiver the control plane says is there: it holds the window from now on."""
        if member not in self.acks:
            self.acks[member] = [self.dseq, now]

    def acknowledge(self, member: int, dseq: int, now: float) -> None:
        entry = self.acks.get(member)
        if entry is None:
            self.acks[member] = [dseq, now]
        else:
            if dseq > entry[0]:
                entry[0] = dseq
            entry[1] = now
        self._advance()

    def _advance(self) -> None:
        low = min((a[0] for a in self.acks.values()), default=self.dseq)
        history = self.history
        while history and history[0][0] <= low:
            self.base_bytes = history.popleft()[1]
        if not self.acks:
            self.base_bytes = self.sent_bytes

    def expire(self, now: float, timeout: float) -> list[int]:
        """Stop waiting for receivers silent for `timeout` while data is outstanding."""
        if self.in_flight() == 0:
            for a in self.acks.values():
                a[1] = now
            return []
        gone = [m for m, a in self.acks.items() if a[0] < self.dseq and now - a[1] > timeout]
        for m in gone:
            del self.acks[m]
        if gone:
            self._advance()
        return gone
