"""Ray Data and topics: `scopecast.read_topic`, a run's rows as a Ray Dataset whose blocks stream
while the run is still being published, ending at every publisher's end message; and
`scopecast.TopicDatasink`, a Dataset published as a run. The first run here is published by hand
in publish_dataframe's format (the schema recorded on the topic, one msgpack map per row, an end
message per publisher), so no Spark is needed; test_dataframes reads a Spark run."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import ray

import scopecast
from scopecast.actors.errors import TopicNotFound
from scopecast.ray_cluster.dataframe_codec import END_TAG
from scopecast.ray_cluster.dataframes import to_dataset

pytestmark = pytest.mark.ray

SPARK_SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": False, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}}]}


def _publish_rows(pub, first: int, n: int) -> None:
    for i in range(first, first + n):
        pub.publish({"id": i, "name": f"n{i}"})


def test_blocks_stream_before_the_run_ends_and_the_dataset_ends_with_it(cluster, topic_name):
    cluster.create_topic(topic_name)
    cluster.set_topic_schema(topic_name, {"spark": json.dumps(SPARK_SCHEMA), "mode": "rows",
                                          "publishers": 2, "topic_column": None,
                                          "key_column": None, "run": "r1"})
    # blocks of about 4 KiB: the 500 rows first published make more than one
    ds = scopecast.read_topic(topic_name, timeout=60, block_bytes=4096)
    # the run's two publishers one after the other (a process's next publisher of a topic is its
    # next session, whose messages follow the previous session's end)
    with cluster.publisher(topic_name) as p0:
        _publish_rows(p0, 0, 500)
        p0.flush(30)
        blocks = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow",
                                      prefetch_batches=0))
        # the first block comes while no publisher has ended (else this would wait for the
        # read's timeout and fail)
        first = next(blocks)
        assert 0 < first.num_rows < 500
        assert first.column("id").to_pylist() == list(range(first.num_rows))
        assert first.schema.field("id").type == "int64"
        _publish_rows(p0, 500, 500)
        p0.publish([END_TAG, "r1", 0, 2, 1000, 1000, "ok"])
    p1 = cluster.publisher(topic_name)
    try:
        _publish_rows(p1, 1000, 700)
        p1.publish([END_TAG, "r1", 1, 2, 700, 700, "ok"])
        rest = list(blocks)  # ends: both publishers have ended
    finally:
        p1.close()
    ids = first.column("id").to_pylist() + [i for b in rest for i in b.column("id").to_pylist()]
    assert sorted(ids) == list(range(1700))
    # each publisher's rows in order
    assert [i for i in ids if i < 1000] == list(range(1000))
    assert [i for i in ids if i >= 1000] == list(range(1000, 1700))
    names = {n for b in rest for n in b.column("name").to_pylist()}
    assert "n1699" in names


def test_a_missing_topic_is_refused_before_anything_starts(cluster, topic_name):
    with pytest.raises(TopicNotFound):
        scopecast.read_topic(topic_name + "-none")


def test_a_dataset_written_to_a_topic_is_read_back_whole(cluster, topic_name):
    cluster.create_topic(topic_name)
    ds = ray.data.from_items([{"id": i, "name": f"n{i}", "score": i / 2, "small": i % 200}
                              for i in range(3000)], override_num_blocks=6)
    read = to_dataset(topic_name, timeout=60)  # given names: read_topic's streaming Dataset
    sink = scopecast.TopicDatasink(topic_name, parallelism=2)
    ds.write_datasink(sink)
    rows = read.take_all()
    assert sorted(r["id"] for r in rows) == list(range(3000))
    assert all(r["name"] == f"n{r['id']}" and r["score"] == r["id"] / 2 for r in rows)
    assert sink.report.rows == 3000 and sink.report.topics == {topic_name: 3000}
    recorded = cluster.topic(topic_name).dataframe
    assert recorded.publishers == 2 and recorded.mode == "rows"
    fields = {f["name"]: f["type"] for f in json.loads(recorded.spark)["fields"]}
    assert fields == {"id": "long", "name": "string", "score": "double", "small": "long"}


def test_a_column_without_a_spark_form_is_refused_before_anything_is_published(cluster,
                                                                               topic_name):
    cluster.create_topic(topic_name)
    ds = ray.data.from_arrow(pa.table({"x": pa.array([1, 2], pa.uint64())}))
    with pytest.raises(Exception, match="has no Spark form") as caught:
        ds.write_datasink(scopecast.TopicDatasink(topic_name))
    assert isinstance(caught.value, scopecast.DataFrameRejected) or \
        "DataFrameRejected" in repr(caught.value)
    assert cluster.topic(topic_name).schema is None
