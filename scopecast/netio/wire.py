"""The wire format: a versioned fixed binary header, message entries, msgpack for variable fields.

Datagram layout (network byte order)::

    header   magic "SC" | version u8 | type u8 | flags u8 | reserved u8 | count u16
             | sender u32 | channel u16 | reserved u16 | dseq u64                    (24 bytes)
    body     DATA / REPAIR: routing table (u16 length + msgpack list of records),
                            then `count` message entries (38-byte struct + payload),
                            a FRAGMENT datagram adds a 16-byte fragment struct before its one entry
             other types:   msgpack value (bounded)
    trailer  MAC (16 bytes), see `auth`

`sender` is the member id of the process that sent the datagram (a forwarder, not necessarily the
source); `channel`/`dseq` number the datagrams of one sender toward one destination (flow control).
Each message entry carries topic id, source member id, session, per-topic sequence number, stream id
and stream sequence number (the sender's sequence space toward one recovery domain), a content type
and an index into the datagram's routing table, so that one routing record serves many messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import msgpack

MAGIC = b"SC"
VERSION = 1

HEADER = struct.Struct("!2sBBBBHIHHQ")
ENTRY = struct.Struct("!IIIQIQBBI")
FRAGMENT = struct.Struct("!IIII")
ROUTE_LEN = struct.Struct("!H")

FLAG_FRAGMENT = 0x01

MAX_ROUTES = 255
MAX_CONTROL_BODY = 60_000


class PacketType(IntEnum):
    DATA = 1
    TOKEN = 2
    NAK = 3
    REPAIR = 4
    CONTROL = 5
    END_OF_STREAM = 6


DATA_TYPES = frozenset((PacketType.DATA, PacketType.REPAIR))


class ContentType(IntEnum):
    RAW = 0
    MSGPACK = 1
    ARROW = 2


class DecodeError(Exception):
    """A datagram that cannot be decoded; `reason` is the drop counter's name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(slots=True, frozen=True)
class Header:
    ptype: int
    flags: int
    count: int
    sender: int
    channel: int
    dseq: int


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

    def entry_size(self) -> int:
        return ENTRY.size + len(self.payload)


@dataclass(slots=True, frozen=True)
class Fragment:
    """One piece of a message too large for a datagram; `payload` of `message` is the chunk."""

    message: WireMessage
    total: int
    index: int
    count: int
    chunk: int


def pack_header(buf: bytearray, ptype: int, flags: int, count: int, sender: int, channel: int,
                dseq: int) -> None:
    HEADER.pack_into(buf, 0, MAGIC, VERSION, ptype, flags, 0, count, sender, channel, 0, dseq)


def unpack_header(view: memoryview | bytes) -> Header:
    if len(view) < HEADER.size:
        raise DecodeError("truncated", f"{len(view)} bytes")
    magic, version, ptype, flags, _, count, sender, channel, _, dseq = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise DecodeError("bad_magic")
    if version != VERSION:
        raise DecodeError("bad_version", str(version))
    if ptype not in _PTYPES:
        raise DecodeError("bad_type", str(ptype))
    return Header(ptype, flags, count, sender, channel, dseq)


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
    try:
        raw = msgpack.unpackb(view[offset:offset + n], use_list=True, max_array_len=MAX_ROUTES,
                              max_bin_len=0, max_map_len=0, max_ext_len=0, max_str_len=256)
        routes = [tuple((x, y) for x, y in record) for record in raw]
    except Exception as exc:  # malformed msgpack or record shape: untrusted input
        raise DecodeError("bad_routes", type(exc).__name__) from None
    return routes, offset + n


def encode_datagram(ptype: int, sender: int, channel: int, dseq: int,
                    messages: list[WireMessage]) -> bytes:
    """Encode data messages into one datagram body (without MAC); used by tests and tools.

    The I/O loop builds datagrams incrementally with `DatagramBuilder` instead."""
    builder = DatagramBuilder(1 << 24)
    builder.begin(ptype, sender, channel, dseq)
    for m in messages:
        if not builder.add(m.topic_id, m.source, m.session, m.seq, m.stream, m.stream_seq,
                           m.content_type, m.route, m.payload):
            raise ValueError("messages do not fit one datagram")
    return bytes(builder.finish())


def decode_data(view: memoryview | bytes) -> tuple[Header, list[WireMessage] | Fragment]:
    """Decode a whole DATA/REPAIR datagram body (MAC already removed) into messages or a fragment."""
    view = memoryview(view)
    header = unpack_header(view)
    if header.ptype not in DATA_TYPES:
        raise DecodeError("bad_type", "not a data packet")
    routes, offset = decode_routes(view, HEADER.size)
    fragment = None
    if header.flags & FLAG_FRAGMENT:
        if header.count != 1:
            raise DecodeError("bad_fragment", "fragment with several entries")
        if offset + FRAGMENT.size > len(view):
            raise DecodeError("truncated", "fragment header")
        fragment = FRAGMENT.unpack_from(view, offset)
        offset += FRAGMENT.size
    messages = []
    end = len(view)
    for _ in range(header.count):
        if offset + ENTRY.size > end:
            raise DecodeError("truncated", "message entry")
        topic, source, session, seq, stream, sseq, ctype, ridx, n = ENTRY.unpack_from(view, offset)
        offset += ENTRY.size
        if offset + n > end:
            raise DecodeError("truncated", "payload")
        if ridx >= len(routes):
            raise DecodeError("bad_routes", "route index")
        messages.append(WireMessage(topic, source, session, seq, stream, sseq, ctype, routes[ridx],
                                    bytes(view[offset:offset + n])))
        offset += n
    if offset != end:
        raise DecodeError("trailing_bytes", str(end - offset))
    if fragment is not None:
        total, index, count, chunk = fragment
        return header, Fragment(messages[0], total, index, count, chunk)
    return header, messages


def encode_control(ptype: int, sender: int, body: object, channel: int = 0, dseq: int = 0) -> bytes:
    """A non-data datagram (token, NAK, control, end-of-stream): header plus a msgpack body."""
    payload = msgpack.packb(body, use_bin_type=True)
    if len(payload) > MAX_CONTROL_BODY:
        raise ValueError(f"control body of {len(payload)} bytes exceeds {MAX_CONTROL_BODY}")
    buf = bytearray(HEADER.size)
    pack_header(buf, ptype, 0, 0, sender, channel, dseq)
    return bytes(buf) + payload


def decode_control(view: memoryview | bytes) -> tuple[Header, object]:
    view = memoryview(view)
    header = unpack_header(view)
    if header.ptype in DATA_TYPES:
        raise DecodeError("bad_type", "data packet")
    if len(view) - HEADER.size > MAX_CONTROL_BODY:
        raise DecodeError("oversized", "control body")
    try:
        body = msgpack.unpackb(view[HEADER.size:], use_list=True, max_bin_len=MAX_CONTROL_BODY,
                               max_str_len=4096, max_array_len=4096, max_map_len=1024)
    except Exception as exc:
        raise DecodeError("bad_body", type(exc).__name__) from None
    return header, body


class DatagramBuilder:
    """Builds one data datagram in a reusable buffer, message by message (pull-based sending).

    Routing records are collected into the datagram's table as messages are added; entries are
    written after the table once the datagram is finished, so `add` only appends to a list."""

    __slots__ = ("capacity", "_buf", "_entries", "_routes", "_route_index", "_size", "_header")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._buf = bytearray(capacity + 64)
        self._entries: list[tuple] = []
        self._routes: list[tuple] = []
        self._route_index: dict[tuple, int] = {}
        self._size = 0
        self._header: tuple = ()

    def begin(self, ptype: int, sender: int, channel: int, dseq: int) -> None:
        self._entries.clear()
        self._routes.clear()
        self._route_index.clear()
        self._header = (ptype, sender, channel, dseq)
        # header + routing-table length + a conservative allowance for the table itself
        self._size = HEADER.size + ROUTE_LEN.size

    def room(self) -> int:
        """Payload bytes the next entry may still carry (routing-table growth not included)."""
        return self.capacity - self._size - ENTRY.size

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, topic: int, source: int, session: int, seq: int, stream: int, stream_seq: int,
            ctype: int, route: tuple, payload: bytes) -> bool:
        """Queue one entry; False (and nothing added) when it would not fit."""
        ridx = self._route_index.get(route)
        extra = 0
        if ridx is None:
            if len(self._routes) >= MAX_ROUTES:
                return False
            extra = _route_size(route)
        size = self._size + ENTRY.size + len(payload) + extra
        if size > self.capacity and self._entries:
            return False
        if ridx is None:
            ridx = self._route_index[route] = len(self._routes)
            self._routes.append(route)
        self._size = size
        self._entries.append((topic, source, session, seq, stream, stream_seq, ctype, ridx, payload))
        return True

    def finish(self, fragment: tuple[int, int, int, int] | None = None) -> memoryview:
        ptype, sender, channel, dseq = self._header
        routes = encode_routes(self._routes)
        need = HEADER.size + ROUTE_LEN.size + len(routes) + FRAGMENT.size + sum(
            ENTRY.size + len(e[8]) for e in self._entries) + 64
        if need > len(self._buf):
            self._buf = bytearray(need)
        buf = self._buf
        pack_header(buf, ptype, FLAG_FRAGMENT if fragment else 0, len(self._entries), sender,
                    channel, dseq)
        off = HEADER.size
        ROUTE_LEN.pack_into(buf, off, len(routes))
        off += ROUTE_LEN.size
        buf[off:off + len(routes)] = routes
        off += len(routes)
        if fragment is not None:
            FRAGMENT.pack_into(buf, off, *fragment)
            off += FRAGMENT.size
        pack = ENTRY.pack_into
        for topic, source, session, seq, stream, sseq, ctype, ridx, payload in self._entries:
            n = len(payload)
            pack(buf, off, topic, source, session, seq, stream, sseq, ctype, ridx, n)
            off += ENTRY.size
            buf[off:off + n] = payload
            off += n
        return memoryview(buf)[:off]


def _route_size(route: tuple) -> int:
    # msgpack size of one record, computed once per distinct record per datagram
    return len(msgpack.packb(route, use_bin_type=True))


def fragments(message: WireMessage, chunk: int):
    """Split a message into (fragment struct, chunk payload) pieces of at most `chunk` bytes."""
    total = len(message.payload)
    count = max(1, -(-total // chunk))
    view = memoryview(message.payload)
    for index in range(count):
        yield (total, index, count, chunk), bytes(view[index * chunk:(index + 1) * chunk])
