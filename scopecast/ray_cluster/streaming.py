"""Spark Structured Streaming into topics: a `foreachBatch` function that publishes each micro-batch
with `publish_dataframe`, and skips a micro-batch Spark runs again after a failure.

    query = (events.writeStream
             .foreachBatch(scopecast.foreach_batch("events", name="events-to-topic"))
             .option("checkpointLocation", "/data/checkpoints/events")
             .start())

Spark numbers micro-batches (`batchId`) and, after a failure, restarts from its checkpoint by
running the last uncommitted batch again with the same id. Once a micro-batch is stable at every
subscriber, the last batch id published under `name` is recorded on the topic (with the schema the
run recorded, in the root scope's state, so that a restarted driver finds it too); a batch whose
id is not above it is skipped. A driver that dies after a batch turned stable and before the id
is recorded publishes that batch again when Spark retries it: the record is as close to the
publishing as the two steps allow.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scopecast.actors.errors import InvalidConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from scopecast.ray_cluster.dataframe_source import PublishReport

log = logging.getLogger(__name__)

STREAM_KEY = "stream"  # where a topic's recorded schema keeps {"name": ..., "batch": ...}


class ForeachBatchPublisher:
    """A `foreachBatch` function (call it with `(df, batch_id)`) publishing each micro-batch to
    `topic` with `publish_dataframe(df, topic, **publish_args)`. `name` tells streaming queries
    that publish to one topic apart (default: the topic). `reports` holds the PublishReport of
    each micro-batch published by this process, `skipped` the ids it skipped."""

    def __init__(self, topic: str, *, name: str | None = None, cluster=None,
                 **publish_args) -> None:
        if "progress" in publish_args or "cluster" in publish_args:
            raise InvalidConfig("foreach_batch sets progress and cluster itself")
        self.topic = topic
        self.name = name or topic
        self._cluster = cluster
        self._args = publish_args
        self.reports: list[PublishReport] = []
        self.skipped: list[int] = []

    def _connected(self):
        if self._cluster is None:
            import scopecast

            self._cluster = scopecast.connect()
        return self._cluster

    def last_batch(self) -> int | None:
        """The id of the last micro-batch published under this name, as the topic records it."""
        recorded = (self._connected().topic(self.topic).schema or {}).get(STREAM_KEY)
        if isinstance(recorded, dict) and recorded.get("name") == self.name:
            return int(recorded["batch"])
        return None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        from scopecast.ray_cluster.dataframe_source import publish_dataframe

        cluster = self._connected()
        done = self.last_batch()
        if done is not None and batch_id <= done:
            log.info("micro-batch %d of %s was published before (up to %d): skipped", batch_id,
                     self.name, done)
            self.skipped.append(batch_id)
            return
        report = publish_dataframe(df, self.topic, cluster=cluster, progress=False, **self._args)
        schema = dict(cluster.topic(self.topic).schema or {})
        schema[STREAM_KEY] = {"name": self.name, "batch": int(batch_id)}
        cluster.set_topic_schema(self.topic, schema)
        self.reports.append(report)


def foreach_batch(topic: str, *, name: str | None = None, cluster=None,
                  **publish_args) -> ForeachBatchPublisher:
    """A `foreachBatch` function that publishes each micro-batch of a streaming query to `topic`
    (see the module docstring); `publish_args` go to `publish_dataframe` (`topic_column`,
    `parallelism`, `mode`, ...)."""
    return ForeachBatchPublisher(topic, name=name, cluster=cluster, **publish_args)
