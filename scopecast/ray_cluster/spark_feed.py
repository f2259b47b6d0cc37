"""Spark's executors stream a DataFrame's partitions to the run's publishers over TCP, as Spark
computes them (`publish_dataframe(transfer="stream")`): no conversion into Ray's object store
first, so the first rows are published while Spark still computes the rest.

- `PartitionSender`: the function `DataFrame.mapInArrow` runs on the executors. A task
  connects to the publisher of its partition (partition p -> publisher p % n; every publisher,
  with a key column, each receiving its keys' rows), sends a header (version, the run's secret,
  partition, attempt) and the partition's Arrow record batches as one Arrow IPC stream, and
  yields one row (partition, rows).
- `FeedIntake`: in a publisher, the listening socket and the partitions it expects. Connections
  are read as they come (a partition's batches are buffered until its turn: bounding them could
  stall Spark's task slots while an earlier partition is retried); `tables()` yields each
  partition's batches in partition order, as they arrive. A retried task attempt resends its
  partition from the start: the rows an earlier attempt already delivered are skipped (a cached
  or deterministic DataFrame computes the same rows again). A connection whose header is not
  this run's (wrong version or secret) is closed and counted (`rejected`).
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Iterator

from scopecast.actors.errors import ScopecastError

log = logging.getLogger(__name__)

MAGIC = b"SCF1"
HEADER = struct.Struct("!4s32sII")  # magic+version, secret, partition, attempt
SECRET_BYTES = 32
RESULT_SCHEMA = "partition int, rows long"  # what the executors' tasks return
CONNECT_TIMEOUT = 30.0
_END = object()


class FeedAborted(ScopecastError):
    """The feed was closed before every partition arrived (the run stopped)."""


class PartitionSender:
    """The mapInArrow function of a run (see the module docstring); an instance of a class
    of this module, so Spark pickles it by reference (scopecast is installed on the executors)."""

    def __init__(self, endpoints: list[tuple[str, int]], secret: bytes,
                 part_column: str | None) -> None:
        self.endpoints = endpoints
        self.secret = secret
        self.part_column = part_column

    def __call__(self, batches: Iterator) -> Iterator:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        task = TaskContext.get()
        partition, attempt = task.partitionId(), task.attemptNumber()
        endpoints, part_column = self.endpoints, self.part_column
        n = len(endpoints)
        targets = range(n) if part_column is not None else [partition % n]
        socks, files, writers, rows = {}, {}, {}, 0
        try:
            for j in targets:
                sock = socket.create_connection(endpoints[j], timeout=CONNECT_TIMEOUT)
                sock.settimeout(None)
                sock.sendall(HEADER.pack(MAGIC, self.secret, partition, attempt))
                socks[j], files[j] = sock, sock.makefile("wb")
            for batch in batches:
                rows += batch.num_rows
                for j in targets:
                    part = batch
                    if part_column is not None:
                        part = batch.filter(pc.equal(batch.column(part_column), j))
                        part = part.drop_columns([part_column])
                    if j not in writers:
                        writers[j] = pa.ipc.new_stream(files[j], part.schema)
                    writers[j].write_batch(part)
                    files[j].flush()  # each batch on its way as soon as Spark made it
            for j in targets:
                if j not in writers:  # an empty partition: the stream's end says so
                    writers[j] = pa.ipc.new_stream(files[j], pa.schema([]))
                writers[j].close()
                files[j].close()  # (flushes)
        finally:
            for sock in socks.values():
                sock.close()
        yield pa.record_batch([pa.array([partition], pa.int32()), pa.array([rows], pa.int64())],
                              names=["partition", "rows"])


class _Partition:
    __slots__ = ("attempt", "items")

    def __init__(self) -> None:
        self.attempt = -1
        self.items: deque = deque()  # (attempt, batch or _END)


class FeedIntake:
    """A publisher's end of the feed: see the module docstring."""

    def __init__(self, host: str, secret: bytes, partitions: list[int]) -> None:
        self._secret = secret
        self._order = list(partitions)
        self._parts = {p: _Partition() for p in partitions}
        self._cond = threading.Condition()
        self._closed: str | None = None
        self.rejected = 0  # connections refused
        self.resent = 0  # rows of a retried attempt skipped: an earlier attempt handed them out
        self._listener = socket.create_server((host, 0), backlog=64)
        self.endpoint = (host, self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="scopecast-feed-accept", daemon=True).start()

    def tables(self) -> Iterator:
        """Each expected partition's record batches in partition order, as they arrive; ends
        when the last partition has ended (FeedAborted if the feed is closed before)."""
        for p in self._order:
            state = self._parts[p]
            published = 0  # rows of this partition handed out
            attempt, seen = None, 0  # the attempt being read, and its rows read so far
            while True:
                with self._cond:
                    while not state.items and self._closed is None:
                        self._cond.wait()
                    if not state.items:
                        raise FeedAborted(self._closed)
                    item_attempt, batch = state.items.popleft()
                if item_attempt != attempt:
                    attempt, seen = item_attempt, 0
                if batch is _END:
                    break
                skip = min(max(0, published - seen), batch.num_rows)
                self.resent += skip
                seen += batch.num_rows
                if skip < batch.num_rows:
                    published += batch.num_rows - skip
                    yield batch.slice(skip) if skip else batch

    def close(self, reason: str = "closed") -> None:
        """Stop listening; a `tables()` still waiting raises FeedAborted(reason)."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._cond.notify_all()
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while self._closed is None:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), name="scopecast-feed-read",
                             daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        import pyarrow as pa

        with conn:
            try:
                conn.settimeout(CONNECT_TIMEOUT)
                header = _recv_exactly(conn, HEADER.size)
                conn.settimeout(None)
                magic, secret, partition, attempt = HEADER.unpack(header)
            except (OSError, struct.error) as exc:
                self._reject(f"no header ({exc})")
                return
            if magic != MAGIC or not hmac.compare_digest(secret, self._secret):
                self._reject("not this run's (version or secret)")
                return
            state = self._parts.get(partition)
            if state is None:
                self._reject(f"partition {partition} is not this publisher's")
                return
            if not self._claim(state, attempt):
                return
            try:
                reader = pa.ipc.open_stream(conn.makefile("rb"))
                for batch in reader:
                    if batch.num_rows and not self._put(state, attempt, batch):
                        return
            except (OSError, pa.ArrowException) as exc:  # the task died: Spark retries it
                log.info("partition %d, attempt %d: its stream broke (%s)", partition, attempt, exc)
                return
            self._put(state, attempt, _END)

    def _claim(self, state: _Partition, attempt: int) -> bool:
        """A newer attempt takes over the partition (what an older one sent but was not handed
        out yet is dropped: the newer one resends it); an older one is ignored."""
        with self._cond:
            if attempt <= state.attempt:
                return False
            state.attempt = attempt
            state.items.clear()  # (all an older attempt's: _put takes only the current one's)
            return True

    def _put(self, state: _Partition, attempt: int, item) -> bool:
        with self._cond:
            if state.attempt != attempt or self._closed is not None:
                return False
            state.items.append((attempt, item))
            self._cond.notify_all()
            return True

    def _reject(self, why: str) -> None:
        with self._cond:
            self.rejected += 1
        log.warning("a feed connection was refused: %s", why)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return bytes(data)
