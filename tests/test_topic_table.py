"""The topic table below the root (pure logic): a change of the same base costs its own entries."""

from __future__ import annotations

import pytest

from scopecast.scopes.topic_table import TopicTable, member_entry


def _body(i: int, session: int = 1) -> dict:
    return {"name": f"t/{i}", "id": i, "session": session}


@pytest.mark.parametrize("member", [False, True], ids=["whole entries", "what a member keeps"])
def test_changes_of_the_same_base_are_taken_key_by_key_and_agree_with_a_full_take(member):
    base = {str(i): _body(i) for i in range(1, 6)}
    # a member's own base, as the root puts it: what it keeps, by topic id (int)
    sent = {int(k): member_entry(v) for k, v in base.items()} if member else base
    table = TopicTable(member)
    assert table.take(("b1", {}, "m1"), sent) and table.changed is None  # a new base: everything
    steps = [{"6": _body(6)},
             {"6": _body(6), "2": None},                       # 2 deleted
             {"6": _body(6), "2": None, "3": _body(3, 2)},     # 3 in a new session
             {"6": _body(6, 2), "2": None, "3": _body(3, 2)},  # 6 again
             {"6": _body(6, 2), "2": None}]                    # 3 as the base has it
    expected_changes = [{"6"}, {"2"}, {"3"}, {"6"}, {"3"}]
    for delta, changed in zip(steps, expected_changes, strict=True):
        assert table.take(("b1", delta, "m1"), None)
        assert table.changed == changed
        full = TopicTable(member)
        full.take(("b1", delta, "m1"), sent)
        assert table.entries == full.entries
        whole = {k: v for k, v in {**base, **delta}.items() if v is not None}
        kept = {int(k): member_entry(v) for k, v in whole.items()}
        assert table.entries == (kept if member else whole)
    assert not table.take(("b1", steps[-1], "m1"), None)  # the same again: nothing to do
    assert table.base_ref(("b2", {}, "m2")) == ("m2" if member else "b2")


def test_a_scope_brings_its_topics_in_line_key_by_key_as_a_full_rebuild_would():
    from scopecast.scopes.scope_manager import ScopeManager
    base = {str(i): {"name": f"t/{i}", "id": i} for i in range(1, 6)}
    scope, fresh = ScopeManager("lan0", "lan", ""), ScopeManager("lan0", "lan", "")
    scope.table.take(("b1", {}, "m1"), base)
    scope._topics_changed(scope.table.changed)
    for delta in [{"6": {"name": "t/6", "id": 6}}, {"6": {"name": "t/6", "id": 6}, "2": None},
                  {"6": {"name": "t/six", "id": 6}, "2": None}]:
        scope.table.take(("b1", delta, "m1"), None)
        scope._topics_changed(scope.table.changed)
        fresh.table.take(("b1", delta, "m1"), base)
        fresh._topics_changed(None)
        assert scope.topics == fresh.topics and scope._named == fresh._named
    assert "t/6" not in scope._named and scope._named["t/six"].id == 6


def test_a_publisher_stays_one_through_a_table_from_above_that_lacks_its_topic_yet():
    """A scope asks the root for a topic its parent's table does not carry yet; a table from
    above still without it (the parent behind, or a restarted scope's first one, on a new base)
    must not make the scope forget the publisher: its agent would be dropped, and nothing it
    publishes would ever be stable."""
    import asyncio

    from scopecast.scopes.scope_manager import Child, ScopeManager
    from scopecast.scopes.topics import TopicInfo

    base = {str(i): {"name": f"t/{i}", "id": i} for i in range(1, 6)}
    scope = ScopeManager("lan0/host-x", "host", "lan0")
    scope.table.take(("b1", {}, "m1"), base)
    scope._topics_changed(None)

    async def root_call(method, name):
        assert method == "topic"
        return TopicInfo(name=name, id=9)
    scope._root_call = root_call
    publisher = scope.children["m"] = Child("m", "member", id=7)
    publisher.pubs.add(asyncio.run(scope._topic("t/new")).id)  # as `advertise` does
    assert scope._reliable_topics(publisher) == {9: "token_ring"}

    scope.table.take(("b2", {}, "m2"), base)  # the parent's table, rebased but behind the root
    scope._topics_changed(scope.table.changed)
    scope._resolve(publisher)
    assert 9 not in scope.topics and scope._reliable_topics(publisher) == {}

    scope.table.take(("b2", {"9": {"name": "t/new", "id": 9}}, "m2"), None)  # ... caught up
    scope._topics_changed(scope.table.changed)
    scope._resolve(publisher)
    assert scope._reliable_topics(publisher) == {9: "token_ring"}
