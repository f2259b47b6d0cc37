"""A destination's send queue and its bytes-bounded flow window.

Queued messages are kept as *chunks*: what fits one datagram under one routing record, as runs of
consecutive messages (see `wire`). The I/O thread extends the open chunk's last run as messages are
taken from publishers (or forwarded), and the socket pulls whole chunks when the window allows, so a
datagram is assembled only when it can be sent, and a message costs one list append.

Receivers acknowledge the highest datagram number they took from this destination's channel; the
bytes in flight are those sent after the slowest live receiver's acknowledgement, and the window
they may fill adapts to the queueing delay they cause (`delay_window`). A receiver the control
plane announced before its sender sent anything holds the window from the moment it is announced;
one announced later (a joiner) only from its first acknowledgement that says it is regular: a
*light* receiver (a joiner not caught up yet: see `promotion`) holds none. One silent for
`ack_timeout` while data is outstanding stops holding it (recovery repairs what it loses).

A receiver that lost every datagram sent after its last acknowledgement would repeat that
acknowledgement for ever, and a full window would never open: so a full window whose slowest
receiver has not moved for `PROBE_AFTER` is probed (the sender re-announces its last datagram
number; recovery repairs what was lost), as Aeron's heartbeats and TCP's tail-loss probes do.
A feed that has sent all it had and is still not acknowledged `TAIL_PROBE_AFTER` after its last
datagram is probed the same way, once: a receiver that lost a burst's last datagrams learns of it
(a gap in the channel's datagram numbers) and only then asks for the stream's tail (see
`recovery_path`); a receiver that took everything sees no gap.
"""

from __future__ import annotations

from collections import deque

from scopecast.netio import wire
from scopecast.netio.delay_window import DelayWindow
from scopecast.timing import TIMING

RUN_COST = wire.RUN.size
MESSAGE_COST = wire.LENGTH.size
MIXED_EXTRA = wire.MIXED_ENTRY.size - MESSAGE_COST  # what a message in a mixed run costs more
END = wire.ContentType.END
PROBE_AFTER = TIMING.window_probe_after
TAIL_PROBE_AFTER = TIMING.tail_probe_after


class Run:
    """Consecutive messages of one topic, source and session (see `wire`)."""

    __slots__ = ("topic", "source", "session", "first_seq", "stream", "first_sseq", "ctype",
                 "payloads", "next_seq", "next_sseq")

    def __init__(self, topic: int, source: int, session: int, seq: int, stream: int, sseq: int,
                 ctype: int, payload: bytes) -> None:
        self.topic, self.source, self.session, self.stream = topic, source, session, stream
        self.first_seq, self.first_sseq, self.ctype = seq, sseq, ctype
        self.payloads = [payload]
        self.next_seq = seq + 1
        self.next_sseq = sseq + 1

    def parts(self, route_index: int = 0) -> list:
        return wire.run_parts(self.topic, self.source, self.session, self.first_seq, self.stream,
                              self.first_sseq, self.ctype, route_index, self.payloads)


class MixedRun:
    """Consecutive stream messages of one source and session, each of its own topic (see `wire`):
    what a publisher going round many topics makes. Its messages are kept as the sender's
    cache keeps them, (sseq, topic, session, seq, ctype, payload), so one of its own costs one
    append. `next_seq` never matches, so callers that extend a run by seq leave it to
    `Feed.put`."""

    __slots__ = ("source", "session", "stream", "first_sseq", "ctype", "messages", "next_seq",
                 "next_sseq")

    def __init__(self, run: Run) -> None:
        self.source, self.session, self.stream = run.source, run.session, run.stream
        self.first_sseq, self.ctype = run.first_sseq, run.ctype
        self.messages = [(run.first_sseq, run.topic, run.session, run.first_seq, run.ctype,
                          run.payloads[0])]
        self.next_seq = -1
        self.next_sseq = run.next_sseq

    @property
    def topic(self) -> int:
        return wire.MIXED

    def parts(self, route_index: int = 0) -> list:
        return wire.mixed_run_parts(self.source, self.session, self.stream, self.first_sseq,
                                    self.ctype, route_index, self.messages)


class Chunk:
    """Runs for one datagram (or one message to fragment)."""

    __slots__ = ("record", "table", "runs", "last", "size", "headers", "room", "first_own",
                 "end_of_stream", "oversized", "stamp")

    def __init__(self, record: tuple | None, table: bytes, room: int, stamp: int = 0) -> None:
        self.record = record
        self.table = table            # the encoded one-record routing table
        self.runs: list[Run] = []
        self.last: Run | None = None  # the run new messages may extend
        self.size = 0                 # bytes of the runs so far
        self.headers = 0              # of which run headers (see `queued`)
        self.room = room              # bytes of runs that fit one datagram with this table
        self.first_own = 0            # stream seq of the first of this member's own messages
        self.end_of_stream = False    # carries an end-of-stream marker (an END_OF_STREAM datagram)
        self.oversized = False        # one message larger than a datagram: sent as fragments
        self.stamp = stamp            # its datagram header's stamp (see wire.stamp_now)

    def queued(self) -> int:
        """Bytes of its messages as the send path counts them: payload and MESSAGE_COST each."""
        mixed = 0
        for r in self.runs:  # (a loop, not sum() of a generator: once a datagram, mostly 1 run)
            if r.__class__ is MixedRun:
                mixed += len(r.messages)
        return self.size - self.headers - mixed * MIXED_EXTRA


class LoneBatch:
    """This member's own messages that each fill a datagram alone (no two of their size share
    one: a 1 KB message in an MTU-sized datagram), of one routing record, queued in one go. They
    are kept as the own-stream cache keeps them, (sseq, topic, session, seq, ctype, payload), and
    built into datagrams in C a GSO call at a time (`_datagram_batch.BatchSealer.seal_lone`):
    queueing one costs a list append, not a chunk and a run of its own. `next` is the first not
    yet sent. Never a feed's open chunk: while it is the last thing queued it may grow."""

    __slots__ = ("record", "table", "stamp", "source", "items", "next", "least", "most")

    oversized = False
    next_seq = -1  # (the send path's run-extending check never matches it)

    def __init__(self, record: tuple, table: bytes, stamp: int, source: int, item: tuple,
                 least: int, most: int) -> None:
        self.record, self.table, self.stamp, self.source = record, table, stamp, source
        self.items = [item]
        self.next = 0
        self.least, self.most = least, most  # (the sizes it takes: see lone_sizes)

    @property
    def first_own(self) -> int:
        return self.items[self.next][0]

    def left(self) -> int:
        return len(self.items) - self.next


def lone_sizes(room: int) -> tuple[int, int]:
    """(least, most): a message of n bytes (payload and MESSAGE_COST) with least < n <= most
    fills a datagram of `room` bytes of runs alone: it fits, and no two of its size do."""
    return room // 2 - RUN_COST, room - RUN_COST


class Fragments:
    """A message larger than a datagram on its way as fragments (`wire.FRAGMENT`): the next piece
    to send of the one-message run of an oversized chunk, `chunk` bytes each."""

    __slots__ = ("first_own", "run", "table", "stamp", "chunk", "count", "next", "_bytes")

    def __init__(self, c: Chunk, chunk: int) -> None:
        self.first_own, self.run, self.table, self.stamp = c.first_own, c.runs[0], c.table, c.stamp
        self._bytes = memoryview(self.run.payloads[0]).cast("B")  # (a view may be of wider items)
        self.chunk = chunk
        self.count = wire.fragment_count(self._bytes.nbytes, chunk)
        self.next = 0

    def take(self) -> tuple[tuple[int, int, int, int], memoryview]:
        """The next piece: (its fragment struct: total, index, count, chunk; its bytes)."""
        self.next += 1
        return wire.fragment(self._bytes, self.next - 1, self.count, self.chunk)

    def left(self) -> int:
        return self.count - self.next


class Feed:
    """Messages queued for one destination, and that destination's flow window."""

    __slots__ = ("address", "channel", "chunks", "open", "dseq", "sent_bytes", "history",
                 "base_bytes", "acks", "light", "frag", "window", "moved_at", "probed_dseq",
                 "stamp")

    def __init__(self, address: tuple[str, int], channel: int, window: DelayWindow,
                 stamp: list[int] | None = None) -> None:
        self.address = address
        # [the stamp a chunk started now takes]: one cell the send path shares with all its
        # feeds and sets once per batch of messages it queues (not an argument per message)
        self.stamp = stamp if stamp is not None else [0]
        self.channel = channel
        self.chunks: deque[Chunk] = deque()
        self.open: Chunk | None = None
        self.dseq = 0
        self.sent_bytes = 0
        self.history: deque[tuple] = deque()  # (dseq, sent_bytes after it, when it was sent)
        self.base_bytes = 0                              # sent_bytes at the slowest receiver's ack
        self.acks: dict[int, list] = {}                  # member -> [dseq, last heard]
        self.light: dict[int, list] = {}  # receivers that hold no window, the same way
        self.frag: Fragments | None = None      # a message being sent as fragments
        self.window = window
        self.moved_at = 0.0                              # the slowest receiver last moved (or probe)
        self.probed_dseq = 0                             # the last datagram a probe re-announced

    # ------------------------------------------------------------------------------- queue

    def pending(self) -> bool:
        return self.frag is not None or self.open is not None or bool(self.chunks)

    def put(self, record: tuple, table: bytes, capacity: int, own: bool, topic: int, source: int,
            session: int, seq: int, stream: int, sseq: int, ctype: int, payload: bytes) -> Run:
        """Queue one message carrying `record` (`own`: published by this member); returns the run
        it joined, which the caller may extend directly while messages stay consecutive."""
        c = self.open
        n = len(payload) + MESSAGE_COST
        if c is not None and (c.record is record or c.record == record):
            r = c.last
            same_stream = (r.next_sseq == sseq and r.source == source and r.session == session
                           and r.stream == stream and r.ctype == ctype)
            if same_stream and r.next_seq == seq and r.topic == topic and c.size + n <= c.room:
                r.payloads.append(payload)
                r.next_seq += 1
                r.next_sseq += 1
                c.size += n
                return r
            if same_stream:  # the next of this stream but of another topic: a mixed run (`wire`)
                message = (sseq, topic, session, seq, ctype, payload)
                if r.__class__ is MixedRun:
                    if c.size + n + MIXED_EXTRA <= c.room:
                        return self._mix(c, r, message, n + MIXED_EXTRA)
                elif len(r.payloads) == 1 and c.size + n + 2 * MIXED_EXTRA <= c.room:
                    m = c.runs[-1] = c.last = MixedRun(r)
                    c.size += MIXED_EXTRA
                    return self._mix(c, m, message, n + MIXED_EXTRA)
            if c.size + RUN_COST + n > c.room:
                c = self._start(record, table, capacity, RUN_COST + n)
        else:
            c = self._start(record, table, capacity, RUN_COST + n)
        r = Run(topic, source, session, seq, stream, sseq, ctype, payload)
        c.runs.append(r)
        c.last = r
        c.size += RUN_COST + n
        c.headers += RUN_COST
        if own and not c.first_own:
            c.first_own = sseq
        if ctype == END:  # (markers of many topics closed at once travel together, as a run)
            c.end_of_stream = True
        return r

    @staticmethod
    def _mix(c: Chunk, r: MixedRun, message: tuple, n: int) -> MixedRun:
        r.messages.append(message)
        r.next_sseq += 1
        c.size += n
        return r

    def put_lone(self, record: tuple, table: bytes, capacity: int, item: tuple, n: int,
                 source: int) -> LoneBatch | None:
        """Queue one of this member's own messages, `item` as its cache keeps it (`n` bytes), in
        a datagram of its own if it fills one alone (see LoneBatch); None if it does not (the
        caller puts it)."""
        least, most = lone_sizes(capacity - len(table))
        if not least < n <= most or item[4] == END:
            return None
        stamp = self.stamp[0]
        if self.open is None and self.chunks:
            b = self.chunks[-1]
            if b.__class__ is LoneBatch and b.stamp == stamp \
                    and (b.record is record or b.record == record):
                b.items.append(item)
                return b
        if self.open is not None:
            self.chunks.append(self.open)
            self.open = None
        b = LoneBatch(record, table, stamp, source, item, least, most)
        self.chunks.append(b)
        return b

    def take_lone(self, n: int) -> None:
        """`n` messages of the LoneBatch heading the queue went."""
        b = self.chunks[0]
        b.next += n
        if b.next == len(b.items):
            self.chunks.popleft()

    def _start(self, record: tuple, table: bytes, capacity: int, n: int) -> Chunk:
        if self.open is not None:
            self.chunks.append(self.open)
        c = Chunk(record, table, capacity - len(table), self.stamp[0])
        if n > c.room:
            c.oversized = True
            self.chunks.append(c)
            self.open = None
        else:
            self.open = c
        return c

    def head(self) -> Chunk | None:
        """The chunk `take` would give (None: nothing queued)."""
        return self.chunks[0] if self.chunks else self.open

    def take(self) -> Chunk:
        """The next chunk to send (the open one last: it keeps filling until it is pulled); of a
        LoneBatch, its next message as a chunk (the way without GSO)."""
        if self.chunks:
            if self.chunks[0].__class__ is LoneBatch:
                return self._lone_chunk()
            return self.chunks.popleft()
        c, self.open = self.open, None
        return c

    def fragment(self, c: Chunk) -> None:
        """Send chunk `c` (taken, oversized)'s one message as fragments, each the most a
        datagram carries."""
        self.frag = Fragments(c, c.room - wire.FRAGMENT.size - wire.run_size(1, 0))

    def _lone_chunk(self) -> Chunk:
        b = self.chunks[0]
        sseq, topic, session, seq, ctype, payload = b.items[b.next]
        self.take_lone(1)
        c = Chunk(b.record, b.table, 0, b.stamp)
        c.runs.append(Run(topic, b.source, session, seq, b.source, sseq, ctype, payload))
        c.size = RUN_COST + len(payload) + MESSAGE_COST
        c.headers = RUN_COST
        c.first_own = sseq
        return c

    def take_plain(self, most: int) -> list[Chunk]:
        """Up to `most` chunks from the head of the queue that are each one plain run under one
        routing table (what `_datagram_batch.BatchSealer` builds), taken as `take` would."""
        out: list[Chunk] = []
        table = None
        while len(out) < most:
            c = self.chunks[0] if self.chunks else self.open
            if c is None or c.__class__ is not Chunk or c.oversized or c.end_of_stream \
                    or len(c.runs) != 1 \
                    or c.runs[0].__class__ is not Run \
                    or (table is not None and c.table is not table and c.table != table):
                break
            table = c.table
            out.append(self.take())
        return out

    def first_own(self) -> int:
        """Stream seq of the first own message not yet handed to the socket (0: none queued)."""
        if self.frag is not None:
            return self.frag.first_own
        for c in self.chunks:
            if c.first_own:
                return c.first_own
        return self.open.first_own if self.open is not None else 0

    def queued_chunks(self) -> int:
        return len(self.chunks) + (self.open is not None)

    # ------------------------------------------------------------------------------ window

    def sent(self, nbytes: int, now: float) -> None:
        """Datagrams up to `dseq` went, `nbytes` on the wire: they are in flight (unless no
        receiver holds the window) until acknowledged."""
        self.sent_bytes += nbytes
        self.history.append((self.dseq, self.sent_bytes, now))
        if not self.acks:
            self.base_bytes = self.sent_bytes

    def in_flight(self) -> int:
        return self.sent_bytes - self.base_bytes

    def set_receivers(self, members: set[int], now: float, streaming: bool = False) -> None:
        """The receivers the control plane says to wait for: a new one holds the window from now
        on, or, `streaming` (its sender has sent already: a joiner), once it acknowledges as
        regular; one no longer listed (gone, or a client nobody waits for) stops holding it."""
        for table in (self.acks, self.light):
            for m in [m for m in table if m not in members]:
                del table[m]
        for m in members:
            if m not in self.acks and m not in self.light:
                (self.light if streaming else self.acks)[m] = [self.dseq, now]
                self.moved_at = now
        self._advance()

    def acknowledge(self, member: int, dseq: int, now: float, held: float = 0.0,
                    light: int = 0) -> bool:
        """Record a receiver's acknowledgement (`held`: how long after datagram `dseq` came the
        receiver sent it; `light`: it is light); False if it is not a receiver of this feed."""
        if light or member in self.light:
            entry = self.light.pop(member, None) or self.acks.pop(member, None)
            if entry is None:
                return False
            if light:  # (it holds nothing: no round-trip sample)
                self.light[member] = entry
                entry[0] = max(entry[0], dseq)
                entry[1] = now
                self._advance()
                return True
            self.acks[member] = entry  # regular now: it holds the window
        entry = self.acks.get(member)
        if entry is None:
            return False
        if dseq > entry[0]:
            entry[0] = dseq
        entry[1] = now
        last = self._advance()
        if last is not None:  # the slowest receiver moved: a round-trip sample, unless a probe
            self.moved_at = now  # may have caused it (Karn: ambiguous samples are not taken)
            if last[0] > self.probed_dseq:  # (the receiver's own delay is no queue)
                rtt = now - last[2]
                if last[0] == dseq and held < rtt:
                    rtt -= held
                self.window.sample(last[0], rtt, now, self.dseq)
        return True

    def probe_due(self, now: float) -> bool:
        """The window is full and its slowest receiver has not moved for PROBE_AFTER (nor since
        the last probe): the caller re-announces `dseq` to the receivers."""
        if self.in_flight() < self.window.size or now - self.moved_at < PROBE_AFTER:
            return False
        self.moved_at = now
        self.probed_dseq = self.dseq
        return True

    def tail_probe_due(self, now: float) -> bool:
        """Everything queued is sent, the last datagram is not acknowledged by every receiver
        `TAIL_PROBE_AFTER` after it went, and it was not probed yet: the caller re-announces
        `dseq`."""
        if not self.unprobed_tail() or self.pending() \
                or now - self.history[-1][2] < TAIL_PROBE_AFTER:
            return False
        self.probed_dseq = self.dseq
        return True

    def unprobed_tail(self) -> bool:
        """Sent datagrams not acknowledged yet whose tail has not been probed."""
        return bool(self.history) and self.probed_dseq < self.dseq and bool(self.acks)

    def _advance(self) -> tuple | None:
        """Drop what the slowest receiver acknowledged; the last datagram of it, if any."""
        low = min((a[0] for a in self.acks.values()), default=self.dseq)
        history = self.history
        last = None
        while history and history[0][0] <= low:
            last = history.popleft()
        if last is not None:
            self.base_bytes = last[1]
        if not self.acks:
            self.base_bytes = self.sent_bytes
        return last

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
