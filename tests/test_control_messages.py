"""The data plane's control messages (`netio.control_messages`): one typed record per kind, one
encoding each, and malformed bodies refused with the drop counter's name."""

from __future__ import annotations

import pytest

from scopecast.netio import control_messages as cm
from scopecast.netio import native, wire
from scopecast.netio.control_messages import (
    Ack,
    GroupAck,
    Instructions,
    InstructionsEnvelope,
    JoinPoints,
    Kind,
    Nak,
    NakAsk,
    PeerToken,
    SenderRecordWire,
    Summary,
    WhereAsk,
)

EXAMPLES = [
    Summary({"acks": {9: 5}, "naks": []}),
    InstructionsEnvelope({"down": {}, "period": 0.05}, "token_ring"),
    PeerToken(3, 1, {"k": "tok", "v": 3}),
    Ack(2, 77, 1500),
    GroupAck(12, 0x8123, 77, 1500, 0, 1),
    WhereAsk(1, (5, 6, 7)),
    JoinPoints(1, (5, 10, 4, 6, 1, 1)),
    NakAsk(5, 1, 10, 12, 100, 102),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.__class__.__name__)
def test_each_kind_goes_through_a_datagram_and_back_as_the_same_record(message):
    ptype, body = cm.encode(message)
    header, got = wire.decode_control(wire.encode_control(ptype, 7, body))
    assert header.ptype == ptype and header.sender == 7
    assert body[0] == int(cm._KINDS[message.__class__])
    decoded = cm.decode(header.ptype, got)
    assert decoded.__class__ is message.__class__ and decoded == message


def test_every_kind_has_a_record_a_reader_and_a_packet_type():
    assert set(cm._KINDS.values()) == set(Kind) == set(cm._READERS) == set(cm.PACKET_TYPE)
    assert {m.__class__ for m in EXAMPLES} == set(cm._KINDS)


BAD = [
    (wire.PacketType.CONTROL, ["ack", 1, 2, 0], "bad_control"),       # wire version 3's form
    (wire.PacketType.CONTROL, [99, 1, 2], "bad_control"),             # no such kind
    (wire.PacketType.CONTROL, [], "bad_control"),
    (wire.PacketType.CONTROL, {"k": 4}, "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.ACK), 1, 2], "bad_control"),  # one short
    (wire.PacketType.CONTROL, [int(Kind.ACK), 1, -2, 0], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.WHERE), 1, [wire.MAX_TOPIC + 1]], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.WHERE), 1, []], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.WHERE), 1, [5] * (cm.MAX_WHERE + 1)], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.WHERE), 5, 1], "bad_control"),  # wire version 8's form
    (wire.PacketType.CONTROL, [int(Kind.JOIN_POINTS), 1, [1, 1.5, 1]], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.JOIN_POINTS), 1, [1, wire.SEQ_LIMIT, 1]], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.JOIN_POINTS), 1, [1, 1, 1, 2]], "bad_control"),
    (wire.PacketType.CONTROL, [int(Kind.NAK), 1, 1, 1, 1, 1, 1], "bad_control"),  # a NAK's kind
    (wire.PacketType.NAK, [int(Kind.NAK), 1, 1, 1, 1, 1], "bad_nak"),
    (wire.PacketType.NAK, [int(Kind.NAK), 1, 1, 1, 1, 1, "x"], "bad_nak"),
    (wire.PacketType.NAK, [int(Kind.ACK), 1, 2, 0], "bad_nak"),
    (wire.PacketType.TOKEN, [int(Kind.SUMMARY), [1]], "bad_summary"),
    (wire.PacketType.TOKEN, [int(Kind.INSTRUCTIONS), {}, 5], "bad_instructions"),
    (wire.PacketType.TOKEN, [int(Kind.TOKEN), "v", 0, None], "bad_token"),
    (wire.PacketType.TOKEN, ["sum", {}], "bad_token"),
    (wire.PacketType.TOKEN, [int(Kind.WHERE), 1, [1]], "bad_token"),
]


@pytest.mark.parametrize("ptype,body,reason", BAD)
def test_a_malformed_or_misplaced_body_is_refused_with_its_counter(ptype, body, reason):
    with pytest.raises(wire.DecodeError) as err:
        cm.decode(ptype, body)
    assert err.value.reason == reason


def test_a_nak_names_what_its_sender_is_asked_and_what_the_summary_reports():
    nak = Nak(9, 5, 1, 10, 12, 100, 102)
    assert nak.ask() == NakAsk(5, 1, 10, 12, 100, 102)
    assert nak.row(4, ("10.0.0.1", 5000)) == [9, 5, 1, 10, 12, 100, 102, 4, "10.0.0.1", 5000]


def test_instructions_are_read_into_typed_fields_once():
    row = Nak(9, 5, 1, 10, 12, 100, 102).row(4, ("10.0.0.1", 5000))
    ins = Instructions.from_wire({
        "down": {"9": [40, [50, b"", 7, 45, 3, 11]], "4": [8, None], "5": [2, [6, []]]},
        "hi": {"9": 60}, "push": [row], "period": 0.02, "cacher": 1})
    assert ins.down[9] == (40, SenderRecordWire(50, b"", 7, 45, 3, 11))
    assert ins.down[4] == (8, None)
    assert ins.down[5] == (2, SenderRecordWire(6, [], 0, 6, 0, 0))  # a protocol's short record
    assert ins.hi == {9: 60} and ins.period == 0.02 and ins.cacher is True
    assert ins.push[0].source == 9 and ins.push[0].nak == NakAsk(5, 1, 10, 12, 100, 102)
    assert ins.push[0].address == ("10.0.0.1", 5000)
    assert Instructions.from_wire({}).period is None  # the member keeps its period


@pytest.mark.parametrize("body", [
    [], {"down": {"x": [1, None]}}, {"down": {"9": [1]}}, {"down": {"9": [1, [5]]}},
    {"down": {"9": [1, [5, b"", 1, 2, 3, 4, 5]]}}, {"hi": {"9": "a"}}, {"push": [[1, 2]]},
    {"period": 0}, {"period": "soon"},
])
def test_malformed_instructions_raise_for_the_member_to_count(body):
    with pytest.raises((ValueError, TypeError)):
        Instructions.from_wire(body)


def test_the_compiled_batches_speak_this_wire_version():
    assert native.DATAGRAM_WIRE_VERSION == wire.VERSION
    if native.BatchScanner is not None:  # (a build without the extension uses neither)
        from scopecast.netio import _datagram_batch
        assert _datagram_batch.WIRE_VERSION == wire.VERSION
        assert _datagram_batch.ABI == native.DATAGRAM_ABI  # (a stale build is refused, not run)


def test_a_members_summary_is_what_agents_api_documents():
    record = SenderRecordWire(50, b"", 7, 45, 3, 11)
    summary = cm.MemberSummary({9: 40}, {9: 41}, [Nak(9, 5, 1, 10, 12, 100, 102)], {4: record})
    body = summary.to_wire(4, ("10.0.0.1", 5000))
    assert body == {"acks": {9: 40}, "seen": {9: 41},
                    "naks": [[9, 5, 1, 10, 12, 100, 102, 4, "10.0.0.1", 5000]], "recs": {4: record}}
    assert "recs" not in cm.MemberSummary({}, {}, [], None).to_wire(4, ("10.0.0.1", 5000))
    ptype, wire_body = cm.encode(Summary(body))  # through a datagram: a record is a list there
    _, got = wire.decode_control(wire.encode_control(ptype, 4, wire_body))
    assert cm.decode(ptype, got).body["recs"] == {4: list(record)}


def test_the_largest_where_ask_and_join_points_fit_a_datagram():
    """(In the smallest datagram a member sends, 1,200 bytes, with its 28-byte MAC.)"""
    big = wire.SEQ_LIMIT - 1
    for message in (WhereAsk(big, (wire.MAX_TOPIC,) * cm.MAX_WHERE),
                    JoinPoints(big, (wire.MAX_TOPIC, big, big) * cm.MAX_JOINS)):
        ptype, body = cm.encode(message)
        assert len(wire.encode_control(ptype, 7, body)) <= 1200 - 28
