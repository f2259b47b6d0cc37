"""The publishers of a run (`publish_dataframe`'s and `TopicDatasink`'s): private Ray actors,
`num_cpus=0`, each a scopecast member of its own that publishes its share of a run's Arrow blocks
as msgpack rows or Arrow record batches and ends the run's topics with an end message. The wire
form of rows and the end messages: `dataframe_codec`.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import msgpack
import ray

from scopecast.actors.errors import (
    ControlTimeout,
    DataFrameRejected,
    MessageTooLarge,
    ScopecastError,
    WindowFull,
)
from scopecast.netio.runtime import RuntimeConfig
from scopecast.ray_cluster import publisher_pool
from scopecast.ray_cluster.dataframe_codec import (
    END_TAG,
    arrow_schema,
    packed_rows,
    to_msgpack_rows,
    wire_schema,
)
from scopecast.timing import TIMING

MODES = ("rows", "arrow")
JOIN_TIMEOUT = TIMING.publisher_join_timeout
ARROW_MESSAGE_BYTES = 1 << 20  # arrow mode aims at messages of this size (a single row may be larger)
ROWS_PER_BATCH = 4096


@dataclass
class RunPlan:
    """What every publisher of one run needs to know."""

    run: str
    mode: str
    publishers: int
    topics: list[str]
    base: str
    topic_column: str | None
    routes: dict
    part_column: str | None
    max_message_bytes: int
    flush_timeout: float
    spark_schema: dict


def start_publishers(run: str, n: int, config: RuntimeConfig | None,
                      topic: str) -> tuple[list, int]:
    """The run's publisher actors, spread over the nodes (warm ones of an earlier run first, see
    `publisher_pool`), and how many were started: each joins the cluster as a member of its own
    and opens a publisher of the base `topic` (while Spark still converts, for publish_dataframe)."""
    actors, started = publisher_pool.take(config, n, lambda: _start(config))
    for index, actor in enumerate(actors):
        actor.join.remote(run, index, topic)
    return actors, started


def warm_publishers(n: int, config: RuntimeConfig | None = None) -> None:
    """Start `n` publisher processes now, idle, for this driver's next runs with `config`: a
    run that finds them takes them instead of starting its own, so starting a worker process
    and importing scopecast, pyarrow and msgpack in it happens while the caller does something
    else (while Spark starts, say) rather than after the publish call."""
    publisher_pool.give_back(config, [_start(config) for _ in range(n)])


def _start(config: RuntimeConfig | None):
    return _actor_class().options(scheduling_strategy="SPREAD").remote(config)


@functools.cache
def _actor_class():
    """RunPublisher as a Ray actor class, made once (not once per actor)."""
    return ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(RunPublisher)


class RunPublisher:
    """One publisher of runs (a private Ray actor): for each run it joins as a scopecast member,
    publishes its share of the blocks to the run's topics, ends every one of them and leaves; the
    process stays warm for the next run (see `publisher_pool`)."""

    def __init__(self, config: RuntimeConfig | None) -> None:
        import scopecast  # imported once per process, not once per run

        self._connect = scopecast.connect
        self._config = config
        self._joined = threading.Event()
        self._cluster = None
        self._join_error: BaseException | None = None
        self._rows = 0
        self._feed = None  # the run's FeedIntake (transfer="stream")
        self._stop: str | None = None  # why the run stops early (a stop may come before join)
        self._publishing = threading.Lock()  # one writer's blocks at a time (see publish_blocks)

    def ping(self) -> bool:
        return True

    def join(self, run: str, index: int, topic: str) -> None:
        """Join the cluster as this run's publisher `index` and open a publisher of `topic` (it
        exists; nothing is published yet): called before `run`, which waits for it."""
        self._index = index
        self._rows = 0
        self._bytes = 0
        self._pubs = {}
        self._join_error = None
        self._cluster = None
        try:
            self._cluster = self._connect(config=self._config, name=f"dataframe-{run}-p{index}")
            self._pubs[topic] = self._cluster.publisher(topic)
        except BaseException as exc:
            self._join_error = exc
        finally:
            self._joined.set()

    def _open(self, plan: RunPlan) -> None:
        """Publishers of the run's topics (created, by now)."""
        self._plan = plan
        self._messages = dict.fromkeys(plan.topics, 0)
        self._topic_rows = dict.fromkeys(plan.topics, 0)
        self._wire = wire_schema(arrow_schema(plan.spark_schema)) if plan.mode == "rows" else None
        new = [name for name in plan.topics if name not in self._pubs]
        if new:  # (together: the scopes lay the channels once for all of them)
            self._pubs.update(zip(new, self._cluster.publishers(new), strict=True))

    def progress(self) -> int:
        return self._rows

    def stop(self, reason: str) -> None:
        self._stop = reason
        if self._feed is not None:
            self._feed.close(reason)

    def run(self, plan: RunPlan, refs: list) -> dict:
        """Publish the blocks `refs` (in order), then end every topic of the run and leave."""
        self.begin(plan)
        error: BaseException | None = None
        try:
            for ref in refs:
                if self._stop is not None:
                    break
                self._publish_block(ray.get(ref))
        except BaseException as exc:
            error = exc
        return self.finish(error)

    def open_feed(self, secret: bytes, share) -> tuple[str, int]:
        """Listen for the partitions (`share`, a spark_feed.FeedShare) that Spark's executors
        stream to this publisher; the address to send them to. `run_feed` publishes them."""
        from scopecast.ray_cluster.spark_feed import FeedIntake

        # (not after `join`: Spark's executors start sending, and the intake keeps what comes,
        # while this process joins the cluster; `finish` forgets a run's feed)
        self._feed = FeedIntake(ray.util.get_node_ip_address(), secret, share)
        return self._feed.endpoint

    def feed_sent(self, rows: dict[int, int]) -> None:
        """The Spark job of the feed ended; the rows it sent this publisher, by partition."""
        self._feed.sent(rows)

    def run_feed(self, plan: RunPlan) -> dict:
        """Publish the fed partitions in partition order as they arrive, then end every topic of
        the run and leave (aborted if `stop` closes the feed first)."""
        import pyarrow as pa

        self.begin(plan)
        error: BaseException | None = None
        try:
            for batch in self._feed.tables():
                if self._stop is not None:
                    break
                self._publish_block(pa.Table.from_batches([batch]))
        except BaseException as exc:
            error = exc
        finally:
            self._feed.close()
        return self.finish(error)

    def begin(self, plan: RunPlan) -> None:
        """Wait for `join` and open the run's topics (the run's calls then are `publish_blocks`
        and one `finish`)."""
        self._wait_joined()  # (a threaded actor may start this call before join's ends)
        self._joined.clear()
        if self._join_error is not None:
            if self._cluster is not None:  # joined, but the topic could not be opened
                self._cluster.shutdown()
            raise self._join_error
        try:
            self._open(plan)
        except BaseException:
            self._cluster.shutdown()
            raise

    def _wait_joined(self) -> None:
        """Wait for this run's `join` (which the driver sends first; it always ends, connected or
        not), bounded: ControlTimeout when joining the cluster hangs."""
        if not self._joined.wait(JOIN_TIMEOUT):
            raise ControlTimeout(f"DataFrame publisher {getattr(self, '_index', '?')} did not join "
                                 f"the cluster within {JOIN_TIMEOUT:.0f}s (its scope manager is "
                                 "busy or restarting); retry the run")

    def publish_blocks(self, blocks: list) -> int:
        """Publish `blocks` (Arrow tables, or refs to them) after those of earlier calls; the
        rows published. Calls of concurrent writers take turns."""
        with self._publishing:
            before = self._rows
            for block in blocks:
                if self._stop is not None:
                    raise ScopecastError(f"the run stopped: {self._stop}")
                self._publish_block(ray.get(block) if isinstance(block, ray.ObjectRef) else block)
            return self._rows - before

    def finish(self, error: BaseException | str | None = None) -> dict:
        """End every topic of the run ("ok", or aborted by `error` or a stop) and leave; the
        run's counts (raises `error`, with the counts on it, if it is an exception)."""
        with self._publishing:
            if error is not None:
                status = f"aborted: {error}"
            elif self._stop is not None:
                status = f"aborted: {self._stop}"
            else:
                status = "ok"
            failure = error if isinstance(error, BaseException) else None
            try:
                self._end(status)
            except BaseException as exc:
                failure = failure or exc
            finally:
                self._cluster.shutdown()
            counts = self._counts()
            self._feed = self._stop = None  # (the next run's may come before its join)
            if failure is not None:
                if isinstance(failure, ScopecastError):
                    failure.counts = counts  # travels with the error to the driver
                raise failure
            return counts

    def _counts(self) -> dict:
        plan = self._plan
        return {"publisher": self._index, "rows": self._rows, "messages": sum(self._messages.values()),
                "bytes": self._bytes, "topics": {t: n for t, n in self._topic_rows.items()
                                                 if t != plan.base or not plan.topic_column},
                "resent_rows": self._feed.resent if self._feed is not None else 0}

    def _publish_block(self, table) -> None:
        import pyarrow.compute as pc

        plan = self._plan
        if plan.part_column is not None:
            table = table.filter(pc.equal(table.column(plan.part_column), self._index))
            table = table.drop_columns([plan.part_column])
        if table.num_rows == 0:
            return
        if plan.mode == "rows":
            for batch in table.to_batches(max_chunksize=ROWS_PER_BATCH):
                if self._stop is not None:
                    return
                self._publish_rows(batch, self._wire)
        else:
            for batch in table.to_batches(max_chunksize=64 * ROWS_PER_BATCH):
                if self._stop is not None:
                    return
                for name, group in self._groups(batch):
                    self._publish_arrow(name, group)

    def _publish_rows(self, batch, wire) -> None:
        """One msgpack map per row, each topic's rows of the batch handed over as one batch (in
        their order); a row over the message size stops the run just before it."""
        limit = self._plan.max_message_bytes
        payloads = packed_rows(batch, wire)
        big = None
        if max(map(len, payloads), default=0) > limit:
            big = next(i for i, p in enumerate(payloads) if len(p) > limit)
        for name, rows in self._topic_rows_of(batch.slice(0, big), payloads[:big]):
            queued = self._pubs[name].publish_msgpack_batch(rows)
            self._bytes += sum(map(len, rows[:queued]))
            self._messages[name] += queued
            self._topic_rows[name] += queued
            self._rows += queued
            if queued < len(rows):
                raise WindowFull(f"{name!r}: the publisher's window is full (block_when_full="
                                 "False); the run stopped")
        if big is not None:
            row = to_msgpack_rows(batch.slice(big, 1), wire)[0]
            raise _too_large(row, len(payloads[big]), limit, self._rows)

    def _topic_rows_of(self, batch, payloads: list):
        """(topic, the payloads of the batch's rows routed to it, in their order)."""
        if self._plan.topic_column is None:
            yield self._plan.base, payloads
            return
        for name, index in self._topic_slices(batch):
            yield name, [payloads[i] for i in index.tolist()]

    def _groups(self, batch):
        """(topic, rows of the batch routed to it), rows in their order."""
        if self._plan.topic_column is None:
            yield self._plan.base, batch
            return
        for name, index in self._topic_slices(batch):
            yield name, batch.take(index)

    def _topic_slices(self, batch):
        """(topic, indices of the batch's rows routed to it, ascending) per topic_column value:
        a stable sort of the rows by value (flights alternate between origins row by row;
        publishing each run of equal values on its own cost a call per two rows)."""
        import numpy as np
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return
        encoded = pc.dictionary_encode(batch.column(self._plan.topic_column), null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        values = encoded.dictionary.to_pylist()
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        ends = np.r_[starts[1:], len(ordered)]
        for s, e in zip(starts, ends, strict=True):
            value = values[ordered[s]]
            topic = self._plan.routes.get(value)
            if topic is None:  # (not among topic_values, or a value Spark did not find before)
                raise DataFrameRejected(f"a row's {self._plan.topic_column} is {value!r}, which "
                                        "is not among the run's values (topic_values, or those "
                                        "found before the run)")
            yield topic, order[s:e]

    def _publish_arrow(self, name: str, batch) -> None:
        """Publish `batch` as record batches that each fit the message size."""
        import pyarrow as pa

        limit = self._plan.max_message_bytes
        overhead = _ipc_overhead(batch.schema)
        target = max(1, min(limit, ARROW_MESSAGE_BYTES) - overhead)
        per_row = max(1, pa.ipc.get_record_batch_size(batch) // max(1, batch.num_rows))
        step = max(1, target // per_row)
        start = 0
        while start < batch.num_rows:
            if self._stop is not None:
                return
            piece = batch.slice(start, step)
            size = pa.ipc.get_record_batch_size(piece) + overhead
            if size > limit and piece.num_rows > 1:
                step = max(1, piece.num_rows // 2)
                continue
            if size > limit:
                raise _too_large(piece.to_pylist()[0], size, limit, self._rows)
            try:
                self._pubs[name].publish(piece)
            except MessageTooLarge as exc:
                if piece.num_rows == 1:
                    raise _too_large(piece.to_pylist()[0], size, limit, self._rows) from exc
                step = max(1, piece.num_rows // 2)
                continue
            self._bytes += size
            self._messages[name] += 1
            self._topic_rows[name] += piece.num_rows
            self._rows += piece.num_rows
            start += piece.num_rows

    def _end(self, status: str) -> None:
        """One end message per topic, then close (flush, the runtime's marker, leave)."""
        plan = self._plan
        errors = []
        for name, pub in self._pubs.items():
            try:
                pub.publish([END_TAG, plan.run, self._index, plan.publishers, self._messages[name],
                             self._topic_rows[name], status])
            except Exception as exc:  # closed by a session move, ...: the others still end
                errors.append(exc)
        try:
            self._cluster.close_publishers(list(self._pubs.values()), plan.flush_timeout)
        except Exception as exc:
            errors.append(exc)
        if errors:
            raise errors[0]


def _ipc_overhead(schema) -> int:
    """Bytes an Arrow IPC stream adds around one record batch of `schema`."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    return len(sink.getvalue()) + 64


def _too_large(row: dict, size: int, limit: int, before: int) -> DataFrameRejected:
    """The error for a row over the message size, naming its largest column."""
    sizes = {k: len(msgpack.packb(v, use_bin_type=True, default=str)) for k, v in row.items()}
    column = max(sizes, key=sizes.get) if sizes else "?"
    return DataFrameRejected(
        f"a row of {size} bytes exceeds max_message_bytes={limit}: column {column!r} holds "
        f"{sizes.get(column, 0)} bytes of it; split or shrink that column (or deploy the "
        f"cluster with a larger max_message_bytes). This publisher had published {before} rows; "
        "the run stopped and every publisher ended its streams")


