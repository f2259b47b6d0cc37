"""KeyTable: a mapping keyed by (topic, source, session), stored per source session (pure logic)."""

from scopecast.netio.key_table import KeyTable


def test_it_reads_as_a_mapping_of_keys_and_stores_each_source_session_by_topic():
    table = KeyTable()
    table[(7, 100, 1)] = 5
    table[(8, 100, 1)] = 9
    table[(7, 200, 1)] = 2
    table[(7, 100, 2)] = 1
    assert table.get((7, 100, 1)) == 5 and table[(8, 100, 1)] == 9
    assert table.get((9, 100, 1)) is None and table.get((7, 300, 1), 0) == 0
    assert (7, 200, 1) in table and (8, 200, 1) not in table and (7, 300, 1) not in table
    assert len(table) == 4
    assert dict(table.items()) == {(7, 100, 1): 5, (8, 100, 1): 9, (7, 200, 1): 2, (7, 100, 2): 1}
    assert sorted(table) == sorted(dict(table.items()))
    # a run of one source session is looked up and updated by topic ids alone
    topics = table.topics(100, 1)
    topics[7], topics[8] = 6, 10
    assert table[(7, 100, 1)] == 6 and table[(8, 100, 1)] == 10


def test_it_lists_the_keys_put_in_since_the_last_look_once_each():
    table = KeyTable()
    seen: dict = {}
    table[(1, 100, 1)] = 1
    table[(2, 100, 1)] = 1
    assert sorted(table.added_since(seen)) == [(1, 100, 1), (2, 100, 1)]
    assert table.added_since(seen) == []
    table[(1, 100, 1)] = 2  # a new value, not a new key
    table.topics(200, 1)[3] = 1  # (as a mixed run puts keys in)
    table[(4, 100, 1)] = 1
    assert sorted(table.added_since(seen)) == [(3, 200, 1), (4, 100, 1)]
    assert table.added_since(seen) == []
