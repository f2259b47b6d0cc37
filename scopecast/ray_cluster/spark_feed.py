"""Spark's executors stream a DataFrame's partitions to the run's publishers over TCP, as Spark
computes them (`publish_dataframe(transfer="stream")`): no conversion into Ray's object store
first, so the first rows are published while Spark still computes the rest.

- `FeedShare`: which partitions go to which publisher (partition p -> publisher p % n; with a
  key column every publisher gets its keys' rows of every partition).
- `PartitionSender`: the function `DataFrame.mapInArrow` runs on the executors. A task
  connects to the publishers of its partition, sends a header (version, the run's secret,
  partition, attempt), the partition's Arrow record batches as one Arrow IPC stream and its row
  count, and yields a row (partition, publisher, rows) per publisher: the job's result says what was sent.
- `FeedIntake`: in a publisher, the listening socket. Connections are read as they come (a
  partition's batches are buffered until its turn: bounding them could stall Spark's task slots
  while an earlier partition is retried); `tables()` yields each partition's batches in
  partition order, as they arrive. A retried task attempt resends its partition from the start:
  the rows an earlier attempt already delivered are skipped (a cached or deterministic DataFrame
  computes the same rows again). A connection whose header is not this run's (wrong version or
  secret) or whose partition is not this publisher's is closed and counted (`rejected`).
  The partitions expected are those of the DataFrame before the job ran; `sent(...)`, the job's
  result, settles them (adaptive execution may make fewer or more) and is checked against what
  arrived: a partition missing or short is FeedAborted, never a run that waits forever.
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from scopecast.actors.errors import SparkUnavailable

log = logging.getLogger(__name__)

MAGIC = b"SCF1"
HEADER = struct.Struct("!4s32sII")  # magic+version, secret, partition, attempt
# after the Arrow stream: its row count (Arrow reads a stream cut off between two batches as one
# that ended, as when a task dies: the trailer tells the two apart)
TRAILER = struct.Struct("!Q")
SECRET_BYTES = 32
RESULT_SCHEMA = "partition int, publisher int, rows long"  # what the executors' tasks return
CONNECT_TIMEOUT = 30.0
_END = object()


@dataclass(frozen=True)
class FeedShare:
    """Publisher `publisher` of `publishers`: the partitions it gets of a DataFrame Spark made
    (as far as the driver knows before the job runs) in `partitions` partitions."""

    publisher: int
    publishers: int
    keyed: bool  # a key column routes rows: every publisher gets (its rows of) every partition
    partitions: int

    @staticmethod
    def targets(partition: int, publishers: int, keyed: bool) -> range:
        """The publishers partition `partition` is sent to."""
        if keyed:
            return range(publishers)
        return range(partition % publishers, partition % publishers + 1)

    def mine(self, partition: int) -> bool:
        return self.publisher in self.targets(partition, self.publishers, self.keyed)

    def expected(self) -> list[int]:
        return [p for p in range(self.partitions) if self.mine(p)]


class FeedAborted(SparkUnavailable):
    """Not every row Spark's executors sent arrived whole (a partition missing or short), or
    the feed was closed before (the run stopped)."""


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
        targets = FeedShare.targets(partition, len(endpoints), part_column is not None)
        socks, files, writers, rows = {}, {}, {}, dict.fromkeys(targets, 0)
        try:
            for j in targets:
                sock = socket.create_connection(endpoints[j], timeout=CONNECT_TIMEOUT)
                sock.settimeout(None)
                sock.sendall(HEADER.pack(MAGIC, self.secret, partition, attempt))
                socks[j], files[j] = sock, sock.makefile("wb")
            for batch in batches:
                for j in targets:
                    part = batch
                    if part_column is not None:
                        part = batch.filter(pc.equal(batch.column(part_column), j))
                        part = part.drop_columns([part_column])
                    rows[j] += part.num_rows
                    if j not in writers:
                        writers[j] = pa.ipc.new_stream(files[j], part.schema)
                    writers[j].write_batch(part)
                    files[j].flush()  # each batch on its way as soon as Spark made it
            for j in targets:
                if j not in writers:  # an empty partition: the stream's end says so
                    writers[j] = pa.ipc.new_stream(files[j], pa.schema([]))
                writers[j].close()
                files[j].write(TRAILER.pack(rows[j]))
                files[j].close()  # (flushes)
        finally:
            for sock in socks.values():
                sock.close()
        yield pa.record_batch([pa.array([partition] * len(targets), pa.int32()),
                               pa.array(list(targets), pa.int32()),
                               pa.array([rows[j] for j in targets], pa.int64())],
                              names=["partition", "publisher", "rows"])


class _Partition:
    __slots__ = ("attempt", "items", "arrived")

    def __init__(self) -> None:
        self.attempt = -1
        self.items: deque = deque()  # (attempt, batch or _END)
        self.arrived = time.monotonic()  # when its last item arrived


class FeedIntake:
    """A publisher's end of the feed: see the module docstring."""

    late = CONNECT_TIMEOUT  # s: a partition Spark sent that shows no progress this long is lost

    def __init__(self, host: str, secret: bytes, share: FeedShare) -> None:
        self._secret = secret
        self._share = share
        self._parts: dict[int, _Partition] = {}
        self._cond = threading.Condition()
        self._closed: str | None = None
        self._sent: dict[int, int] | None = None  # the job's result: rows sent, by partition
        self._sent_at = 0.0
        self.rejected = 0  # connections refused
        self.resent = 0  # rows of a retried attempt skipped: an earlier attempt handed them out
        self._listener = socket.create_server((host, 0), backlog=64)
        self.endpoint = (host, self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="scopecast-feed-accept", daemon=True).start()

    def sent(self, rows: dict[int, int]) -> None:
        """The Spark job ended: `rows` are the rows it sent this publisher, by partition."""
        with self._cond:
            self._sent, self._sent_at = dict(rows), time.monotonic()
            self._cond.notify_all()

    def tables(self) -> Iterator:
        """Each partition's record batches in partition order, as they arrive; ends when the
        job's result (`sent`) has come and every partition it names has arrived whole
        (FeedAborted if the feed is closed before, or a partition is missing or short)."""
        delivered: dict[int, int] = {}
        for p in self._share.expected():
            delivered[p] = yield from self._partition(p)
        with self._cond:
            while self._sent is None and self._closed is None:
                self._cond.wait()
            if self._sent is None:
                raise FeedAborted(self._closed)
            beyond = sorted(p for p in self._sent if p not in delivered)
        for p in beyond:  # the job made more partitions than the DataFrame had before it ran
            delivered[p] = yield from self._partition(p)
        for p, rows in sorted(self._sent.items()):
            if delivered.get(p, 0) != rows:
                raise FeedAborted(f"partition {p}: Spark sent {rows} rows, "
                                  f"{delivered.get(p, 0)} arrived")

    def _partition(self, p: int) -> Iterator:
        """Partition `p`'s batches (a retried attempt's rows handed out once); its row count."""
        with self._cond:
            state = self._parts.setdefault(p, _Partition())
        published = 0  # rows of this partition handed out
        attempt, seen = None, 0  # the attempt being read, and its rows read so far
        while True:
            with self._cond:
                while not state.items and self._closed is None:
                    if self._sent is not None:
                        if p not in self._sent:  # the job made no such partition
                            return published
                        if time.monotonic() - max(state.arrived, self._sent_at) > self.late:
                            raise FeedAborted(f"partition {p}: Spark's task ended, but its "
                                              f"stream stopped after {published} rows")
                    self._cond.wait(1.0 if self._sent is not None else None)
                if not state.items:
                    raise FeedAborted(self._closed)
                item_attempt, batch = state.items.popleft()
            if item_attempt != attempt:
                attempt, seen = item_attempt, 0
            if batch is _END:
                return published
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
            if not self._share.mine(partition):
                self._reject(f"partition {partition} is not this publisher's")
                return
            with self._cond:
                state = self._parts.setdefault(partition, _Partition())
            if not self._claim(state, attempt):
                return
            rows = 0
            try:
                stream = conn.makefile("rb")
                for batch in pa.ipc.open_stream(stream):
                    rows += batch.num_rows
                    if batch.num_rows and not self._put(state, attempt, batch):
                        return
                trailer = stream.read(TRAILER.size)
                if len(trailer) != TRAILER.size or TRAILER.unpack(trailer)[0] != rows:
                    raise OSError(f"cut off after {rows} rows")
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
            state.attempt, state.arrived = attempt, time.monotonic()
            state.items.clear()  # (all an older attempt's: _put takes only the current one's)
            return True

    def _put(self, state: _Partition, attempt: int, item) -> bool:
        with self._cond:
            if state.attempt != attempt or self._closed is not None:
                return False
            state.items.append((attempt, item))
            state.arrived = time.monotonic()
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
