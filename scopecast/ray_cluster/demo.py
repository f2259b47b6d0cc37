"""The main job (`make demo`, `scopecast demo`): a topic streamed from a publisher to subscribers
in Ray actors over loopback IP multicast, on an embedded local Ray, with a printed summary."""

from __future__ import annotations

import sys
import time

import ray

from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer


def run(messages: int = 200_000, subscribers: int = 3, topic: str = "demo/ticks",
        out=sys.stdout) -> int:
    """Run the demo; returns the process exit code (0 only if every subscriber got everything)."""
    import scopecast

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say(f"scopecast demo: {messages:,} messages -> {subscribers} subscriber actors")
    cluster = scopecast.connect()
    try:
        info = cluster.create_topic(topic)
        say(f"topic {info.name!r} (id {info.id}), policy {info.policy}")
        consumer = ray.remote(num_cpus=0)(TopicConsumer)
        actors = [consumer.remote(topic) for _ in range(subscribers)]
        ray.get([a.ready.remote() for a in actors])
        say(f"{subscribers} subscribers ready; publishing")
        pending = [a.consume.remote(messages, 300.0) for a in actors]
        digest = DeliveryDigest()
        start = time.monotonic()
        with cluster.publisher(topic) as pub:
            for i in range(1, messages + 1):
                payload = scopecast_tick(i)
                pub.publish(payload)
                digest.add(topic, i, payload)
                if i % 50_000 == 0:
                    say(f"  published {i:,}")
            pub.flush(timeout=120.0)
        published_in = time.monotonic() - start
        summaries = ray.get(pending, timeout=600)
        ok = True
        say("")
        say(f"{'subscriber':<12}{'delivered':>12}{'in order':>10}{'content':>10}{'msgs/s':>12}")
        for n, s in enumerate(summaries, 1):
            in_order = s["gaps"] == 0 and s["out_of_order"] == 0
            content = s["digest"] == digest.hexdigest()
            ok &= s["count"] == messages and in_order and content
            say(f"{'actor ' + str(n):<12}{s['count']:>12,}{'yes' if in_order else 'NO':>10}"
                f"{'same' if content else 'DIFFERS':>10}{s['rate']:>12,.0f}")
        say("")
        say(f"published {messages:,} messages in {published_in:.2f}s "
            f"({messages / published_in:,.0f} msgs/s)")
        say("every subscriber got every message, in order" if ok else "FAILED: messages missing")
        for a in actors:
            ray.get(a.close.remote())
        return 0 if ok else 1
    finally:
        cluster.shutdown()


def scopecast_tick(i: int) -> bytes:
    """A 64-byte market-data-like record that differs per message."""
    return b"%012d|XYZ|%016.4f|%08d|" % (i, 100.0 + (i % 1000) / 100, i % 997) + b"." * 18
