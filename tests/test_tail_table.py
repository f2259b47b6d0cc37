"""TailTable: a sender's per-stream tails, in C and in the pure-Python fallback alike (pure logic,
against the dict of lists it replaced as the model)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopecast.netio import _tail_table, _tail_table_py
from scopecast.netio.recovery_records import RECORD_ENTRY

# every test runs over both implementations (see scopecast.netio.native)
pytestmark = pytest.mark.parametrize("impl", [pytest.param(_tail_table, id="C"),
                                              pytest.param(_tail_table_py, id="python")])


def model_note(tails: dict, entries: list) -> list:
    """The dict version: each sent entry ends its stream, and starts its unstable part if it
    had none; the keys met for the first time."""
    made = []
    for sseq, topic, session, seq, _c, _p in entries:
        tail = tails.get((topic, session))
        if tail.__class__ is not list:
            if tail is None:
                made.append((topic, session))
            tail = tails[(topic, session)] = [seq, sseq, seq, sseq]
        tail[2], tail[3] = seq, sseq
    return made


def model_release(tails: dict, entries: list) -> int:
    """The dict version: each stream's unstable part starts after its last released entry."""
    for (topic, session), (sseq, _t, _s, seq, _c, _p) in {(e[1], e[2]): e for e in entries}.items():
        tail = tails.get((topic, session))
        if tail.__class__ is list:
            if seq >= tail[2]:
                tails[(topic, session)] = seq
            else:
                tail[0], tail[1] = seq + 1, sseq + 1
    return sum(len(e[5]) for e in entries)


def model_record(tails: dict, cache: list, head: int, handed: int, scan: int, limit: int):
    """The Python version (recovery_path before record() was in C): every unstable stream when
    there are at most `limit`; else those of the oldest unstable messages, first met first, and
    the stream seq up to which every message looked at is of one of them."""
    if len(tails) <= limit:
        return {k: t for k, t in tails.items() if t.__class__ is list}, handed
    keys: dict = {}
    horizon, scanned = handed, 0
    for e in cache[head:head + scan]:
        if e[0] > handed:
            break
        if (e[1], e[2]) not in keys:
            if len(keys) == limit:
                horizon = e[0] - 1
                break
            keys[(e[1], e[2])] = None
        scanned += 1
        if scanned == scan:
            horizon = e[0]
    return [(k, tails[k]) for k in keys if tails[k].__class__ is list], horizon


def unpacked(named: bytes) -> list:
    return [((t, s), [fs, fss, ls, lss]) for t, s, fs, fss, ls, lss in
            RECORD_ENTRY.iter_unpack(named)]


streams = st.tuples(st.integers(1, 6), st.integers(1, 3)) | st.tuples(  # (topic 0: wire.MIXED)
    st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1)) | st.just((2**32 - 1, 2**32 - 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(streams, max_size=40), st.integers(0, 50)), max_size=30))
def test_sending_and_releasing_read_as_the_dict_it_replaced(impl, rounds):
    """Rounds of sent messages (streams numbered on from 1 each) and releases of a prefix of
    what is unstable leave the same tails, in the same two shapes, as the dict of lists."""
    table, model, seqs = impl.TailTable(), {}, {}
    cache: list = []
    head = 0
    for sent, released in rounds:
        start = len(cache)
        for key in sent:
            seqs[key] = seqs.get(key, 0) + 1
            cache.append((len(cache) + 1, *key, seqs[key], 0, b"x" * (key[0] % 7)))
        assert table.note(cache, start) == model_note(model, cache[start:])
        stop = min(len(cache), head + released)
        assert table.release(cache, head, stop) == model_release(model, cache[head:stop])
        head = stop
        assert dict(table.items()) == model and len(table) == len(model)
        for handed, scan, limit in ((len(cache), 4096, 256), (len(cache) - 3, 7, 3),
                                    (len(cache), 2, 5)):
            named, horizon = table.record(cache, head, handed, scan, limit)
            want, want_horizon = model_record(model, cache, head, handed, scan, limit)
            got = dict(unpacked(named)) if isinstance(want, dict) else unpacked(named)
            assert (got, horizon) == (want, want_horizon)
    for key, tail in list(model.items())[:20]:
        assert table[key] == tail and table.get(key) == tail and key in table


def test_set_read_and_refused(impl):
    """Set by hand (tests, join points), read back; what is not a stream is refused or absent."""
    table = impl.TailTable()
    table[(7, 2)] = [1, 2, 3, 4]
    table[(8, 1)] = 9
    table[(2**32 - 1, 2**32 - 1)] = 5  # the largest key
    assert table[(7, 2)] == [1, 2, 3, 4] and table[(8, 1)] == 9 and len(table) == 3
    assert table[(2**32 - 1, 2**32 - 1)] == 5
    assert table.get((9, 1)) is None and table.get((9, 1), 0) == 0 and table.get("x") is None
    assert (7, 3) not in table and 7 not in table
    with pytest.raises(KeyError):
        table[(9, 1)]
    with pytest.raises(OverflowError):
        table[(2**32, 1)] = 1
    with pytest.raises(ValueError):  # wire.MIXED, no stream's topic
        table[(0, 1)] = 1
    with pytest.raises(TypeError):
        table[(1, 1)] = [1, 2, 3]
    with pytest.raises(TypeError):
        del table[(7, 2)]
    for seqs in (2**62, [1, 2, 2**63 - 1, 4], [-1, 2, 3, 4]):  # outside wire.SEQ_LIMIT
        with pytest.raises(ValueError):
            table[(7, 2)] = seqs
    with pytest.raises(IndexError):
        table.release([(1, 7, 2, 1, 0, b"")], 0, 2)
    with pytest.raises(IndexError):
        table.release([(1, 7, 2, 1, 0, b"")], -1, 1)
    with pytest.raises(IndexError):
        table.note([(1, 7, 2, 1, 0, b"")], -1)
    with pytest.raises(TypeError):
        table.note([("not", "an", "entry", 1)], 0)
    with pytest.raises(IndexError):
        table.record([], 1, 5, 10, 2)
    with pytest.raises(ValueError):
        table.record([], 0, 5, 10, 0)
    with pytest.raises(TypeError):  # more streams than the limit: the cache is read
        table.record([("not", "an", "entry", 1)], 0, 5, 10, 2)
    assert table[(7, 2)] == [1, 2, 3, 4] and len(table) == 3


def test_ten_thousand_streams_grow_the_table_and_stay_found(impl):
    table = impl.TailTable()
    cache = [(i + 1, 1 + i % 10_000, 1, 1 + i // 10_000, 0, b"") for i in range(30_000)]
    assert len(table.note(cache, 0)) == 10_000
    table.release(cache, 0, 25_000)  # topics 1..5,000 wholly stable, the rest from seq 3 on
    assert table[(1, 1)] == 3 and table[(10_000, 1)] == [3, 20_001, 3, 30_000]
    named, horizon = table.record(cache, 25_000, 30_000, 4096, 256)  # the oldest 256 streams
    assert unpacked(named)[:2] == [((5_001, 1), [3, 15_002, 3, 25_001]),
                                   ((5_002, 1), [3, 15_003, 3, 25_002])]
    assert len(named) == 256 * RECORD_ENTRY.size and horizon == 25_256
