"""Topics alike asked once (pure logic: the policy container and a policy host in this process):
a scope asks a built-in policy once for the topics of a re-layout with the same options, the
same state before and the same state wanted, and lays what asking per topic lays."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from scopecast.policies.builtin import alike_topics
from scopecast.policies.host import PolicyHost
from scopecast.scopes.container import PolicyContainer
from scopecast.scopes.policy_runner import PolicyRunner
from scopecast.scopes.scope_admin import ScopeChoices

NAMES = ["A", "B", "C", "D", "E"]


def wanted(states: dict[int, tuple], policy: str = "chain", options: dict | None = None,
           multicast: bool = False) -> dict[int, dict]:
    """Per topic (members, sources) wanted; the options dict one object for all topics, as a
    scope's planner hands them (or one each: `options` None)."""
    shared = {} if options is None else options
    out = {}
    for tid, (members, sources) in states.items():
        members, sources = set(members), set(sources)
        out[tid] = {"policy": policy,
                    "context": {"scope": "X", "topic": f"t{tid}", "topic_id": tid,
                                "multicast": multicast,
                                "options": shared if options is not None else {}},
                    "members": members | sources, "sources": sources,
                    "candidates": sorted(members) or sorted(sources), "replicas": {1}}
    return out


def answer(container: PolicyContainer, host: PolicyHost, batches: dict) -> None:
    """What PolicyRunner.run does with the policy actor, here in this process."""
    for policy, items in batches.items():
        public = [{k: v for k, v in it.items() if not k.startswith("_")} for it in items]
        for item, result in zip(items, host.apply("X", policy, public), strict=True):
            container.apply(item, result)  # (an op of an event between may be refused)


def run(container: PolicyContainer, host: PolicyHost, w: dict) -> list[int]:
    """A re-layout's two phases; returns how many items each policy batch held."""
    sizes = []
    for phase in ("choices", "events"):
        batches = container.requests(w, phase)
        sizes += [len(items) for items in batches.values()]
        answer(container, host, batches)
    return sizes


def laid(container: PolicyContainer) -> dict[int, tuple]:
    return {t: (dict(lay.channels), lay.entry, lay.exits, lay.error)
            for t, lay in container.topics.items()}


def test_a_thousand_topics_alike_are_one_item_and_each_is_laid():
    container, host = PolicyContainer("X", False, alike_topics), PolicyHost()
    states = {t: (["B", "C", "D"], ["A"]) for t in range(1, 1001)}
    assert run(container, host, wanted(states)) == [1, 1]
    for lay in container.topics.values():
        assert set(lay.channels) == {("A", "B", "A"), ("B", "C", "A"), ("C", "D", "A")}
        assert lay.entry == "B" and lay.exits == {1: ["D"]}
    assert not host._instances  # nothing kept: the next change brings a fresh one to `had`
    states[5] = (["B", "C"], ["A"])  # one topic changes: only it is asked again, on its own
    assert run(container, host, wanted(states)) == [1, 1]
    assert set(container.topics[5].channels) == {("A", "B", "A"), ("B", "C", "A")}
    assert set(container.topics[6].channels) == {("A", "B", "A"), ("B", "C", "A"),
                                                 ("C", "D", "A")}


def test_topics_with_other_options_or_a_plugin_are_not_asked_together():
    container, host = PolicyContainer("X", False, alike_topics), PolicyHost()
    w = wanted({1: (["B", "C", "D"], ["A"]), 2: (["B", "C", "D"], ["A"])}, "tree")
    w[2]["context"]["options"] = {"fanout": 1}
    assert run(container, host, w) == [2, 2]
    assert set(container.topics[2].channels) == {("A", "B", "A"), ("B", "C", "A"),
                                                 ("C", "D", "A")}
    assert ("A", "D", "A") not in container.topics[2].channels
    assert ("A", "C", "A") in container.topics[1].channels  # fan-out 2
    assert not alike_topics("plugin:0123") and not alike_topics("no-such-policy")


def test_a_failed_answer_marks_every_topic_alike_for_a_whole_state_next_time():
    container = PolicyContainer("X", False, alike_topics)
    w = wanted({1: (["B"], ["A"]), 2: (["B"], ["A"])})
    container.requests(w, "choices")
    (item,) = container.requests(w, "events")["chain"]
    assert container.topics_of(item) == [1, 2] and item["had"] == ([], [])
    container.apply(item, {"topic": 1, "ops": [], "error": "boom"})
    assert all(lay.fresh and lay.error == "boom" for lay in container.topics.values())


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(["chain", "tree", "star", "lan_multicast", "replicated"]),
       multicast=st.booleans(),
       steps=st.lists(st.dictionaries(st.integers(1, 6),
                                      st.tuples(st.sets(st.sampled_from(NAMES)),
                                                st.sets(st.sampled_from(NAMES), max_size=2)),
                                      min_size=1, max_size=6),
                      min_size=1, max_size=5))
def test_asking_alike_lays_what_asking_per_topic_lays(policy, multicast, steps):
    """Any run of re-layouts (topics coming, changing and going): the channels, entry and exits
    of every topic are those a policy instance kept per topic gives."""
    alike = PolicyContainer("X", multicast, alike_topics), PolicyHost()
    each = PolicyContainer("X", multicast), PolicyHost()
    for states in steps:
        states = {t: s for t, s in states.items() if s[0] or s[1]}
        for container, host in (alike, each):
            run(container, host, wanted(states, policy, {}, multicast))
        assert laid(alike[0]) == laid(each[0])


def test_the_events_phase_asks_the_planner_again_only_where_the_choices_moved_something():
    """(At 100,000 topics the planner's wanted state takes a second or more to make.)"""
    container, host = PolicyContainer("X", False, alike_topics), PolicyHost()
    runner = PolicyRunner("X", container, None, lambda: None, ScopeChoices("X"))

    async def run(batches: dict) -> bool:
        answer(container, host, batches)
        return False
    runner.run = run
    states = {t: (["B", "C"], ["A"]) for t in range(1, 101)}
    asked = []

    def wanted_of() -> dict:
        asked.append(1)
        return wanted(states)

    def lay() -> int:
        asked.clear()
        assert asyncio.run(runner.lay(wanted_of)) is False
        return len(asked)

    assert lay() == 2  # new topics: their entries were chosen
    assert lay() == 1  # nothing moved
    states[7] = (["C", "D"], ["A"])  # topic 7's entry moves
    assert lay() == 2
    assert container.topics[7].entry == "C" and container.topics[8].entry == "B"


def test_a_multicast_change_during_the_choices_lays_the_events_with_contexts_that_say_so():
    """A LAN's probe may decide while a re-layout waits on the policy actor: it clears every
    layout, and the events must not lay them afresh with the wanted state made before (its
    contexts said no multicast: lan_multicast then laid trees, and kept them)."""
    container, host = PolicyContainer("X", False, alike_topics), PolicyHost()
    runner = PolicyRunner("X", container, None, lambda: None, ScopeChoices("X"))

    async def run(batches: dict) -> bool:
        if any("_choices" in it for items in batches.values() for it in items):
            container.multicast = True  # (as ScopeManager._set_multicast does)
            container.topics.clear()
        answer(container, host, batches)
        return False
    runner.run = run
    states = {t: (["B", "C"], ["A"]) for t in range(1, 11)}
    asyncio.run(runner.lay(lambda: wanted(states, "lan_multicast", {}, container.multicast)))
    assert container.covered_topics() == set(states)
