"""scopecast's side of a throughput case: a publisher process and subscriber processes.

    python -m benchmarks.throughput subscribe --address A --topic T [--topics N] [--warmup S]
    python -m benchmarks.throughput publish   --address A --topic T [--topics N] --size B --seconds D

Both attach to the harness's cluster with `connect(address=..., start=False)`. The subscriber prints
READY once subscribed, then consumes with `receive_batch()`, touching every payload (`len()`), until
the publisher's end-of-stream marker (or `--idle` seconds without a message after the first), and
prints `RESULT {json}`. The publisher publishes one payload as fast as `publish()` allows for
`--seconds`, flushes, closes (which sends end-of-stream) and prints `RESULT {json}` with the count and
its (time, CPU) samples. With `--topics N` (N > 1) the publisher publishes to the topics T/0 ..
T/N-1 in turn and every subscriber subscribes to the pattern T/*; the stream ends when the markers of
all N topics came. The publisher prints READY once it has advertised its topics: a readiness case
(`--ready-within S`) starts its subscribers only then, and each reports `ready_seconds`, from its
subscribe call until it has had a message of every topic, and stops then (or S seconds after the
call, not ready, with the count of topics it had).
"""

from __future__ import annotations

import os
import sys
import time
from operator import attrgetter

from benchmarks.meter import (
    CpuSampler,
    DeliveryMeter,
    LatencyLog,
    cpu,
    monotonic,
    pace,
    pace_step,
    rss,
    stamp,
)
from benchmarks.procs import READY, report, role_parser, run_role, topic_names

CHECK_EVERY = 256  # publishes between clock reads
SETTLE_TIMEOUT = 3.0  # s a subscriber waits at the end for what it holds to become stable


def _connect(address: str):
    import scopecast

    return scopecast.connect(address=address, start=False)


def _member_counters(cluster) -> dict:
    try:
        (me,) = cluster.counters().values()  # this process's one member
        # every gap-to-repair time, for percentiles over all subscribers together (each one's
        # own p99 of a hundred-odd repairs is its slowest)
        return {"drops": me["drops"], "stats": me["stats"], "recovery": me["recovery"],
                "repair_ms": [round(ms, 2) for ms in cluster.repair_times()]}
    except Exception as exc:  # counters are diagnostics; never lose the result for them
        return {"error": repr(exc)}


def _settle(cluster, timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait (at most `timeout`) until this member holds no message for repairs, as the publisher's
    flush waits until its window is stable: the resident memory then taken (the topic sweep's
    memory a topic) is what the member keeps for its topics, not the in-flight data of the last
    moment, which varies from run to run and has nothing to do with the number of topics."""
    deadline = monotonic() + timeout
    while monotonic() < deadline:
        try:
            (me,) = cluster.counters().values()
            if not me["recovery"].get("cached_messages"):
                return
        except Exception:  # counters are diagnostics: the result is taken anyway
            return
        time.sleep(0.02)


def subscribe(args) -> None:
    cluster = _connect(args.address)
    try:
        subscribing = monotonic()
        sub = cluster.subscriber(args.topic if args.topics <= 1 else f"{args.topic}/*")
        print(READY, flush=True)
        unseen = set(topic_names(args.topic, args.topics)) if args.ready_within else None
        topic_of, ready_seconds = attrgetter("topic"), None
        give_up = subscribing + args.ready_within
        meter = DeliveryMeter(args.warmup)
        latency = LatencyLog() if args.latency else None
        receive_batch = sub.receive_batch
        # per message in C (map over attrgetter), as a user counting a batch would
        payload_of, seq_of = attrgetter("payload"), attrgetter("seq")
        prev_seq = 0
        gaps = 0
        many = args.topics > 1
        seq_sum = 0  # several topics: with the end markers' seqs, tells a gap or a duplicate
        end_seq = None
        ended_by = "deadline"
        deadline = monotonic() + args.timeout
        while True:
            batch = receive_batch(0.05)
            if batch:
                now = monotonic()
                meter.add(len(batch), sum(map(len, map(payload_of, batch))), now)
                if latency is not None and meter.k is not None:
                    latency.add([m.payload for m in batch], now)
                if unseen is not None:  # a readiness case: until a message of every topic came
                    unseen.difference_update(map(topic_of, batch))
                    if not unseen:
                        ready_seconds, ended_by = now - subscribing, "ready"
                        break
                    if now > give_up:
                        ended_by = "not_ready"
                        break
                if many:  # several topics: checked at the end
                    seq_sum += sum(map(seq_of, batch))
                    continue
                first, last = batch[0].seq, batch[-1].seq
                gaps += (first - prev_seq - 1) + (last - first + 1 - len(batch))
                prev_seq = last
                if end_seq is not None and last >= end_seq:
                    ended_by = "end_of_stream"
                    break
                continue
            now = monotonic()
            if unseen is not None and now > give_up:
                ended_by = "not_ready"
                break
            ends = sub.ends
            if many:
                if len(ends) >= args.topics:
                    end_seq = sum(ends.values())
                    ended_by = "end_of_stream"
                    break
            elif ends:  # the queue is drained and the marker came after the last datagram
                end_seq = max(ends.values())
                ended_by = "end_of_stream"
                break
            elif meter.count and now - meter.last_t > args.idle:
                ended_by = "idle"
                break
            if now > deadline:
                break
        end_cpu = cpu()
        seqs_ok = None
        if many:  # seqs run 1..n per topic: n messages summing to n(n+1)/2, unless one is
            # missing or came twice (order within a topic the system checks itself)
            ends = list(sub.ends.values()) if ended_by == "end_of_stream" else None
            prev_seq = sum(ends) if ends else None
            gaps = prev_seq - meter.count if ends else None
            seqs_ok = seq_sum == sum(e * (e + 1) // 2 for e in ends) if ends else None
        _settle(cluster)
        result = meter.summary(end_cpu)
        if latency is not None:
            result["latency"] = latency.summary()
        result.update(role="subscriber", pid=os.getpid(), ended_by=ended_by, gaps=gaps,
                      seqs_ok=seqs_ok, last_seq=prev_seq, end_seq=end_seq,
                      ready_seconds=ready_seconds,
                      topics_seen=None if unseen is None else args.topics - len(unseen),
                      **_member_counters(cluster))
        report(result)
        sub.close()
    finally:
        cluster.shutdown()


def publish(args) -> None:
    cluster = _connect(args.address)
    try:
        advertising = monotonic()
        pubs = cluster.publishers(topic_names(args.topic, args.topics))
        advertised = monotonic()
        print(READY, flush=True)  # (a readiness case starts its subscribers now)
        payload = os.urandom(args.size)
        sampler = CpuSampler()
        count = 0
        start = monotonic()
        sampler.sample(0, start, force=True)
        stop_at = start + args.seconds
        if args.rate > 0:  # a latency run: paced, every payload stamped
            count = _paced(pubs[0].publish, bytearray(payload), args.rate, start, stop_at, sampler)
        # between clock reads, the topics in turn (one topic: its publish CHECK_EVERY times)
        turn = [p.publish for p in pubs] * max(1, CHECK_EVERY // len(pubs))
        while args.rate <= 0:
            for publish in turn:
                publish(payload)
            count += len(turn)
            now = monotonic()
            sampler.sample(count, now)
            if now >= stop_at:
                break
        stopped = monotonic()
        sampler.sample(count, stopped, force=True)
        flush_error = None
        try:
            pubs[-1].flush(timeout=args.flush_timeout)  # one sender stream: covers every topic
        except Exception as exc:  # FlushTimeout: report it, the subscribers' counts tell the rest
            flush_error = repr(exc)
        flushed = monotonic()
        sampler.sample(count, flushed, force=True)
        published = sum(p.seq for p in pubs)
        cluster.close_publishers(pubs, timeout=args.flush_timeout)
        closed = monotonic()
        sampler.sample(count, closed, force=True)
        result = {"role": "publisher", "pid": os.getpid(), "published": published,
                  "size": args.size, "topics": len(pubs), "rss_bytes": rss(),
                  "advertise_seconds": round(advertised - advertising, 3),
                  "start": start, "stopped": stopped, "flushed": flushed, "closed": closed,
                  "flush_error": flush_error, "samples": sampler.samples,
                  **_member_counters(cluster)}
        report(result)
    finally:
        cluster.shutdown()


def _paced(publish_one, template: bytearray, rate: float, start: float, stop_at: float,
           sampler: CpuSampler) -> int:
    """Publish stamped payloads at `rate` msgs/s until `stop_at`, a millisecond's worth at a
    time as the peers' senders do (`pace_step`); returns how many."""
    count = 0
    step = pace_step(rate, CHECK_EVERY)
    while (now := monotonic()) < stop_at:
        pace(count, start, rate, now, step)
        for _ in range(step):
            publish_one(stamp(template))
        count += step
        sampler.sample(count)
    return count


def build_parser():
    p, pub_opts, sub_opts = role_parser(
        "python -m benchmarks.throughput", "scopecast publisher/subscriber of a throughput case",
        sender="publish", receiver="subscribe", what="message")
    for s in (pub_opts, sub_opts):
        s.add_argument("--address", required=True, help="Ray GCS address of the harness's cluster")
        s.add_argument("--topic", required=True)
        s.add_argument("--topics", type=int, default=1, metavar="N",
                       help="publish to N topics T/0 .. T/N-1 in turn, subscribe to T/* "
                            "(default 1: the topic T itself)")
    sub_opts.add_argument("--idle", type=float, default=15.0,
                          help="stop after this long without a message (once one arrived): a guard "
                               "against a dead publisher, longer than any stall of a live one")
    pub_opts.add_argument("--flush-timeout", type=float, default=60.0)
    pub_opts.add_argument("--rate", type=float, default=0.0,
                          help="a latency run: publish stamped payloads at this many msgs/s "
                               "(default 0: flat out, unstamped)")
    sub_opts.add_argument("--ready-within", type=float, default=0.0, metavar="S",
                          help="a readiness case (the publisher is publishing already): report "
                               "how long after the subscribe call a message of every topic came, "
                               "and stop then, or after S seconds, not ready (default 0: not a "
                               "readiness case)")
    sub_opts.add_argument("--latency", action="store_true",
                          help="read each payload's send-time stamp; report p50/p99/p99.9")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_role(build_parser(), {"subscribe": subscribe, "publish": publish}, argv)


if __name__ == "__main__":
    sys.exit(main())
