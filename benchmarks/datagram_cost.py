"""CPU per datagram of a member's receive and send paths, without scheduling noise.

    python -m benchmarks.datagram_cost [--size 1000] [--datagram-bytes 1472] [--datagrams 50000]

Receive: a real `MemberRuntime` subscribed to one reliable topic takes pre-built, signed
datagrams of one publisher's stream as a GRO receive call hands them over (batches of segments),
on its own I/O thread: authentication, header, routing table, runs, order, the stable cache,
delivery. The application side takes each delivered batch.

Send: a real `MemberRuntime` takes queued publishes of one topic routed to a UDP socket nobody
reads, and pumps them out: runs, chunks, datagrams, MACs, GSO batches, the kernel's send.

Reported: microseconds of the I/O thread's CPU per datagram and per message. Throughput runs on
a shared machine swing with the load; these measure only the work a datagram costs, to tell
what a change to that work bought.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from scopecast.netio import wire
from scopecast.netio.auth import authenticator, sealed
from scopecast.netio.channel import UnicastEndpoint
from scopecast.netio.delivery import Subscription
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig
from scopecast.netio.transport import TransportConfig
from scopecast.netio.udp_batch import batch_limit

TOPIC, SOURCE, ME = 3, 9, 1
ROUTE = (("lan0", "host-a"),)


def datagrams(key: bytes, size: int, datagram_bytes: int, count: int) -> tuple[list, int]:
    """`count` signed datagrams of consecutive messages of `size` bytes, as many per datagram as
    fit `datagram_bytes`; (the datagrams, messages per datagram)."""
    signer = authenticator(RuntimeConfig().mac, key)
    table = wire.encode_route_table([ROUTE])
    room = datagram_bytes - wire.HEADER.size - len(table) - signer.trailer_size - wire.RUN.size
    per = max(1, room // (size + wire.LENGTH.size))
    payload = bytes(size)
    out = []
    seq = 1
    for dseq in range(1, count + 1):
        parts = wire.run_parts(TOPIC, SOURCE, 1, seq, SOURCE, seq, 0, 0, [payload] * per)
        body = wire.encode_data(wire.PacketType.DATA, SOURCE, 1, dseq, table, 1, parts)
        out.append(sealed(signer, body))
        seq += per
    return out, per


def measure(size: int, datagram_bytes: int, count: int, batch_c: bool = True) -> dict:
    key = os.urandom(32)
    data, per = datagrams(key, size, datagram_bytes, count)
    rt = MemberRuntime(ME, "bench", key, RuntimeConfig())
    sub = Subscription(frozenset([TOPIC]))
    try:
        rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
        rt.call_wait(rt.install_topics, {TOPIC: "t"})
        rt.call_wait(rt.install_recovery, {}, {TOPIC: "token_ring"})
        rt.call_wait(rt.add_subscription, sub)
        batch = batch_limit(datagram_bytes)
        calls = [b"".join(data[i:i + batch]) for i in range(0, len(data), batch)]
        if not batch_c:
            rt.receiver._scanner = None
        segment = len(data[0])

        def take() -> float:
            began = time.thread_time()
            for call in calls:  # as one GRO receive call hands them over
                rt.receiver._take_segments(call, segment)
                rt.delivery.deliver()
                while sub.queue:  # the application takes what came
                    sub.consumed_bytes += sub.queue.popleft()[1]
            return time.thread_time() - began

        cpu = rt.call_wait(take, timeout=600)
        delivered = rt.stats["delivered"]
    finally:
        rt.close()
    if delivered != count * per:
        raise SystemExit(f"delivered {delivered} of {count * per} messages")
    return {"size": size, "datagram_bytes": datagram_bytes, "datagrams": count,
            "messages_per_datagram": per, "us_per_datagram": cpu / count * 1e6,
            "us_per_message": cpu / (count * per) * 1e6}


def measure_send(size: int, datagram_bytes: int, count: int, batch_c: bool = True) -> dict:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    config = RuntimeConfig(transport=TransportConfig(datagram_bytes=datagram_bytes))
    rt = MemberRuntime(ME, "A", os.urandom(32), config)  # (the label below routes from A)
    payload = bytes(size)
    if not batch_c:
        rt.sender._sealer = None
    try:
        rt.call_wait(rt.install_members, [MemberInfo(ME, "A", *rt.address)])
        rt.call_wait(rt.install_topics, {TOPIC: "t"}, {TOPIC: 1})
        rt.call_wait(rt.install_routes, {TOPIC: [Route(RoutingLabel(("A",), ("B",), "A"),
                                                       UnicastEndpoint(*sink.getsockname()))]})
        messages = count  # at least one datagram each at MTU size and 1 KB; more if smaller

        def send() -> float:
            q = rt._publish_q
            began = time.thread_time()
            for first in range(1, messages + 1, 1000):  # (as publishers hand them over)
                q.extend((i, TOPIC, 1, i, 0, payload)
                         for i in range(first, min(first + 1000, messages + 1)))
                rt.sender.take_publishes()
                while rt.sender.pump():
                    pass
            return time.thread_time() - began

        cpu = rt.call_wait(send, timeout=600)
        out = rt.stats["datagrams_out"]
    finally:
        rt.close()
        sink.close()
    return {"size": size, "datagram_bytes": datagram_bytes, "datagrams": out,
            "messages_per_datagram": messages / out, "us_per_datagram": cpu / out * 1e6,
            "us_per_message": cpu / messages * 1e6}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1000, help="message payload bytes (default 1000)")
    p.add_argument("--datagram-bytes", type=int, default=1472,
                   help="datagram size, MAC included (default 1472: a 1,500-byte MTU)")
    p.add_argument("--datagrams", type=int, default=50_000, help="datagrams taken (default 50000)")
    p.add_argument("--repeat", type=int, default=3, help="runs; the least CPU is reported")
    p.add_argument("--python-only", action="store_true",
                   help="build and take every datagram in Python (no C batches: _datagram_batch)")
    args = p.parse_args(argv)
    batch_c = not args.python_only
    for path, run in (("receive", lambda: measure(args.size, args.datagram_bytes,
                                                   args.datagrams, batch_c)),
                      ("send", lambda: measure_send(args.size, args.datagram_bytes,
                                                    args.datagrams, batch_c))):
        best = min((run() for _ in range(args.repeat)), key=lambda r: r["us_per_datagram"])
        print(f"{best['size']} B messages, {best['datagram_bytes']}-byte datagrams "
              f"({best['messages_per_datagram']:.3g} per datagram)"
              f"{', Python only' * args.python_only}: {path} path "
              f"{best['us_per_datagram']:.2f} us CPU per datagram, "
              f"{best['us_per_message']:.2f} us per message")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
