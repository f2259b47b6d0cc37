"""A topic streamed over loopback IP multicast to subscribers in a plain process and Ray actors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import ray

from scopecast import PublisherClosed
from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer

pytestmark = pytest.mark.ray

N = 100_000


def _payload(i: int) -> bytes:
    return i.to_bytes(8, "little") * 16  # 128 bytes that differ per message


def _plain_subscriber(address: str, topic: str, expect: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scopecast.ray_cluster.consumers", "--address", address,
         "--topic", topic, "--expect", str(expect), "--timeout", "240"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"subscriber process did not start: {line!r}"
    return proc


def test_100k_messages_to_three_subscribers_in_order(cluster, ray_address, topic_name):
    cluster.create_topic(topic_name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer)
    actors = [consumer.remote(topic_name) for _ in range(2)]
    ray.get([a.ready.remote() for a in actors])
    proc = _plain_subscriber(ray_address, topic_name, N)
    results = [a.consume.remote(N, 240.0) for a in actors]

    expected = DeliveryDigest()
    with cluster.publisher(topic_name) as pub:
        for i in range(1, N + 1):
            payload = _payload(i)
            assert pub.publish(payload) == i
            expected.add(topic_name, i, payload)
        pub.flush(timeout=120)

    summaries = ray.get(results, timeout=300)
    out, _ = proc.communicate(timeout=300)
    summaries.append(json.loads(out.strip().splitlines()[-1]))
    for s in summaries:
        assert s["count"] == N
        assert s["gaps"] == 0 and s["out_of_order"] == 0
        assert s["digest"] == expected.hexdigest()
    assert proc.returncode == 0
    for a in actors:
        ray.get(a.close.remote())


def test_a_publisher_reopened_in_one_process_numbers_on_after_the_last(cluster, topic_name):
    """A process that closes its publisher of a topic and opens another goes on after the first
    one's end marker: a subscriber elsewhere gets both runs (a restart at seq 1 in the same
    session would be dropped there as duplicates)."""
    cluster.create_topic(topic_name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(consumer.ready.remote())
    result = consumer.consume.remote(6, 120.0)
    seqs = []
    for run in range(2):
        with cluster.publisher(topic_name) as pub:
            seqs += [pub.publish(f"{run}-{i}".encode()) for i in range(3)]
    summary = ray.get(result, timeout=180)
    ends = ray.get(consumer.ends.remote())
    ray.get(consumer.close.remote())
    assert seqs == [1, 2, 3, 5, 6, 7]  # 4: the first publisher's end marker
    assert summary["count"] == 6 and summary["gaps"] == 0 and summary["out_of_order"] == 0, (summary, ends)
    assert list(ends.values()) == [7]  # the last data message before the second marker


def _datagrams_out(cluster) -> int:
    return sum(m["stats"].get("datagrams_out", 0) for m in cluster.counters().values())


def test_publishers_closed_together_end_every_stream(cluster, topic_name):
    """close_publishers queues every end marker, then flushes and waits once: each stream ends
    after its last message, for a subscriber elsewhere; the markers share datagrams."""
    names = [f"{topic_name}/{i}" for i in range(200)]
    for name in names:
        cluster.create_topic(name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(f"{topic_name}/*")
    ray.get(consumer.ready.remote())
    result = consumer.consume.remote(3 * len(names), 120.0)
    pubs = cluster.publishers(names)
    for i in range(3):
        for pub in pubs:
            pub.publish(b"%d" % i)
    pubs[-1].flush()  # (one stream: every message is sent and stable)
    sent = _datagrams_out(cluster)
    cluster.close_publishers(pubs)
    # the markers of topics closed together travel together, a run of them per datagram
    assert _datagrams_out(cluster) - sent < len(names) // 10
    summary = ray.get(result, timeout=180)
    deadline = time.monotonic() + 60
    while len(ends := ray.get(consumer.ends.remote())) < len(names):
        assert time.monotonic() < deadline, len(ends)
        time.sleep(0.2)
    ray.get(consumer.close.remote())
    assert summary["count"] == 3 * len(names) and summary["gaps"] == 0
    assert sorted(k.split("|")[0] for k in ends) == sorted(names)
    assert set(ends.values()) == {3}
    with pytest.raises(PublisherClosed):
        pubs[0].publish(b"late")


def test_values_round_trip_through_msgpack(cluster, topic_name):
    cluster.create_topic(topic_name)
    values = [{"a": 1, "b": [1.5, "x", None]}, [1, 2, 3], "text", 42, b"raw bytes"]
    with cluster.subscriber(topic_name) as sub, cluster.publisher(topic_name) as pub:
        for v in values:
            pub.publish(v)
        pub.flush()
        got = [sub.receive(timeout=10.0) for _ in values]
    assert [m.value for m in got] == values
    assert [m.seq for m in got] == [1, 2, 3, 4, 5]
    assert got[-1].payload == b"raw bytes"
    assert all(m.topic == topic_name for m in got)


def test_messages_larger_than_a_datagram_are_fragmented_and_reassembled(cluster, topic_name):
    """Fragmentation on the wire: the subscriber is another process (a Ray actor)."""
    from scopecast.netio.pubsub import encode_value

    cluster.create_topic(topic_name)
    big = bytes(range(256)) * (5 * 4096)            # 5 MiB, many fragments
    values = [b"small before", big, {"blob": big[:300_000], "n": 1}, b"small after"]
    actor = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(actor.ready.remote())
    pending = actor.consume.remote(len(values), 60.0)
    expected = DeliveryDigest()
    with cluster.publisher(topic_name) as pub:
        for seq, v in enumerate(values, 1):
            pub.publish(v)
            expected.add(topic_name, seq, encode_value(v)[1])
        pub.flush(timeout=30.0)
    summary = ray.get(pending, timeout=120)
    counters = ray.get(actor.counters.remote())
    ray.get(actor.close.remote())
    assert summary["count"] == len(values) and summary["gaps"] == 0
    assert summary["digest"] == expected.hexdigest()
    assert summary["bytes"] == sum(len(encode_value(v)[1]) for v in values)
    assert counters["stats"]["reassembled"] == 2
    assert counters["drops"] == {}


def test_message_above_the_maximum_is_refused(cluster, topic_name):
    import scopecast

    cluster.create_topic(topic_name)
    with cluster.publisher(topic_name) as pub:
        with pytest.raises(scopecast.MessageTooLarge):
            pub.publish(b"x" * (16 * 1024 * 1024 + 1))


def test_quickstart_example_runs(ray_address):
    import os
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "quickstart.py"
    out = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "RAY_ADDRESS": ray_address})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("subscriber")]
    assert len(lines) == 2
    assert all("(5, {'symbol': 'XYZ', 'price': 104})" in line for line in lines)
