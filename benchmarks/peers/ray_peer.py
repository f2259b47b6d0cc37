"""Ray-native fan-out as a peer: what a Ray user writes without scopecast.

    python -m benchmarks.peers.ray_peer receive --address A --topic T
    python -m benchmarks.peers.ray_peer send    --address A --topic T --subscribers N --size B --seconds D

Each receiver process is a Ray driver that starts one `Sink` actor (named `T/<pid>`, `num_cpus=0`)
and waits for its summary; the actor's process does the receiving, so its CPU is what the case
counts. The sender (another driver) finds the N sinks by name and calls `deliver` on every sink
with a list of `BATCH` payloads per call (and their topics, when a case has several), keeping at
most `IN_FLIGHT` calls outstanding per sink (`ray.wait` on the oldest) — batching and back-pressure
as a fair Ray user would. Nothing is lost: Ray's actor calls are reliable and ordered, so the sender
simply goes no faster than the slowest sink.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque

from benchmarks.peers import stream
from benchmarks.procs import report

BATCH = 256
IN_FLIGHT = 4
NAMESPACE = "scopecast-bench-peers"
FIND_TIMEOUT = 60.0


class Sink:
    def __init__(self, warmup: float, timeout: float, idle: float, latency: bool) -> None:
        self._receiver = stream.Receiver(warmup, timeout, idle, latency)
        self._ended = False

    def deliver(self, payloads: list, topics: list | None = None) -> None:
        """A batch of messages (`topics`: each one's topic, when a case has several; every sink
        takes every topic, so they are only carried)."""
        if not self._ended:
            self._ended = self._receiver.take(payloads)

    def summary(self) -> dict | None:
        """The count once the stream ended (or went idle), else None."""
        if self._ended or self._receiver.done():
            return self._receiver.summary()
        return None


def _init(address: str) -> None:
    import ray

    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
             logging_level="ERROR", include_dashboard=False)


def receive(args) -> None:
    import ray

    _init(args.address)
    sink = ray.remote(num_cpus=0)(Sink).options(name=f"{args.topic}/{os.getpid()}").remote(
        args.warmup, args.timeout, args.idle, args.latency)
    ray.get(sink.summary.remote())  # the actor is up
    stream.ready()
    while (result := ray.get(sink.summary.remote())) is None:
        time.sleep(0.1)
    report(result)
    ray.shutdown()


def send(args) -> None:
    import ray

    _init(args.address)
    sinks = _find_sinks(args.topic, args.subscribers)
    pending = [deque() for _ in sinks]
    distinct: list[bytes] = []  # pickle would send one object listed n times only once
    topic = stream.Topics(args.topic, args.topics).next

    def send_batch(payloads) -> None:
        payloads = list(payloads)
        n = len(payloads)
        if n > 1 and payloads[0] is payloads[-1]:  # one object repeated: as many copies
            if len(distinct) < n or distinct[0] != payloads[0]:
                distinct[:] = [bytes(bytearray(payloads[0])) for _ in range(n)]
            batch = distinct[:n]
        else:  # (stamped: each its own)
            batch = payloads
        labels = [topic() for _ in range(n)] if args.topics > 1 else None
        for sink, refs in zip(sinks, pending, strict=True):
            if len(refs) >= IN_FLIGHT:
                ray.wait([refs.popleft()], fetch_local=False)
            refs.append(sink.deliver.remote(batch, labels))

    result = stream.send_loop(send_batch, args.size, args.seconds, args.rate, BATCH,
                              args.stamped)
    ray.get([s.deliver.remote([stream.END]) for s in sinks])
    report(result)
    ray.shutdown()


def _find_sinks(topic: str, n: int) -> list:
    import ray

    deadline = time.monotonic() + FIND_TIMEOUT
    while True:
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["namespace"] == NAMESPACE and a["name"].startswith(topic + "/"))
        if len(names) >= n:
            return [ray.get_actor(name) for name in names[:n]]
        if time.monotonic() > deadline:
            raise SystemExit(f"found {len(names)} of {n} sinks for {topic!r}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    return stream.run("benchmarks.peers.ray_peer", "Ray-native fan-out sender/receiver of a peer case",
                      "--address", send, receive, argv)


if __name__ == "__main__":
    sys.exit(main())
