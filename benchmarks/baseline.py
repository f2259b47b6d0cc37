"""The baseline: plain Python over a multicast socket, no scopecast, no batching, no flow control.

    python -m benchmarks.baseline receive --group G --port P [--rcvbuf B] [--warmup S] [--idle S]
    python -m benchmarks.baseline send    --group G --port P --size B --seconds D [--ttl N --loop 0|1]

The sender does one `sendto` per message for `--seconds` on a socket set up like a scopecast member's
(IP_MULTICAST_IF on the interface, the same TTL and loopback settings and send buffer), then sends a
few end markers (datagrams shorter than any message). Each receiver joins the group like a scopecast
member does (bound to the group, IP_MULTICAST_ALL off, a forced big SO_RCVBUF), prints READY, then
counts datagrams with a blocking `recv_into` (touching each one's length) until an end marker or
`--idle` seconds of silence, and prints `RESULT {json}`. Under overload the kernel drops what the
receivers cannot keep up with; the harness reports what they were delivered.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

from benchmarks.meter import CpuSampler, DeliveryMeter, cpu, monotonic
from benchmarks.procs import READY, report, role_parser, run_role

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)
END_MARKER = b"E"          # shorter than any message
END_REPEATS = 20
END_SPACING = 0.05
CHECK_EVERY = 256          # sends between clock reads
METER_EVERY = 64           # datagrams per meter update on the receiving side


def _buffer(sock: socket.socket, opt: int, force: int, size: int) -> int:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:  # not root: the plain option, capped by net.core.[rw]mem_max
        sock.setsockopt(socket.SOL_SOCKET, opt, size)
    return sock.getsockopt(socket.SOL_SOCKET, opt)


def receiver_socket(group: str, port: int, interface: str, rcvbuf: int) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((group, port))
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
    except OSError:
        pass
    got = _buffer(sock, socket.SO_RCVBUF, SO_RCVBUFFORCE, rcvbuf)
    mreq = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    return sock, got


def sender_socket(interface: str, ttl: int, loop: bool, sndbuf: int) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((interface, 0))
    got = _buffer(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, sndbuf)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1 if loop else 0)
    return sock, got


def receive(args) -> None:
    sock, got = receiver_socket(args.group, args.port, args.interface, args.rcvbuf)
    sock.settimeout(args.idle)
    buf = bytearray(65536)
    recv_into = sock.recv_into
    meter = DeliveryMeter(args.warmup)
    end_len = len(END_MARKER)
    pending = pending_bytes = 0
    last = 0.0
    ended_by = "deadline"
    print(READY, flush=True)
    deadline = monotonic() + args.timeout
    while True:
        try:
            n = recv_into(buf)
        except TimeoutError:
            if meter.count + pending:
                ended_by = "idle"
                break
            if monotonic() > deadline:
                break
            continue
        if n == end_len:
            ended_by = "end_marker"
            break
        last = monotonic()
        pending += 1
        pending_bytes += n
        if pending == METER_EVERY:
            meter.add(pending, pending_bytes, last)
            pending = pending_bytes = 0
    if pending:
        meter.add(pending, pending_bytes, last)
    result = meter.summary(cpu())
    result.update(role="receiver", pid=os.getpid(), ended_by=ended_by, rcvbuf=got)
    report(result)
    sock.close()


def send(args) -> None:
    sock, got = sender_socket(args.interface, args.ttl, bool(args.loop), args.sndbuf)
    dest = (args.group, args.port)
    payload = os.urandom(args.size)
    sendto = sock.sendto
    sampler = CpuSampler()
    count = errors = 0
    start = monotonic()
    sampler.sample(0, start, force=True)
    stop_at = start + args.seconds
    while True:
        for _ in range(CHECK_EVERY):
            try:
                sendto(payload, dest)
            except OSError:  # ENOBUFS and the like: not sent, so not published
                errors += 1
        count += CHECK_EVERY
        now = monotonic()
        sampler.sample(count - errors, now)
        if now >= stop_at:
            break
    stopped = monotonic()
    sampler.sample(count - errors, stopped, force=True)
    for _ in range(END_REPEATS):
        try:
            sendto(END_MARKER, dest)
        except OSError:
            pass
        time.sleep(END_SPACING)
    result = {"role": "sender", "pid": os.getpid(), "published": count - errors,
              "send_errors": errors, "size": args.size, "start": start, "stopped": stopped,
              "samples": sampler.samples, "sndbuf": got}
    report(result)
    sock.close()


def build_parser():
    p, send_opts, recv_opts = role_parser(
        "python -m benchmarks.baseline", "plain multicast sender/receiver of a baseline case",
        sender="send", receiver="receive", what="datagram")
    for s in (send_opts, recv_opts):
        s.add_argument("--group", required=True, help="IP multicast group")
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--interface", default="127.0.0.1", help="interface address (loopback)")
    recv_opts.add_argument("--rcvbuf", type=int, default=32 << 20, help="SO_RCVBUF(FORCE) bytes")
    recv_opts.add_argument("--idle", type=float, default=1.0,
                           help="stop after this long without a datagram (once one arrived)")
    send_opts.add_argument("--ttl", type=int, default=1, help="IP_MULTICAST_TTL")
    send_opts.add_argument("--loop", type=int, default=1, help="IP_MULTICAST_LOOP (0 or 1)")
    send_opts.add_argument("--sndbuf", type=int, default=4 << 20, help="SO_SNDBUF(FORCE) bytes")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_role(build_parser(), {"receive": receive, "send": send}, argv)


if __name__ == "__main__":
    sys.exit(main())
