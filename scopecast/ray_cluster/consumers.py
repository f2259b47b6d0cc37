"""Subscribers that run as Ray actors or plain processes and report what they received.

`consume` reads until it has `expect` messages (or every publisher's end-of-stream marker, or a
timeout) and summarises: counts, order per (topic, source, session), and a digest over the delivered
sequence so a caller can compare it with what was published. The demo, the tests and the benchmarks
use the same code."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time


class DeliveryDigest:
    """Order-sensitive digest of (topic, source, seq, payload) per message, as published or received."""

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=16)

    def add(self, topic: str, seq: int, payload: bytes) -> None:
        h = self._h
        h.update(topic.encode())
        h.update(seq.to_bytes(8, "little"))
        h.update(payload)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def consume(sub, expect: int | None = None, timeout: float = 60.0, idle: float | None = None,
            touch: bool = True, until: bytes | None = None) -> dict:
    """Receive until `expect` messages, the deadline, `idle` seconds without a message, or a
    message whose payload is `until` (for streams whose length is not known in advance)."""
    count = 0
    nbytes = 0
    gaps = 0
    out_of_order = 0
    last: dict[tuple, int] = {}
    digest = DeliveryDigest()
    start = first = time.monotonic()
    end = start + timeout
    while expect is None or count < expect:
        now = time.monotonic()
        if now >= end:
            break
        batch = sub.receive_batch(min(end - now, idle if idle else end - now))
        if not batch:
            if idle is not None and count:
                break
            continue
        if count == 0:
            first = time.monotonic()
        for m in batch:
            key = (m.topic, m.source, m.session)
            prev = last.get(key)
            if prev is not None and m.seq != prev + 1:
                if m.seq <= prev:
                    out_of_order += 1
                elif not (m.seq == prev + 2 and sub.ended(*key, prev)):
                    gaps += m.seq - prev - 1  # (else an end marker took that seq: a publisher
                                              # closed, and another of that process went on)
            last[key] = m.seq
            if touch:
                digest.add(m.topic, m.seq, m.payload)
            nbytes += len(m.payload)
        count += len(batch)
        if until is not None and any(m.payload == until for m in batch):
            break
    elapsed = time.monotonic() - first
    return {"count": count, "bytes": nbytes, "gaps": gaps, "out_of_order": out_of_order,
            "sources": len(last), "digest": digest.hexdigest() if touch else "",
            "seconds": elapsed, "rate": count / elapsed if elapsed > 0 else 0.0,
            "last_seq": {f"{t}|{s}|{sess}": q for (t, s, sess), q in last.items()},
            "demoted": getattr(sub, "demoted", "")}


class TopicConsumer:
    """A subscriber living in a Ray actor (declare with `ray.remote(num_cpus=0)`)."""

    def __init__(self, topics: str | list[str], role: str = "member", scope: str | None = None,
                 name: str | None = None, config=None) -> None:
        import scopecast

        self._cluster = scopecast.connect(name=name, config=config)  # (a RuntimeConfig)
        self._sub = self._cluster.subscriber(topics, role=role, scope=scope)
        self._held = threading.Event()

    def ready(self) -> bool:
        return True

    def consume(self, expect: int | None = None, timeout: float = 60.0, idle: float | None = None,
                touch: bool = True, until: bytes | None = None) -> dict:
        return consume(self._sub, expect, timeout, idle, touch, until)

    def hold_io(self, seconds: float) -> None:
        """Keep this member's I/O thread busy for `seconds` from now, or until `release_io()`
        (a fault tests inject: what a burst to catch up with on a loaded machine does to a data
        plane). Unlike a stopped process it keeps heartbeating: it stays a member, and what it
        has not acknowledged stays unstable however long the hold."""
        self._held = threading.Event()
        self._sub.runtime.call(self._held.wait, seconds)

    def release_io(self) -> None:
        self._held.set()

    def ends(self) -> dict[str, int]:
        """End-of-stream markers seen: "topic|source|session" -> last sequence number."""
        return {"|".join(map(str, k)): last for k, last in self._sub.ends.items()}

    def counters(self) -> dict:
        (counters,) = self._cluster.counters().values()
        return counters

    def close(self) -> None:
        self._sub.close()
        self._cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    """A plain-process subscriber: prints 'ready', then one JSON summary line."""
    parser = argparse.ArgumentParser(description="consume a topic and print a JSON summary")
    parser.add_argument("--address", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--expect", type=int)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--no-digest", action="store_true",
                        help="count and check order only; skip the content digest")
    parser.add_argument("--scope", help="the member's scope path (default: its host's scope)")
    parser.add_argument("--name", help="the member's name in its scope (default host:pid)")
    args = parser.parse_args(argv)
    import scopecast

    cluster = scopecast.connect(address=args.address, start=False, name=args.name)
    sub = cluster.subscriber(args.topic, scope=args.scope)
    print("ready", flush=True)
    summary = consume(sub, args.expect, args.timeout, touch=not args.no_digest)
    (counters,) = cluster.counters().values()
    summary["drops"] = counters["drops"]
    print(json.dumps(summary), flush=True)
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

