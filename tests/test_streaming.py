"""Spark Structured Streaming into topics (`scopecast.foreach_batch`): each micro-batch is published
with `publish_dataframe`, and a micro-batch Spark runs again after a failure (same batchId, from
its checkpoint) is not published twice. Real Spark (RayDP), a file source, a real subscriber."""

from __future__ import annotations

import json

import pytest

import scopecast

pytestmark = pytest.mark.ray

TIMEOUT = 120.0  # liveness bound, not a performance figure


def _write(directory, name: str, ids: range) -> None:
    (directory / name).write_text("\n".join(json.dumps({"id": i}) for i in ids) + "\n")


def test_a_micro_batch_spark_retries_is_not_published_twice(cluster, spark, topic_name, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    _write(source, "a.json", range(50))
    cluster.create_topic(topic_name)
    publisher = scopecast.foreach_batch(topic_name, parallelism=1)
    failures = [RuntimeError("the user's code after publishing failed")]

    def flaky(df, batch_id: int) -> None:  # fails once, after publishing: Spark runs it again
        publisher(df, batch_id)
        if failures:
            raise failures.pop()

    def run_query() -> None:
        query = (spark.readStream.schema("id long").json(str(source)).writeStream
                 .foreachBatch(flaky).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(TIMEOUT)

    with cluster.subscriber(topic_name) as sub:
        with pytest.raises(Exception, match="after publishing failed"):
            run_query()
        run_query()  # restarted from the checkpoint: batch 0 again, skipped
        first = sub.rows(TIMEOUT)
        assert sorted(r["id"] for r in first) == list(range(50))  # once, not twice
        assert publisher.skipped == [0] and publisher.last_batch() == 0

        _write(source, "b.json", range(50, 80))
        run_query()  # the next micro-batch goes on as usual
        second = sub.rows(TIMEOUT)
        assert sorted(r["id"] for r in second) == list(range(50, 80))
    # (a second copy of batch 0 would have been the second run read, before batch 1's rows)
    assert publisher.last_batch() == 1 and [r.rows for r in publisher.reports] == [50, 30]
