"""Topic metadata at the root: typed errors for bad requests, idempotent creation, deletion."""

from __future__ import annotations

from pathlib import Path

import pytest

import scopecast

pytestmark = pytest.mark.ray


@pytest.mark.parametrize("name", ["", "/lead", "trail/", "two//slashes", "sp ace", "x" * 201,
                                  "star*"])
def test_bad_topic_names_are_refused(cluster, name):
    with pytest.raises(scopecast.InvalidConfig):
        cluster.create_topic(name)


def test_unknown_policy_or_recovery_is_refused(cluster, topic_name):
    with pytest.raises(scopecast.InvalidConfig, match="built-ins are"):
        cluster.create_topic(topic_name, policy="no_such_policy")
    with pytest.raises(scopecast.InvalidConfig, match="built-ins are"):
        cluster.create_topic(topic_name, recovery="no_such_protocol")
    with pytest.raises(scopecast.InvalidConfig, match="from_join or cached"):
        cluster.create_topic(topic_name, history="everything")
    ring = cluster.submit_plugin(str(Path(__file__).parent.parent / "examples" / "ring_policy.py"))
    with pytest.raises(scopecast.InvalidConfig, match="not a recovery protocol"):
        cluster.create_topic(topic_name, recovery=f"{ring.name}@{ring.version}")


def test_create_is_idempotent_but_not_with_other_settings(cluster, topic_name):
    first = cluster.create_topic(topic_name)
    assert cluster.create_topic(topic_name) == first
    with pytest.raises(scopecast.TopicExists):
        cluster.create_topic(topic_name, policy="chain")
    with pytest.raises(scopecast.TopicExists):
        cluster.create_topic(topic_name, exist_ok=False)


def test_create_topics_makes_many_in_one_call_and_nothing_when_one_is_refused(cluster, topic_name):
    names = [f"{topic_name}/{i}" for i in range(500)]
    made = cluster.create_topics(names + names[:3], policy="chain")  # (a repeat counts once)
    assert [t.name for t in made] == names and {t.policy for t in made} == {"chain"}
    assert len({t.id for t in made}) == 500
    assert cluster.create_topics(names[:2], policy="chain") == made[:2]  # idempotent
    with pytest.raises(scopecast.TopicExists):  # one of other settings: none is created
        cluster.create_topics([f"{topic_name}/new", names[0]])
    with pytest.raises(scopecast.InvalidConfig):
        cluster.create_topics([f"{topic_name}/fine", "bad name"])
    assert cluster.topics([f"{topic_name}/new", f"{topic_name}/fine"]) == []
    assert len(cluster.topics([f"{topic_name}/*"])) == 500


def test_unknown_topics_are_typed_errors(cluster):
    with pytest.raises(scopecast.TopicNotFound) as e:
        cluster.subscriber("no/such/topic")
    assert isinstance(e.value, KeyError) and "create_topic" in str(e.value)
    with pytest.raises(scopecast.TopicNotFound):
        cluster.publisher("no/such/topic")
    with pytest.raises(scopecast.TopicNotFound):
        cluster.update_topic("no/such/topic", policy="chain")


def test_delete_topic_leaves_others(cluster, topic_name):
    keep = cluster.create_topic(topic_name + "/keep")
    cluster.create_topic(topic_name + "/gone")
    cluster.delete_topic(topic_name + "/gone")
    names = [t.name for t in cluster.topics()]
    assert topic_name + "/gone" not in names and keep.name in names
    with pytest.raises(scopecast.TopicNotFound):
        cluster.topic(topic_name + "/gone")


def test_topics_lists_those_named_or_matched_only(cluster, topic_name):
    for leaf in ("a/x", "a/y", "b/z", "a/x/deeper"):
        cluster.create_topic(f"{topic_name}/{leaf}")
    listed = cluster.topics([f"{topic_name}/a/*", f"{topic_name}/b/z"])
    assert [t.name for t in listed] == [f"{topic_name}/{leaf}" for leaf in ("a/x", "a/y", "b/z")]
    assert [t.name for t in cluster.topics(f"{topic_name}/a/y")] == [f"{topic_name}/a/y"]
    assert cluster.topics([f"{topic_name}/none/*"]) == []
    assert len(cluster.topics()) >= 4
    with pytest.raises(scopecast.InvalidConfig):
        cluster.topics(["bad pattern*"])
    with pytest.raises(scopecast.InvalidConfig):
        cluster.topics([f"{topic_name}/a/x", 7])


def test_status_without_topics_leaves_out_what_is_per_topic(cluster, topic_name):
    """`status(topics=False)`, for polling a cluster of thousands of topics: the topic list is
    its length, scopes omit their layouts and members their topic ids; the rest is there."""
    from scopecast.scopes.status import members, walk
    info = cluster.create_topic(topic_name)
    with cluster.subscriber(topic_name):
        full, brief = cluster.status(), cluster.status(topics=False)
    assert info.id in {t["id"] for t in full["topics"]}
    assert isinstance(brief["topics"], int) and brief["topics"] >= 1
    assert any(str(info.id) in s.get("topics", {}) for s in walk(full))
    assert not any("topics" in s for s in walk(brief))
    mine = [m for m in members(brief) if info.name in m["subscriptions"]]
    assert mine and all("subscribes" not in m and "counters" in m for m in mine)
    assert all(isinstance(m["channels"], int) for m in members(brief))
    assert [m for m in members(full) if info.id in m.get("subscribes", ())]
