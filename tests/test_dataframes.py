"""DataFrames to topics and back (issue 6): publish_dataframe through publisher actors, collectors that
turn the topics back into a DataFrame with the recorded schema, and what bad input does. Real Ray,
real Spark (RayDP), real UDP."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import scopecast
from scopecast.ray_cluster import dataframe_source, publisher_pool
from scopecast.ray_cluster.dataframes import (
    MAX_NESTING,
    PublishReport,
    TopicCollector,
    arrow_schema,
    check_schema,
    collect_topic,
    from_msgpack_rows,
    publish_dataframe,
    routed_topics,
    to_dataset,
    to_msgpack_rows,
    topic_part,
    warm_publishers,
    wire_schema,
)

TIMEOUT = 120.0  # liveness bound for a collector, not a performance figure

# ---------------------------------------------------------------------- unit: no Ray, no Spark


def _field(name, type_, nullable=True):
    return {"name": name, "type": type_, "nullable": nullable, "metadata": {}}


def _struct(*fields):
    return {"type": "struct", "fields": list(fields)}


def test_maps_anywhere_are_refused():
    mp = {"type": "map", "keyType": "string", "valueType": "integer", "valueContainsNull": True}
    with pytest.raises(scopecast.DataFrameRejected, match=r"column 'm' is a map \(map<string,integer>\)"):
        check_schema(_struct(_field("m", mp)))
    nested = {"type": "array", "elementType": _struct(_field("inner", mp)), "containsNull": True}
    with pytest.raises(scopecast.DataFrameRejected, match=r"column 'a\[\]\.inner' is a map"):
        check_schema(_struct(_field("id", "long"), _field("a", nested)))


def test_nesting_is_bounded():
    deep = "integer"
    for _ in range(MAX_NESTING):
        deep = {"type": "array", "elementType": deep, "containsNull": True}
    check_schema(_struct(_field("ok", deep)))
    deeper = _struct(_field("s", deep))
    with pytest.raises(scopecast.DataFrameRejected, match=f"column 'x' nests .* deeper than {MAX_NESTING}"):
        check_schema(_struct(_field("x", deeper)))


def test_types_without_arrow_form_and_duplicate_names_are_refused():
    with pytest.raises(scopecast.DataFrameRejected, match="'iv' has type 'interval day to second'"):
        check_schema(_struct(_field("iv", "interval day to second")))
    with pytest.raises(scopecast.DataFrameRejected, match=r"duplicate field names \['a'\]"):
        check_schema(_struct(_field("a", "long"), _field("a", "string")))


def test_a_topics_recorded_dataframe_schema_reads_typed():
    from scopecast.scopes.topics import DataFrameSchema

    recorded = {"spark": "{}", "mode": "arrow", "publishers": 3, "run": "abc",
                "topic_column": "x", "key_column": None}
    assert scopecast.TopicInfo("t", 1, schema=recorded).dataframe == DataFrameSchema(
        spark="{}", mode="arrow", publishers=3, run="abc", topic_column="x")
    assert scopecast.TopicInfo("t", 1).dataframe is None  # no schema, or not a DataFrame's
    assert scopecast.TopicInfo("t", 1, schema={"note": "mine"}).dataframe is None
    for publishers in ("2", 0, None):  # recorded by hand, only like a DataFrame's: not read as one
        assert scopecast.TopicInfo("t", 1, schema={**recorded, "publishers": publishers}) \
            .dataframe is None


def test_topic_parts_escape_what_topic_names_do_not_allow():
    assert topic_part("JFK") == "JFK"
    assert topic_part("New York") == "New_20York"
    assert topic_part("a/b") == "a_2fb"
    assert topic_part("é") == "_c3_a9"
    assert topic_part(None) == "__null__"
    assert topic_part("") == "__empty__"
    assert topic_part(True) == "true" and topic_part(-3) == "-3"
    assert routed_topics("f", ["JFK", None, 7]) == {"JFK": "f/JFK", None: "f/__null__", 7: "f/7"}
    with pytest.raises(scopecast.DataFrameRejected, match="both route to topic 'f/a_20b'"):
        routed_topics("f", ["a b", "a_20b"])
    with pytest.raises(scopecast.DataFrameRejected, match="characters"):
        routed_topics("f", ["x" * 300])


def test_rows_survive_msgpack_exactly():
    import msgpack
    import pyarrow as pa

    spark = _struct(
        _field("ts", "timestamp"), _field("ntz", "timestamp_ntz"), _field("d", "date"),
        _field("dec", "decimal(38,10)"), _field("b", "binary"), _field("f", "float"),
        _field("s", _struct(_field("q", "decimal(5,1)"), _field("t", "timestamp"))),
        _field("l", {"type": "array", "elementType": _struct(_field("x", "date")), "containsNull": True},
               nullable=False))
    schema = arrow_schema(spark)
    table = pa.Table.from_pylist([
        {"ts": datetime.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=datetime.timezone.utc),
         "ntz": datetime.datetime(1000, 1, 1, 0, 0, 0, 1), "d": datetime.date(1, 1, 1),
         "dec": decimal.Decimal("1234567890123456789012345678.0123456789"), "b": b"\x00\xff",
         "f": 1.1, "s": {"q": decimal.Decimal("-1.5"), "t": None},
         "l": [{"x": datetime.date(1970, 1, 1)}, None]},
        {"ts": None, "ntz": None, "d": None, "dec": None, "b": None, "f": None, "s": None, "l": []},
    ], schema=schema)
    packed = [msgpack.packb(r, use_bin_type=True) for r in to_msgpack_rows(table, wire_schema(schema))]
    back = from_msgpack_rows([msgpack.unpackb(p, raw=False) for p in packed], schema)
    assert back.schema == schema
    assert back.equals(table)


def test_flat_rows_packed_in_arrow_decode_as_the_per_row_maps():
    """packed_rows encodes a flat batch column by column in Arrow: every value (extremes, nulls,
    empty and non-ASCII strings, every flat Spark type) decodes as the per-row dict path's."""
    import msgpack
    import pyarrow as pa

    from scopecast.ray_cluster.dataframe_codec import packed_rows

    spark = _struct(*(_field(n, t) for n, t in (
        ("by", "byte"), ("sh", "short"), ("i", "integer"), ("l", "long"), ("f", "float"),
        ("d", "double"), ("bo", "boolean"), ("s", "string"), ("b", "binary"), ("ts", "timestamp"),
        ("dt", "date"), ("dec", "decimal(10,2)"), ("v", "void"))))
    schema = arrow_schema(spark)
    rows = [
        {"by": -128, "sh": 32767, "i": -(2 ** 31), "l": 2 ** 63 - 1, "f": 1.5, "d": -0.0,
         "bo": True, "s": "é" * 300, "b": b"\x00" * 70000, "dec": decimal.Decimal("-12.34"),
         "ts": datetime.datetime(2013, 1, 1, 5, 15, tzinfo=datetime.timezone.utc),
         "dt": datetime.date(1, 1, 1)},
        {"by": None, "sh": None, "i": None, "l": None, "f": None, "d": None, "bo": None,
         "s": None, "b": None, "ts": None, "dt": None, "dec": None},
        {"by": 0, "sh": -1, "i": 7, "l": -(2 ** 63), "f": float("inf"), "d": 1e308, "bo": False,
         "s": "", "b": b"", "dec": decimal.Decimal("0.00"),
         "ts": datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.timezone.utc),
         "dt": datetime.date(9999, 12, 31)},
    ]
    table = pa.Table.from_pylist(rows, schema=schema)
    wire = wire_schema(schema)
    expected = to_msgpack_rows(table, wire)
    packed = packed_rows(table, wire)
    assert all(isinstance(p, memoryview) for p in packed)  # the Arrow path, not the fallback
    assert [msgpack.unpackb(p, raw=False) for p in packed] == expected
    for one in range(len(rows)):  # a slice (an Arrow offset) and a batch rather than a table
        batch = table.slice(one, 1).to_batches()[0]
        assert [msgpack.unpackb(p, raw=False) for p in packed_rows(batch, wire)] == [expected[one]]
    # nested columns take the per-row path, with the same result
    nested = arrow_schema(_struct(_field("a", {"type": "array", "elementType": "long",
                                                    "containsNull": True}), _field("n", "long")))
    table = pa.Table.from_pylist([{"a": [1, None], "n": 3}, {"a": None, "n": None}], schema=nested)
    assert [msgpack.unpackb(p, raw=False) for p in packed_rows(table, wire_schema(nested))] == \
        to_msgpack_rows(table, wire_schema(nested))


class _Stderr(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_a_progress_bar_in_a_terminal_only_and_never_when_asked_not_to(monkeypatch, tty):
    err = _Stderr(tty)
    monkeypatch.setattr(dataframe_source.sys, "stderr", err)
    bar = dataframe_source._progress_bar(None, 1000, "publishing to t")
    assert (bar is not None) == tty
    if bar is not None:
        bar.update(500)
        bar.close()
        assert "publishing to t" in err.getvalue() and "500/1000" in err.getvalue()
    for progress in (False, print):  # off, or the caller's callback instead
        assert dataframe_source._progress_bar(progress, 1000, "publishing to t") is None


# ------------------------------------------------------------------------ with Ray and Spark


@pytest.mark.ray
def test_a_topic_records_a_bounded_schema(cluster, topic_name):
    cluster.create_topic(topic_name)
    info = cluster.set_topic_schema(topic_name, {"spark": "{}", "mode": "rows", "publishers": 2})
    assert info.schema == cluster.topic(topic_name).schema == {"spark": "{}", "mode": "rows", "publishers": 2}
    assert [t.schema for t in cluster.topics() if t.name == topic_name] == [info.schema]
    with pytest.raises(scopecast.InvalidConfig, match="exceeds 65536"):
        cluster.set_topic_schema(topic_name, {"spark": "x" * 70_000})
    with pytest.raises(scopecast.InvalidConfig, match="JSON"):
        cluster.set_topic_schema(topic_name, {"when": datetime.date(2024, 1, 1)})
    with pytest.raises(scopecast.TopicNotFound):
        cluster.set_topic_schema(topic_name + "/missing", {})
    assert cluster.topic(topic_name).schema == info.schema  # refused changes left it alone
    assert cluster.set_topic_schema(topic_name, None).schema is None


def _typed_frame(spark, n: int = 240):
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    schema = StructType([
        StructField("id", LongType(), False), StructField("i", IntegerType()),
        StructField("d", DoubleType()), StructField("s", StringType()), StructField("b", BooleanType()),
        StructField("day", DateType()), StructField("ts", TimestampType()),
        StructField("price", DecimalType(20, 4)), StructField("tags", ArrayType(IntegerType())),
        StructField("point", StructType([StructField("x", IntegerType()), StructField("label", StringType()),
                                         StructField("at", TimestampType())])),
        StructField("raw", BinaryType()), StructField("f", FloatType()),
    ])
    base = datetime.datetime(2024, 2, 29, 12, 30, 15, 123456)
    rows = []
    for k in range(n):
        if k % 7 == 3:  # nulls everywhere but the key
            rows.append((k, None, None, None, None, None, None, None, None, None, None, None))
            continue
        rows.append((k, k * 3 - 100, k / 8, f"row-{k}-ü", k % 2 == 0,
                     datetime.date(1970, 1, 1) + datetime.timedelta(days=k * 97 - 5000),
                     base + datetime.timedelta(seconds=k * 3607, microseconds=k),
                     decimal.Decimal(k * 12345 - 99999) / 10000,
                     [k, None, -k] if k % 5 else [],
                     (k, None if k % 3 else f"p{k}", base - datetime.timedelta(days=k)),
                     bytes([k % 256, 0, 255]), float(k) / 4))
    return spark.createDataFrame(rows, schema).repartition(3)


def _same_rows(a, b) -> bool:
    return sorted(map(repr, a.collect())) == sorted(map(repr, b.collect()))


@pytest.mark.ray
def test_a_table_with_an_empty_chunk_reaches_spark_whole(spark):
    """A collector's table is the topics' parts end to end, and a part can hold an empty chunk:
    Spark's Arrow reader stopped at an empty batch, and the rows after it were lost."""
    import pyarrow as pa

    from scopecast.ray_cluster.dataframe_sink import arrow_to_spark

    df = spark.range(1).selectExpr("id", "cast(id as string) as name")
    parts = [pa.table({"id": pa.array(range(n * 10, n * 10 + k), pa.int64()),
                       "name": pa.array([str(n)] * k, pa.string())}) for n, k in ((0, 7), (1, 0), (2, 5))]
    out = arrow_to_spark(spark, pa.concat_tables(parts), df.schema)
    assert sorted(r["id"] for r in out.collect()) == [*range(7), *range(20, 25)]


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["rows", "arrow"])
def test_round_trip_keeps_every_row_and_the_schema(cluster, spark, topic_name, mode):
    cluster.create_topic(topic_name)
    df = _typed_frame(spark)
    read = scopecast.read_topic(topic_name, timeout=TIMEOUT)  # subscribed from here on
    with TopicCollector(topic_name) as collector, cluster.subscriber(topic_name) as sub:
        report = publish_dataframe(df, topic_name, parallelism=2, mode=mode, progress=False)
        summary = collector.wait(TIMEOUT)
        ds = collector.to_dataset(TIMEOUT)
        out = collect_topic(spark, collector, timeout=TIMEOUT)
        # a subscriber of one's own reads the same rows, decoded, until both publishers' ends
        stream = sub.rows(TIMEOUT)
        rows = list(stream)
        assert sorted(rows, key=lambda r: r["id"]) == sorted(
            collector.to_arrow(TIMEOUT).to_pylist(), key=lambda r: r["id"])
        assert stream.done and stream.rows == 240 and stream.ends == {topic_name: {0, 1}}
    assert isinstance(rows[0]["ts"], datetime.datetime) and rows[0]["ts"].tzinfo is not None
    assert isinstance(rows[0]["price"], decimal.Decimal) and isinstance(rows[0]["point"], dict)

    assert isinstance(report, PublishReport)
    assert report.rows == 240 and report.topics == {topic_name: 240}
    assert report.bytes > 0 and report.seconds > 0
    if mode == "rows":
        assert report.messages == 240  # one per row
    else:
        assert 1 <= report.messages < 240  # record batches
    assert out.schema == df.schema
    assert _same_rows(out, df)
    assert ds.count() == 240
    assert sorted(r["id"] for r in ds.take_all()) == list(range(240))
    assert sorted(read.take_all(), key=lambda r: r["id"]) == sorted(ds.take_all(),
                                                                    key=lambda r: r["id"])
    assert summary["topics"][topic_name]["publishers"] == 2
    assert summary["topics"][topic_name]["rows"] == 240 and summary["aborted"] == {}

    recorded = cluster.topic(topic_name).schema
    assert json.loads(recorded["spark"]) == df.schema.jsonValue()
    assert (recorded["mode"], recorded["publishers"]) == (mode, 2)
    assert recorded["topic_column"] is None and recorded["key_column"] is None


def _idle_publishers() -> list[str]:
    return [actor._actor_id.hex() for _, actor in publisher_pool._idle]


@pytest.mark.ray
def test_a_later_run_reuses_the_publisher_processes_as_new_members(cluster, spark, topic_name):
    """The publisher actors of a run that succeeded serve the next run of the driver (no process
    start); each run joins as members of its own, so the second run's rows on the same topic are
    numbered afresh and every one arrives."""
    cluster.create_topic(topic_name)
    df = spark.range(0, 300, 1, 2)
    kept, started = [], []
    for _ in range(2):
        with TopicCollector(topic_name) as collector:
            started.append(publish_dataframe(df, topic_name, parallelism=2,
                                             progress=False).publishers_started)
            collector.wait(TIMEOUT)
            ids = collector.to_arrow(TIMEOUT).column("id").to_pylist()
            streams = collector.status()["streams"]
        assert sorted(ids) == list(range(300))
        assert all(s["gaps"] == 0 and s["dups"] == 0 for s in streams)
        kept.append(set(_idle_publishers()))
    assert started[1] == 0 and len(kept[1]) >= 2 and kept[1] == kept[0]  # the same, idle again
    names = {s["source"] for s in streams}
    assert len(names) == 2 and all(n.startswith("dataframe-") for n in names)


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["rows", "arrow"])
def test_topic_column_routes_rows_to_topics_created_like_the_base(cluster, spark, topic_name, mode):
    base = topic_name
    cluster.create_topic(base, policy="chain", options={"note": "kept"})
    airports = ["JFK", "LAX", None, "New York", "JFK"]
    df = spark.createDataFrame([(k, airports[k % 5], k * 0.5) for k in range(150)],
                               "id long, airport string, fare double")
    # the topics split between two subscribers in a scope of their own: they learn of the topics
    # publish_dataframe creates only through the scope tree, and must still get every row
    with TopicCollector(f"{base}/*", parallelism=2, scope="dataframes-lan") as collector, \
            cluster.subscriber(f"{base}/*") as sub:
        report = publish_dataframe(df, base, topic_column="airport", parallelism=2, mode=mode,
                                   progress=False)
        summary = collector.wait(TIMEOUT)
        out = collect_topic(spark, collector, timeout=TIMEOUT)
        # rows() ends when every routed topic has both publishers' ends, not at the first one's
        stream = sub.rows(TIMEOUT)
        assert sorted(r["id"] for r in stream) == list(range(150))
        assert stream.topics == set(report.topics) and stream.done

    expected = {f"{base}/{topic_part(r['airport'])}": r["count"]
                for r in df.groupBy("airport").count().collect()}
    assert set(expected) == {f"{base}/JFK", f"{base}/LAX", f"{base}/__null__", f"{base}/New_20York"}
    assert report.topics == expected
    assert report.rows == 150
    assert {name: t["rows"] for name, t in summary["topics"].items()} == expected
    for name in expected:
        info = cluster.topic(name)
        assert (info.policy, info.recovery, info.options) == ("chain", "token_ring", {"note": "kept"})
        assert info.schema["topic_column"] == "airport" and info.schema["publishers"] == 2
    assert cluster.topic(base).schema["run"] == cluster.topic(f"{base}/JFK").schema["run"]
    assert out.schema == df.schema
    assert _same_rows(out, df)


@pytest.mark.ray
def test_given_topic_values_route_without_a_spark_job_of_their_own(cluster, spark, topic_name):
    """topic_values (known to the caller) spare the Spark job that finds the values: a streamed
    run is then one Spark job; publishers warmed ahead serve it (no process started after the
    call); a row whose value is not among them ends the run aborted, DataFrameRejected."""
    cluster.create_topic(topic_name)
    df = spark.createDataFrame([(k, "abc"[k % 3]) for k in range(60)], "id long, region string")
    with pytest.raises(scopecast.InvalidConfig, match="give the column too"):
        publish_dataframe(df, topic_name, topic_values=["a"], progress=False)
    with pytest.raises(scopecast.InvalidConfig, match="not a string"):
        publish_dataframe(df, topic_name, topic_column="region", topic_values="abc", progress=False)
    warm_publishers(2)
    tracker = spark.sparkContext.statusTracker()
    jobs = set(tracker.getJobIdsForGroup(None))
    with TopicCollector(f"{topic_name}/*") as collector:
        report = publish_dataframe(df, topic_name, topic_column="region", topic_values=["c", "a", "b"],
                                   transfer="stream", progress=False)
        collector.wait(TIMEOUT)
        ids = collector.to_arrow(TIMEOUT).column("id").to_pylist()
    assert len(set(tracker.getJobIdsForGroup(None)) - jobs) == 1  # only the stream's
    assert report.publishers_started == 0
    assert report.topics == {f"{topic_name}/{v}": 20 for v in "abc"} and sorted(ids) == list(range(60))
    with pytest.raises(scopecast.DataFrameRejected, match="'c', which is not among"):
        publish_dataframe(df, topic_name, topic_column="region", topic_values=["a", "b"],
                          transfer="stream", progress=False)


@pytest.mark.ray
@pytest.mark.parametrize("transfer", ["object_store", "stream"])
def test_key_column_keeps_each_key_on_one_publisher_in_order(cluster, spark, topic_name, transfer):
    cluster.create_topic(topic_name)
    df = spark.createDataFrame([(k, f"key{k % 11}", k) for k in range(600)], "id long, key string, n long")
    sub = cluster.subscriber(topic_name)
    try:
        report = publish_dataframe(df, topic_name, key_column="key", parallelism=3, progress=False,
                                   transfer=transfer)
        seen: dict[str, list] = {}
        ends = 0
        deadline = time.monotonic() + TIMEOUT
        while ends < 3 and time.monotonic() < deadline:
            for msg in sub.receive_batch(1.0):
                if isinstance(msg.value, list):  # a publisher's end message
                    ends += 1
                else:
                    seen.setdefault(msg.value["key"], []).append((msg.source, msg.value["n"]))
    finally:
        sub.close()
    assert report.rows == 600 and ends == 3
    assert sorted(seen) == sorted(f"key{j}" for j in range(11))
    for key, got in seen.items():
        assert len({source for source, _ in got}) == 1, key  # one publisher per key
        numbers = [n for _, n in got]
        assert numbers == sorted(numbers) == [k for k in range(600) if f"key{k % 11}" == key]
    assert cluster.topic(topic_name).schema["key_column"] == "key"


@pytest.mark.ray
def test_streamed_from_the_executors_a_retried_task_is_not_published_twice(cluster, spark,
                                                                          topic_name):
    """transfer="stream": the executors send the partitions to the publishers as Spark computes
    them; partition 1's first attempt dies halfway (Arrow batches of 100 rows), and Spark's retry
    sends it again: every row arrives once. (Here Spark's first attempt gets no batch to the
    publisher before it dies; a retry of a partition partly handed out is test_spark_feed's.)"""
    from pyspark.sql import functions as F

    def fails_first_attempt(n):  # (nested: Spark pickles it by value)
        from pyspark import TaskContext

        task = TaskContext.get()
        if n == 1500 and task.partitionId() == 1 and task.attemptNumber() == 0:
            raise RuntimeError("the first attempt dies here")
        return n

    cluster.create_topic(topic_name)
    flaky = F.udf(fails_first_attempt, "long")
    df = (spark.range(0, 3000, numPartitions=3)
          .select(F.col("id"), flaky("id").alias("n"), (F.col("id") % 3).cast("string").alias("k")))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        with TopicCollector(f"{topic_name}/*", timeout=TIMEOUT) as collector:
            report = publish_dataframe(df, topic_name, topic_column="k", parallelism=2,
                                       progress=False, transfer="stream")
            summary = collector.wait(TIMEOUT)
            table = collector.to_arrow(TIMEOUT)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert report.rows == 3000 and not summary["aborted"]
    assert sorted(table.column("n").to_pylist()) == list(range(3000))
    assert report.topics == {f"{topic_name}/{k}": 1000 for k in "012"}


# ------------------------------------------------------------------ bad input (issue 6, item 6)


@pytest.mark.ray
def test_a_map_column_is_refused_before_anything_is_published(cluster, spark, topic_name):
    cluster.create_topic(topic_name)
    df = spark.sql("select id, cast(id % 3 as string) as airport, map('a', id) as m from range(10)")
    with TopicCollector([topic_name, f"{topic_name}/*"]) as collector:
        with pytest.raises(scopecast.DataFrameRejected, match="column 'm' is a map"):
            publish_dataframe(df, topic_name, topic_column="airport", progress=False)
        with pytest.raises(scopecast.FlushTimeout, match="no publisher has ended"):
            collector.wait(timeout=2.0)
        assert collector.status()["messages"] == 0
    assert [t.name for t in cluster.topics() if t.name.startswith(topic_name + "/")] == []
    assert cluster.topic(topic_name).schema is None


@pytest.mark.ray
def test_nesting_deeper_than_the_bound_is_refused(cluster, spark, topic_name):
    cluster.create_topic(topic_name)
    depth = MAX_NESTING + 1
    df = spark.sql("select " + "array(" * depth + "1" + ")" * depth + " as deep")
    deeper = f"column 'deep' nests .* deeper than {MAX_NESTING}"
    with pytest.raises(scopecast.DataFrameRejected, match=deeper):
        publish_dataframe(df, topic_name, progress=False)
    assert cluster.topic(topic_name).schema is None


@pytest.mark.ray
@pytest.mark.parametrize("mode", ["rows", "arrow"])
def test_a_row_over_the_message_size_stops_the_run_without_losing_what_was_published(
        cluster, spark, topic_name, mode):
    from pyspark.sql import functions as F

    cluster.create_topic(topic_name)
    big = scopecast.RuntimeConfig().max_message_bytes + (1 << 20)
    # two partitions, 0..49 and 50..99: publisher 0 meets the big row (id 30) after 30 rows
    df = spark.range(0, 100, 1, 2).withColumn(
        "blob", F.when(F.col("id") == 30, F.expr(f"cast(repeat('x', {big}) as binary)"))
        .otherwise(F.expr("cast(cast(id as string) as binary)")))
    idle = _idle_publishers()
    with TopicCollector(topic_name) as collector:
        with pytest.raises(scopecast.DataFrameRejected) as err:
            publish_dataframe(df, topic_name, parallelism=2, progress=False, mode=mode)
        assert _idle_publishers() == idle[2:]  # a failed run's publishers are not kept
        summary = collector.wait(TIMEOUT)  # every publisher still ended its stream
        status = collector.status()
        out = collector.to_arrow(TIMEOUT)

    message = str(err.value)
    assert "column 'blob'" in message and f"exceeds max_message_bytes={big - (1 << 20)}" in message
    assert "published 30 rows" in message
    assert collector.aborted and all(v.startswith("aborted") for v in collector.aborted.values())
    ids = out.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == err.value.report.rows == summary["topics"][topic_name]["rows"]
    assert [i for i in ids if i < 50] == list(range(30))  # everything before the big row, once, in order
    later = [i for i in ids if i >= 50]
    assert later == list(range(50, 50 + len(later)))  # the other publisher: a prefix of its block
    assert all(s["gaps"] == 0 and s["dups"] == 0 for s in status["streams"])


@pytest.mark.ray
def test_an_empty_dataframe_ends_with_an_empty_result(cluster, spark, topic_name):
    cluster.create_topic(topic_name)
    df = spark.createDataFrame([], "id long, name string, at timestamp")
    with TopicCollector(topic_name) as collector:
        report = publish_dataframe(df, topic_name, parallelism=2, progress=False)
        summary = collector.wait(TIMEOUT)
        out = collect_topic(spark, collector, timeout=TIMEOUT)
    assert (report.rows, report.messages, report.bytes, report.topics) == (0, 0, 0, {topic_name: 0})
    assert summary["topics"][topic_name]["publishers"] == 2  # an end message from each
    assert out.schema == df.schema and out.count() == 0


@pytest.mark.ray
def test_null_topic_column_values_go_to_the_null_topic(cluster, spark, topic_name):
    cluster.create_topic(topic_name)
    df = spark.sql("select id, cast(null as string) as region from range(25)")
    with TopicCollector(f"{topic_name}/*") as collector:
        report = publish_dataframe(df, topic_name, topic_column="region", progress=False)
        ds = to_dataset(collector, timeout=TIMEOUT)
    assert report.topics == {f"{topic_name}/__null__": 25}
    assert [t.name for t in cluster.topics() if t.name.startswith(topic_name + "/")] == \
        [f"{topic_name}/__null__"]
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(25)) and {r["region"] for r in rows} == {None}


@pytest.mark.ray
def test_progress_callback_missing_topic_and_nothing_to_collect(cluster, spark, topic_name):
    df = spark.range(0, 50)
    with pytest.raises(scopecast.TopicNotFound):
        publish_dataframe(df, topic_name, progress=False)
    with pytest.raises(scopecast.TopicNotFound):
        TopicCollector(topic_name)
    cluster.create_topic(topic_name)
    with pytest.raises(scopecast.FlushTimeout, match="no publisher has ended yet"):
        collect_topic(spark, topic_name, timeout=1.0)  # started now: nothing published since
    seen: list[int] = []
    report = publish_dataframe(df, topic_name, parallelism=1, progress=seen.append)
    assert report.rows == 50 and seen and seen[-1] == 50 and seen == sorted(seen)


# ------------------------------------------------------------- a Spark executor killed mid-run

_KILL_CHILD = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    import ray
    address, topic = sys.argv[1], sys.argv[2]
    # a namespace of its own: RayDP's actors must not meet the test session's Spark
    ray.init(address=address, namespace=f"scopecast-df-kill-{os.getpid()}", logging_level="ERROR")
    import scopecast
    from pyspark.sql.functions import udf
    from scopecast.ray_cluster.dataframes import TopicCollector, publish_dataframe
    from scopecast.ray_cluster.spark import init_spark, stop_spark

    cluster = scopecast.connect()

    def kill_executor():
        """Kill -9 this Spark's executor (RayDP names it in the driver's namespace; the app master
        that creates it is a Ray job of its own) once it runs; returns its pid. (A loaded machine
        may still be starting it, or the name may still lead to the last Spark's.)"""
        import ray._private.state as state
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                actor_id = ray.get_actor("raydp-executor-0")._actor_id.hex()
                entry = state.actors().get(actor_id) or {}
            except ValueError:
                entry = {}
            if entry.get("State") == "ALIVE" and entry.get("Pid"):
                os.kill(entry["Pid"], signal.SIGKILL)
                return entry["Pid"]
            time.sleep(0.1)
        return None

    def attempt(name, df, rows, progress=None, kill_after=None, convert_timeout=None):
        cluster.create_topic(name)
        collector = TopicCollector(name)
        killed = []
        if kill_after is not None:
            timer = threading.Timer(kill_after, lambda: killed.append(kill_executor()))
            timer.daemon = True
            timer.start()
        result = {}
        try:
            report = publish_dataframe(df, name, parallelism=2, mode="rows",
                                       progress=(lambda n: progress(n, killed)) if progress else False,
                                       convert_timeout=convert_timeout)
            result.update(outcome="completed", rows=report.rows)
            result["ids"] = collector.to_arrow(120).column("id").to_pylist()
        except Exception as exc:
            result.update(outcome="error", type=type(exc).__name__, message=str(exc))
        status = collector.status()
        result.update(killed=killed, messages=status["messages"],
                      streams=[(s["topic"], s["source"], s["gaps"], s["dups"]) for s in status["streams"]],
                      schema=cluster.topic(name).schema)
        collector.close()
        return result

    results = {}
    # 1. while the blocks are published: the executors are no longer needed
    spark = init_spark("df-kill", num_executors=1, executor_cores=1, executor_memory="1G")
    def kill_once(rows, killed):
        if rows and not killed:
            killed.append(kill_executor())
    results["publishing"] = attempt(topic + "/publishing", spark.range(0, 20000, numPartitions=4),
                                    20000, progress=kill_once)
    stop_spark()
    # 2. while Spark computes the partitions (a slow UDF over 8000 rows takes seconds)
    spark = init_spark("df-kill-2", num_executors=1, executor_cores=1, executor_memory="1G")
    slow = udf(lambda x: (time.sleep(0.002), x)[1], "long")
    df = spark.range(0, 8000, numPartitions=8).withColumn("v", slow("id"))
    # (an executor lost while its blocks are fetched leaves RayDP retrying: convert_timeout)
    results["converting"] = attempt(topic + "/converting", df, 8000, kill_after=3.0,
                                    convert_timeout=60.0)
    print("RESULT " + json.dumps(results), flush=True)
    stop_spark()
    cluster.shutdown()
''')


@pytest.mark.ray
@pytest.mark.timeout(480)
def test_a_spark_executor_killed_mid_run(cluster, topic_name, tmp_path):
    """An executor killed while the blocks are published (completes), then one killed while Spark
    computes them (SparkUnavailable, or completion if Spark recovers); no duplicates, no gaps.
    Runs in a driver of its own with its own Spark on the session's Ray: a killed executor may
    leave Spark unusable, and the session's Spark must stay intact for the other tests."""
    script = tmp_path / "kill_executor.py"
    script.write_text(_KILL_CHILD)
    proc = subprocess.Popen([sys.executable, str(script), cluster.address, topic_name],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out: list[str] = []
    try:  # read up to the result: stopping a Spark that lost an executor may hang, and is not
        for line in proc.stdout:  # what is tested
            out.append(line)
            if line.startswith("RESULT "):
                break
        try:  # (a driver killed takes its Spark with it: Ray ends the actors a driver owns)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
    finally:
        proc.kill()
    assert out and out[-1].startswith("RESULT "), "no result:\n" + "".join(out)[-5000:]
    results = json.loads(out[-1][len("RESULT "):])
    print("outcomes:", {k: {f: v for f, v in r.items() if f != "ids"} for k, r in results.items()})
    for case, rows in (("publishing", 20000), ("converting", 8000)):
        result = results[case]
        assert result["killed"] and result["killed"][0], f"{case}: the executor was not found"
        assert all(gaps == 0 and dups == 0 for _t, _s, gaps, dups in result["streams"]), case
        if result["outcome"] == "completed":  # every row exactly once
            assert result["rows"] == rows, case
            assert sorted(result["ids"]) == list(range(rows)), case
        else:  # a clear error, raised before anything was created or published
            assert result["type"] == "SparkUnavailable", result
            assert "nothing was published" in result["message"]
            assert result["messages"] == 0 and result["schema"] is None
    # once the blocks are in Ray's object store, the executors are not needed any more
    assert results["publishing"]["outcome"] == "completed", results["publishing"]
