"""Bad input to the scope managers: typed errors or ignored with a log line; no scope manager
crashes and no existing channel is lost."""

from __future__ import annotations

import asyncio

import pytest
import ray

from scopecast.actors import declare
from scopecast.actors.errors import ControlTimeout, InvalidConfig, MemberExpired, TopicNotFound
from scopecast.netio import wire
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.cluster_manager import _check_settings
from scopecast.scopes.controlled_element import call
from scopecast.scopes.paths import scope_actor_name
from scopecast.scopes.reports import ScopeReport
from scopecast.scopes.status import members, scope

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def listener(cluster):
    """A subscriber in scope bad/ok whose channel must survive everything below."""
    info = cluster.create_topic("bad/kept", policy="chain")
    actor = ray.remote(num_cpus=0)(TopicConsumer).remote(info.name, scope="bad/ok", name="L")
    ray.get(actor.ready.remote())
    yield info, actor
    ray.get(actor.close.remote())


def still_delivers(cluster, listener) -> None:
    info, actor = listener
    pending = actor.consume.remote(500, 60.0)
    with cluster.publisher(info.name, scope="bad/other") as pub:
        for i in range(500):
            pub.publish(b"%d" % i)
        pub.flush(timeout=30)
    got = ray.get(pending, timeout=120)
    assert (got["count"], got["gaps"]) == (500, 0)


def test_a_control_call_not_answered_in_time_is_a_typed_timeout(cluster):
    """(Not a raw GetTimeoutError: a subscriber of thousands of topics met one from a busy
    scope.)"""
    @ray.remote(num_cpus=0)
    class Busy:
        async def subscribe(self, *args):
            await asyncio.Event().wait()

    busy = Busy.remote()
    try:
        with pytest.raises(ControlTimeout, match="did not answer subscribe within 0.5 s") as err:
            call(busy.subscribe, 1, ["t"], "member", timeout=0.5)
        assert isinstance(err.value, TimeoutError)
    finally:
        ray.kill(busy)


@pytest.mark.parametrize("path", ["bad/../x", "bad//x", "bad/x/bad", "bad/x y",
                                  "/".join("abcdefghi")])
def test_malformed_or_cyclic_scope_paths_are_typed_errors(cluster, listener, path):
    with pytest.raises(InvalidConfig):
        cluster.subscriber(listener[0].name, scope=path)


def test_unknown_topic_in_a_scope_is_a_typed_error(cluster, listener):
    with pytest.raises(TopicNotFound):
        cluster.subscriber("bad/no-such-topic", scope="bad/ok")
    with pytest.raises(TopicNotFound):
        cluster.publisher("bad/no-such-topic", scope="bad/other")


def test_a_topic_rooted_elsewhere_is_refused(cluster, listener):
    info = cluster.create_topic("bad/rooted", root="bad/ok")
    with pytest.raises(InvalidConfig, match="rooted at"):
        cluster.subscriber(info.name, scope="bad/other")


def test_stale_and_unknown_members_get_typed_errors(cluster, listener):
    manager = declare.lookup(scope_actor_name("bad/ok"))
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(manager.watch.remote(987654321, 5, 0))
    assert isinstance(err.value.cause, MemberExpired)
    member = next(m for m in members(scope(cluster.status(), "bad/ok")) if m["name"] == "L")
    # a member re-registering with a stale view, or someone else's name, is refused
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        ray.get(manager.register_member.remote("L", "127.0.0.1", 1, 1, "", "member", 0,
                                               wire.VERSION))
    assert isinstance(err.value.cause, InvalidConfig)
    view = ray.get(manager.watch.remote(member["id"], 1, 0))  # a stale version: the current view
    assert view is not None and view["version"] >= member["view"]  # (it may have moved on)
    # a malformed table position: the whole table (the piece starts at its base)
    view = ray.get(manager.watch.remote(member["id"], 1, 0, None, ["x", {}]))
    assert view["topics"][3] == view["topics"][2]
    # reports that are not from a child scope, malformed or of another version are dropped
    # (logged and counted)
    beat = ScopeReport(1, 1, 0, None).to_wire()
    assert ray.get(manager.report.remote("L", beat, None)) is True
    assert ray.get(manager.report.remote("zz", {"incarnation": "x", "depth": []}, None)) is True
    assert ray.get(manager.report.remote("zz", {**beat, "v": 99}, None)) is True
    assert ray.get(manager.report.remote("zz", {**beat, "state": {"subs": {"1": "boss"}}},
                                         None)) is True
    assert scope(cluster.status(), "bad/ok")["dropped"] == {"malformed_report": 3}
    # a heartbeat naming a state this scope does not have asks for the state (False)
    assert ray.get(manager.report.remote("zz", beat, None)) is False
    assert "zz" not in {s["name"] for s in scope(cluster.status(), "bad/ok")["scopes"]}
    still_delivers(cluster, listener)


@pytest.mark.parametrize("settings", [{"token_period": 2.0}, {"idle_token_period": 0.005},
                                      {"token_period": -1}, {"tokens": 1.0}])
def test_bad_token_period_settings_are_typed_errors(settings):
    with pytest.raises(InvalidConfig):
        _check_settings(settings)
