"""Redis pub/sub as a peer: `redis-server` (Debian) and the `redis` client with the hiredis parser.

    python -m benchmarks.peers.redis_peer receive --port P --topic CH [--topics N]
    python -m benchmarks.peers.redis_peer send    --port P --topic CH [--topics N] --size B
                                                  --seconds D [--rate R]

Tuned as redis-py's documentation recommends: hiredis installed (the client uses it by itself),
PUBLISHes pipelined without MULTI (`pipeline(transaction=False)`, one round trip per batch), the
subscriber reading with `get_message` (several topics: one `PSUBSCRIBE CH/*`). The server runs with
persistence off and its default
`client-output-buffer-limit pubsub 32mb 8mb 60`: a subscriber that falls that far behind is
disconnected, which the harness sees as loss.
"""

from __future__ import annotations

import sys

from benchmarks.peers import stream
from benchmarks.procs import report

BATCH = 100  # publishes per pipeline round trip


def server_argv(port: int) -> list[str]:
    return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no"]


def _client(port: int):
    import redis

    return redis.Redis(host="127.0.0.1", port=port)


def receive(args) -> None:
    ps = _client(args.port).pubsub()
    if args.topics > 1:
        ps.psubscribe(f"{args.topic}/*")
    else:
        ps.subscribe(args.topic)
    while (m := ps.get_message(timeout=5.0)) is None or m["type"] not in ("subscribe",
                                                                          "psubscribe"):
        pass
    receiver = stream.Receiver(args.warmup, args.timeout, args.idle, args.latency)
    get = ps.get_message

    def next_batch(timeout: float) -> list:
        """Up to 1024 payloads; other replies (a late subscribe confirmation) are skipped."""
        m = get(timeout=timeout)
        out = []
        while m is not None:
            if m["type"] in ("message", "pmessage"):
                out.append(m["data"])
            if len(out) >= 1024:
                break
            m = get(timeout=0)
        return out

    stream.ready()
    try:
        report(stream.receive_loop(next_batch, receiver))
    finally:
        ps.close()


def send(args) -> None:
    client = _client(args.port)
    pipe = client.pipeline(transaction=False)
    channel = stream.Topics(args.topic, args.topics).next

    def send_batch(payloads: list) -> None:
        for payload in payloads:
            pipe.publish(channel(), payload)
        pipe.execute()

    result = stream.send_loop(send_batch, args.size, args.seconds, args.rate, BATCH,
                              args.stamped)
    stream.send_end(lambda p: client.publish(channel(), p))
    report(result)


def main(argv: list[str] | None = None) -> int:
    return stream.run("benchmarks.peers.redis_peer", "Redis pub/sub sender/receiver of a peer case",
                      "--port", send, receive, argv)


if __name__ == "__main__":
    sys.exit(main())
