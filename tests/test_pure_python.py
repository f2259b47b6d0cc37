"""The data path with its compiled parts ruled out (SCOPECAST_PURE_PYTHON=1, what a machine without
a compiler runs: see scopecast.netio.native), end to end: a publisher going round topics (mixed
runs, the sender's tail table) and a subscriber both in pure Python, beside a subscriber with the C
parts, under real packet loss (repairs: records, NAKs, retransmissions). Everyone gets every
message of every topic once and in order."""

from __future__ import annotations

import sys

import pytest
import ray
import ray.cloudpickle

from benchmarks.loss import available, dropped, udp_loss
from scopecast.ray_cluster.consumers import TopicConsumer

pytestmark = pytest.mark.ray

PURE = {"env_vars": {"SCOPECAST_PURE_PYTHON": "1"}}
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # (workers cannot import tests)
TOPICS = 12
PER_TOPIC = 800


class Publisher:
    """Publishes PER_TOPIC messages to each topic, going round them."""

    def __init__(self, topics: list[str]) -> None:
        import scopecast

        self.cluster = scopecast.connect()
        self.pubs = self.cluster.publishers(topics)

    def run(self) -> str:
        for i in range(PER_TOPIC):
            for pub in self.pubs:
                pub.publish(b"p%06d" % i + b"." * 150)
        for pub in self.pubs:
            pub.flush(timeout=180)
        (counters,) = self.cluster.counters().values()
        return counters["offloads"]["native"]

    def close(self) -> None:
        self.cluster.shutdown()


@pytest.mark.skipif(not available(), reason="needs root and iptables")
def test_the_pure_python_data_path_delivers_whole_under_loss_beside_the_compiled_one(
        cluster, topic_name):
    topics = [f"{topic_name}/{i}" for i in range(TOPICS)]
    for t in topics:
        cluster.create_topic(t)
    consumer = ray.remote(num_cpus=0)(TopicConsumer)
    pure_sub = consumer.options(runtime_env=PURE).remote(f"{topic_name}/*")
    c_sub = consumer.remote(f"{topic_name}/*")
    ray.get([pure_sub.ready.remote(), c_sub.ready.remote()], timeout=120)
    publisher = ray.remote(num_cpus=0)(Publisher).options(runtime_env=PURE).remote(topics)
    total = TOPICS * PER_TOPIC
    pending = [s.consume.remote(total, 240.0) for s in (pure_sub, c_sub)]
    with udp_loss(0.03):
        native = ray.get(publisher.run.remote(), timeout=300)
        got = ray.get(pending, timeout=300)
        assert dropped() > 0
    assert native == "python"
    for r in got:
        assert (r["count"], r["gaps"], r["out_of_order"]) == (total, 0, 0), r
        assert sorted(r["last_seq"].values()) == [PER_TOPIC] * TOPICS
    pure, compiled = ray.get([pure_sub.counters.remote(), c_sub.counters.remote()])
    assert (pure["offloads"]["native"], compiled["offloads"]["native"]) == ("python", "C")
    assert pure["stats"]["mixed_runs"] > 0, pure["stats"]  # the pure take_mixed took runs
    ray.get([s.close.remote() for s in (pure_sub, c_sub)] + [publisher.close.remote()])
