"""CPU per datagram of a member's receive path, without sockets or scheduling noise.

    python -m benchmarks.datagram_cost [--size 1000] [--datagram-bytes 1472] [--datagrams 50000]

A real `MemberRuntime` subscribed to one reliable topic takes pre-built, signed datagrams of one
publisher's stream as a GRO receive call hands them over (batches of segments), on its own I/O
thread: authentication, header, routing table, runs, order, the stable cache, delivery. The
application side takes each delivered batch. Reported: microseconds of this process's CPU per
datagram and per message. Throughput runs on a shared machine swing with the load; this one
measures only the Python work a datagram costs, to tell what a change to that work bought.
"""

from __future__ import annotations

import argparse
import os
import time

from scopecast.netio import wire
from scopecast.netio.auth import authenticator
from scopecast.netio.delivery import Subscription
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig
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
        out.append(body + signer.sign(body))
        seq += per
    return out, per


def measure(size: int, datagram_bytes: int, count: int) -> dict:
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

        def take() -> float:
            began = time.thread_time()
            for i in range(0, len(data), batch):
                for part in data[i:i + batch]:  # (one GRO call's segments)
                    rt._on_datagram(part)
                rt._deliver()
                while sub.queue:  # the application takes what came
                    sub.queue.popleft()
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1000, help="message payload bytes (default 1000)")
    p.add_argument("--datagram-bytes", type=int, default=1472,
                   help="datagram size, MAC included (default 1472: a 1,500-byte MTU)")
    p.add_argument("--datagrams", type=int, default=50_000, help="datagrams taken (default 50000)")
    p.add_argument("--repeat", type=int, default=3, help="runs; the least CPU is reported")
    args = p.parse_args(argv)
    best = min((measure(args.size, args.datagram_bytes, args.datagrams)
                for _ in range(args.repeat)), key=lambda r: r["us_per_datagram"])
    print(f"{best['size']} B messages, {best['datagram_bytes']}-byte datagrams "
          f"({best['messages_per_datagram']} per datagram): receive path "
          f"{best['us_per_datagram']:.2f} us CPU per datagram, "
          f"{best['us_per_message']:.2f} us per message")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
