"""CPU of a sender's I/O thread per message, going round N topics (no Ray, no receivers).

A real MemberRuntime takes reliable messages from this thread, sends them as datagrams to a local
socket nobody reads, and releases what an agent would call stable (driven here by hand, a few
thousand messages behind); the I/O thread's CPU comes from /proc. What it isolates is the
per-topic bookkeeping of the send path (plans, mixed runs, stream tails), which the end-to-end
topic-scale case shows only through much noise.

    .venv/bin/python -m benchmarks.sender_io --topics 1,10000
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from scopecast.netio.channel import UnicastEndpoint
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig

WARMUP = 20_000
ROUND = 2_000       # messages between releases
LAG = 4_000         # stream seqs the stable point stays behind


def thread_cpu(thread) -> float:
    """CPU seconds `thread` (a threading.Thread) has used, to the nanosecond (/proc's ticks of
    10 ms read 0 for a short run on a fast machine)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def reliable_topics(rt: MemberRuntime, topics: int) -> range:
    """Install topics 1..`topics` ("bench/t<id>"), reliable by token_ring (an agent that is not
    there: stability is driven by hand); their ids."""
    ids = range(1, topics + 1)
    rt.call_wait(rt.install_topics, {t: f"bench/t{t}" for t in ids})
    rt.call_wait(rt.install_recovery, {"token_ring": ("127.0.0.1", 9)},
                 dict.fromkeys(ids, "token_ring"))
    return ids


def sender(key: bytes, topics: int, sink: socket.socket) -> MemberRuntime:
    """Member 1 "p", publishing reliable topics 1..`topics` to `sink`."""
    rt = MemberRuntime(1, "p", key, RuntimeConfig())
    rt.call_wait(rt.install_members, [MemberInfo(1, "p", *rt.address)])
    ids = reliable_topics(rt, topics)
    to = UnicastEndpoint(*sink.getsockname())
    rt.call_wait(rt.install_routes,
                 {t: [Route(RoutingLabel(("p",), ("*",), "p"), to)] for t in ids})
    return rt


def us_per_message(topics: int, messages: int, size: int) -> float:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    rt = sender(os.urandom(32), topics, sink)
    try:
        payload, seqs, sseq, start = b"x" * size, [0] * (topics + 1), 0, 0.0
        for i in range(WARMUP + messages):
            if i == WARMUP:
                rt.call_wait(lambda: None)
                start = thread_cpu(rt._thread)
            topic = 1 + i % topics
            seqs[topic] += 1
            sseq = rt.publish(topic, 1, seqs[topic], 0, payload)
            if i % ROUND == ROUND - 1:
                rt.call_wait(rt.own.release, max(0, sseq - LAG))
        rt.call_wait(rt.own.release, sseq)
        return (thread_cpu(rt._thread) - start) / messages * 1e6
    finally:
        rt.close()
        sink.close()


def main(measure=us_per_message, doc: str = __doc__) -> None:
    """The command line of this benchmark, and of `receiver_io` (`measure` its
    us_per_message)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--topics", default="1,10000", help="topic counts, comma-separated")
    parser.add_argument("--messages", type=int, default=300_000, help="measured per count")
    parser.add_argument("--size", type=int, default=1000, help="payload bytes")
    args = parser.parse_args()
    for topics in map(int, args.topics.split(",")):
        print(f"{topics} topics: {measure(topics, args.messages, args.size):.2f} us "
              "of the I/O thread per message", flush=True)


if __name__ == "__main__":
    main()
