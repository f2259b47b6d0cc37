"""The wire format: a versioned fixed binary header, runs of messages, msgpack for variable fields.

Datagram layout (network byte order)::

    header   magic "SC" | version u8 | type u8 | flags u8 | reserved u8 | count u16
             | sender u32 | channel u16 | pad u16 | dseq u64 | stamp u32             (28 bytes)
    body     DATA / REPAIR: routing table (u16 length + msgpack list of records), then `count`
                            runs; a FRAGMENT datagram adds a 16-byte fragment struct before its
                            single one-message run
             other types:   msgpack value (bounded)
    padding  `pad` zero bytes (DATA types only): the datagrams of one batch handed to the kernel
             at once (`udp_batch`, GSO) are cut at one segment size, so all but the last are
             padded to it
    trailer  MAC, see `auth` (over everything before it, padding included)

    run      topic u32 | source u32 | session u32 | first seq u64 | stream u32
             | first stream seq u64 | content type u8 | routing index u8 | n u16        (36 bytes)
             then n payload lengths (u32 each), then the n payloads;
             a *mixed* run has topic 0 and first seq 0, then n entries topic u32 | seq u64
             | length u32 (16 bytes each), then the n payloads

`sender` is the member id of the process that sent the datagram (a forwarder, not necessarily the
source); `channel`/`dseq` number the datagrams of one sender toward one destination (flow control;
a DATA datagram of no runs re-announces the last number: a full window's probe, see `feed`).
`stamp` is when the first of a DATA datagram's messages was taken from `publish()` (or, forwarded,
the stamp of the datagram that brought it): the sender's wall clock in microseconds, modulo 2**32
(`stamp_now`); 0 on other datagrams. A receiver times delivery latency by it (`stamp_age_ms`), on
one clock where its members share a host and as well as their clocks agree across hosts.
A *run* is n messages of one topic, source and session with consecutive sequence numbers (the
per-topic delivery order, 1, 2, ... per session) and consecutive stream sequence numbers (the
sender's sequence space toward one recovery domain, which recovery keys on), one content type (raw
bytes, msgpack value, Arrow batch) and one routing record (an index into the datagram's table).
A publisher's messages form runs naturally, so a message costs 4 bytes of framing, and the receiver
checks order and duplicates once per run rather than once per message. A publisher that goes round
many topics makes runs of one message each; those travel as *mixed* runs instead: consecutive
stream sequence numbers of one source and session, each message naming its topic and seq (16
bytes of framing rather than a 36-byte run each).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import msgpack

from scopecast.actors.errors import IncompatibleVersion
from scopecast.netio.native import mixed_extent, mixed_parts

MAGIC = b"SC"
VERSION = 9  # 9: join points asked and answered for many topics at once (WhereAsk, JoinPoints);
            # 8: acknowledgements of a multicast channel gathered up a tree (GROUP_ACK);
            # 7: acknowledgements say whether the receiver is light (promotion); 6: control
            # datagrams numbered and stamped (replay_guard); 5: the header's stamp; 4: control
            # bodies are `control_messages` records

HEADER = struct.Struct("!2sBBBBHIHHQI")
STAMP_AT = 24  # the header's stamp field
STAMP = struct.Struct("!I")
STAMP_WRAP = 1 << 32
STAMP_MOST_US = 60_000_000  # an age beyond this is a clock that disagrees (or a wrap), not latency
RUN = struct.Struct("!IIIQIQBBH")
LENGTH = struct.Struct("!I")
MIXED_ENTRY = struct.Struct("!IQI")  # a mixed run's message: topic, seq, length
MIXED = 0                            # the topic field of a mixed run
FRAGMENT = struct.Struct("!IIII")
ROUTE_LEN = struct.Struct("!H")
PAD = struct.Struct("!H")

FLAG_FRAGMENT = 0x01
PAD_AT = 14  # the header's pad field (see `padded`)
FLAG_ACK_NOW = 0x02   # a DATA datagram: the sender's window is filling, acknowledge without delay
FLAG_MORE = 0x04      # a REPAIR datagram: its server's budget cut the repair short (ask on)

MAX_ROUTES = 255
MAX_RUN = 0xFFFF
SEQ_LIMIT = 1 << 62  # seqs and stream seqs of runs stay below (receivers keep them in 64 bits)
MAX_TOPIC = 0xFFFFFFFF
MAX_ROUTE_NAME = 256  # bytes of one scope or member name in a routing record
MAX_CONTROL_BODY = 60_000


class PacketType(IntEnum):
    DATA = 1
    TOKEN = 2
    NAK = 3
    REPAIR = 4
    CONTROL = 5
    END_OF_STREAM = 6


DATA_TYPES = frozenset((PacketType.DATA, PacketType.REPAIR, PacketType.END_OF_STREAM))


class ContentType(IntEnum):
    RAW = 0
    MSGPACK = 1
    ARROW = 2
    END = 3  # a publisher's end-of-stream marker: the last message of its stream, no payload


class DecodeError(Exception):
    """A datagram that cannot be decoded; `reason` is the drop counter's name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Header(NamedTuple):
    """A datagram's fixed header, as read (a tuple: one is made per datagram received)."""

    ptype: int
    flags: int
    count: int
    sender: int
    channel: int
    dseq: int
    pad: int = 0  # zero bytes between the body and the MAC
    stamp: int = 0  # see `stamp_now` (0: none)


@dataclass(slots=True, frozen=True)
class WireMessage:
    """One message as it travels: identity, order, recovery key, content and routing record."""

    topic_id: int
    source: int
    session: int
    seq: int
    stream: int
    stream_seq: int
    content_type: int
    route: tuple
    payload: bytes



@dataclass(slots=True, frozen=True)
class Fragment:
    """One piece of a message too large for a datagram; `payload` of `message` is the chunk."""

    message: WireMessage
    total: int
    index: int
    count: int
    chunk: int


def pack_header(ptype: int, flags: int, count: int, sender: int, channel: int,
                dseq: int, stamp: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ptype, flags, 0, count, sender, channel, 0, dseq, stamp)


def check_version(found, what: str) -> None:
    """IncompatibleVersion unless `found` (what another process or scope says it speaks) is this
    process's wire VERSION: members of two wire versions would drop each other's datagrams."""
    if found != VERSION:
        raise IncompatibleVersion.of(f"{what} speaks the datagram wire", found, VERSION,
                                     "every process and node of a cluster needs one scopecast "
                                     "version (pip install the same on each)")


def stamp_now() -> int:
    """The header's stamp for now: the wall clock in microseconds modulo 2**32, never 0."""
    return (time.time_ns() // 1000) % STAMP_WRAP or 1


def stamp_age_ms(stamp: int, now: int) -> float | None:
    """Milliseconds from `stamp` to `now` (both `stamp_now` values); None where the stamp is
    missing or the age is no latency (a clock behind the sender's, or one far ahead)."""
    if not stamp:
        return None
    age = (now - stamp) % STAMP_WRAP
    return age / 1000 if age <= STAMP_MOST_US else None


def unpack_header(view: memoryview | bytes) -> Header:
    if len(view) < HEADER.size:
        raise DecodeError("truncated", f"{len(view)} bytes")
    magic, version, ptype, flags, _, count, sender, channel, pad, dseq, stamp = \
        HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise DecodeError("bad_magic")
    if version != VERSION:
        raise DecodeError("bad_version", str(version))
    if ptype not in _PTYPES:
        raise DecodeError("bad_type", str(ptype))
    if pad and ptype not in DATA_TYPES:
        raise DecodeError("bad_pad", "padding on a control datagram")
    return Header(ptype, flags, count, sender, channel, dseq, pad, stamp)


def padded(datagram: bytes, size: int) -> bytes:
    """A data datagram (without MAC) grown to `size` bytes: zeros after its body, counted in its
    header's pad field."""
    pad = size - len(datagram)
    if pad <= 0:
        return datagram
    out = bytearray(datagram)
    out += bytes(pad)
    PAD.pack_into(out, PAD_AT, pad)
    return bytes(out)


def unpadded(view: memoryview, header: Header) -> memoryview:
    """The body of a datagram (MAC removed) without its padding."""
    if header.pad:
        if HEADER.size + header.pad > len(view):
            raise DecodeError("truncated", "padding")
        return view[:len(view) - header.pad]
    return view


_PTYPES = frozenset(int(t) for t in PacketType)


def encode_routes(routes: list[tuple]) -> bytes:
    return msgpack.packb(routes, use_bin_type=True)


def decode_routes(view: memoryview, offset: int) -> tuple[list[tuple], int]:
    """Read the routing table at `offset`; return the records and the offset after them."""
    if offset + ROUTE_LEN.size > len(view):
        raise DecodeError("truncated", "routing table length")
    (n,) = ROUTE_LEN.unpack_from(view, offset)
    offset += ROUTE_LEN.size
    if offset + n > len(view):
        raise DecodeError("truncated", "routing table")
    return decode_table(bytes(view[offset:offset + n])), offset + n


def decode_table(raw: bytes) -> list[tuple]:
    """The records of a routing table's msgpack bytes (the same list for the same bytes)."""
    routes = _decoded_tables.get(raw)
    if routes is None:
        try:
            routes = [_record(r) for r in msgpack.unpackb(
                raw, use_list=True, max_array_len=MAX_ROUTES, max_bin_len=0, max_map_len=0,
                max_ext_len=0, max_str_len=MAX_ROUTE_NAME)]
        except DecodeError:
            raise
        except Exception as exc:  # malformed msgpack: untrusted input
            raise DecodeError("bad_routes", type(exc).__name__) from None
        if len(_decoded_tables) >= DECODED_TABLES:
            _decoded_tables.clear()
        _decoded_tables[raw] = routes
    return routes


# A stream's datagrams mostly carry one routing table: decoded once (a msgpack decode and its
# checks cost more than the rest of a small datagram's header). Callers must not change the list.
DECODED_TABLES = 1024
_decoded_tables: dict[bytes, list[tuple]] = {}


def _record(raw) -> tuple:
    """A routing record from its msgpack form: a non-empty list of [str, str] levels."""
    if not isinstance(raw, list) or not raw:
        raise DecodeError("bad_routes", "record is not a list of levels")
    for level in raw:
        if not (isinstance(level, list) and len(level) == 2 and isinstance(level[0], str)
                and isinstance(level[1], str)):
            raise DecodeError("bad_routes", "level is not a pair of names")
    return tuple((x, y) for x, y in raw)


def encode_route_table(records: list[tuple]) -> bytes:
    """A datagram's routing table: u16 length, then the msgpack list of records."""
    for record in records:
        for level in record:
            for name in level:
                if len(name.encode()) > MAX_ROUTE_NAME:
                    raise ValueError(f"scope or member name longer than {MAX_ROUTE_NAME} bytes: "
                                     f"{name[:40]!r}...")
    routes = encode_routes(records)
    if len(routes) > 0xFFFF:
        raise ValueError("routing table too large")
    return ROUTE_LEN.pack(len(routes)) + routes


def run_parts(topic: int, source: int, session: int, first_seq: int, stream: int,
              first_stream_seq: int, ctype: int, route_index: int, payloads: list) -> list:
    """The byte strings of one run: its fixed part, its payload lengths, its payloads."""
    n = len(payloads)
    if not 0 < n <= MAX_RUN:
        raise ValueError(f"a run holds 1..{MAX_RUN} messages, not {n}")
    return [RUN.pack(topic, source, session, first_seq, stream, first_stream_seq, ctype,
                     route_index, n),
            _lengths(n).pack(*map(len, payloads)), *payloads]


def mixed_run_parts(source: int, session: int, stream: int, first_stream_seq: int, ctype: int,
                    route_index: int, messages: list[tuple]) -> list:
    """The byte strings of one mixed run: its fixed part, its entries, its payloads. `messages`
    are as a sender caches them: (stream seq, topic, session, seq, ctype, payload)."""
    n = len(messages)
    if not 0 < n <= MAX_RUN:
        raise ValueError(f"a run holds 1..{MAX_RUN} messages, not {n}")
    return mixed_parts(RUN.pack(MIXED, source, session, 0, stream, first_stream_seq, ctype,
                                route_index, n), messages)


_LENGTHS: dict[int, struct.Struct] = {}


def _lengths(n: int) -> struct.Struct:
    """The struct of a run's n payload lengths (made once per n <= MAX_RUN)."""
    s = _LENGTHS.get(n)
    if s is None:
        s = _LENGTHS[n] = struct.Struct(f"!{n}I")
    return s


def run_size(count: int, payload_bytes: int) -> int:
    return RUN.size + LENGTH.size * count + payload_bytes


def encode_data(ptype: int, sender: int, channel: int, dseq: int, table: bytes, runs: int,
                parts: list, fragment: tuple[int, int, int, int] | None = None,
                flags: int = 0, stamp: int = 0) -> bytes:
    """A data datagram (without MAC) from an encoded routing table and the parts of `runs` runs."""
    header = pack_header(ptype, flags | (FLAG_FRAGMENT if fragment else 0), runs, sender, channel,
                         dseq, stamp)
    if fragment is not None:
        return b"".join((header, table, FRAGMENT.pack(*fragment), *parts))
    return b"".join((header, table, *parts))


def _same_stream(a: WireMessage, b: WireMessage) -> bool:
    """`b` may follow `a` in one mixed run."""
    return ((a.source, a.session, a.stream, a.content_type, a.route)
            == (b.source, b.session, b.stream, b.content_type, b.route)
            and b.stream_seq == a.stream_seq + 1)


def _same_run(a: WireMessage, b: WireMessage) -> bool:
    """`b` may follow `a` in one run."""
    return _same_stream(a, b) and a.topic_id == b.topic_id and b.seq == a.seq + 1


def encode_datagram(ptype: int, sender: int, channel: int, dseq: int,
                    messages: list[WireMessage]) -> bytes:
    """Encode messages (any mix of topics, sources and routing records) into one data datagram,
    without MAC, grouping consecutive messages into runs (mixed runs where runs would hold one
    message each)."""
    index: dict[tuple, int] = {}
    parts: list = []
    runs = 0
    i = 0
    while i < len(messages):
        j = i + 1
        while j < len(messages) and j - i < MAX_RUN and _same_run(messages[j - 1], messages[j]):
            j += 1
        mixed = j == i + 1
        while mixed and j < len(messages) and j - i < MAX_RUN \
                and _same_stream(messages[j - 1], messages[j]):
            j += 1
        m, group = messages[i], messages[i:j]
        ridx = index.setdefault(m.route, len(index))
        if mixed and len(group) > 1:
            parts += mixed_run_parts(m.source, m.session, m.stream, m.stream_seq, m.content_type,
                                     ridx, [(x.stream_seq, x.topic_id, x.session, x.seq,
                                             x.content_type, x.payload) for x in group])
        else:
            parts += run_parts(m.topic_id, m.source, m.session, m.seq, m.stream, m.stream_seq,
                               m.content_type, ridx, [x.payload for x in group])
        runs += 1
        i = j
    if len(index) > MAX_ROUTES:
        raise ValueError(f"more than {MAX_ROUTES} routing records in one datagram")
    return encode_data(ptype, sender, channel, dseq, encode_route_table(list(index)), runs, parts)


def encode_fragment(ptype: int, sender: int, channel: int, dseq: int, fragment: Fragment) -> bytes:
    """One fragment datagram (without MAC)."""
    m = fragment.message
    parts = run_parts(m.topic_id, m.source, m.session, m.seq, m.stream, m.stream_seq,
                      m.content_type, 0, [m.payload])
    return encode_data(ptype, sender, channel, dseq, encode_route_table([m.route]), 1, parts,
                       (fragment.total, fragment.index, fragment.count, fragment.chunk))


class WireRun(NamedTuple):
    """A run as `iter_runs` reads it from a datagram (a tuple: one is made per run received)."""

    topic: int
    source: int
    session: int
    first: int                # the seq of its first message
    stream: int               # the stream (sending member) its stream seqs are of
    first_sseq: int
    ctype: int
    route_index: int          # into the datagram's routing table
    lengths: tuple[int, ...]  # of its payloads (a mixed run: its message count)
    offset: int               # of its first payload in the datagram


_new_run = tuple.__new__


def iter_runs(view: memoryview, offset: int, runs: int, nroutes: int):
    """Validate and yield the runs of a data datagram body (without MAC) starting at `offset`,
    as `WireRun`s. A mixed run comes as topic MIXED with, in place of the lengths, its message
    count: its entries are read where they lie (checked here in C, unpacked by `mixed_entries`
    when wanted). Raises DecodeError on malformed input."""
    end = len(view)
    unpack = RUN.unpack_from
    for _ in range(runs):
        if offset + RUN.size > end:
            raise DecodeError("truncated", "run")
        fields = unpack(view, offset)
        n = fields[8]
        offset += RUN.size
        if n == 0:
            raise DecodeError("bad_run", "empty run")
        if fields[7] >= nroutes:
            raise DecodeError("bad_routes", "route index")
        if fields[5] + n > SEQ_LIMIT:
            raise DecodeError("bad_seq", "stream seq")
        if fields[0] == MIXED:
            size = mixed_extent(view, offset, n)
            if size < 0:
                raise DecodeError(*_MIXED_ERRORS[size])
            lengths = n
            offset += MIXED_ENTRY.size * n
            start = offset
            offset += size
        else:
            if fields[3] + n > SEQ_LIMIT:
                raise DecodeError("bad_seq", "seq")
            if offset + LENGTH.size * n > end:
                raise DecodeError("truncated", "run lengths")
            lengths = _lengths(n).unpack_from(view, offset)
            offset += LENGTH.size * n
            start = offset
            offset += sum(lengths)
        if offset > end:
            raise DecodeError("truncated", "payload")
        yield _new_run(WireRun, fields[:8] + (lengths, start))
    if offset != end:
        raise DecodeError("trailing_bytes", str(end - offset))


_MIXED_ERRORS = {-1: ("truncated", "mixed run entries"), -2: ("bad_run", "topic 0 in a mixed run"),
                 -3: ("bad_seq", "seq")}


def mixed_entries(data, offset: int, n: int):
    """The entries of a mixed run of `n` messages whose payloads start at `offset` (as
    `iter_runs` gives it): an iterator of (topic, seq, length)."""
    return MIXED_ENTRY.iter_unpack(memoryview(data)[offset - MIXED_ENTRY.size * n:offset])


def mixed_topic(data, offset: int, n: int) -> int:
    """The topic of the first message of a mixed run (as `iter_runs` gives it)."""
    return LENGTH.unpack_from(data, offset - MIXED_ENTRY.size * n)[0]


def decode_data(view: memoryview | bytes) -> tuple[Header, list[WireMessage] | Fragment]:
    """Decode a whole DATA/REPAIR datagram body (MAC already removed) into messages or a fragment."""
    view = memoryview(view)
    header = unpack_header(view)
    if header.ptype not in DATA_TYPES:
        raise DecodeError("bad_type", "not a data packet")
    view = unpadded(view, header)
    routes, offset = decode_routes(view, HEADER.size)
    fragment = None
    if header.flags & FLAG_FRAGMENT:
        if header.count != 1:
            raise DecodeError("bad_fragment", "fragment with several runs")
        if offset + FRAGMENT.size > len(view):
            raise DecodeError("truncated", "fragment header")
        fragment = FRAGMENT.unpack_from(view, offset)
        offset += FRAGMENT.size
    messages = []
    for topic, source, session, seq, stream, sseq, ctype, ridx, lengths, off in iter_runs(
            view, offset, header.count, len(routes)):
        if topic == MIXED:
            entries = mixed_entries(view, off, lengths)
        else:
            entries = ((topic, seq + i, n) for i, n in enumerate(lengths))
        for i, (t, q, n) in enumerate(entries):
            messages.append(WireMessage(t, source, session, q, stream, sseq + i, ctype,
                                        routes[ridx], bytes(view[off:off + n])))
            off += n
    if fragment is not None:
        if len(messages) != 1:
            raise DecodeError("bad_fragment", "fragment run of several messages")
        total, index, count, chunk = fragment
        return header, Fragment(messages[0], total, index, count, chunk)
    return header, messages


def encode_control(ptype: int, sender: int, body: object, channel: int = 0, dseq: int = 0,
                   stamp: int = 0) -> bytes:
    """A non-data datagram (token, NAK, control): header plus a msgpack body. A sender numbers
    them (`dseq`: its epoch and a counter) and stamps them (`stamp_now`): see replay_guard."""
    payload = msgpack.packb(body, use_bin_type=True)
    if len(payload) > MAX_CONTROL_BODY:
        raise ValueError(f"control body of {len(payload)} bytes exceeds {MAX_CONTROL_BODY}")
    return pack_header(ptype, 0, 0, sender, channel, dseq, stamp) + payload


def decode_control(view: memoryview | bytes) -> tuple[Header, object]:
    view = memoryview(view)
    header = unpack_header(view)
    if header.ptype in DATA_TYPES:
        raise DecodeError("bad_type", "data packet")
    if len(view) - HEADER.size > MAX_CONTROL_BODY:
        raise DecodeError("oversized", "control body")
    try:
        # the body is at most MAX_CONTROL_BODY bytes, which bounds every container in it too
        body = msgpack.unpackb(view[HEADER.size:], use_list=True, strict_map_key=False,
                               max_bin_len=MAX_CONTROL_BODY, max_str_len=MAX_CONTROL_BODY,
                               max_array_len=MAX_CONTROL_BODY, max_map_len=MAX_CONTROL_BODY)
    except Exception as exc:
        raise DecodeError("bad_body", type(exc).__name__) from None
    return header, body


def fragment_count(total: int, chunk: int) -> int:
    """How many fragments of at most `chunk` bytes a payload of `total` bytes takes."""
    return max(1, -(-total // chunk))


def fragment(view: memoryview, index: int, count: int, chunk: int) -> tuple[tuple, memoryview]:
    """Fragment `index` of a payload's byte view: (its fragment struct, its bytes as a view)."""
    return (view.nbytes, index, count, chunk), view[index * chunk:(index + 1) * chunk]


def fragments(payload, chunk: int):
    """Split a payload into (fragment struct, chunk bytes) pieces of at most `chunk` bytes."""
    view = memoryview(payload).cast("B")
    count = fragment_count(view.nbytes, chunk)
    for index in range(count):
        struct, piece = fragment(view, index, count, chunk)
        yield struct, bytes(piece)
