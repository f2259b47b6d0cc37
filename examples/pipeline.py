"""A pipeline: a script run as a Ray job on a running cluster.

    scopecast up
    scopecast pipeline submit examples/pipeline.py -- --messages 1000

It attaches to the cluster it runs on, creates a topic, starts a subscriber actor, publishes the
messages, flushes, and exits 0 only if the subscriber got every one of them, in order and intact.
(Run directly, `python examples/pipeline.py` attaches to the running cluster, else starts an
embedded one.)
"""

from __future__ import annotations

import argparse
import sys

import ray

import scopecast
from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="publish to a subscriber actor and check delivery")
    parser.add_argument("--messages", type=int, default=1000, help="how many to publish (1000)")
    parser.add_argument("--topic", default="pipeline/example", help="the topic (pipeline/example)")
    args = parser.parse_args(argv)

    cluster = scopecast.connect()  # in a Ray job: the job's cluster (Ray sets RAY_ADDRESS)
    cluster.create_topic(args.topic)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(args.topic)
    ray.get(consumer.ready.remote())  # subscribed: it gets everything published from now on
    summary = consumer.consume.remote(expect=args.messages, timeout=120.0)

    sent = DeliveryDigest()
    with cluster.publisher(args.topic) as pub:
        for i in range(args.messages):
            payload = f"message {i}".encode()
            sent.add(args.topic, pub.publish(payload), payload)
        pub.flush(timeout=60.0)
    got = ray.get(summary)
    ray.get(consumer.close.remote())
    cluster.shutdown()

    ok = got["count"] == args.messages and got["digest"] == sent.hexdigest()
    print(f"published {args.messages} messages to {args.topic}; the subscriber received "
          f"{got['count']} ({got['gaps']} gaps, {got['out_of_order']} out of order): "
          + ("all delivered" if ok else "DELIVERY FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
