"""The topic table as it travels down (pure logic): a child takes what it lacks, a change costs
its own entry, and every table below the root ends with the root's entries."""

from __future__ import annotations

import random

import pytest

from scopecast.scopes import topic_table
from scopecast.scopes.topic_table import REBASE_MIN, MemberTopicTable, TopicTable, member_entry


@pytest.fixture(autouse=True)
def _store(monkeypatch):
    """Ray's object store stand-in: a base's ref is the base itself (fetched by `_get`)."""
    monkeypatch.setattr(topic_table.ray, "put", lambda value: value)


def _get(ref):
    return ref


def _body(i: int, session: int = 1) -> dict:
    return {"name": f"t/{i}", "id": i, "session": session}


def _root(n: int = 5) -> TopicTable:
    root = TopicTable()
    root.load({str(i): _body(i) for i in range(1, n + 1)})
    return root


def _send(parent: TopicTable, child: TopicTable, have=None) -> tuple | None:
    """What `parent` sends `child` (at `have`, by default where it is); taken if any."""
    piece = parent.piece(child.position if have is None else have)
    if piece is not None:
        base = _get(child.base_ref(piece)) if child.needs_base(piece) else None
        child.take(piece, base)
    return piece


def _kept(entries: dict) -> dict:
    return {int(k): member_entry(v) for k, v in entries.items()}


def test_a_child_takes_only_the_changes_past_its_position():
    root, scope, member = _root(), TopicTable(), MemberTopicTable()
    _send(root, scope)
    _send(scope, member)
    assert scope.changed is None and scope.entries == root.entries
    assert member.entries == _kept(root.entries)
    steps = [("6", _body(6)), ("2", None), ("3", _body(3, 2)), ("6", _body(6, 2))]
    for key, body in steps:
        root.change(key, body)
        piece = _send(root, scope)
        assert [k for _s, k, _b in piece[4]] == [key]  # one change: one entry, whatever the log
        assert scope.changed == {key}
        _send(scope, member)
        assert member.changed == {key}
        assert scope.entries == root.entries and member.entries == _kept(root.entries)
    assert root.piece(scope.position) is None and scope.piece(member.position) is None
    assert not scope.take(root.piece(None), None)  # the whole log again: nothing new


def test_a_members_names_and_sessions_handed_over_are_never_changed_afterwards():
    """The member's runtime keeps the dicts it is given and reads them on its I/O thread."""
    root, member = _root(), MemberTopicTable()
    _send(root, member)
    names, sessions = member.names, member.sessions
    assert names == {i: f"t/{i}" for i in range(1, 6)} and set(sessions) == set(names)
    root.change("6", _body(6))
    root.change("3", _body(3, 2))
    _send(root, member)
    assert names == {i: f"t/{i}" for i in range(1, 6)} and sessions[3] == 1  # as handed over
    assert member.names[6] == "t/6" and member.sessions[3] == 2
    held = member.names
    assert member.take_early({"9": _body(9)}) == {"9"}
    assert 9 not in held and member.names[9] == "t/9"
    assert member.entries == {**_kept(root.entries), 9: ("t/9", 1)}


def test_a_lost_piece_is_refused_and_sent_again_from_the_position_the_child_has():
    root, scope = _root(), TopicTable()
    _send(root, scope)
    before = scope.position
    root.change("6", _body(6))
    lost = root.piece(before)
    root.change("7", _body(7))
    after_lost = root.piece((lost[2], lost[5]))  # what a parent believing the first arrived sends next
    assert not scope.take(after_lost, None) and scope.position == before
    _send(root, scope)  # from the position it reports
    assert scope.entries == root.entries
    assert not scope.take(lost, None)  # the lost one arriving late: nothing new


def test_a_new_base_replaces_the_old_and_an_older_piece_is_ignored():
    root, scope = _root(), TopicTable()
    _send(root, scope)
    old = root.piece(None)
    for i in range(6, 6 + REBASE_MIN + 2):  # past the log's bound: the root rebases
        root.change(str(i), _body(i))
    assert root.position[0] > old[2]
    piece = _send(root, scope)
    assert piece[2] == root.position[0] and scope.changed is None
    assert scope.entries == root.entries
    assert scope.needs_base(old) is False and not scope.take(old, _get(old[0]))


def test_random_changes_through_two_levels_end_at_the_roots_entries():
    rng = random.Random(7)
    root, scope, members = _root(20), TopicTable(), [MemberTopicTable() for _ in range(3)]
    for step in range(600):
        key = str(rng.randrange(1, 120))
        root.change(key, None if rng.random() < 0.2 else _body(int(key), step))
        if rng.random() < 0.5:
            _send(root, scope)
        for m in members:
            if rng.random() < 0.3:
                _send(scope, m)
    _send(root, scope)
    for m in members:
        _send(scope, m)
        assert m.entries == _kept(root.entries)
    assert scope.entries == root.entries


def test_early_entries_travel_down_and_give_way_to_the_tables_own():
    root, scope, member = _root(), TopicTable(), MemberTopicTable()
    _send(root, scope)
    _send(scope, member)
    assert scope.take_early({"9": _body(9)}) == {"9"}  # fetched from the root before the table
    assert member.take_early(dict(scope.early)) == {"9"}
    assert member.entries[9] == ("t/9", 1) and scope.take_early({"9": _body(9)}) == set()
    root.change("9", _body(9, 3))
    _send(root, scope)
    _send(scope, member)
    assert scope.early == {} and member.early == {} and member.entries[9] == ("t/9", 3)


def _scope(name="lan0", kind="lan", parent=""):
    from scopecast.scopes.scope_manager import ScopeManager
    return ScopeManager(name, kind, parent)


def test_a_scope_brings_its_topics_in_line_key_by_key_as_a_full_rebuild_would():
    from scopecast.scopes.topic_view import ScopeTopics

    root = _root()
    topics = ScopeTopics()
    _send(root, topics.table)
    topics.follow(topics.table.changed)
    for key, body in [("6", _body(6)), ("2", None), ("6", {**_body(6), "name": "t/six"})]:
        root.change(key, body)
        _send(root, topics.table)
        topics.follow(topics.table.changed)
        fresh = ScopeTopics()
        _send(root, fresh.table)
        fresh.follow(None)
        assert topics.by_id == fresh.by_id and topics.by_name == fresh.by_name
    assert "t/6" not in topics.by_name and topics.by_name["t/six"].id == 6


def test_a_publisher_stays_one_through_a_table_from_above_that_lacks_its_topic_yet():
    """A scope asks the root for a topic its parent's table does not carry yet; a table from
    above still without it (the parent behind, or on a new base) must not make the scope
    forget the publisher: its agent would be dropped, and nothing it publishes would be
    stable."""
    import asyncio

    from scopecast.scopes.membership import MemberProcess
    from scopecast.scopes.topics import TopicInfo

    root = _root()
    scope = _scope("lan0/host-x", "host", "lan0")
    _send(root, scope.topics.table)
    scope.topics.follow(None)

    async def root_call(method, name):
        assert method == "topic"
        return TopicInfo(name=name, id=9)
    scope._root_call = root_call
    publisher = scope.members.children["m"] = MemberProcess("m", id=7)
    publisher.pubs.add(asyncio.run(scope._topic("t/new")).id)  # as `advertise` does
    assert scope.planner.reliable_topics(publisher) == {9: "token_ring"}

    for i in range(10, 10 + REBASE_MIN + 2):  # the parent's table, rebased, without it yet
        root.change(str(i), _body(i))
    _send(root, scope.topics.table)
    scope._table_changed(scope.topics.table.changed)
    assert scope.planner.reliable_topics(publisher) == {9: "token_ring"}

    root.change("9", TopicInfo(name="t/new", id=9).to_dict())  # ... caught up
    _send(root, scope.topics.table)
    scope._table_changed(scope.topics.table.changed)
    assert scope.topics.table.early == {} and scope.planner.reliable_topics(publisher) == {9: "token_ring"}
