"""Property tests of the wire codec (scopecast/netio/wire.py): every datagram shape the encoder
produces decodes to exactly what was encoded, fragments reassemble to the original message whatever
their order, and undecodable input fails with `DecodeError` only."""

from __future__ import annotations

import dataclasses
import random
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scopecast.netio import wire
from scopecast.netio.delay_window import DelayWindow
from scopecast.netio.feed import Feed, Run, lone_sizes
from scopecast.netio.reassembly import Reassembler
from scopecast.netio.wire import (
    FLAG_FRAGMENT,
    HEADER,
    MAX_CONTROL_BODY,
    MAX_ROUTES,
    ROUTE_LEN,
    DecodeError,
    Fragment,
    PacketType,
    WireMessage,
)

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

def split(msg: WireMessage, chunk: int) -> list:
    """`wire.fragments` pieces of a message's payload."""
    return list(wire.fragments(msg.payload, chunk))

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
seqs = st.integers(0, wire.SEQ_LIMIT - wire.MAX_RUN - 1)  # of messages: with room for a run
topics = st.integers(1, 2**32 - 1)  # 0 marks a mixed run
data_types = st.sampled_from([PacketType.DATA, PacketType.REPAIR])
control_types = st.sampled_from([t for t in PacketType if t not in wire.DATA_TYPES])
# scope member names; the decoder bounds strings at 256 bytes (<= 4 bytes per character here)
names = st.text(max_size=24)
routes = st.lists(st.tuples(names, names), min_size=1, max_size=4).map(tuple)
payloads = st.binary(max_size=2000)


@st.composite
def wire_messages(draw, route_pool=None, payload=payloads):
    route = draw(st.sampled_from(route_pool)) if route_pool else draw(routes)
    return WireMessage(draw(topics), draw(u32), draw(u32), draw(seqs), draw(u32), draw(seqs),
                       draw(st.integers(0, 2)), route, draw(payload))


@st.composite
def round_robin(draw):
    """A publisher going round topics: consecutive stream seqs of one source and session, each
    message of a topic of its own (or now and then the same as the one before)."""
    head = draw(wire_messages())
    n = draw(st.integers(2, 80))
    picks = draw(st.lists(topics, min_size=n, max_size=n))
    numbers = draw(st.lists(seqs, min_size=n, max_size=n))
    return [dataclasses.replace(head, topic_id=t, seq=q, stream_seq=head.stream_seq + i,
                                payload=draw(st.binary(max_size=300)))
            for i, (t, q) in enumerate(zip(picks, numbers, strict=True))]


@st.composite
def message_lists(draw, max_size=24):
    # a few distinct routing records shared by many messages (one record serves many entries)
    pool = draw(st.lists(routes, min_size=1, max_size=5))
    return draw(st.lists(wire_messages(route_pool=pool), max_size=max_size))


# ------------------------------------------------------------------------------ data datagrams


@SETTINGS
@given(ptype=data_types, sender=u32, channel=u16, dseq=u64, messages=message_lists())
def test_data_datagram_roundtrip(ptype, sender, channel, dseq, messages):
    data = wire.encode_datagram(ptype, sender, channel, dseq, messages)
    header, decoded = wire.decode_data(data)
    assert (header.ptype, header.flags, header.sender, header.channel, header.dseq) == (
        int(ptype), 0, sender, channel, dseq)
    assert header.count <= len(messages)  # runs: consecutive messages share one
    assert decoded == messages
    assert all(type(m.payload) is bytes for m in decoded)


def test_consecutive_messages_share_one_run():
    route = (("A", "A"),)
    msgs = [WireMessage(3, 9, 1, s, 9, 100 + s, 0, route, b"p%d" % s) for s in range(1, 51)]
    data = wire.encode_datagram(PacketType.DATA, 9, 1, 1, msgs)
    header, decoded = wire.decode_data(data)
    assert header.count == 1 and decoded == msgs
    assert len(data) == (HEADER.size + len(wire.encode_route_table([route]))
                         + wire.run_size(50, sum(len(m.payload) for m in msgs)))


@SETTINGS
@given(messages=round_robin())
def test_a_publisher_going_round_topics_travels_in_one_mixed_run(messages):
    assume(not any(map(wire._same_run, messages, messages[1:])))
    data = wire.encode_datagram(PacketType.DATA, 9, 1, 1, messages)
    header, decoded = wire.decode_data(data)
    assert header.count == 1 and decoded == messages
    assert len(data) == (HEADER.size + len(wire.encode_route_table([messages[0].route]))
                         + wire.RUN.size + sum(wire.MIXED_ENTRY.size + len(m.payload)
                                               for m in messages))


@pytest.mark.parametrize("topics, seq, sseq", [
    ((5, 5), wire.SEQ_LIMIT - 1, 100),      # a run's seqs run past the limit
    ((5, 6), wire.SEQ_LIMIT, 100),          # a mixed run's seq at the limit
    ((5, 5), 1, wire.SEQ_LIMIT - 1),        # stream seqs past it
    ((5, 6), 1, wire.SEQ_LIMIT - 1),
])
def test_a_run_of_seqs_beyond_64_bits_of_room_is_refused(topics, seq, sseq):
    """Receivers keep seqs in 64-bit slots (TopicTable): a run numbered at or past
    SEQ_LIMIT is a counted drop, not an overflow in the I/O loop."""
    route = (("A", "A"),)
    msgs = [WireMessage(t, 9, 1, seq + (t == topics[0]) * i, 9, sseq + i, 0, route, b"p")
            for i, t in enumerate(topics)]
    data = wire.encode_datagram(PacketType.DATA, 9, 1, 1, msgs)
    with pytest.raises(DecodeError) as err:
        wire.decode_data(data)
    assert err.value.reason == "bad_seq"


def test_a_mixed_run_naming_topic_0_is_refused():
    route = (("A", "A"),)
    msgs = [WireMessage(t, 9, 1, 1, 9, 100 + i, 0, route, b"p") for i, t in enumerate((5, 6))]
    data = bytearray(wire.encode_datagram(PacketType.DATA, 9, 1, 1, msgs))
    at = HEADER.size + len(wire.encode_route_table([route])) + wire.RUN.size
    data[at:at + 4] = bytes(4)  # the first entry's topic
    with pytest.raises(DecodeError, match="topic 0"):
        wire.decode_data(bytes(data))


@SETTINGS
@given(ptype=data_types, sender=u32, channel=u16, dseq=u64,
       messages=st.one_of(message_lists(max_size=60).filter(bool), round_robin()),
       capacity=st.integers(400, 65_000 - 28))
def test_feed_chunks_fit_a_datagram_and_decode(ptype, sender, channel, dseq, messages, capacity):
    """The I/O loop's way: messages queued in a Feed's chunks (runs under one routing record),
    each chunk encoded as the runtime does, within capacity, decoding to the same messages."""
    tables = {m.route: wire.encode_route_table([m.route]) for m in messages}
    assume(all(len(tables[m.route]) + wire.run_size(1, len(m.payload)) <= capacity - HEADER.size
               for m in messages))  # (larger ones are fragmented, tested below)
    feed = Feed(("127.0.0.1", 1), 1, DelayWindow(4 << 20, 0.005))
    for m in messages:
        feed.put(m.route, tables[m.route], capacity - HEADER.size, False, m.topic_id, m.source,
                 m.session, m.seq, m.stream, m.stream_seq, m.content_type, m.payload)
    decoded = []
    while feed.pending():
        chunk = feed.take()
        parts = [p for run in chunk.runs for p in run.parts()]
        data = wire.encode_data(ptype, sender, channel, dseq, chunk.table, len(chunk.runs), parts)
        assert len(data) <= capacity
        assert len(data) == HEADER.size + len(chunk.table) + chunk.size
        got = wire.decode_data(data)[1]
        # what the runtime counts as queued: payload and MESSAGE_COST per message, no framing
        assert chunk.queued() == sum(len(m.payload) + wire.LENGTH.size for m in got)
        decoded += got
    assert decoded == messages


def test_a_feed_queues_a_publisher_going_round_topics_as_one_mixed_run():
    route = (("A", "A"),)
    table = wire.encode_route_table([route])
    feed = Feed(("127.0.0.1", 1), 1, DelayWindow(4 << 20, 0.005))
    for i in range(12):  # topics 1, 2, 3, 1, 2, 3, ...: one message each in a row
        feed.put(route, table, 60_000, True, 1 + i % 3, 7, 1, 1 + i // 3, 7, 100 + i, 0, b"x" * 10)
    chunk = feed.take()
    assert not feed.pending() and len(chunk.runs) == 1 and chunk.first_own == 100
    assert chunk.size == wire.RUN.size + 12 * (wire.MIXED_ENTRY.size + 10)


def test_routing_table_holds_up_to_max_routes():
    msgs = [WireMessage(1, 1, 1, i, 1, i, 0, ((f"m{i}", "x"),), b"") for i in range(MAX_ROUTES)]
    assert wire.decode_data(wire.encode_datagram(PacketType.DATA, 1, 1, 1, msgs))[1] == msgs
    more = msgs + [WireMessage(1, 1, 1, 999, 1, 999, 0, (("extra", "x"),), b"")]
    with pytest.raises(ValueError):
        wire.encode_datagram(PacketType.DATA, 1, 1, 1, more)


# --------------------------------------------------------------------------- control datagrams

json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=40) | st.binary(max_size=200),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=8),
    max_leaves=30,
)


@SETTINGS
@given(ptype=control_types, sender=u32, channel=u16, dseq=u64, body=json_like)
def test_control_datagram_roundtrip(ptype, sender, channel, dseq, body):
    data = wire.encode_control(ptype, sender, body, channel, dseq)
    header, decoded = wire.decode_control(data)
    assert header == wire.Header(int(ptype), 0, 0, sender, channel, dseq)
    assert decoded == body


@SETTINGS
@given(messages=message_lists(max_size=5), extra=st.integers(1, 3000))
def test_a_padded_data_datagram_decodes_to_what_was_encoded(messages, extra):
    """Every datagram of a GSO batch but the last is padded to the batch's segment size."""
    data = wire.encode_datagram(PacketType.DATA, 1, 2, 3, messages)
    grown = wire.padded(data, len(data) + extra)
    assert len(grown) == len(data) + extra
    header, decoded = wire.decode_data(grown)
    assert header.pad == extra and decoded == wire.decode_data(data)[1]


def test_padding_on_a_control_datagram_or_beyond_the_body_is_refused():
    control = bytearray(wire.encode_control(PacketType.TOKEN, 1, ["x"]))
    struct.pack_into("!H", control, wire.PAD_AT, 1)
    with pytest.raises(DecodeError) as e:
        wire.decode_control(bytes(control))
    assert e.value.reason == "bad_pad"
    data = bytearray(wire.pack_header(PacketType.DATA, 0, 0, 1, 1, 1))
    struct.pack_into("!H", data, wire.PAD_AT, 100)
    with pytest.raises(DecodeError) as e:
        wire.decode_data(bytes(data))
    assert e.value.reason == "truncated"


def test_control_body_bound_enforced_by_encoder():
    with pytest.raises(ValueError, match="exceeds"):
        wire.encode_control(PacketType.TOKEN, 1, b"x" * (MAX_CONTROL_BODY + 1))
    body = b"x" * (MAX_CONTROL_BODY - 10)  # bin32 header: 5 bytes
    assert wire.decode_control(wire.encode_control(PacketType.TOKEN, 1, body))[1] == body


def test_control_roundtrip_int_keyed_map():
    body = {1: 5, 2: 7}  # e.g. a token's per-sender MaxContiguous
    assert wire.decode_control(wire.encode_control(PacketType.TOKEN, 3, body))[1] == body


@pytest.mark.parametrize("body", [list(range(5000)), "s" * 5000, {str(i): 0 for i in range(1100)}],
                         ids=["array5000", "str5000", "map1100"])
def test_control_encoder_and_decoder_agree_on_bounds(body):
    try:
        data = wire.encode_control(PacketType.NAK, 3, body)
    except ValueError:
        return  # refusing at the sender is a consistent outcome
    assert wire.decode_control(data)[1] == body


def test_control_and_data_decoders_refuse_each_other():
    ctl = wire.encode_control(PacketType.TOKEN, 1, [1, 2])
    with pytest.raises(DecodeError) as e:
        wire.decode_data(ctl)
    assert e.value.reason == "bad_type"
    data = wire.encode_datagram(PacketType.DATA, 1, 1, 1, [])
    with pytest.raises(DecodeError) as e:
        wire.decode_control(data)
    assert e.value.reason == "bad_type"


# ----------------------------------------------------------------------------------- fragments


@st.composite
def fragmented(draw):
    chunk = draw(st.integers(1, 3000))
    size = draw(st.integers(0, min(12_000, chunk * 60)))
    payload = draw(st.binary(min_size=size, max_size=size))
    msg = draw(wire_messages(payload=st.just(payload)))
    pieces = list(split(msg, chunk))
    count = len(pieces)
    dups = draw(st.lists(st.integers(0, count - 1), max_size=6))
    order = draw(st.permutations(list(range(count)) + dups))
    return msg, chunk, pieces, order


def fragment_datagrams(msg: WireMessage, pieces, ptype, sender, channel, dseq0) -> list[bytes]:
    out = []
    for i, ((total, index, count, chunk), chunk_bytes) in enumerate(pieces):
        piece = dataclasses.replace(msg, payload=chunk_bytes)
        out.append(wire.encode_fragment(ptype, sender, channel, (dseq0 + i) % 2**64,
                                        Fragment(piece, total, index, count, chunk)))
    return out


@SETTINGS
@given(case=fragmented(), ptype=data_types, sender=u32, channel=u16, dseq0=u64)
def test_fragments_reassemble_in_any_order(case, ptype, sender, channel, dseq0):
    msg, chunk, pieces, order = case
    total = len(msg.payload)
    count = len(pieces)
    assert count == max(1, -(-total // chunk))
    assert b"".join(p for _, p in pieces) == msg.payload
    datagrams = fragment_datagrams(msg, pieces, ptype, sender, channel, dseq0)

    reassembler = Reassembler(max_message=1 << 20, budget_bytes=1 << 22)
    seen: set[int] = set()
    results = []
    for index in order:
        header, frag = wire.decode_data(datagrams[index])
        assert isinstance(frag, Fragment)
        assert header.flags & FLAG_FRAGMENT and header.count == 1 and header.sender == sender
        assert (frag.total, frag.index, frag.count, frag.chunk) == pieces[index][0]
        assert frag.message.payload == pieces[index][1]
        whole = reassembler.add(header.sender, frag)
        complete_now = index not in seen and len(seen) == count - 1
        seen.add(index)
        if len(results) == 0:
            # nothing before the last distinct fragment, the message exactly then
            assert (whole is not None) == complete_now
        if whole is not None:
            results.append(whole)
    assert results and results[0] == msg
    # a duplicate arriving after completion may only ever yield the same message again
    assert all(r == msg for r in results)


@settings(max_examples=30, deadline=None)
@given(size=st.integers(60_000, 200_000), seed=st.integers(0, 2**32), head=wire_messages())
def test_fragments_of_the_runtime_chunk_size_fit_a_datagram(size, seed, head):
    """The runtime's chunk arithmetic (capacity minus fixed parts) yields datagrams within capacity."""
    msg = dataclasses.replace(head, payload=random.Random(seed).randbytes(size))
    capacity = 65_000 - 16
    chunk = capacity - HEADER.size - ROUTE_LEN.size - len(wire.encode_routes([msg.route])) \
        - wire.FRAGMENT.size - wire.run_size(1, 0)
    pieces = list(split(msg, chunk))
    datagrams = fragment_datagrams(msg, pieces, PacketType.DATA, 1, 1, 0)
    assert all(len(d) <= capacity for d in datagrams)
    r = Reassembler()
    out = [r.add(1, wire.decode_data(d)[1]) for d in reversed(datagrams)]
    assert out[-1] == msg and all(o is None for o in out[:-1])


# ----------------------------------------------------------------------------- untrusted input


def _decode_any(data: bytes):
    try:
        return wire.decode_data(data)
    except DecodeError as exc:
        assert exc.reason
        return None


@SETTINGS
@given(junk=st.binary(max_size=400))
def test_random_bytes_only_raise_decode_error(junk):
    _decode_any(junk)
    _decode_any(wire.MAGIC + bytes([wire.VERSION]) + junk)
    try:
        wire.decode_control(junk)
    except DecodeError:
        pass


@SETTINGS
@given(messages=message_lists(max_size=6).filter(bool), data=st.data())
def test_mutated_datagrams_only_raise_decode_error(messages, data):
    good = bytearray(wire.encode_datagram(PacketType.DATA, 1, 1, 1, messages))
    mutation = data.draw(st.sampled_from(["truncate", "flip", "extend"]))
    if mutation == "truncate":
        bad = bytes(good[:data.draw(st.integers(0, len(good) - 1))])
    elif mutation == "flip":
        i = data.draw(st.integers(0, len(good) - 1))
        good[i] ^= data.draw(st.integers(1, 255))
        bad = bytes(good)
    else:
        bad = bytes(good) + data.draw(st.binary(min_size=1, max_size=20))
    result = _decode_any(bad)
    if mutation in ("truncate", "extend"):
        assert result is None


@pytest.mark.parametrize("raw, reason", [
    (b"SC", "truncated"),
    (b"XX" + bytes(HEADER.size - 2), "bad_magic"),
    (HEADER.pack(b"SC", wire.VERSION - 1, 1, 0, 0, 0, 1, 0, 0, 0, 0), "bad_version"),
    (HEADER.pack(b"SC", wire.VERSION + 1, 1, 0, 0, 0, 1, 0, 0, 0, 0), "bad_version"),
    (HEADER.pack(b"SC", wire.VERSION, 99, 0, 0, 0, 1, 0, 0, 0, 0), "bad_type"),
    (HEADER.pack(b"SC", wire.VERSION, 1, 0, 0, 1, 1, 0, 0, 0, 0), "truncated"),
])
def test_header_errors_have_reasons(raw, reason):
    with pytest.raises(DecodeError) as e:
        wire.decode_data(raw)
    assert e.value.reason == reason


def _with_routes(routes_bytes: bytes, n_entries: int = 1) -> bytes:
    """A DATA datagram with a hand-made routing table and `n_entries` runs of one empty message
    (route 0)."""
    out = bytearray(wire.pack_header(PacketType.DATA, 0, n_entries, 1, 1, 1))
    out += ROUTE_LEN.pack(len(routes_bytes)) + routes_bytes
    for _ in range(n_entries):
        out += wire.RUN.pack(1, 1, 1, 1, 1, 1, 0, 0, 1) + wire.LENGTH.pack(0)
    return bytes(out)


@pytest.mark.parametrize("routes_value", [5, "ab", [5], [[5]], [["abc"]], [[["a", "b", "c"]]]],
                         ids=["int", "str", "list-int", "record-int", "record-str", "triple"])
def test_malformed_routing_table_is_bad_routes(routes_value):
    with pytest.raises(DecodeError) as e:
        wire.decode_data(_with_routes(msgpack.packb(routes_value)))
    assert e.value.reason == "bad_routes"


def test_route_index_out_of_table_is_bad_routes():
    data = bytearray(_with_routes(msgpack.packb([[["a", "b"]]])))
    struct.pack_into("!B", data, len(data) - wire.LENGTH.size - 3, 1)  # ridx byte of the run
    with pytest.raises(DecodeError) as e:
        wire.decode_data(bytes(data))
    assert e.value.reason == "bad_routes"


@pytest.mark.parametrize("record", [[[[1], "b"]], [[1, 2]], [[None, "b"]], ["ab"]],
                         ids=["nested-array", "ints", "nil", "two-char-str-as-pair"])
def test_routing_levels_must_be_string_pairs(record):
    with pytest.raises(DecodeError) as e:
        wire.decode_data(_with_routes(msgpack.packb([record])))
    assert e.value.reason == "bad_routes"


def test_long_member_names_roundtrip_or_are_refused_by_the_encoder():
    m = WireMessage(1, 2, 3, 4, 5, 6, 0, (("x" * 300, "y"),), b"payload")
    try:
        data = wire.encode_datagram(PacketType.DATA, 1, 1, 1, [m])
    except ValueError:
        return
    assert wire.decode_data(data)[1] == [m]


def test_empty_run_is_rejected():
    data = bytearray(_with_routes(msgpack.packb([[["a", "b"]]])))
    struct.pack_into("!H", data, len(data) - wire.LENGTH.size - 2, 0)  # the run's count
    with pytest.raises(DecodeError) as e:
        wire.decode_data(bytes(data[:-wire.LENGTH.size]))
    assert e.value.reason == "bad_run"


def test_own_messages_that_fill_a_datagram_alone_queue_as_lone_batches_in_order():
    """Feed.put_lone takes a message that fills a datagram alone (no two of its size fit) into
    the LoneBatch the queue ends with, or a new one after what is queued; smaller ones, end
    markers and another stamp are not put in; the way without GSO takes each as a chunk of the
    same datagram, in order with the chunks around it."""
    route = (("A", "A"),)
    table = wire.encode_route_table([route])
    capacity = 1472 - 28 - HEADER.size
    least, most = lone_sizes(capacity - len(table))
    feed = Feed(("127.0.0.1", 1), 1, DelayWindow(4 << 20, 0.005))
    sseq = 0

    def item(size: int, ctype: int = 0) -> tuple:
        nonlocal sseq
        sseq += 1
        return (sseq, 3, 1, sseq, ctype, bytes([sseq % 256]) * (size - wire.LENGTH.size))

    def put(size: int, ctype: int = 0):
        i = item(size, ctype)
        got = feed.put_lone(route, table, capacity, i, size, 7)
        if got is None:
            feed.put(route, table, capacity, True, i[1], 7, i[2], i[3], 7, i[0], i[4], i[5])
        return got

    first = put(most)
    assert first is not None and put(least + 1) is first and first.first_own == 1
    assert put(least) is None and put(most + 1) is None  # shares a datagram; fragmented
    assert put(most, ctype=wire.ContentType.END) is None
    second = put(1000)
    assert second is not None and second is not first and put(900) is second
    feed.stamp[0] += 1  # a later batch of publishes: its own stamp
    third = put(1000)
    assert third is not None and third is not second and third.stamp == feed.stamp[0]
    assert feed.take_plain(8) == []  # (the sealer's plain batches stop at a LoneBatch)
    assert feed.first_own() == 1
    feed.take_lone(1)
    assert feed.first_own() == 2
    order, sizes = [], []
    while feed.pending():
        chunk = feed.take()
        if chunk.oversized:  # (sent as fragments)
            order.append(chunk.first_own)
            sizes.append(chunk.queued())
            continue
        data = wire.encode_data(wire.PacketType.DATA, 7, 1, 1, chunk.table, len(chunk.runs),
                                [p for r in chunk.runs for p in r.parts()])
        assert len(data) + 28 <= 1472 and chunk.queued() == sum(
            len(r.payloads[0]) + wire.LENGTH.size for r in chunk.runs if r.__class__ is Run)
        for m in wire.decode_data(data)[1]:
            order.append(m.stream_seq)
            sizes.append(len(m.payload) + wire.LENGTH.size)
    assert order == list(range(2, sseq + 1))
    assert sizes == [least + 1, least, most + 1, most, 1000, 900, 1000]
