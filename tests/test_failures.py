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
from scopecast.scopes.cluster_manager import MEMBER_TIMEOUT

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
        while any(m["pid"] == victim.pid for m in cluster.status()["members"]):
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
