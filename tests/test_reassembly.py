"""Unit tests of fragment reassembly (scopecast/netio/reassembly.py): untrusted fragments are refused
with a reason, memory stays within the budget and incomplete messages expire (injectable clock)."""

from __future__ import annotations

import pytest

from scopecast.netio import wire
from scopecast.netio.reassembly import Reassembler, ReassemblyError
from scopecast.netio.wire import Fragment, WireMessage

ROUTE = (("a", "a"),)


def split(msg: WireMessage, chunk: int) -> list:
    """`wire.fragments` pieces of a message's payload."""
    return list(wire.fragments(msg.payload, chunk))

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def message(payload: bytes, stream_seq: int = 1, source: int = 2) -> WireMessage:
    return WireMessage(7, source, 1, stream_seq, source, stream_seq, 0, ROUTE, payload)


def pieces(msg: WireMessage, chunk: int) -> list[Fragment]:
    out = []
    for (total, index, count, ch), data in split(msg, chunk):
        piece = WireMessage(msg.topic_id, msg.source, msg.session, msg.seq, msg.stream,
                            msg.stream_seq, msg.content_type, msg.route, data)
        out.append(Fragment(piece, total, index, count, ch))
    return out


def reason(excinfo) -> str:
    return excinfo.value.reason


def test_in_order_and_reverse_reassembly():
    payload = bytes(range(256)) * 10
    for order in (lambda fs: fs, lambda fs: list(reversed(fs))):
        r = Reassembler()
        frags = order(pieces(message(payload), 300))
        results = [r.add(1, f) for f in frags]
        assert all(x is None for x in results[:-1])
        assert results[-1] == message(payload)
        assert r.bytes_held == 0 and len(r) == 0


def test_duplicate_fragment_is_ignored_while_incomplete():
    r = Reassembler()
    f = pieces(message(b"x" * 1000), 400)
    assert r.add(1, f[0]) is None
    assert r.add(1, f[0]) is None
    assert r.add(1, f[1]) is None
    assert r.bytes_held == 1000
    assert r.add(1, f[2]) == message(b"x" * 1000)
    assert r.bytes_held == 0


def test_empty_message_as_one_fragment():
    r = Reassembler()
    (f,) = pieces(message(b""), 100)
    assert (f.total, f.count) == (0, 1)
    assert r.add(1, f) == message(b"")
    assert r.bytes_held == 0


def test_interleaved_messages_of_several_senders_are_kept_apart():
    r = Reassembler()
    a, b = message(b"A" * 900), message(b"B" * 900)
    fa, fb = pieces(a, 300), pieces(b, 300)
    # same source/stream/stream_seq but different forwarding sender: two messages
    out = []
    for x, y in zip(fa, fb, strict=True):
        out += [r.add(1, x), r.add(2, y)]
    assert out[-2:] == [a, b]
    assert r.bytes_held == 0


# ------------------------------------------------------------------------------------ refusals


def test_oversized_total_rejected():
    r = Reassembler(max_message=1000)
    f = pieces(message(b"x" * 1001), 500)[0]
    with pytest.raises(ReassemblyError) as e:
        r.add(1, f)
    assert reason(e) == "oversized"
    assert r.bytes_held == 0 and len(r) == 0
    # exactly max_message is fine
    assert [r.add(1, p) for p in pieces(message(b"y" * 1000), 500)][-1] == message(b"y" * 1000)


def _frag(total: int, index: int, count: int, chunk: int, n: int, stream_seq: int = 1) -> Fragment:
    return Fragment(message(b"z" * n, stream_seq), total, index, count, chunk)


@pytest.mark.parametrize("fields", [
    (1000, 0, 3, 0, 0),        # chunk 0
    (1000, 0, 3, -5, 0),       # negative chunk
    (1000, 0, 5, 400, 400),    # count disagrees with total/chunk (should be 3)
    (1000, 3, 3, 400, 200),    # index past the last fragment
    (1000, -1, 3, 400, 400),   # negative index
    (1000, 0, 3, 400, 399),    # payload shorter than the chunk
    (1000, 2, 3, 400, 400),    # last fragment longer than the remainder (200)
    (1000, 2, 3, 400, 100),    # last fragment shorter than the remainder
    (0, 0, 1, 100, 1),         # empty message carrying a byte
], ids=["chunk0", "chunk-neg", "count", "index-high", "index-neg", "short", "last-long",
        "last-short", "empty-with-data"])
def test_inconsistent_fragment_fields_rejected(fields):
    r = Reassembler()
    with pytest.raises(ReassemblyError) as e:
        r.add(1, _frag(*fields))
    assert reason(e) == "bad_fragment"
    assert r.bytes_held == 0 and len(r) == 0


def test_fragment_disagreeing_with_its_partial_rejected():
    r = Reassembler()
    assert r.add(1, _frag(1000, 0, 3, 400, 400)) is None
    with pytest.raises(ReassemblyError) as e:
        r.add(1, _frag(2000, 1, 5, 400, 400))  # a different total for the same message
    assert reason(e) == "bad_fragment"
    # the partial is untouched: the consistent rest still completes it
    assert r.add(1, _frag(1000, 1, 3, 400, 400)) is None
    assert r.add(1, _frag(1000, 2, 3, 400, 200)).payload == b"z" * 1000
    assert r.bytes_held == 0


def test_a_message_cut_another_way_completes_it_and_ends_the_first_cut():
    """The data path and a repair cut a message to different chunk sizes (their routing tables
    differ): the repair's fragments complete the message whose original fragment was lost."""
    r = Reassembler()
    msg = message(bytes(range(250)) * 4)
    original, repair = pieces(msg, 400), pieces(msg, 300)
    assert r.add(1, original[0]) is None and r.add(1, original[2]) is None  # [1] was lost
    assert r.bytes_held == 1000
    out = [r.add(1, f) for f in repair]
    assert out[-1] == msg and all(o is None for o in out[:-1])
    assert r.bytes_held == 0 and len(r) == 0  # the first cut ended with it
    assert r.expire() == 0


def test_budget_exceeded_rejected_and_recovers():
    r = Reassembler(max_message=10_000, budget_bytes=2500)
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=1)) is None
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=2)) is None
    assert r.bytes_held == 2000
    with pytest.raises(ReassemblyError) as e:
        r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=3))
    assert reason(e) == "reassembly_budget"
    assert r.bytes_held == 2000 and len(r) == 2
    # fragments of messages already held are still taken
    assert r.add(1, _frag(1000, 1, 2, 500, 500, stream_seq=1)).stream_seq == 1
    assert r.bytes_held == 1000
    # and the freed room admits a new one
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=3)) is None
    assert r.bytes_held == 2000


def test_budget_counts_whole_message_not_fragments_received():
    r = Reassembler(max_message=1 << 20, budget_bytes=50_000)
    with pytest.raises(ReassemblyError) as e:
        r.add(1, _frag(60_000, 0, 60, 1000, 1000))
    assert reason(e) == "reassembly_budget"
    assert r.bytes_held == 0


# -------------------------------------------------------------------------------------- timeouts


def test_timeout_expires_partials_and_frees_memory():
    clock = Clock()
    r = Reassembler(timeout=5.0, clock=clock)
    for s in range(1, 4):
        assert r.add(1, _frag(1000, 0, 3, 400, 400, stream_seq=s)) is None
    clock.now += 2.0
    assert r.add(1, _frag(500, 0, 2, 400, 400, stream_seq=9)) is None
    assert r.bytes_held == 3500
    assert r.expire() == 0
    clock.now += 3.0  # the first three reached their deadline, the fourth has 2 s left
    assert r.expire() == 3
    assert r.bytes_held == 500 and len(r) == 1
    clock.now += 2.0
    assert r.expire() == 1
    assert r.bytes_held == 0 and len(r) == 0
    assert r.expire() == 0


def test_late_fragment_after_expiry_starts_over():
    clock = Clock()
    r = Reassembler(timeout=1.0, clock=clock)
    f = pieces(message(b"q" * 900), 300)
    assert r.add(1, f[0]) is None
    assert r.add(1, f[1]) is None
    clock.now += 1.5
    assert r.expire() == 1
    # the third fragment alone does not complete the expired message
    assert r.add(1, f[2]) is None
    assert r.bytes_held == 900
    assert r.add(1, f[0]) is None
    assert r.add(1, f[1]) == message(b"q" * 900)
    assert r.bytes_held == 0


def test_expiry_makes_room_in_the_budget():
    clock = Clock()
    r = Reassembler(budget_bytes=1000, timeout=1.0, clock=clock)
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=1)) is None
    with pytest.raises(ReassemblyError):
        r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=2))
    clock.now += 1.0
    # a new message triggers expiry of the old one, which frees the budget
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=2)) is None
    assert r.bytes_held == 1000 and len(r) == 1


def test_every_expired_partial_is_reported_once():
    clock = Clock()
    r = Reassembler(timeout=1.0, clock=clock)
    reported = 0
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=1)) is None
    clock.now += 2.0
    # a fragment of a new message arrives before the runtime's periodic expire() runs
    assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=2)) is None
    reported += r.expire()
    clock.now += 2.0
    reported += r.expire()
    assert reported == 2


def test_expiries_found_while_adding_are_each_reported_once():
    clock = Clock()
    r = Reassembler(timeout=1.0, clock=clock)
    for s in range(1, 4):  # each new message finds the one before it expired
        assert r.add(1, _frag(1000, 0, 2, 500, 500, stream_seq=s)) is None
        clock.now += 2.0
    assert r.expire() == 3
    assert r.expire() == 0
