"""Two curves of the loss suite (issue 5): how long a token takes round a peer group as the group
grows, and how much memory a publisher spends per byte it holds until stable.

* *Token round time*: n subscriber actors and the harness's own publisher in a scope of their own
  (one peer group of n + 1 members: partitions of five, a regional ring above 5), streaming 1 KB
  messages; the leading agents' `round_time` is sampled from `status()` while it streams.
* *Memory in flight*: the publisher's RSS growth while one subscriber is stopped (SIGSTOP), so that
  nothing it publishes becomes stable and everything stays in its window, at a few levels below
  the 64 MiB window (the subscriber resumes well inside the member timeout).
"""

from __future__ import annotations

import os
import signal
import statistics
import time

import psutil
import ray

from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import scope

PAYLOAD = b"r" * 1000
SAMPLE_EVERY = 0.5


def _consumers(topic: str, n: int, path: str) -> list:
    actor = ray.remote(num_cpus=0)(TopicConsumer)
    actors = [actor.remote(topic, scope=path, name=f"r{i}") for i in range(n)]
    ray.get([a.ready.remote() for a in actors], timeout=300)
    return actors


def _close(actors: list) -> None:
    ray.get([a.close.remote() for a in actors], timeout=120)
    for a in actors:
        ray.kill(a)


def token_rounds(cluster, stamp: str, counts: list[int], seconds: float) -> list[dict]:
    out = []
    for n in counts:
        path, topic = f"bench-ring-{n}-{stamp}", f"bench/{stamp}/ring{n}"
        cluster.create_topic(topic, policy="lan_multicast")
        actors = _consumers(topic, n, path)
        reading = [a.consume.remote(None, seconds + 120.0, 2.0) for a in actors]  # never lag
        rounds: list[float] = []
        try:
            with cluster.publisher(topic, scope=path) as pub:
                end = time.monotonic() + seconds
                next_sample = time.monotonic() + SAMPLE_EVERY
                while time.monotonic() < end:
                    for _ in range(200):
                        pub.publish(PAYLOAD)
                    if time.monotonic() >= next_sample:
                        next_sample += SAMPLE_EVERY
                        domain = scope(cluster.status(), path).get("recovery", {}).get("token_ring")
                        agents = domain["agents"] if domain else {}
                        rounds += [a["protocol_stats"]["round_time"] for a in agents.values()
                                   if a.get("leader") and a.get("protocol_stats", {}).get("rounds")]
                pub.flush(timeout=120)
            ray.get(reading, timeout=300)
        finally:
            _close(actors)
        out.append({"members": n + 1, "samples": len(rounds),
                    "round_ms_p50": round(statistics.median(rounds) * 1000, 1) if rounds else None,
                    "round_ms_max": round(max(rounds) * 1000, 1) if rounds else None})
        print(f"[curves] token round, {n + 1} members: {out[-1]}", flush=True)
    return out


def memory_in_flight(cluster, stamp: str, levels_mb: list[int]) -> list[dict]:
    topic = f"bench/{stamp}/memory"
    cluster.create_topic(topic, policy="lan_multicast")
    (actor,) = _consumers(topic, 1, f"bench-memory-{stamp}")
    pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
    me = psutil.Process()
    out = []
    try:
        with cluster.publisher(topic) as pub:
            for _ in range(1000):  # warm: the publisher's own buffers exist before the baseline
                pub.publish(PAYLOAD)
            pub.flush(timeout=60)
            base = me.memory_info().rss
            sent = 0
            os.kill(pid, signal.SIGSTOP)
            try:
                for level in sorted(levels_mb):
                    while sent < level << 20:  # a payload of its own each (held until stable)
                        pub.publish(sent.to_bytes(8, "big") + PAYLOAD[8:])
                        sent += len(PAYLOAD)
                    grown = me.memory_info().rss - base
                    out.append({"in_flight_mb": level, "rss_growth_mb": round(grown / 2**20, 1),
                                "bytes_per_payload_byte": round(grown / sent, 2)})
                    print(f"[curves] memory: {out[-1]}", flush=True)
            finally:
                os.kill(pid, signal.SIGCONT)
            pub.flush(timeout=120)
    finally:
        _close([actor])
    return out


RING_SUBSCRIBERS = (2, 4, 8, 16)
MEMORY_LEVELS_MB = (8, 16, 32, 48)


def run(cluster, stamp: str, seconds: float, ring_subscribers=RING_SUBSCRIBERS,
        memory_levels_mb=MEMORY_LEVELS_MB) -> dict:
    return {"token_rounds": token_rounds(cluster, stamp, list(ring_subscribers), seconds),
            "memory_in_flight": memory_in_flight(cluster, stamp, list(memory_levels_mb))}
