"""`TopicDatasink`: `ds.write_datasink(TopicDatasink(topic))` publishes a Ray Dataset's rows to a
topic as one run, the way `publish_dataframe` publishes a Spark DataFrame's, so every reader of
runs (`read_topic`, `TopicCollector`, `sub.rows()`) reads it.

When Ray Data starts the write (on the driver, with the Dataset's schema) the sink records the
run's schema on the topic and starts `parallelism` publisher actors (`publish_dataframe`'s, warm
ones first). Each write task casts its blocks to the recorded schema and hands them to one of the
publishers (by task index; a publisher takes one task's blocks at a time, in the order the tasks
come). When the write completes every publisher ends the run on the topic and leaves, once its
messages are stable; a failed write ends it as aborted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

import ray

from scopecast.actors.errors import DataFrameRejected, InvalidConfig
from scopecast.extras import require
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.topic_names import check_topic_name
from scopecast.ray_cluster import publisher_pool
from scopecast.ray_cluster.dataframe_codec import (
    MAX_PARALLELISM,
    arrow_schema,
    cast_table,
    check_schema,
    spark_schema,
)
from scopecast.ray_cluster.dataframe_source import PublishReport
from scopecast.ray_cluster.run_publisher import MODES, RunPlan, start_publishers
from scopecast.scopes.cluster_manager import MAX_SCHEMA_BYTES

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


require("data", "TopicDatasink")  # (this module is loaded only when the sink is asked for)

from ray.data.datasource import Datasink  # noqa: E402


class TopicDatasink(Datasink):
    """Publishes a Dataset to `topic` (which must exist) as one run: `ds.write_datasink(
    TopicDatasink("prices"))`. `parallelism` publishers, `mode` "rows" (a msgpack map per
    row) or "arrow" (record batches), `config` their RuntimeConfig, `flush_timeout` how long
    the end waits for stability. After the write, `.report` is its PublishReport."""

    def __init__(self, topic: str, *, parallelism: int = 2, mode: str = "rows",
                 config: RuntimeConfig | None = None, flush_timeout: float = 120.0) -> None:
        check_topic_name(topic)
        if mode not in MODES:
            raise InvalidConfig(f"unknown mode {mode!r}: {' or '.join(MODES)}")
        if not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_PARALLELISM:
            raise InvalidConfig(f"parallelism must be an integer from 1 to {MAX_PARALLELISM}")
        self.topic = topic
        self.parallelism = parallelism
        self.mode = mode
        self.config = config
        self.flush_timeout = flush_timeout
        self.report: PublishReport | None = None
        self._actors: list = []
        self._spark: dict | None = None

    def get_name(self) -> str:
        return f"ScopecastTopic({self.topic})"

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        from scopecast.ray_cluster.cluster import connect

        if schema is None:
            raise DataFrameRejected("the Dataset has no schema to record on the topic")
        spark = spark_schema(schema)
        check_schema(spark)
        cluster = connect(start=False)
        cluster.topic(self.topic)  # TopicNotFound
        run = uuid.uuid4().hex[:16]
        record = {"spark": json.dumps(spark), "mode": self.mode,
                  "publishers": self.parallelism, "topic_column": None, "key_column": None,
                  "run": run}
        if len(json.dumps(record)) > MAX_SCHEMA_BYTES:
            raise DataFrameRejected("the Dataset's schema is larger than a topic records "
                                    f"({MAX_SCHEMA_BYTES} bytes as JSON); write fewer columns")
        actors, _started = start_publishers(run, self.parallelism, self.config, self.topic)
        try:
            cluster.set_topic_schema(self.topic, record)
            plan = RunPlan(run=run, mode=self.mode, publishers=self.parallelism,
                         topics=[self.topic], base=self.topic, topic_column=None, routes={},
                         part_column=None, max_message_bytes=cluster.max_message_bytes,
                         flush_timeout=self.flush_timeout, spark_schema=spark)
            ray.get([a.begin.remote(plan) for a in actors])
        except BaseException:
            publisher_pool.kill(actors)
            raise
        self._actors, self._spark = actors, spark

    def write(self, blocks: Iterable, ctx) -> int:
        target = arrow_schema(self._spark)
        tables = [cast_table(b, target) for b in blocks]
        publisher = self._actors[ctx.task_idx % len(self._actors)]
        return ray.get(publisher.publish_blocks.remote(tables))

    def on_write_complete(self, write_result) -> None:
        actors, self._actors = self._actors, []
        try:
            results = ray.get([a.finish.remote() for a in actors])
        except BaseException:
            publisher_pool.kill(actors)
            raise
        publisher_pool.give_back(self.config, actors)
        report = PublishReport.of(results)
        report.topics = {self.topic: report.rows}
        self.report = report
        log.info("published %d rows of a Dataset to %s in %d messages", report.rows,
                 self.topic, report.messages)

    def on_write_failed(self, error: Exception) -> None:
        actors, self._actors = self._actors, []
        refs = [a.finish.remote(f"the write failed: {error}") for a in actors]
        for ref in refs:
            try:
                ray.get(ref, timeout=self.flush_timeout)
            except Exception as exc:  # each publisher ends on its own
                log.info("ending an aborted Dataset write: %s", exc)
        publisher_pool.kill(actors)

