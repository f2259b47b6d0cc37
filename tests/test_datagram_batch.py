"""Batches of plain-run datagrams in C. The scan of a GRO receive call: consecutive authentic
plain runs of one stream become one run; anything else (a forged or damaged datagram, a datagram
that does not continue the one before, a control datagram, a mixed run, a fragment, garbage) ends
the scan, for the slow path to count or handle. The sealer's GSO batch: datagrams that `wire`
decodes and `auth` accepts, each padded to one segment but the last."""

from __future__ import annotations

import os

import pytest

from scopecast.netio import control_messages, wire
from scopecast.netio._datagram_batch import BatchScanner, BatchSealer
from scopecast.netio.auth import GmacAuthenticator, sealed

KEY = os.urandom(32)
TABLE = wire.encode_route_table([(("lan0", "h1"),)])
SEGMENT = 400


def datagram(dseq: int, seq: int, payloads: list[bytes], topic: int = 3, key: bytes = KEY,
             table: bytes = TABLE, ptype: int = wire.PacketType.DATA) -> bytes:
    """A signed single-run datagram, padded to SEGMENT as a GSO batch's are."""
    parts = wire.run_parts(topic, 9, 1, seq, 9, seq, 0, 0, payloads)
    body = wire.padded(wire.encode_data(ptype, 9, 1, dseq, table, 1, parts), SEGMENT - 28)
    return sealed(GmacAuthenticator(key), body)


def stream(n: int, per: int = 2) -> list[bytes]:
    return [datagram(d, 1 + (d - 1) * per, [b"%d" % (d * 10 + i) for i in range(per)])
            for d in range(1, n + 1)]


def test_consecutive_plain_runs_are_one_run():
    got = BatchScanner(KEY).scan(b"".join(stream(5)), SEGMENT, 0)
    (end, n, sender, channel, first_dseq, last_dseq, flags, table, topic, source, session, first,
     stream_, first_sseq, ctype, lengths, payloads) = got
    assert (end, n, sender, channel, first_dseq, last_dseq) == (5 * SEGMENT, 5, 9, 1, 1, 5)
    assert (topic, source, session, first, stream_, first_sseq, ctype) == (3, 9, 1, 1, 9, 1, 0)
    assert table == TABLE[2:]
    want = [b"%d" % (d * 10 + i) for d in range(1, 6) for i in range(2)]
    assert lengths == tuple(map(len, want)) and payloads == b"".join(want)


def test_a_shorter_last_segment_is_read():
    short = datagram(3, 5, [b"x"])
    body = short[:-28].rstrip(b"\0")  # unpadded: a GSO batch's last datagram
    body = body[:wire.PAD_AT] + b"\0\0" + body[wire.PAD_AT + 2:]
    last = sealed(GmacAuthenticator(KEY), body)
    got = BatchScanner(KEY).scan(b"".join(stream(2)) + last, SEGMENT, 0)
    assert got[1] == 3 and got[0] == 2 * SEGMENT + len(last) and got[16].endswith(b"x")


@pytest.mark.parametrize("spoil", ["mac", "key", "seq", "dseq", "topic", "table", "type"])
def test_the_scan_ends_before_a_datagram_that_does_not_continue(spoil):
    segs = stream(4)
    third = {"mac": lambda: bytes([segs[2][0]]) + segs[2][1:-1] + bytes([segs[2][-1] ^ 1]),
             "key": lambda: datagram(3, 5, [b"30", b"31"], key=os.urandom(32)),
             "seq": lambda: datagram(3, 6, [b"30", b"31"]),
             "dseq": lambda: datagram(4, 5, [b"30", b"31"]),
             "topic": lambda: datagram(3, 5, [b"30", b"31"], topic=4),
             "table": lambda: datagram(3, 5, [b"30", b"31"],
                                       table=wire.encode_route_table([(("lan1", "h1"),)])),
             "type": lambda: datagram(3, 5, [b"30", b"31"], ptype=wire.PacketType.REPAIR),
             }[spoil]()
    buf = b"".join([segs[0], segs[1], third, segs[3]])
    scanner = BatchScanner(KEY)
    got = scanner.scan(buf, SEGMENT, 0)
    assert got[:2] == (2 * SEGMENT, 2)
    restarted = scanner.scan(buf, SEGMENT, 2 * SEGMENT)
    if spoil in ("mac", "key", "type"):
        assert restarted is None  # the slow path takes it (and counts a forged one)
    else:  # authentic, only not next: a scan of its own
        assert restarted[1] >= 1


def test_other_datagrams_and_garbage_are_left_to_the_slow_path():
    signer = GmacAuthenticator(KEY)
    control = wire.encode_control(wire.PacketType.CONTROL, 9,
                                  control_messages.encode(control_messages.Ack(1, 2, 0))[1])
    mixed_msgs = [wire.WireMessage(t, 9, 1, 1, 9, 1 + i, 0, (("a", "b"),), b"p")
                  for i, t in enumerate((3, 4))]
    mixed = wire.encode_datagram(wire.PacketType.DATA, 9, 1, 1, mixed_msgs)
    two_runs = wire.encode_datagram(wire.PacketType.DATA, 9, 1, 1, [
        wire.WireMessage(3, 9, 1, 1, 9, 1, 0, (("a", "b"),), b"p"),
        wire.WireMessage(3, 9, 1, 1, 8, 1, 0, (("a", "b"),), b"q")])
    scanner = BatchScanner(KEY)
    for body in (control, mixed, two_runs):
        assert scanner.scan(sealed(signer, body), SEGMENT, 0) is None
    for junk in (b"", b"SC", os.urandom(SEGMENT), bytes(SEGMENT), stream(1)[0][:60]):
        assert scanner.scan(junk, SEGMENT, 0) is None
    with pytest.raises(ValueError):
        scanner.scan(stream(1)[0], 0, 0)
    with pytest.raises(ValueError):
        BatchScanner(b"short")


def test_a_sealed_batch_is_what_wire_and_auth_make():
    runs = [(3, 9, 1, 1, 9, 1, 0, [b"a" * 100, b"b" * 7], 111),
            (3, 9, 1, 3, 9, 3, 0, [b"c" * 300], 222), (3, 9, 1, 4, 9, 4, 0, [b"d" * 10], 333)]
    sealer = BatchSealer(KEY)
    data, segment = sealer.seal(9, 1, 5, wire.FLAG_ACK_NOW, TABLE, runs)
    largest = wire.HEADER.size + len(TABLE) + wire.RUN.size + 4 + 300 + 28
    assert segment == largest and len(data) > 2 * segment
    checker = GmacAuthenticator(KEY)
    seen = []
    for i in range(0, len(data), segment):
        d = data[i:i + segment]
        assert checker.open(d, len(d) - 28) is not None
        header, messages = wire.decode_data(memoryview(d)[:len(d) - 28])
        assert (header.sender, header.channel, header.flags) == (9, 1, wire.FLAG_ACK_NOW)
        assert header.stamp == 111 * (header.dseq - 4)  # each datagram its run's stamp
        seen += [(header.dseq, m.topic_id, m.seq, m.stream_seq, m.route, m.payload)
                 for m in messages]
    assert seen == [(5, 3, 1, 1, (("lan0", "h1"),), b"a" * 100), (5, 3, 2, 2, (("lan0", "h1"),),
                    b"b" * 7), (6, 3, 3, 3, (("lan0", "h1"),), b"c" * 300),
                    (7, 3, 4, 4, (("lan0", "h1"),), b"d" * 10)]
    got = BatchScanner(KEY).scan(data, segment, 0)  # and the receiver reads it as one run
    assert got[1] == 3 and got[15] == (100, 7, 300, 10)
    again, _ = sealer.seal(9, 1, 5, 0, TABLE, runs)
    assert again[-28:-16] != data[-28:-16]  # a fresh nonce per datagram
    one, no_segment = sealer.seal(9, 1, 8, 0, TABLE, runs[:1])
    assert no_segment == 0 and checker.open(one, len(one) - 28) is not None
    # payloads may be views (the DataFrame publisher queues them): the same datagram's content
    viewed, _ = sealer.seal(9, 1, 8, 0, TABLE, [(3, 9, 1, 1, 9, 1, 0, [
        memoryview(b"xa" * 100)[1::1][1:101], bytearray(b"b" * 7)], 1)])
    header, messages = wire.decode_data(memoryview(viewed)[:len(viewed) - 28])
    assert [m.payload for m in messages] == [(b"xa" * 100)[2:102], b"b" * 7]


def test_the_sealer_refuses_what_is_not_a_batch_of_plain_runs():
    sealer = BatchSealer(KEY)
    for runs in ([], [(3, 9, 1, 1, 9, 1, 0, [], 1)], [(3, 9, 1, 1, 9, 1, 0, [17], 1)],
                 [(3, 9, 1, 1, 9, 1, 0, [bytes(70_000)], 1)], [(3, 9)],
                 [(3, 9, 1, 1, 9, 1, 0, [b"no stamp"])]):
        with pytest.raises((ValueError, TypeError)):
            sealer.seal(9, 1, 1, 0, TABLE, runs)


def test_a_sealed_batch_of_fragments_is_what_wire_makes_and_reassembles():
    """A message larger than a datagram goes as fragments built in C (sealed_batches):
    each a FRAGMENT datagram as wire.encode_data makes it, and together the whole message."""
    from scopecast.netio.reassembly import Reassembler

    payload = os.urandom(2500)
    pieces = list(wire.fragments(payload, 1000))
    runs = [(3, 9, 1, 7, 9, 7, 0, [memoryview(payload)[f[1] * 1000:(f[1] + 1) * 1000]], 55, f)
            for f, _piece in pieces]
    data, segment = BatchSealer(KEY).seal(9, 1, 20, 0, TABLE, runs)
    checker = GmacAuthenticator(KEY)
    reassembler = Reassembler(1 << 20, 1 << 22, 5.0)
    whole = None
    for i, (frag, piece) in enumerate(pieces):
        d = data[i * segment:(i + 1) * segment]
        assert checker.open(d, len(d) - 28) is not None
        body = wire.unpadded(memoryview(d)[:len(d) - 28], wire.unpack_header(d))
        expect = wire.encode_data(wire.PacketType.DATA, 9, 1, 20 + i, TABLE, 1,
                                  wire.run_parts(3, 9, 1, 7, 9, 7, 0, 0, [piece]), frag, 0, 55)
        assert bytes(body) == expect
        header, fragment = wire.decode_data(body)
        assert header.flags & wire.FLAG_FRAGMENT and header.dseq == 20 + i
        whole = reassembler.add(9, fragment)
    assert whole is not None and whole.payload == payload and whole.seq == 7
    with pytest.raises(ValueError):  # a fragment is one payload
        BatchSealer(KEY).seal(9, 1, 1, 0, TABLE, [(3, 9, 1, 1, 9, 1, 0, [b"a", b"b"], 1,
                                                   (2, 0, 1, 1))])
    with pytest.raises(ValueError):  # its index below its count
        BatchSealer(KEY).seal(9, 1, 1, 0, TABLE, [(3, 9, 1, 1, 9, 1, 0, [b"a"], 1, (1, 1, 1, 1))])


def test_a_messages_fragments_in_one_receive_call_are_read_as_the_message():
    payload = os.urandom(2500)
    runs = [(3, 9, 1, 7, 9, 7, 0, [payload[f[1] * 1000:(f[1] + 1) * 1000]], 55, f)
            for f, _ in wire.fragments(payload, 1000)]
    plain = (3, 9, 1, 8, 9, 8, 0, [b"next"], 56)
    data, segment = BatchSealer(KEY).seal(9, 1, 20, wire.FLAG_ACK_NOW, TABLE, runs + [plain])
    scanner = BatchScanner(KEY)
    got = scanner.scan(data, segment, 0)
    (end, n, sender, channel, first_dseq, last_dseq, flags, _table, topic, source, session, seq,
     stream, sseq, ctype, lengths, payloads) = got
    assert (end, n, first_dseq, last_dseq, seq, sseq) == (3 * segment, 3, 20, 22, 7, 7)
    assert lengths == (2500,) and payloads == payload
    assert flags == wire.FLAG_ACK_NOW  # (not the fragment flag: what is read is a message)
    assert scanner.scan(data, segment, end)[15] == (4,)  # the plain run after it, on its own
    # not from its first fragment, or one missing: the slow path's (its reassembler)
    assert scanner.scan(data, segment, segment) is None
    gap = data[:segment] + data[2 * segment:3 * segment]
    assert scanner.scan(gap, segment, 0) is None
    assert scanner.scan(data[:2 * segment], segment, 0) is None  # the last not here yet


def test_an_encrypting_cluster_s_batches_hide_payloads_and_read_back_as_python_seals_them():
    """connect(encrypt=True): the sealer encrypts everything after each header, the scanner
    decrypts (leaving the receive buffer as it came: a segment it stops at is read again by the
    slow path), and both agree with auth's aes-256-gcm sealer; a GMAC scanner, or another key,
    reads none of it."""
    from scopecast.netio.auth import GcmSealer

    secret = b"secret payload %d"
    runs = [(3, 9, 1, 1 + i, 9, 1 + i, 0, [secret % i], 7) for i in range(4)]
    data, segment = BatchSealer(KEY, True).seal(9, 1, 1, 0, TABLE, runs)
    assert b"secret" not in data and TABLE[2:] not in data
    python = GcmSealer(KEY, encrypt=True)
    for i in range(4):
        d = data[i * segment:(i + 1) * segment]
        plain = python.open(d, len(d) - 28)
        assert plain is not None and secret % i in plain and d[:28] == plain[:28]
    buf = bytes(data)
    got = BatchScanner(KEY, True).scan(buf, segment, 0)
    assert got[1] == 4 and got[16] == b"".join(secret % i for i in range(4))
    assert buf == data  # decrypted aside
    assert BatchScanner(KEY).scan(data, segment, 0) is None
    assert BatchScanner(os.urandom(32), True).scan(data, segment, 0) is None
    # Python's seal, C's scan (a datagram the slow path sent, a batch of one)
    parts = wire.run_parts(3, 9, 1, 5, 9, 5, 0, 0, [b"from python"])
    body, trailer = python.seal(wire.encode_data(wire.PacketType.DATA, 9, 1, 5, TABLE, 1, parts))
    one = bytes(body) + trailer
    assert b"from python" not in one
    assert BatchScanner(KEY, True).scan(one, len(one), 0)[16] == b"from python"


def test_lone_messages_are_sealed_one_datagram_each_as_seal_makes_them():
    """seal_lone: the own-stream cache's items from `start`, each a one-message run of its own
    datagram; what seal makes of the same runs, and the payload bytes besides."""
    items = [(100 + i, 3 + i % 2, 1, 50 + i, 0, bytes([65 + i]) * (700 + i)) for i in range(6)]
    sealer, checker = BatchSealer(KEY), GmacAuthenticator(KEY)
    data, segment, payload = sealer.seal_lone(9, 1, 20, wire.FLAG_ACK_NOW, TABLE, 9, 9, 77,
                                              items, 2, 3)
    assert payload == 702 + 703 + 704
    runs = [(t, 9, s, seq, 9, sseq, c, [p], 77) for sseq, t, s, seq, c, p in items[2:5]]
    same, same_segment = sealer.seal(9, 1, 20, wire.FLAG_ACK_NOW, TABLE, runs)
    last = wire.HEADER.size + len(TABLE) + wire.RUN.size + 4 + 704 + 28
    assert (len(data), segment) == (len(same), same_segment) == (3 * last, last)  # (the largest, last)
    seen = []
    for i in range(0, len(data), segment):
        d = data[i:i + segment]
        assert checker.open(d, len(d) - 28) is not None
        assert d[:-28] == same[i:i + segment][:-28]  # (the nonce and tag differ)
        header, messages = wire.decode_data(memoryview(d)[:len(d) - 28])
        assert header.stamp == 77 and len(messages) == 1
        seen += [(header.dseq, m.topic_id, m.seq, m.stream_seq, m.payload) for m in messages]
    assert seen == [(20 + i, 3 + (2 + i) % 2, 52 + i, 102 + i, bytes([67 + i]) * (702 + i))
                    for i in range(3)]
    for bad in ((items, 4, 3), (items, -1, 1), (items, 0, 0), ([(1, 2)], 0, 1),
                ([(1, 2, 3, 4, 5, 17)], 0, 1), ([(1, 2, 3, 4, 5, bytes(70_000))], 0, 1)):
        with pytest.raises((ValueError, TypeError)):
            sealer.seal_lone(9, 1, 1, 0, TABLE, 9, 9, 1, *bad)
