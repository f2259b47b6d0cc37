"""SeqTable, NameTable, take_mixed and mixed_parts: a receiver's per-topic numbers of one source
session, its intake of mixed runs and a sender's packing of them, in C and in the pure-Python
fallback alike (pure logic, against dicts and `struct` as the models)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopecast.netio import _seq_table, _seq_table_py, wire

# every test runs over both implementations (see scopecast.netio.native)
pytestmark = pytest.mark.parametrize("impl", [pytest.param(_seq_table, id="C"),
                                              pytest.param(_seq_table_py, id="python")])

topic_ids = st.integers(1, 2**32 - 1)
values = st.integers(-(2**63), 2**63 - 1)


NAMES = {t: f"t{t}" for t in (5, 6, 7, 9)}


def payload(i: int) -> bytes:
    return b"%c" % (65 + i % 26) * i


def mixed(*messages: tuple[int, int]) -> tuple[bytes, int, int]:
    """A mixed run as it lies in a datagram, between other bytes: (the datagram, the offset of
    its first payload, its count), as wire.iter_runs gives them. Payload i is i bytes."""
    entries = b"".join(wire.MIXED_ENTRY.pack(t, q, i) for i, (t, q) in enumerate(messages))
    payloads = b"".join(payload(i) for i in range(len(messages)))
    return b"header" + entries + payloads + b"mac", 6 + len(entries), len(messages)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(topic_ids | st.integers(1, 40), values), max_size=300))
def test_it_reads_as_a_dict_of_the_same_puts_in_insertion_order(impl, puts):
    table, model = impl.SeqTable(), {}
    for topic, value in puts:
        table[topic] = value
        model[topic] = value
    assert len(table) == len(model)
    assert table.items() == list(model.items()) and list(table) == list(model)
    for topic in list(model)[:50]:
        assert table[topic] == model[topic] and table.get(topic) == model[topic] and topic in table
    assert table.keys_after(len(model) // 2) == list(model)[len(model) // 2:]
    assert table.keys_after(len(model) + 5) == [] and table.keys_after(-1) == list(model)


def test_missing_keys_and_values_out_of_range(impl):
    table = impl.SeqTable()
    table[7] = 1
    assert table.get(8) is None and table.get(8, 0) == 0 and 8 not in table
    assert table.get(-1) is None and table.get(2**40, 5) == 5 and "7" not in table
    with pytest.raises(KeyError):
        table[8]
    with pytest.raises(OverflowError):
        table[2**32] = 1  # not a topic id
    with pytest.raises(OverflowError):
        table[7] = 2**63  # beyond 64 bits
    with pytest.raises(TypeError):
        del table[7]  # keys are never taken out
    assert table[7] == 1 and len(table) == 1


def test_a_run_each_next_of_its_topic_moves_every_topic_and_records_its_stream_seq(impl):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    nxt[5], nxt[6], nxt[7] = 10, 1, 4
    taken = impl.take_mixed(nxt, last, impl.NameTable(NAMES), *mixed((5, 10), (6, 1), (7, 4)), 100)
    assert taken == (["t5", "t6", "t7"], [10, 1, 4], [b"", b"B", b"CC"], 3)
    assert nxt.items() == [(5, 11), (6, 2), (7, 5)]
    assert last.items() == [(5, 100), (6, 101), (7, 102)]


def test_a_topic_twice_in_a_run_is_in_order_when_its_seqs_follow_on(impl):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    nxt[5], nxt[6] = 3, 8
    run = mixed((5, 3), (6, 8), (5, 4))
    names, seqs, _, _ = impl.take_mixed(nxt, last, impl.NameTable(NAMES), *run, 20)
    assert names == ["t5", "t6", "t5"] and seqs == [3, 8, 4]
    assert nxt[5] == 5 and nxt[6] == 9 and last[5] == 22 and last[6] == 21


@pytest.mark.parametrize("run", [
    mixed((5, 3), (6, 9)),             # the second is ahead of its topic
    mixed((5, 3), (6, 8), (5, 3)),     # a duplicate within the run
    mixed((5, 3), (9, 2)),             # a topic never started, and this not its first
    mixed((5, 3), (8, 1)),             # a topic without a name here
    mixed((5, 2), (6, 8)),             # the first one already taken
    (mixed((5, 3), (6, 8), (6, 9))[0][:-6], 6 + 48, 3),  # payloads cut short
])
def test_a_run_not_wholly_taken_changes_nothing(impl, run):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    nxt[5], nxt[6], nxt[8] = 3, 8, 1
    last[5] = 7
    assert impl.take_mixed(nxt, last, impl.NameTable(NAMES), *run, 20) is None
    assert nxt.items() == [(5, 3), (6, 8), (8, 1)] and last.items() == [(5, 7)]


def test_a_topics_first_message_starts_its_topic_and_a_second_first_is_a_duplicate(impl):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    nxt[5] = 3
    taken = impl.take_mixed(nxt, last, impl.NameTable(NAMES), *mixed((5, 3), (9, 1), (9, 2)), 10)
    assert taken[:2] == (["t5", "t9", "t9"], [3, 1, 2])
    assert nxt.items() == [(5, 4), (9, 3)] and last.items() == [(5, 10), (9, 12)]
    nxt, last = impl.SeqTable(), impl.SeqTable()
    assert impl.take_mixed(nxt, last, impl.NameTable(NAMES), *mixed((6, 1), (6, 1)), 10) is None
    assert nxt.items() == [(6, 1)] and len(last) == 0  # (it expects its first, as before)
    assert impl.take_mixed(nxt, last, impl.NameTable(NAMES), *mixed((8, 1)), 10) is None
    assert nxt.get(8) is None  # no name here: not started


@pytest.mark.parametrize("offset, count, sseq", [(6 + 32, 3, 1), (6 + 32, 0, 1), (10**6, 2, 1),
                                                 (6 + 32, 2, -1), (6 + 32, 2, 2**62 - 1)])
def test_entries_out_of_the_datagram_or_stream_seqs_out_of_range_are_refused(
        impl, offset, count, sseq):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    nxt[5], nxt[6] = 3, 8
    data, _, _ = mixed((5, 3), (6, 8))
    with pytest.raises(ValueError):
        impl.take_mixed(nxt, last, impl.NameTable(NAMES), data, offset, count, sseq)
    assert nxt.items() == [(5, 3), (6, 8)] and len(last) == 0


@settings(max_examples=300, deadline=None)
@given(start=st.dictionaries(st.integers(1, 12), st.integers(0, 6)),
       run=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 8)), min_size=1, max_size=20))
def test_it_takes_a_run_exactly_when_each_message_is_next_of_a_named_topic(impl, start, run):
    names = {t: f"t{t}" for t in range(1, 10)}  # 10..12 have none
    nxt, last = impl.SeqTable(), impl.SeqTable()
    for topic, seq in start.items():
        nxt[topic] = seq
    model, expected = dict(start), []
    for topic, seq in run:
        if topic not in names or model.get(topic, 1) != seq:  # (a topic not started: 1)
            expected = None
            break
        model[topic] = seq + 1
        expected.append(topic)
    taken = impl.take_mixed(nxt, last, impl.NameTable(names), *mixed(*run), 50)
    if expected is None:  # nothing changed, but that a topic started in the run expects 1
        after = dict(nxt.items())
        assert taken is None and len(last) == 0
        assert {t: after[t] for t in start} == start
        assert all(after[t] == 1 for t in set(after) - set(start))
    else:
        assert taken[0] == [names[t] for t in expected] and taken[1] == [q for _, q in run]
        assert taken[2] == [payload(i) for i in range(len(run))]
        assert taken[3] == sum(range(len(run)))
        assert dict(nxt.items()) == model
        assert dict(last.items()) == {t: 50 + i for i, t in enumerate(expected)}


def test_thousands_of_topics_grow_the_table_and_go_round_in_order(impl):
    nxt, last = impl.SeqTable(), impl.SeqTable()
    topics = range(1000, 11_000)
    names = impl.NameTable({t: str(t) for t in topics})
    for t in topics:
        nxt[t] = 1
    sseq = 1
    for round_ in range(1, 4):
        for at in range(0, len(topics), 60):
            run = mixed(*((t, round_) for t in topics[at:at + 60]))
            assert impl.take_mixed(nxt, last, names, *run, sseq)[0] == [str(t) for t in topics[at:at + 60]]
            sseq += run[2]
    assert all(nxt[t] == 4 for t in topics) and len(last) == len(topics)
    assert last[10_999] == sseq - 1 and last.keys_after(0) == list(topics)


def test_a_name_table_is_a_fixed_map_of_topic_ids_to_names(impl):
    names = impl.NameTable({5: "a", 2**32 - 1: "b"})
    assert len(names) == 2 and names.get(5) == "a" and names.get(2**32 - 1) == "b"
    assert names.get(6) is None and names.get(6, "?") == "?" and names.get(-1) is None
    with pytest.raises(TypeError):
        impl.NameTable({5: b"a"})  # names are str
    with pytest.raises(OverflowError):
        impl.NameTable({2**32: "a"})  # not a topic id
    with pytest.raises(TypeError):
        impl.NameTable([(5, "a")])


@given(st.lists(st.tuples(topic_ids, st.integers(0, 2**64 - 1), st.binary(max_size=40)),
                min_size=1, max_size=30))
def test_a_senders_mixed_run_packs_as_struct_packs_its_entries(impl, messages):
    cached = [(100 + i, t, 1, q, 0, memoryview(p) if i % 2 else p)
              for i, (t, q, p) in enumerate(messages)]
    parts = impl.mixed_parts(b"head", cached)
    assert parts[0] == b"head"
    assert parts[1] == b"".join(wire.MIXED_ENTRY.pack(t, q, len(p)) for t, q, p in messages)
    assert [bytes(p) for p in parts[2:]] == [p for _, _, p in messages]


@pytest.mark.parametrize("messages, error", [
    ([(1, 5, 1, 1)], TypeError),                        # not a cache entry
    ([[1, 5, 1, 1, 0, b"x"]], TypeError),
    ([(1, 2**32, 1, 1, 0, b"x")], OverflowError),        # topic beyond 32 bits
    ([(1, 5, 1, 2**64, 0, b"x")], OverflowError),        # seq beyond 64 bits
    ([(1, 5, 1, -1, 0, b"x")], OverflowError),
    ([(1, 5, 1, 1, 0, 7)], TypeError),                   # a payload without a length
])
def test_a_mixed_run_of_what_is_not_cache_entries_is_refused(impl, messages, error):
    with pytest.raises(error):
        impl.mixed_parts(b"head", messages)


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1) | st.just(0), st.integers(0, 2**64 - 1)
                          | st.integers(0, 99), st.integers(0, 2**32 - 1)), max_size=20),
       st.integers(0, 40), st.integers(-1, 25), st.booleans())
def test_a_mixed_runs_extent_is_what_wire_checks_of_its_entries(impl, entries, offset, n, view):
    data = b"h" * offset + b"".join(wire.MIXED_ENTRY.pack(*e) for e in entries)
    want = -1 if not 0 <= n <= len(entries) else 0
    for topic, seq, length in entries[:max(n, 0)] if want == 0 else ():
        if topic == 0 or seq >= wire.SEQ_LIMIT:
            want = -2 if topic == 0 else -3
            break
        want += length
    assert impl.mixed_extent(memoryview(data) if view else data, offset, n) == want
