"""SeqTable and take_in_order: a receiver's per-topic numbers of one source session, in C
(pure logic, against a dict as the model)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopecast.netio._seq_table import SeqTable, take_in_order

topic_ids = st.integers(1, 2**32 - 1)
values = st.integers(-(2**63), 2**63 - 1)


def entries(*messages: tuple[int, int]) -> tuple:
    """A mixed run's entries as wire.iter_runs gives them: (topic, seq, length) flat."""
    return tuple(v for topic, seq in messages for v in (topic, seq, 10))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(topic_ids | st.integers(1, 40), values), max_size=300))
def test_it_reads_as_a_dict_of_the_same_puts_in_insertion_order(puts):
    table, model = SeqTable(), {}
    for topic, value in puts:
        table[topic] = value
        model[topic] = value
    assert len(table) == len(model)
    assert table.items() == list(model.items()) and list(table) == list(model)
    for topic in list(model)[:50]:
        assert table[topic] == model[topic] and table.get(topic) == model[topic] and topic in table
    assert table.keys_after(len(model) // 2) == list(model)[len(model) // 2:]
    assert table.keys_after(len(model) + 5) == [] and table.keys_after(-1) == list(model)


def test_missing_keys_and_values_out_of_range():
    table = SeqTable()
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


def test_a_run_each_next_of_its_topic_moves_every_topic_and_records_its_stream_seq():
    nxt, last = SeqTable(), SeqTable()
    nxt[5], nxt[6], nxt[7] = 10, 1, 4
    assert take_in_order(nxt, last, entries((5, 10), (6, 1), (7, 4)), 100)
    assert nxt.items() == [(5, 11), (6, 2), (7, 5)]
    assert last.items() == [(5, 100), (6, 101), (7, 102)]


def test_a_topic_twice_in_a_run_is_in_order_when_its_seqs_follow_on():
    nxt, last = SeqTable(), SeqTable()
    nxt[5], nxt[6] = 3, 8
    assert take_in_order(nxt, last, entries((5, 3), (6, 8), (5, 4)), 20)
    assert nxt[5] == 5 and nxt[6] == 9 and last[5] == 22 and last[6] == 21


@pytest.mark.parametrize("run", [
    entries((5, 3), (6, 9)),           # the second is ahead of its topic
    entries((5, 3), (6, 8), (5, 3)),   # a duplicate within the run
    entries((5, 3), (9, 1)),           # a topic never started
    entries((5, 2), (6, 8)),           # the first one already taken
    (5, 3, 10, 6),                     # entries cut short
    (),
])
def test_a_run_not_wholly_in_order_changes_nothing(run):
    nxt, last = SeqTable(), SeqTable()
    nxt[5], nxt[6] = 3, 8
    last[5] = 7
    assert not take_in_order(nxt, last, run, 20)
    assert nxt.items() == [(5, 3), (6, 8)] and last.items() == [(5, 7)]


def test_thousands_of_topics_grow_the_table_and_go_round_in_order():
    nxt, last = SeqTable(), SeqTable()
    topics = range(1000, 11_000)
    for t in topics:
        nxt[t] = 1
    sseq = 1
    for round_ in range(1, 4):
        for at in range(0, len(topics), 60):
            run = entries(*((t, round_) for t in topics[at:at + 60]))
            assert take_in_order(nxt, last, run, sseq)
            sseq += len(run) // 3
    assert all(nxt[t] == 4 for t in topics) and len(last) == len(topics)
    assert last[10_999] == sseq - 1 and last.keys_after(0) == list(topics)
