"""NATS core as a peer: `nats-server` (Debian) and the asyncio client `nats-py`.

    python -m benchmarks.peers.nats_peer receive --port P --topic SUBJ
    python -m benchmarks.peers.nats_peer send    --port P --topic SUBJ --size B --seconds D [--rate R]

Tuned as nats-py's documentation has it: publishes go into the client's pending buffer, which its
flusher writes out in large chunks (one `flush()` round trip per batch bounds what is outstanding);
the subscriber takes messages in a callback and the measuring loop collects them. The client's
default slow-consumer limits stay (pending messages and bytes per subscription): past them it drops,
which the harness sees as loss, as it does the server's own slow-consumer cut-off.
"""

from __future__ import annotations

import asyncio
import sys

from benchmarks.peers import stream
from benchmarks.procs import report

BATCH = 1000  # publishes between flush round trips


def server_argv(port: int) -> list[str]:
    return ["nats-server", "-a", "127.0.0.1", "-p", str(port)]


async def _connect(port: int):
    import nats

    return await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)


def receive(args) -> None:
    asyncio.run(_receive(args))


async def _receive(args) -> None:
    nc = await _connect(args.port)
    inbox: list[bytes] = []
    arrived = asyncio.Event()

    async def on_message(msg) -> None:
        inbox.append(msg.data)
        arrived.set()

    await nc.subscribe(args.topic if args.topics <= 1 else f"{args.topic}.*", cb=on_message)
    await nc.flush()  # the server has the subscription
    receiver = stream.Receiver(args.warmup, args.timeout, args.idle, args.latency)
    stream.ready()
    while True:  # taken as they arrive (the callbacks run on this loop): no polling delay
        try:
            await asyncio.wait_for(arrived.wait(), 0.05)
        except asyncio.TimeoutError:
            pass
        arrived.clear()
        if inbox:
            batch, inbox[:] = inbox[:], []
            if receiver.take(batch):
                break
        elif receiver.done():
            break
    report(receiver.summary())
    await nc.close()


def send(args) -> None:
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(_connect(args.port))
    subject = stream.Topics(args.topic, args.topics, sep=".").next

    async def burst(payloads: list) -> None:
        publish = nc.publish
        for payload in payloads:
            await publish(subject(), payload)
        await nc.flush()

    result = stream.send_loop(lambda ps: loop.run_until_complete(burst(ps)), args.size,
                              args.seconds, args.rate, BATCH, args.stamped)
    stream.send_end(lambda p: loop.run_until_complete(burst([p])))
    loop.run_until_complete(nc.close())
    loop.close()
    report(result)


def main(argv: list[str] | None = None) -> int:
    return stream.run("benchmarks.peers.nats_peer", "NATS core sender/receiver of a peer case",
                      "--port", send, receive, argv)


if __name__ == "__main__":
    sys.exit(main())
