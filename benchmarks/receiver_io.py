"""CPU of a subscriber's I/O thread per message, from a sender going round N topics (no Ray).

A real sender runtime publishes reliable messages round-robin over N topics to a socket this
process reads, so the datagrams are what a subscriber gets (runs, or mixed runs across topics).
A real receiver runtime, subscribed to every topic, then takes them on its I/O thread in slices
(the application thread empties its queue in between); the I/O thread's CPU comes from /proc. What
it isolates is the per-topic work of the receive path (order, duplicates, last stream seqs, names),
which the end-to-end topic-scale case shows only through much noise; the sender's side is
`benchmarks.sender_io`.

    .venv/bin/python -m benchmarks.receiver_io --topics 1,10000
"""

from __future__ import annotations

import os
import socket

from benchmarks import sender_io
from benchmarks.sender_io import LAG, ROUND, reliable_topics, sender, thread_cpu
from scopecast.netio import wire
from scopecast.netio.delivery import Subscription
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig

SLICE = 200  # datagrams taken per call on the receiver's I/O thread


def datagrams(key: bytes, topics: int, messages: int, size: int) -> list[bytes]:
    """What sender 1 sends of `messages` reliable messages round-robin over `topics`."""
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(0.5)
    rt = sender(key, topics, sink)
    out: list[bytes] = []
    try:
        payload, seqs, sent = b"x" * size, [0] * (topics + 1), 0
        for i in range(messages):
            topic = 1 + i % topics
            seqs[topic] += 1
            sseq = rt.publish(topic, 1, seqs[topic], 0, payload)
            if i % ROUND == ROUND - 1 or i == messages - 1:
                rt.call_wait(rt.own.release, max(0, sseq - LAG))
                sent = _collect(rt, sink, sent, out)
        return out
    finally:
        rt.close()
        sink.close()


def _collect(rt: MemberRuntime, sink: socket.socket, sent: int, out: list[bytes]) -> int:
    """Read from `sink` every data datagram the sender sent so far."""
    total = rt.call_wait(lambda: rt.stats["datagrams_out"])
    while sent < total:
        data = sink.recv(1 << 16)
        sent += 1
        if wire.unpack_header(data).ptype == wire.PacketType.DATA:  # (not control)
            out.append(data)
    return sent


def us_per_message(topics: int, messages: int, size: int) -> float:
    key = os.urandom(32)
    sent = datagrams(key, topics, messages, size)
    rt = MemberRuntime(2, "s", key, RuntimeConfig())
    try:
        rt.call_wait(rt.install_members, [MemberInfo(1, "p", "127.0.0.1", 9),
                                          MemberInfo(2, "s", *rt.address)])
        ids = reliable_topics(rt, topics)
        inbox = Subscription(frozenset(ids))
        rt.call_wait(rt.add_subscription, inbox)
        warm = len(sent) // 10 // SLICE * SLICE  # tables made, caches warm
        total = cpu = 0.0
        for lo in range(0, len(sent), SLICE):
            if lo == warm:
                before, cpu = total, thread_cpu(rt._thread)
            rt.call_wait(_take, rt, sent[lo:lo + SLICE])
            while inbox.queue:
                batch, nbytes = inbox.queue.popleft()
                inbox.consumed_bytes += nbytes
                total += len(batch)
        cpu = thread_cpu(rt._thread) - cpu
        if rt.drops or total != messages:
            raise RuntimeError(f"the receiver took {total:,} of {messages:,} messages; "
                               f"drops: {dict(rt.drops)}")
        return cpu / (total - before) * 1e6
    finally:
        rt.close()


def _take(rt: MemberRuntime, datagrams: list[bytes]) -> None:
    for data in datagrams:
        rt.receiver._on_datagram(data)
    rt.delivery.deliver()


def main() -> None:
    sender_io.main(us_per_message, __doc__)


if __name__ == "__main__":
    main()
