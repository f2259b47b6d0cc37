"""What every peer's case processes share: the send loop (flat out or paced), the receiving side's
count and the end-of-stream marker.

A sender hands `send_batch(payloads)` the payloads of a batch (one payload object repeated when flat
out; in a latency run, each stamped as the peer's loop draws it); the peer module decides how that
becomes messages (a Redis pipeline, NATS publishes, ZeroMQ sends, one Ray call), taking the topic of
each from `Topics` (round-robin when a case has several; receivers take all of them, by the peer's
own wildcard). Paced at `rate` msgs/s, a batch covers at most a millisecond of the rate, so a paced
stream stays even. After `seconds` the sender sends `END` a few times (the peers without flow
control may drop some).
"""

from __future__ import annotations

import itertools
import os
import time

from benchmarks.meter import (
    CpuSampler,
    DeliveryMeter,
    LatencyLog,
    cpu,
    monotonic,
    pace,
    pace_step,
    stamp,
)
from benchmarks.procs import READY, role_parser, run_role, topic_names

END = b"E"               # shorter than any message
END_LEN = len(END)
END_REPEATS = 10
END_SPACING = 0.02


def send_loop(send_batch, size: int, seconds: float, rate: float, batch: int,
              stamped: bool = False) -> dict:
    """Send for `seconds`, flat out (`rate` 0) or at `rate` msgs/s (`pace_step` messages at a
    time); `stamped`: every message carries the time it is handed over (`meter.stamp`). Returns
    the sender's summary for `analysis.summarize_case` (published, start, stopped, CPU
    samples)."""
    payload = os.urandom(size)
    template = bytearray(payload)
    step = batch if rate <= 0 else pace_step(rate, batch)
    flat = [payload] * step
    sampler = CpuSampler()
    count = 0
    start = monotonic()
    sampler.sample(0, start, force=True)
    stop_at = start + seconds
    while True:
        now = monotonic()
        if now >= stop_at:
            break
        if rate > 0:
            pace(count, start, rate, now, step)
        # stamped: each message as it is handed over (a generator the peer's loop draws from)
        send_batch((stamp(template) for _ in range(step)) if stamped else flat)
        count += step
        sampler.sample(count)
    stopped = monotonic()
    sampler.sample(count, stopped, force=True)
    return {"role": "sender", "pid": os.getpid(), "published": count, "size": size,
            "offered_rate": rate, "start": start, "stopped": stopped, "samples": sampler.samples}


class Topics:
    """The sender's topics, taken in turn: `next()` is the topic of the next message."""

    __slots__ = ("names", "next")

    def __init__(self, topic: str, n: int, sep: str = "/", encode: bool = False) -> None:
        self.names = topic_names(topic, n, sep)
        self.next = itertools.cycle([t.encode() for t in self.names] if encode
                                    else self.names).__next__


def send_end(send_one) -> None:
    for _ in range(END_REPEATS):
        send_one(END)
        time.sleep(END_SPACING)


def ready() -> None:
    print(READY, flush=True)


class Receiver:
    """A receiving process's count: batches of payloads in, its summary out."""

    __slots__ = ("meter", "deadline", "idle", "ended_by", "latency")

    def __init__(self, warmup: float, timeout: float, idle: float, latency: bool = False) -> None:
        self.meter = DeliveryMeter(warmup)
        self.deadline = monotonic() + timeout
        self.idle = idle
        self.ended_by = ""
        self.latency = LatencyLog() if latency else None

    def take(self, payloads) -> bool:
        """Count a batch (every payload's len() touched); True once the end marker came."""
        lengths = list(map(len, payloads))  # per payload in C, as scopecast's count does
        ended = END_LEN in lengths
        n = lengths.index(END_LEN) if ended else len(lengths)
        nbytes = sum(lengths[:n]) if ended else sum(lengths)
        if n:
            now = monotonic()
            self.meter.add(n, nbytes, now)
            if self.latency is not None and self.meter.k is not None:
                self.latency.add(payloads[:n], now)
        if ended:
            self.ended_by = "end_marker"
        return ended

    def done(self) -> bool:
        """Whether to stop although nothing came: silent for `idle` since the last message (the
        end markers can be dropped too), or past the deadline."""
        now = monotonic()
        if self.meter.count and now - self.meter.last_t > self.idle:
            self.ended_by = "idle"
        elif now > self.deadline:
            self.ended_by = "deadline"
        return bool(self.ended_by)

    def summary(self) -> dict:
        result = self.meter.summary(cpu())
        if self.latency is not None:
            result["latency"] = self.latency.summary()
        result.update(role="receiver", pid=os.getpid(), ended_by=self.ended_by)
        return result


def receive_loop(next_batch, receiver: Receiver) -> dict:
    """Drive `receiver` with `next_batch(timeout_s)` (a list of payloads, empty when none came)."""
    while True:
        batch = next_batch(0.05)
        if batch:
            if receiver.take(batch):
                break
        elif receiver.done():
            break
    return receiver.summary()


def parser(module: str, description: str, endpoint: str):
    """The command line of a peer's two roles, `send` and `receive`: `procs.role_parser`'s options,
    the endpoint (`--port` of the peer's server, or `--address` of the Ray cluster), the topic,
    the offered rate."""
    p, send_opts, recv_opts = role_parser(f"python -m {module}", description, sender="send",
                                          receiver="receive", what="message")
    for s in (send_opts, recv_opts):
        if endpoint == "--port":
            s.add_argument("--port", type=int, required=True, help="the server's (or PUB's) port")
        else:
            s.add_argument("--address", required=True, help="Ray GCS address")
        s.add_argument("--topic", required=True, help="channel / subject / prefix")
        s.add_argument("--topics", type=int, default=1, metavar="N",
                       help="send to N topics T<sep>0 .. T<sep>N-1 in turn, receive all of them "
                            "by wildcard (default 1: T itself)")
    send_opts.add_argument("--rate", type=float, default=0.0,
                           help="offered msgs/s (0: as fast as the client goes)")
    send_opts.add_argument("--stamped", action="store_true",
                           help="stamp each payload with its send time (latency runs)")
    recv_opts.add_argument("--latency", action="store_true",
                           help="read each payload's send-time stamp; report p50/p99/p99.9")
    send_opts.add_argument("--subscribers", type=int, default=1,
                           help="receivers to wait for where the peer can tell")
    recv_opts.add_argument("--idle", type=float, default=2.0,
                           help="stop after this long without a message (once one arrived)")
    return p


def run(module: str, description: str, endpoint: str, send, receive, argv) -> int:
    """A peer module's main: parse, arrange to die with the harness, run the role."""
    return run_role(parser(module, description, endpoint), {"send": send, "receive": receive},
                    argv)
