"""The data plane's control messages, typed: what members and recovery agents say to each other
in TOKEN, NAK and CONTROL datagrams (data and end-of-stream datagrams carry `wire` runs).

Each message is a record with one encoding at the edge: `encode(message)` is the msgpack-able
body `[kind, *fields]`, and `decode(ptype, body)` gives the record back, or raises
`wire.DecodeError` with the drop counter's name (the receiver counts it and drops the datagram).
The body's version is the datagram header's (`wire.VERSION`). A kind travels only in the packet
type it belongs to (`PACKET_TYPE`).

What recovery protocols exchange inside these envelopes (a summary, instructions, a peer's token)
is theirs: dicts and values as `agents.api` documents them. The member reads the instructions it
gets through `Instructions.from_wire` and the sender records in them through
`SenderRecordWire.from_wire`, once, here."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from scopecast.netio import wire

__all__ = ["Kind", "Summary", "InstructionsEnvelope", "PeerToken", "Ack", "GroupAck", "WhereAsk",
           "JoinPoints", "MAX_WHERE", "MAX_JOINS", "NakAsk", "Nak", "MemberSummary",
           "Instructions", "PushAsk", "SenderRecordWire", "PACKET_TYPE", "encode", "decode"]


class Kind(IntEnum):
    SUMMARY = 1       # a member (or a group's leader agent) to its agent: `agents.api` Summary
    INSTRUCTIONS = 2  # the agent's answer (or the agent above's, to a leader)
    TOKEN = 3         # between the agents of one peer group
    ACK = 4           # a receiver to a sender: datagrams of a channel taken
    WHERE = 5         # a receiver to a sender: where did my streams of these topics start?
    JOIN_POINTS = 6   # ... the sender's answer
    NAK = 7           # a receiver to a sender: messages to repair
    GROUP_ACK = 8     # a receiver to its parent in a multicast channel's tree (`ack_gathering`)


def _ints(values, limit: int = wire.SEQ_LIMIT) -> bool:
    return all(v.__class__ is int and 0 <= v < limit for v in values)


class Summary(NamedTuple):
    """A bottom's summary for its agent (`agents.api`: acks, seen, naks, recs)."""

    body: dict

    @classmethod
    def read(cls, fields: list) -> Summary:
        if len(fields) != 1 or not isinstance(fields[0], dict):
            raise wire.DecodeError("bad_summary")
        return cls(fields[0])


class InstructionsEnvelope(NamedTuple):
    """An agent's instructions (`agents.api`) and the recovery protocol it speaks for (a member
    has one agent per protocol among its topics)."""

    body: dict
    protocol: str

    @classmethod
    def read(cls, fields: list) -> InstructionsEnvelope:
        if len(fields) != 2 or not isinstance(fields[0], dict) or not isinstance(fields[1], str):
            raise wire.DecodeError("bad_instructions")
        return cls(fields[0], fields[1])


class PeerToken(NamedTuple):
    """A message between the agents of a peer group, of view `version`, from the peer at
    `index`; `body` is the protocol's."""

    version: int
    index: int
    body: object

    @classmethod
    def read(cls, fields: list) -> PeerToken:
        if len(fields) != 3 or not _ints(fields[:2], 1 << 63):
            raise wire.DecodeError("bad_token")
        return cls(*fields)


class Ack(NamedTuple):
    """Datagrams of a sender's `channel` taken up to `dseq`; `held_us`: how long that datagram
    waited for this acknowledgement (the sender's round-trip sample leaves it out); `light`: 1
    while the receiver is light (`promotion`: the sender's window does not wait for it)."""

    channel: int
    dseq: int
    held_us: int
    light: int = 0


class GroupAck(NamedTuple):
    """An `Ack` of `source`'s multicast `channel` on its way up the channel's tree
    (`ack_gathering`): the lowest datagram number the sending receiver's subtree took; `light`:
    1 when none of it is regular; `urgent`: 1 when the sender asked for it at once (the parent
    passes it on without waiting for its ack period)."""

    source: int
    channel: int
    dseq: int
    held_us: int
    light: int
    urgent: int


MAX_WHERE = 192  # topics a WhereAsk names (a datagram of at most about 1,000 bytes)
MAX_JOINS = 48   # join points a JoinPoints carries (at most about 1,150 bytes)


class WhereAsk(NamedTuple):
    """A receiver asks a sender where its streams of `topics` (1 to MAX_WHERE, of `session`)
    start for it (at 100,000 topics, one ask a topic was 100,000 datagrams a subscriber)."""

    session: int
    topics: tuple[int, ...]

    @classmethod
    def read(cls, fields: list) -> WhereAsk:
        topics = _session_list(fields, MAX_WHERE)
        if not _ints(topics, wire.MAX_TOPIC + 1):
            raise wire.DecodeError("bad_control")
        return cls(fields[0], tuple(topics))


class JoinPoints(NamedTuple):
    """The sender's answer, `points` flat (topic, start, cached) triples (1 to MAX_JOINS): the
    receiver joined the topic's stream at `start`; the sender holds everything from `cached` on."""

    session: int
    points: tuple[int, ...]

    def triples(self):
        p = self.points
        return zip(p[0::3], p[1::3], p[2::3], strict=True)

    @classmethod
    def read(cls, fields: list) -> JoinPoints:
        points = _session_list(fields, 3 * MAX_JOINS)
        if len(points) % 3 or not _ints(points) or not _ints(points[0::3], wire.MAX_TOPIC + 1):
            raise wire.DecodeError("bad_control")
        return cls(fields[0], tuple(points))


class NakAsk(NamedTuple):
    """Messages `lo`..`hi` of `topic` (`session`), stream seqs `lo_sseq`..`hi_sseq`, to repair
    (topic 0: every message in the sseq range; `hi` 2**32-1: all of the topic in it)."""

    topic: int
    session: int
    lo: int
    hi: int
    lo_sseq: int
    hi_sseq: int


class Nak(NamedTuple):
    """A hole (or tail) a member misses in `source`'s stream: the NAK it sends to the sender is
    `ask()`, the row of its summary `agents.api`'s naks row."""

    source: int
    topic: int
    session: int
    lo: int
    hi: int
    lo_sseq: int
    hi_sseq: int

    def ask(self) -> NakAsk:
        return NakAsk(*self[1:])

    def row(self, member: int, address: tuple[str, int]) -> list:
        return [*self, member, *address]


def _session_list(fields: list, most: int) -> list:
    """The list of a [session, [1 to `most` values]] body (WhereAsk, JoinPoints)."""
    if len(fields) != 2 or not _ints(fields[:1]) or fields[1].__class__ is not list \
            or not 1 <= len(fields[1]) <= most:
        raise wire.DecodeError("bad_control")
    return fields[1]


def _numbers(cls, limit: int, reason: str):
    """The reader of a record of ints in [0, `limit`)."""
    size = len(cls._fields)

    def read(fields: list):
        if len(fields) != size or not _ints(fields, limit):
            raise wire.DecodeError(reason)
        return cls(*fields)
    return read


_READERS = {Kind.SUMMARY: Summary.read, Kind.INSTRUCTIONS: InstructionsEnvelope.read,
            Kind.TOKEN: PeerToken.read, Kind.ACK: _numbers(Ack, 1 << 64, "bad_control"),
            Kind.GROUP_ACK: _numbers(GroupAck, 1 << 64, "bad_control"),
            Kind.WHERE: WhereAsk.read, Kind.JOIN_POINTS: JoinPoints.read,
            Kind.NAK: _numbers(NakAsk, 1 << 64, "bad_nak")}
_KINDS = {Summary: Kind.SUMMARY, InstructionsEnvelope: Kind.INSTRUCTIONS, PeerToken: Kind.TOKEN,
          Ack: Kind.ACK, GroupAck: Kind.GROUP_ACK, WhereAsk: Kind.WHERE,
          JoinPoints: Kind.JOIN_POINTS, NakAsk: Kind.NAK}
PACKET_TYPE = {Kind.SUMMARY: wire.PacketType.TOKEN, Kind.INSTRUCTIONS: wire.PacketType.TOKEN,
               Kind.TOKEN: wire.PacketType.TOKEN, Kind.ACK: wire.PacketType.CONTROL,
               Kind.GROUP_ACK: wire.PacketType.CONTROL,
               Kind.WHERE: wire.PacketType.CONTROL, Kind.JOIN_POINTS: wire.PacketType.CONTROL,
               Kind.NAK: wire.PacketType.NAK}
_BAD = {wire.PacketType.TOKEN: "bad_token", wire.PacketType.NAK: "bad_nak"}


def encode(message: NamedTuple) -> tuple[int, list]:
    """(packet type, body) of a control message."""
    kind = _KINDS[message.__class__]
    return PACKET_TYPE[kind], [int(kind), *message]


def decode(ptype: int, body: object):
    """The record a control datagram's body holds; DecodeError (the drop counter's name) when it
    is malformed, of an unknown kind, or of a kind its packet type does not carry."""
    if not isinstance(body, list) or not body or body[0].__class__ is not int:
        raise wire.DecodeError(_BAD.get(ptype, "bad_control"), "no kind")
    try:
        kind = Kind(body[0])
    except ValueError:
        raise wire.DecodeError(_BAD.get(ptype, "bad_control"), f"kind {body[0]}") from None
    if PACKET_TYPE[kind] != ptype:
        raise wire.DecodeError(_BAD.get(ptype, "bad_control"), f"{kind.name} in packet {ptype}")
    return _READERS[kind](body[1:])


class SenderRecordWire(NamedTuple):
    """A sender's record as it travels in summaries and instructions (`agents.api`): what is on
    the wire, its unstable topics (packed `recovery_records.RECORD_ENTRY`s, or lists), its
    heartbeat, its horizon, and the (count, digest) of the keys it sent on. Protocols pass
    records on as they are; one they wrote short has heartbeat 0, horizon `top` and no keys."""

    top: int
    named: object
    beat: int
    horizon: int
    key_count: int
    key_digest: int

    @classmethod
    def from_wire(cls, record) -> SenderRecordWire:
        """ValueError or TypeError when malformed."""
        if not isinstance(record, (list, tuple)) or not 2 <= len(record) <= 6:
            raise ValueError("a sender record is a list of 2 to 6 values")
        top = int(record[0])
        n = len(record)
        return cls(top, record[1], int(record[2]) if n > 2 else 0,
                   int(record[3]) if n > 3 else top,
                   int(record[4]) if n > 5 else 0, int(record[5]) if n > 5 else 0)


class MemberSummary(NamedTuple):
    """What a member tells each of its agents every period (`agents.api` Summary)."""

    acks: dict[int, int]            # stream -> MaxContiguous
    seen: dict[int, int]            # stream -> highest delivered
    naks: list[Nak]                 # of this agent's protocol's topics
    recs: dict[int, SenderRecordWire] | None  # its own record, as a sender
    light: bool = False             # not caught up yet: stability leaves its acks out

    def to_wire(self, member: int, address: tuple[str, int]) -> dict:
        """The summary a protocol gets; its NAKs name `member` at `address` as the asker."""
        body = {"acks": self.acks, "seen": self.seen,
                "naks": [n.row(member, address) for n in self.naks]}
        if self.recs is not None:
            body["recs"] = self.recs
        if self.light:
            body["light"] = True
        return body


class PushAsk(NamedTuple):
    """Instructions' `push`: repair `nak` of `source`'s stream from the cache, to `address`."""

    source: int
    nak: NakAsk
    address: tuple[str, int]


class Instructions(NamedTuple):
    """An agent's instructions to a member (`agents.api`), read once at the edge."""

    down: dict[int, tuple[int, SenderRecordWire | None]]  # stream -> (stable, its record)
    hi: dict[int, int]                                    # stream -> highest any delivered
    push: list[PushAsk]
    period: float | None
    cacher: bool

    @classmethod
    def from_wire(cls, body: dict) -> Instructions:
        """ValueError or TypeError when malformed (the member counts `bad_instructions`)."""
        if not isinstance(body, dict):
            raise TypeError("instructions are a map")
        down = {}
        for source, (stable, record) in body.get("down", {}).items():
            down[int(source)] = (int(stable),
                                 SenderRecordWire.from_wire(record) if record else None)
        hi = {int(s): int(v) for s, v in body.get("hi", {}).items()}
        push = []
        for row in body.get("push", ()):
            if len(row) != 10:
                raise ValueError("a push row is a summary's NAK row")
            push.append(PushAsk(int(row[0]), NakAsk(*(int(v) for v in row[1:7])),
                                (str(row[8]), int(row[9]))))
        period = body.get("period")
        period = None if period is None else float(period)
        if period is not None and not 0 < period < 3600:
            raise ValueError(f"period {period}")
        return cls(down, hi, push, period, bool(body.get("cacher")))
