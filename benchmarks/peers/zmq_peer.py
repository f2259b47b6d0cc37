"""ZeroMQ PUB/SUB over TCP as a peer (`pyzmq`).

    python -m benchmarks.peers.zmq_peer receive --port P --topic T
    python -m benchmarks.peers.zmq_peer send    --port P --topic T --size B --seconds D [--rate R]

The publisher binds `tcp://127.0.0.1:P`, each subscriber connects (ZeroMQ reconnects until the bind
is there) and subscribes to the topic prefix (which also takes T/0 .. T/N-1 when a case has
several topics); every message is one two-part message [topic,
payload], as the ZeroMQ guide's pub-sub envelopes are. ZeroMQ batches small messages into TCP
writes by itself. The guide's "slow joiner": a subscription reaches the publisher a moment after
the connection, so the publisher waits until every subscriber's subscription has arrived
(`XPUB`, which hands subscriptions to the application) before it sends. High-water marks stay at
their defaults (1000 messages each way): past them a PUB drops, which the harness sees as loss.
"""

from __future__ import annotations

import sys
import time

from benchmarks.peers import stream
from benchmarks.procs import report

BATCH = 256
JOIN_TIMEOUT = 30.0


def receive(args) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.connect(f"tcp://127.0.0.1:{args.port}")
    sock.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    receiver = stream.Receiver(args.warmup, args.timeout, args.idle, args.latency)
    recv_multipart, poll, again = sock.recv_multipart, sock.poll, zmq.Again

    def next_batch(timeout: float) -> list:
        if not poll(int(timeout * 1000)):
            return []
        out = []
        try:
            while len(out) < 1024:
                out.append(recv_multipart(zmq.NOBLOCK)[1])
        except again:
            pass
        return out

    stream.ready()
    try:
        report(stream.receive_loop(next_batch, receiver))
    finally:
        sock.close(linger=0)
        ctx.term()


def send(args) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.bind(f"tcp://127.0.0.1:{args.port}")
    _await_subscribers(sock, args.subscribers)
    topic = stream.Topics(args.topic, args.topics, encode=True)
    send_multipart = sock.send_multipart

    def send_batch(payloads: list) -> None:
        for payload in payloads:
            send_multipart((topic.next(), payload))

    result = stream.send_loop(send_batch, args.size, args.seconds, args.rate, BATCH,
                              args.stamped)
    stream.send_end(lambda p: send_multipart((topic.next(), p)))
    time.sleep(0.2)  # let the last messages leave before the socket closes
    report(result)
    sock.close(linger=1000)
    ctx.term()


def _await_subscribers(sock, n: int) -> None:
    """XPUB passes each subscription up as a message (b"\\x01" + prefix); XPUB_VERBOSE passes
    every subscriber's, not only the first of a prefix."""
    import zmq

    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    seen = 0
    deadline = time.monotonic() + JOIN_TIMEOUT
    while seen < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {seen} of {n} subscribers subscribed within {JOIN_TIMEOUT:.0f}s")
        if sock.poll(100) and sock.recv()[:1] == b"\x01":
            seen += 1


def main(argv: list[str] | None = None) -> int:
    return stream.run("benchmarks.peers.zmq_peer", "ZeroMQ PUB/SUB sender/receiver of a peer case",
                      "--port", send, receive, argv)


if __name__ == "__main__":
    sys.exit(main())
