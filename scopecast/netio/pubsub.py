"""Publisher and Subscriber: the application's handles on a member's runtime.

Both are cheap facades. `publish` encodes the value, numbers it and appends it to the runtime's
hand-over queue; `receive` pops from the subscription's delivery queue. Neither touches a lock on
the common path nor calls Ray."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import msgpack

from scopecast.actors.errors import (
    FlushTimeout,
    InvalidConfig,
    MessageTooLarge,
    PublisherClosed,
    WindowFull,
)
from scopecast.netio.message import Message
from scopecast.netio.runtime import Subscription
from scopecast.netio.topic_names import Advertised, is_pattern, topic_matcher
from scopecast.netio.wire import ContentType
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

_BYTES = (bytes, bytearray, memoryview)
RAW = ContentType.RAW
MSGPACK = ContentType.MSGPACK


def encode_value(value) -> tuple[int, bytes]:
    """(content type, payload) for a published value: bytes as they are, Arrow as IPC, else msgpack."""
    if isinstance(value, bytes):
        return ContentType.RAW, value
    if isinstance(value, _BYTES):
        return ContentType.RAW, bytes(value)
    if type(value).__module__.startswith("pyarrow"):
        return ContentType.ARROW, _arrow_ipc(value)
    return ContentType.MSGPACK, msgpack.packb(value, use_bin_type=True)


def _arrow_ipc(batch) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write(batch)
    return sink.getvalue().to_pybytes()


END_WAIT = TIMING.end_wait
END_LINGER = TIMING.end_linger


class Publisher:
    """Publishes to one topic; messages are numbered 1, 2, ... per (topic, source, session)."""

    __slots__ = ("_element", "_runtime", "_publish", "topic", "_topic_id", "_sessions", "_session",
                 "_max", "reliable", "_seq", "_start", "_last_sseq", "_closed",
                 "exported")  # thousands a process

    def __init__(self, element, name: str, grant: Advertised) -> None:
        self._element = element
        self._runtime = element.runtime
        self._publish = element.publish
        self.topic = name
        self._topic_id = topic_id = grant.id
        self._sessions = element.runtime.publish_sessions  # moved on by the controlled element
        self._session = self._sessions.setdefault(topic_id, grant.session)
        self._max = self._runtime.config.max_message_bytes
        self.reliable = grant.reliable
        self._seq = self._start = self._runtime.stream_ends.get((topic_id, self._session), 0)
        self._last_sseq = 0
        self._closed = False
        self.exported = 0  # what of `published` the metrics exporter copied (not a dict of them)

    @property
    def seq(self) -> int:
        """Sequence number of the last published message."""
        return self._seq

    def publish(self, value) -> int:
        """Queue one message (bytes as they are, anything else msgpack-encoded); returns its seq.

        Blocks while this process has more than `RuntimeConfig.queue_bytes` queued for sending."""
        if value.__class__ is bytes:
            return self._send(RAW, value)
        return self._send(*encode_value(value))

    def publish_msgpack_batch(self, payloads: list[bytes | memoryview]) -> int:
        """Queue values its caller already msgpack-encoded, in order (subscribers see each decoded,
        as if published with `publish`), with the checks done once for the batch: for callers
        that encode anyway, such as publish_dataframe's rows (views of one buffer, which stays
        alive until every message in it is stable: do not change it). Returns how many were
        queued: all, unless the window fills and the runtime does not block
        (`block_when_full=False`), like a non-blocking socket's send (then those before, in
        chunks of MANY_BYTES; WindowFull if not even the first chunk fits)."""
        self._check(max(map(len, payloads), default=0))
        queued, last = self._runtime.publish_many(self._topic_id, self._session, self._seq + 1,
                                                  MSGPACK, payloads)
        if queued:
            self._last_sseq = last
            self._seq += queued
        return queued

    def _check(self, size: int) -> None:
        """Before queueing a message of `size` bytes: refuse what cannot be sent, and move to the
        topic's new session if it has one."""
        if size > self._max:
            raise MessageTooLarge(f"message of {size} bytes exceeds max_message_bytes="
                                  f"{self._max}; split it or raise the limit in RuntimeConfig")
        if self._closed:
            raise PublisherClosed(f"publisher of {self.topic!r} is closed")
        if self._sessions[self._topic_id] != self._session:
            self._next_session()

    def _send(self, ctype: int, payload: bytes) -> int:
        self._check(len(payload))
        seq = self._seq + 1
        # numbered only once the runtime took it (a full window raises WindowFull before)
        self._last_sseq = self._publish(self._topic_id, self._session, seq, ctype, payload)
        self._seq = seq
        return seq

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def scope(self) -> str:
        """The scope path of the member this publisher sends as."""
        return self._element.scope

    @property
    def published(self) -> int:
        """Messages this publisher published (its session's seqs may have started before it)."""
        return self._seq - self._start

    @property
    def session(self) -> int:
        """The session this publisher's messages belong to (moves when the topic changes)."""
        return self._session

    def _next_session(self) -> None:
        """End the old session's stream and number the new session's messages from 1."""
        self._runtime.end_stream(self._topic_id, self._session, self._seq)
        self._session = self._sessions[self._topic_id]
        self._seq = 0

    def flush(self, timeout: float = 10.0) -> None:
        """Return when every message published so far is stable: held by every regular member
        of the topic's recovery domains (a topic with recovery="none": handed to the socket)."""
        if not self._wait(self._last_sseq, timeout):
            what = "stable" if self.reliable else "sent"
            why = f" ({self._runtime.recovery.stability_digest()})" if self.reliable else ""
            raise FlushTimeout(f"{self.topic!r}: messages up to seq {self._seq} not {what} within "
                               f"{timeout}s{why}; receivers may be slow or gone (see "
                               "cluster.status())")

    def close(self, timeout: float = 10.0) -> None:
        """Flush, mark the end of this publisher's stream, leave the topic.

        The marker is the stream's last message: it is waited for like the rest (stable, or sent
        with recovery="none") for up to END_WAIT seconds more, and repaired meanwhile; one still
        not stable then does not fail the close, whose data is (the member stays in the topic's
        recovery domains, repairing it, until it is stable or END_LINGER has passed). It is
        queued before the flush (unless the window is full), so that data and marker become
        stable together rather than one token round after the other. To close many publishers,
        `close_publishers` waits once for all of them."""
        close_publishers([self], timeout)

    def _wait(self, sseq: int, timeout: float) -> bool:
        wait = self._runtime.wait_stable if self.reliable else self._runtime.wait_sent
        return wait(sseq, max(0.0, timeout))

    async def flush_async(self, timeout: float = 10.0) -> None:
        """`flush` for asyncio code: the wait runs on a worker thread, not the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.flush, timeout)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except FlushTimeout:
            if exc_type is None:
                raise  # else the exception leaving the block says more; this one would hide it


def close_publishers(pubs: list[Publisher], timeout: float = 10.0) -> None:
    """Close publishers together (see `Publisher.close`): every end marker is queued first, then
    one flush and one wait for the markers cover them all, within `timeout` (and END_WAIT). One
    by one, each close waits a token round or more for its marker: minutes for thousands."""
    pubs = [p for p in pubs if not p._closed]
    ends: dict[Publisher, int] = {}
    for p in pubs:
        p._closed = True
        try:
            ends[p] = p._runtime.end_stream(p._topic_id, p._session, p._seq)
        except WindowFull:  # (block_when_full=False) it follows the flush
            pass
    deadline = time.monotonic() + timeout
    try:
        for p in pubs:
            p.flush(deadline - time.monotonic())
    finally:
        for p in pubs:
            if p not in ends:
                ends[p] = p._runtime.end_stream(p._topic_id, p._session, p._seq)
        deadline = time.monotonic() + min(timeout, END_WAIT)
        stable, late = [], []
        for p in pubs:
            (stable if p._wait(ends[p], deadline - time.monotonic()) else late).append(p)
        _release(stable)
        if late:
            # a marker not stable yet is repaired from this member's record, which its topics'
            # recovery domains carry only while it publishes there: it leaves them once the
            # markers are stable (or END_LINGER on), or one lost everywhere is lost for good
            threading.Thread(target=_release_when_stable, args=(late, ends), daemon=True,
                             name="scopecast-end-linger").start()


def _release(pubs: list[Publisher]) -> None:
    """The closed publishers leave their topics (one call per member process)."""
    by_element: dict[object, list[str]] = {}
    for p in pubs:
        by_element.setdefault(p._element, []).append(p.topic)
    for element, topics in by_element.items():
        element.release(publisher_of=topics)


def _release_when_stable(pubs: list[Publisher], ends: dict[Publisher, int]) -> None:
    start = time.monotonic()
    deadline = start + END_LINGER
    for p in pubs:
        if p._wait(ends[p], deadline - time.monotonic()):
            continue
        if p._runtime.stopped:  # (the process shuts down: its scopes drop it with it)
            log.info("%r: end marker not stable when the member closed", p.topic)
        else:
            log.warning("%r: end marker not stable %.0fs after close; leaving the topic anyway",
                        p.topic, END_WAIT + time.monotonic() - start)
    try:
        _release(pubs)
    except Exception as exc:  # (the cluster connection closed meanwhile: it left with it)
        log.info("closed publishers left with their process: %s", exc)


class Subscriber:
    """Receives messages of one or more topics, in order per sender, without duplicates."""

    def __init__(self, element, names: list[str], ids: list[int],
                 on_message: Callable[[Message], None] | None = None,
                 role: str = "member", rows: Callable | None = None) -> None:
        self._element = element
        self._rows = rows  # (subscriber, timeout) -> the row iterator (see `rows`)
        self.role = role
        self._runtime = element.runtime
        self.topics = list(names)  # as subscribed: names and patterns
        self._sub = Subscription(frozenset(ids),
                                 tuple(topic_matcher(n) for n in names if is_pattern(n)))
        self._batch: list[Message] = []
        self._index = 0
        self._closed = False
        self._runtime.call_wait(self._runtime.add_subscription, self._sub)
        self._thread = None
        if on_message is not None:
            self._thread = threading.Thread(target=self._dispatch, args=(on_message,),
                                            name="scopecast-callback", daemon=True)
            self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def demoted(self) -> str:
        """Why this member was demoted to client for lagging behind ("" if it was not)."""
        return self._element.demoted

    @property
    def runtime(self):
        """The member runtime this subscriber reads from (for diagnostics and fault injection:
        its `call` runs a function on the member's I/O thread)."""
        return self._runtime

    @property
    def ends(self) -> dict[tuple[str, str, int], int]:
        """End-of-stream markers seen: (topic, source, session) -> last sequence number."""
        return dict(self._sub.ends)

    def ended(self, topic: str, source: str, session: int, seq: int) -> bool:
        """Whether an end marker of that stream came right after message `seq`: the marker takes
        seq + 1, so when a publisher of the same process goes on after it, its first message is
        seq + 2 (the latest few thousand markers are remembered)."""
        return (topic, source, session, seq) in self._sub.marks

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout` seconds (None: wait until closed)."""
        if self._index < len(self._batch):
            msg = self._batch[self._index]
            self._index += 1
            return msg
        if self._refill(timeout):
            self._index = 1
            return self._batch[0]
        return None

    def receive_batch(self, timeout: float | None = None) -> list[Message]:
        """Every message available now (waiting up to `timeout` for the first)."""
        if self._index < len(self._batch):
            rest = self._batch[self._index:]
            self._index = len(self._batch)
            return rest
        if self._refill(timeout):
            self._index = len(self._batch)
            return self._batch
        return []

    def _refill(self, timeout: float | None) -> bool:
        sub = self._sub
        q = sub.queue
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                batch, nbytes = q.popleft()
            except IndexError:
                if self._closed:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                wait = 0.5 if remaining is None else min(remaining, 0.5)
                # take the sockets while waiting (one wake-up per datagram; see runtime)
                if self._runtime.lead(self._ready, wait):
                    continue
                sub.waiting = True  # another thread leads: it hands batches over
                if q:
                    sub.waiting = False
                    continue
                sub.event.wait(wait)
                sub.event.clear()
                sub.waiting = False
                continue
            sub.consumed_bytes += nbytes
            self._batch = batch
            return True

    async def receive_async(self, timeout: float | None = None) -> Message | None:
        """`receive` for asyncio code: waits without blocking the event loop (the I/O thread
        hands batches over and wakes the loop)."""
        if self._index < len(self._batch) or self._sub.queue:
            return self.receive(0)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        sub = self._sub
        while not self._closed:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            woken = loop.create_future()
            sub.event.notify = functools.partial(loop.call_soon_threadsafe, _settle, woken)
            sub.waiting = True
            try:
                if not sub.queue:  # (checked after `waiting`: a batch handed over meanwhile)
                    await asyncio.wait((woken,), timeout=0.5 if remaining is None
                                       else min(remaining, 0.5))
            finally:
                sub.waiting = False
                sub.event.notify = None
            if sub.queue:
                return self.receive(0)
        return None

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while (msg := await self.receive_async()) is not None:
            yield msg

    def _ready(self) -> bool:
        """Something to return from receive(): a batch, or the end (closed)."""
        return bool(self._sub.queue) or self._closed

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.receive()
            if msg is None:
                return
            yield msg

    def rows(self, timeout: float = 60.0) -> Iterator[dict]:
        """The rows of one `publish_dataframe` run on this subscriber's topics, decoded with the
        schema recorded on each topic; the run's end messages end the iteration instead of being
        handed over. CollectIncomplete after `timeout` seconds without a message, or on a hole.
        Needs the `[data]` extra. (See scopecast.ray_cluster.dataframe_rows.RowStream.)"""
        if self._rows is None:
            raise InvalidConfig("rows() needs the cluster's topic schemas: subscribe with "
                                "Cluster.subscriber")
        return self._rows(self, timeout)

    def _dispatch(self, on_message) -> None:
        for msg in self:
            try:
                on_message(msg)
            except Exception:
                log.exception("on_message callback failed for %r (continuing)", msg)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._runtime.call_wait(self._runtime.remove_subscription, self._sub)
        self._element.release(subscriber_of=self.topics, role=self.role)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def on_loop(callback, loop: asyncio.AbstractEventLoop) -> Callable[[Message], None]:
    """A coroutine callback run on `loop`, one message at a time, in order."""
    def deliver(msg: Message) -> None:
        asyncio.run_coroutine_threadsafe(callback(msg), loop).result()
    return deliver


def running_loop(what: str) -> asyncio.AbstractEventLoop:
    """The running event loop; InvalidConfig (saying `what` needs it) outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise InvalidConfig(f"{what}: call it from a coroutine (`await "
                            "cluster.subscriber_async(...)`)") from None
