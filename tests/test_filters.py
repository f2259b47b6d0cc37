"""Filter specs (netio.filters) and filters as a policy names them (scopes.policy_filters): pure
logic. Filters on real channels: test_channels; a split scope on real members: test_split_scope."""

from __future__ import annotations

import pytest

from scopecast.netio import filters
from scopecast.netio.filters import all_of, build, check_spec
from scopecast.policies import api
from scopecast.scopes import policy_filters


@pytest.mark.parametrize("spec, canonical", [
    (None, None),
    (["modulo", 3, 1], ("modulo", 3, 1)),
    (("modulo", 3, 1, "seq"), ("modulo", 3, 1)),
    (["modulo", 2, 0, "stream"], ("modulo", 2, 0, "stream")),
    (["topics", 9, 3, 9], ("topics", 3, 9)),
    (("origin", 5), ("origin", 5)),
    (["all", ["origin", 5], ["all", ["modulo", 2, 1]]], ("all", ("modulo", 2, 1), ("origin", 5))),
    (["all", ["topics", 1]], ("topics", 1)),
])
def test_specs_off_the_wire_are_canonical(spec, canonical):
    assert check_spec(spec) == canonical
    assert check_spec(check_spec(spec)) == canonical


@pytest.mark.parametrize("spec", [
    "modulo", [], ["modulo", 2, 2], ["modulo", 65, 1], ["modulo", 2, 1, "time"],
    ["modulo", 2.0, 1], ["topics"], ["topics", -1], ["topics", "t/a"], ["origin", True],
    ["topics", *range(filters.MAX_IDS + 1)], ["regex", ".*"],
    ["all", *[["modulo", n, 0] for n in range(2, 40)]], ["all"],
    ["all", ["all", ["all", ["all", ["all", ["origin", 1]]]]]],
])
def test_bad_specs_are_refused(spec):
    with pytest.raises(ValueError):
        check_spec(spec)


def test_built_filters_pass_what_their_specs_say():
    f = build(check_spec(["all", ["modulo", 2, 1], ["origin", 7, 8], ["topics", 3]]))
    assert f.accepts(3, 7, 5, 0) and f.accepts(3, 8, 1, 0)
    assert not f.accepts(3, 7, 4, 0) and not f.accepts(3, 9, 5, 0) and not f.accepts(4, 7, 5, 0)
    assert build(("modulo", 2, 0, "stream")).accepts(1, 1, 1, 4)
    assert all_of(None, None) is None and all_of(("origin", 1), None) == ("origin", 1)


def test_a_policy_names_members_and_topics_and_the_scope_lays_ids():
    spec = policy_filters.check(api.every(api.origins("h1-pub", 12), api.topic_set("t/a/*", 40),
                                          api.modulo(2, 1, on="stream")))
    members = {"h1-pub": 3, "h2-pub": 4}
    assert policy_filters.resolve(spec, 5, "t/a/x", members) == (
        True, ("all", ("modulo", 2, 1, "stream"), ("origin", 3, 12)))
    assert policy_filters.resolve(spec, 40, "t/b/x", members)[0] is True  # by id
    assert policy_filters.resolve(spec, 5, "t/b/x", members) == (False, None)  # not laid
    assert policy_filters.resolve(("origin", "gone"), 5, "t", members) == (False, None)
    for bad in [("topics", "t/["), ("origin", ""), ("all",), ("origin", 1.5),
                ("all", *[("origin", n) for n in range(9)])]:
        with pytest.raises(ValueError):
            policy_filters.check(bad)
