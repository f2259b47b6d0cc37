"""The asyncio API inside an async Ray actor: joining, receiving (`receive_async`, `async for`),
flushing and coroutine callbacks never block the actor's event loop. A ticker task on the same
loop shows it: a blocking call would stop its ticks for as long as it waits (here seconds: the
messages come only after a pause), while the longest gap between ticks stays a fraction of that."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

import scopecast

pytestmark = pytest.mark.ray

PAUSE = 2.0     # the publisher waits this long before sending: a blocking wait would stop the loop
BLOCKED = 1.0   # a gap between ticks this long means the loop was blocked (ticks every 10 ms)


@ray.remote(num_cpus=0)
class AsyncReader:
    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.stop = False

    async def _tick(self) -> None:
        while not self.stop:
            self.ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def read(self, topic: str, n: int) -> dict:
        ticker = asyncio.create_task(self._tick())
        loop = asyncio.get_running_loop()
        cluster = await loop.run_in_executor(None, scopecast.connect)
        called: list[int] = []

        async def on_message(msg) -> None:  # a coroutine callback, on this loop
            await asyncio.sleep(0)
            called.append(msg.seq)

        sub = await cluster.subscriber_async(topic)
        watcher = await cluster.subscriber_async(topic, on_message=on_message)
        self.ready = True
        first = await sub.receive_async(timeout=60.0)  # waits PAUSE without blocking the loop
        got = [first.seq] if first else []
        async for msg in sub:
            got.append(msg.seq)
            if len(got) == n:
                break
        timed_out = await sub.receive_async(timeout=0.2)
        for _ in range(200):
            if len(called) == n:
                break
            await asyncio.sleep(0.05)
        pub = await cluster.publisher_async(topic + "/back")
        pub.publish(b"x")
        await pub.flush_async(timeout=30.0)
        pub.close()
        sub.close()
        watcher.close()
        self.stop = True
        await ticker
        gaps = [b - a for a, b in zip(self.ticks, self.ticks[1:], strict=False)]
        return {"got": got, "called": called, "timed_out": timed_out is None,
                "longest_gap": max(gaps), "ticks": len(self.ticks)}

    def is_ready(self) -> bool:
        return getattr(self, "ready", False)


def test_receiving_in_an_async_actor_never_blocks_its_event_loop(cluster, topic_name):
    cluster.create_topic(topic_name)
    cluster.create_topic(topic_name + "/back")
    reader = AsyncReader.remote()
    result = reader.read.remote(topic_name, 50)
    for _ in range(600):
        if ray.get(reader.is_ready.remote()):
            break
        time.sleep(0.1)
    time.sleep(PAUSE)
    with cluster.publisher(topic_name) as pub:
        for i in range(50):
            pub.publish(i)
        pub.flush(timeout=30.0)
    out = ray.get(result, timeout=180)
    assert out["got"] == list(range(1, 51)) and out["called"] == list(range(1, 51)), out
    assert out["timed_out"]
    assert out["longest_gap"] < BLOCKED, out  # the loop ran through every wait


def test_a_coroutine_callback_outside_an_event_loop_is_refused(cluster, topic_name):
    async def on_message(msg) -> None:
        pass

    cluster.create_topic(topic_name)
    with pytest.raises(scopecast.InvalidConfig, match="subscriber_async"):
        cluster.subscriber(topic_name, on_message=on_message)
