"""Failure detection: a member killed mid-stream (kill -9) is removed from the scope, and the other
subscribers keep receiving everything."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import ray

from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer
from scopecast.scopes.paths import scope_actor_name
from scopecast.scopes.scope_manager import DEFAULT_SETTINGS
from scopecast.scopes.status import members

MEMBER_TIMEOUT = DEFAULT_SETTINGS["member_timeout"]

pytestmark = pytest.mark.ray


def test_subscriber_killed_mid_stream_is_removed_and_the_rest_keep_receiving(
        cluster, ray_address, topic_name):
    cluster.create_topic(topic_name)
    actors = [ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name) for _ in range(2)]
    ray.get([a.ready.remote() for a in actors])
    victim = subprocess.Popen(
        [sys.executable, "-m", "scopecast.ray_cluster.consumers", "--address", ray_address,
         "--topic", topic_name, "--expect", "1000000", "--timeout", "300"],
        stdout=subprocess.PIPE, text=True)
    assert victim.stdout.readline().strip() == "ready"
    n, kill_at, more = 20_000, 5_000, 1_000
    pending = [a.consume.remote(n + more, 240.0) for a in actors]
    expected = DeliveryDigest()
    with cluster.publisher(topic_name) as pub:
        for i in range(1, n + 1):
            payload = b"m%08d" % i
            pub.publish(payload)
            expected.add(topic_name, i, payload)
            if i == kill_at:
                victim.send_signal(signal.SIGKILL)
                victim.wait(30)
        pub.flush(timeout=120)
        # the scope notices the dead member within a few heartbeat timeouts and drops it
        deadline = time.monotonic() + 3 * MEMBER_TIMEOUT + 10
        while any(m["pid"] == victim.pid for m in members(cluster.status())):
            assert time.monotonic() < deadline, "the killed member was never removed"
            time.sleep(0.5)
        for i in range(n + 1, n + more + 1):  # and the survivors get what comes after
            payload = b"m%08d" % i
            pub.publish(payload)
            expected.add(topic_name, i, payload)
        pub.flush(timeout=60)
    for summary in ray.get(pending, timeout=300):
        assert summary["count"] == n + more
        assert summary["gaps"] == 0 and summary["out_of_order"] == 0
        assert summary["digest"] == expected.hexdigest()
    ray.get([a.close.remote() for a in actors])


def test_a_member_the_scope_dropped_rejoins_and_keeps_receiving(cluster, topic_name):
    """A member whose registration is gone (missed heartbeats, or removed) registers again with the
    same socket and subscriptions, and receives what is published afterwards."""
    from scopecast.actors import declare

    cluster.create_topic(topic_name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(consumer.ready.remote())
    old = ray.get(consumer.counters.remote())["member"]
    scope = next(m["scope"] for m in members(cluster.status()) if m["id"] == old)
    manager = declare.lookup(scope_actor_name(scope))
    ray.get(manager.unregister_member.remote(old))  # as its heartbeat timeout would
    deadline = time.monotonic() + 30
    while ray.get(consumer.counters.remote())["member"] == old:
        assert time.monotonic() < deadline, "the dropped member never rejoined"
        time.sleep(0.2)
    pending = consumer.consume.remote(500, 60.0)
    with cluster.publisher(topic_name) as pub:  # the publisher waits for the rejoined member
        for i in range(500):
            pub.publish(b"after %d" % i)
        pub.flush()
    got = ray.get(pending, timeout=120)
    assert got["count"] == 500 and got["gaps"] == 0
    ray.get(consumer.close.remote())
