"""Relations (thesis 3.2.2): a client subscriber is transient — nobody waits for it."""

from __future__ import annotations

import time

import pytest
import ray

from scopecast.netio.runtime import RuntimeConfig
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import members

pytestmark = pytest.mark.ray


def host_counters(cluster) -> dict:
    """The data-plane counters of this process's member in its host's scope."""
    return next(v for path, v in cluster.counters().items() if path.startswith("lan0/"))


def test_a_stalled_client_never_holds_the_publisher(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer)
    member = consumer.remote(topic_name)
    client = consumer.remote(topic_name, role="client")  # subscribes, then never reads
    ray.get([member.ready.remote(), client.ready.remote()])
    n = 40_000
    pending = member.consume.remote(n, 120.0)
    everyone = members(cluster.status())
    member_id = next(m["id"] for m in everyone if topic_name in m["subscriptions"])
    client_id = next(m["id"] for m in everyone if topic_name in m["client_subscriptions"])
    with cluster.publisher(topic_name) as pub:
        counters = host_counters(cluster)
        timeouts_before = counters["stats"].get("receiver_timeouts", 0)
        me = next(m for m in members(cluster.status()) if m["id"] == counters["member"])
        waited = {i for ids in me["receivers"].values() for i in ids}
        for _ in range(n):
            pub.publish(b"x" * 1000)
        pub.flush(timeout=60)
        stats = host_counters(cluster)["stats"]
    assert client_id != member_id
    assert waited == {member_id}                    # only the member is waited for
    assert stats.get("receiver_timeouts", 0) == timeouts_before  # nobody held the publisher
    got = ray.get(pending, timeout=120)
    assert got["count"] == n and got["gaps"] == 0
    late = ray.get(client.consume.remote(None, 10.0, 1.0))  # the client, reading at last
    assert late["count"] > 0
    ray.get([member.close.remote(), client.close.remote()])


def test_a_client_that_never_reads_stays_bounded_in_memory(cluster, topic_name):
    """Nobody waits for a client, so its delivery queue is capped (2 x max_backlog_bytes) and what
    does not fit is dropped and counted, not queued without bound."""
    cluster.create_topic(topic_name)
    client = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name, role="client")
    ray.get(client.ready.remote())
    with cluster.publisher(topic_name) as pub:
        for _ in range(100_000):  # ~100 MB, more than the cap
            pub.publish(b"y" * 1000)
        pub.flush(timeout=60)
    deadline = time.monotonic() + 30
    while (counters := ray.get(client.counters.remote()))["stats"].get(
            "delivery_overflow", 0) == 0:
        assert time.monotonic() < deadline, "no overflow was ever counted"
        time.sleep(0.2)
    cap = 2 * RuntimeConfig().max_backlog_bytes
    assert counters["backlog_bytes"] <= cap + RuntimeConfig().window_bytes
    ray.get(client.close.remote())
