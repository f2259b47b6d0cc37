"""`publish_dataframe`: a Spark DataFrame's rows to topics, through `ray.data.from_spark` and the
run's publisher actors (`run_publisher`). The wire form of rows and the end messages:
`dataframe_codec`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import ray

from scopecast.actors.errors import (
    DataFrameRejected,
    InvalidConfig,
    ScopecastError,
    SparkUnavailable,
    typed_cause,
)
from scopecast.extras import require
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.topic_names import MAX_TOPIC_NAME, check_topic_name
from scopecast.ray_cluster import publisher_pool
from scopecast.ray_cluster.dataframe_codec import (
    CHAR_TYPES,
    MAX_PARALLELISM,
    check_schema,
    type_name,
)
from scopecast.ray_cluster.run_publisher import MODES, RunPlan, start_publishers
from scopecast.ray_cluster.spark_feed import RESULT_SCHEMA, SECRET_BYTES, FeedShare, PartitionSender
from scopecast.scopes.cluster_manager import MAX_SCHEMA_BYTES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from scopecast.ray_cluster.cluster import Cluster

log = logging.getLogger(__name__)

MAX_ROUTED_TOPICS = 10_000  # distinct topic_column values
NULL_PART = "__null__"      # the topic part of a null topic_column value
EMPTY_PART = "__empty__"    # ... and of an empty string
_PART_COLUMN = "__scopecast_publisher"
TRANSFERS = ("object_store", "stream")
_VALID_PART = re.compile(r"[A-Za-z0-9_.\-]")


@dataclass
class PublishReport:
    """What `publish_dataframe` published: rows, messages (end messages not counted), payload bytes,
    wall-clock seconds, rows per destination topic, how many publisher processes it started
    (the others were warm from an earlier run of this driver) and, with transfer="stream", the
    rows a retried Spark task sent again (skipped: published once)."""

    rows: int = 0
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    topics: dict[str, int] = field(default_factory=dict)
    publishers_started: int = 0
    resent_rows: int = 0  # transfer="stream": rows a retried Spark task sent again (not published)

    @classmethod
    def of(cls, results) -> PublishReport:
        """The sums of the publishers' counts (`RunPublisher.finish`: rows, messages, bytes and
        rows per topic)."""
        report = cls()
        for out in results:
            report.rows += out["rows"]
            report.messages += out["messages"]
            report.bytes += out["bytes"]
            report.resent_rows += out.get("resent_rows", 0)
            for name, n in out["topics"].items():
                report.topics[name] = report.topics.get(name, 0) + n
        return report


def topic_part(value: Any) -> str:
    """The topic-name part a `topic_column` value routes to: the value as text with every character
    outside [A-Za-z0-9_.-] escaped as `_` plus the hex of its UTF-8 bytes ("New York" ->
    "New_20York"); null -> "__null__", "" -> "__empty__"; booleans as "true"/"false"."""
    if value is None:
        return NULL_PART
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if text == "":
        return EMPTY_PART
    return "".join(c if _VALID_PART.match(c) else "".join(f"_{b:02x}" for b in c.encode())
                   for c in text)


def routed_topics(topic: str, values: list) -> dict[Any, str]:
    """topic_column value -> topic name (`f"{topic}/{topic_part(value)}"`); DataFrameRejected when
    two values map to one name or a name is too long."""
    out: dict[Any, str] = {}
    seen: dict[str, Any] = {}
    for value in values:
        name = f"{topic}/{topic_part(value)}"
        if name in seen:
            raise DataFrameRejected(f"topic_column values {seen[name]!r} and {value!r} both route to "
                                    f"topic {name!r}; make them distinct after escaping")
        if len(name) > MAX_TOPIC_NAME:
            raise DataFrameRejected(f"topic_column value {value!r} makes a topic name of {len(name)} "
                                    f"characters (at most {MAX_TOPIC_NAME})")
        seen[name] = value
        out[value] = name
    return out


# -------------------------------------------------------------------------------- publishing


def publish_dataframe(df: DataFrame, topic: str, *, topic_column: str | None = None,
                      key_column: str | None = None, topic_values: Iterable | None = None,
                      parallelism: int = 2, mode: str = "rows",
                      progress: bool | Callable[[int], None] | None = None,
                      cluster: Cluster | None = None, config: RuntimeConfig | None = None,
                      flush_timeout: float = 120.0, convert_timeout: float | None = None,
                      transfer: str = "object_store") -> PublishReport:
    """Publish every row of the Spark DataFrame `df` to `topic` (which must exist) and return a
    PublishReport once every message is stable (held by every regular subscriber).

    The DataFrame goes to Ray through `ray.data.from_spark`; its blocks are split among
    `parallelism` publisher actors spread over the nodes, each a scopecast member that publishes
    one msgpack map per row (mode="rows") or Arrow record batches of up to ~1 MiB (mode="arrow",
    for bulk), then ends its stream on every topic of the run with an end message (see the module
    docstring) and closes. Subscribers get each publisher's rows in the DataFrame's order.

    - `topic_column`: each row goes to `f"{topic}/{part}"` where part is the column's value as a
      topic-name part: characters outside [A-Za-z0-9_.-] are escaped (not refused) as `_` plus
      their UTF-8 hex, null -> "__null__", "" -> "__empty__" (two values that escape to one name,
      or more than 10,000 distinct values, are refused). The column must be a string, integer or
      boolean column. Missing topics are created up front with the base topic's policy, recovery,
      root, history and options; the base topic gets the end messages too but no rows. Finding
      the values is a Spark job of its own (cache() a DataFrame that is costly to compute).
    - `topic_values`: the topic_column's values, when the caller knows them (as with Spark's
      `pivot(column, values)`): no Spark job finds them, and the run's topics are these values'
      (a row with another value ends the run aborted: DataFrameRejected).
    - `key_column`: all rows of one key go through one publisher (Spark's hash of the key modulo
      `parallelism`), so subscribers get a key's rows in the DataFrame's order. Each publisher then
      reads every block and keeps its keys: the whole DataFrame is read `parallelism` times.
    - `progress`: a tqdm bar over rows when stderr is a terminal (False: never); a callable gets
      the number of rows published so far, about four times a second.
    - `config`: the publishers' RuntimeConfig (the cluster's max_message_bytes bounds a message).
    - `transfer`: how the rows reach the publishers. "object_store" (the default): the DataFrame
      is converted into Ray's object store first (below), then published. "stream": Spark's
      executors send each partition's Arrow batches straight to its publisher over TCP as Spark
      computes them (`spark_feed`; a secret per run), so publishing overlaps Spark's work and the
      first rows go out while Spark still computes the rest; the publishers buffer partitions
      that come before their turn. A failed Spark task is retried by Spark and the rows it sent
      are not published twice (the DataFrame must compute the same rows again: cache() one that
      would not); a Spark job that fails ends the run aborted: SparkUnavailable, its `report`
      what was published. `report.resent_rows` counts the rows a retry sent again. The job's
      result says what each task sent, and is checked against what arrived: a partition
      missing or short ends the run aborted too (FeedAborted, a SparkUnavailable).
    - The publisher processes of a run that succeeds stay idle for this driver's next run with
      the same config, which starts none of its own (`report.publishers_started`; each run still
      joins as new members). `Cluster.shutdown()` stops them, and so does the driver's exit.

    Before anything is created or published the schema is checked (DataFrameRejected for a map
    anywhere, nesting deeper than 32 struct/array levels, intervals and user-defined types,
    duplicate names) and the DataFrame is converted; then the topics are created and the schema
    recorded on each (`TopicInfo.schema`: Spark schema JSON, mode, publishers, topic_column,
    key_column, run id).

    A row over the maximum message size (a binary value of 20 MB) is found while publishing: its
    publisher stops before it, the others after their batch, all end their streams ("aborted"),
    and DataFrameRejected names the column and the row's size, its `report` what was published;
    subscribers get everything before the abort exactly once, in order, and collectors end.

    With transfer="object_store", a Spark executor that dies while the DataFrame is converted
    (Spark computes and caches the partitions, then Ray tasks fetch them from the executors:
    `ray.data.from_spark` returns only once every block is in Ray's object store) makes the
    conversion fail: SparkUnavailable, raised before any topic is created or anything
    published, and Spark on Ray may need a restart (stop_spark() / init_spark()). Once
    converted, the executors are no longer needed: one that dies while the blocks are published
    changes nothing. RayDP retries a failed fetch without end, so an executor lost while
    fetching may leave the conversion waiting: `convert_timeout` (seconds; None: no bound)
    makes a longer one SparkUnavailable, before anything is published. With transfer="stream",
    `convert_timeout` bounds the Spark job that sends the rows.
    """
    from scopecast.ray_cluster.cluster import connect

    require("spark", "publish_dataframe")
    begun = time.monotonic()
    if mode not in MODES:
        raise InvalidConfig(f"unknown mode {mode!r}: {' or '.join(MODES)}")
    if transfer not in TRANSFERS:
        raise InvalidConfig(f"unknown transfer {transfer!r}: {' or '.join(TRANSFERS)}")
    if not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_PARALLELISM:
        raise InvalidConfig(f"parallelism must be an integer from 1 to {MAX_PARALLELISM}")
    check_topic_name(topic)
    cluster = cluster or connect(start=False)
    base = cluster.topic(topic)  # TopicNotFound
    spark_schema = df.schema.jsonValue()
    check_schema(spark_schema)
    columns = {f["name"]: f["type"] for f in spark_schema["fields"]}
    for what, name in (("topic_column", topic_column), ("key_column", key_column)):
        if name is not None and name not in columns:
            raise DataFrameRejected(f"{what} {name!r} is not a column of the DataFrame "
                                    f"(columns: {sorted(columns)})")
    if key_column is not None and not isinstance(columns[key_column], str):
        raise DataFrameRejected(f"key_column {key_column!r} is a {type_name(columns[key_column])}; "
                                "use an atomic column")
    max_bytes = cluster.max_message_bytes  # (every member's: a cluster setting)

    if topic_column is not None and \
            columns[topic_column] not in ("string", "byte", "short", "integer", "long", "boolean") \
            and not CHAR_TYPES.match(str(columns[topic_column])):
        raise DataFrameRejected(f"topic_column {topic_column!r} is a {type_name(columns[topic_column])}"
                                "; use a string, integer or boolean column")
    if isinstance(topic_values, str | bytes):  # (its characters are not the values meant)
        raise InvalidConfig("topic_values is a list of the topic_column's values, not a string")
    given = None if topic_values is None else list(dict.fromkeys(topic_values))
    if given is not None and topic_column is None:
        raise InvalidConfig("topic_values are the values of a topic_column: give the column too")
    run = uuid.uuid4().hex[:16]
    schema = {"spark": df.schema.json(), "mode": mode, "publishers": parallelism,
              "topic_column": topic_column, "key_column": key_column, "run": run}
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise DataFrameRejected(f"the DataFrame's schema takes {size} bytes as JSON, more than a topic "
                                f"records ({MAX_SCHEMA_BYTES}); publish fewer columns")

    # the publisher processes start and join while Spark works (the topic_column values, then
    # the conversion or the stream)
    actors, started = start_publishers(run, parallelism, config, topic)
    report = None
    try:
        routes: dict[Any, str] = {}
        if topic_column is not None:
            values = given
            if values is None:
                values = _spark_job("finding the topic_column values", lambda: [
                    r[0] for r in df.select(topic_column).distinct().limit(MAX_ROUTED_TOPICS + 1).collect()])
            if len(values) > MAX_ROUTED_TOPICS:
                raise DataFrameRejected(f"topic_column {topic_column!r} has more than "
                                        f"{MAX_ROUTED_TOPICS} distinct values; route on a coarser column")
            routes = routed_topics(topic, values)
        destinations = sorted(set(routes.values())) if topic_column is not None else [topic]
        source = df
        part = None
        if key_column is not None and parallelism > 1:
            from pyspark.sql import functions as F

            part = _PART_COLUMN
            while part in columns:
                part += "_"
            source = df.withColumn(part, F.pmod(F.hash(F.col(key_column)), F.lit(parallelism)))
        report = _publish(cluster, source, actors, schema, destinations, base, convert_timeout,
                          RunPlan(run=run, mode=mode, publishers=parallelism,
                                  topics=sorted({topic, *destinations}), base=topic,
                                  topic_column=topic_column, routes=routes, part_column=part,
                                  max_message_bytes=max_bytes, flush_timeout=flush_timeout,
                                  spark_schema=spark_schema),
                          progress, transfer)
    finally:
        if report is None:
            publisher_pool.kill(actors)
        else:
            publisher_pool.give_back(config, actors)
    report.seconds = time.monotonic() - begun
    report.publishers_started = started
    log.info("published %d rows of a DataFrame to %d topic(s) in %d messages (%.1f s, run %s)",
             report.rows, len(report.topics), report.messages, report.seconds, run)
    return report


def _publish(cluster, source, actors: list, schema: dict, destinations: list[str], base,
             convert_timeout: float | None, plan: RunPlan, progress, transfer: str) -> PublishReport:
    """Convert (transfer="object_store"), create the routed topics, record the schema, and let
    the publishers run."""
    if transfer == "stream":
        return _stream(source, actors, plan, progress, convert_timeout,
                       lambda: _create(cluster, schema, destinations, base, plan))
    refs, total = spark_blocks(source, convert_timeout)
    try:
        _create(cluster, schema, destinations, base, plan)
        n = plan.publishers
        if plan.part_column is not None:
            shares = [refs] * n  # every publisher reads every block and keeps its keys
        else:
            shares = [refs[i::n] for i in range(n)]
        calls = {a.run.remote(plan, share): a for a, share in zip(actors, shares, strict=True)}
        return _run_publishers(plan, calls, total, progress)
    finally:
        release(source)


def _create(cluster, schema: dict, destinations: list[str], base, plan: RunPlan) -> None:
    """The routed topics (like the base topic), and the schema recorded on every topic of the run."""
    for name in destinations:
        if name != base.name:
            cluster.create_topic(name, policy=base.policy, recovery=base.recovery, root=base.root,
                                 options=base.options, history=base.history)
    for name in plan.topics:
        cluster.set_topic_schema(name, schema)


def _stream(source, actors: list, plan: RunPlan, progress, timeout: float | None,
            create: Callable[[], None]) -> PublishReport:
    """transfer="stream": Spark's executors send the partitions straight to the publishers
    (`spark_feed`) while the publishers publish them; a failed Spark job stops the run. The job
    starts first, and `create` (the run's topics and schema) runs while Spark starts it: the
    publishers keep what arrives until they start."""
    n, partitions = plan.publishers, source.rdd.getNumPartitions()
    secret = secrets.token_bytes(SECRET_BYTES)
    endpoints = ray.get([a.open_feed.remote(secret, FeedShare(j, n, plan.part_column is not None,
                                                               partitions))
                         for j, a in enumerate(actors)])
    job = source.mapInArrow(PartitionSender(endpoints, secret, plan.part_column), RESULT_SCHEMA)
    failed: list[BaseException] = []

    def send() -> None:
        try:
            result = _spark_job("streaming the DataFrame to the publishers", job.collect, timeout,
                                outcome="the run stopped; subscribers got the rows before it, and "
                                        "an end message saying it was aborted")
            sent: list[dict[int, int]] = [{} for _ in actors]
            for row in result:
                sent[row["publisher"]][row["partition"]] = row["rows"]
            for a, rows in zip(actors, sent, strict=True):
                a.feed_sent.remote(rows)
        except BaseException as exc:  # every publisher ends the run, aborted
            failed.append(exc)
            for a in actors:
                a.stop.remote(f"Spark failed: {exc}")

    sender = threading.Thread(target=send, name="scopecast-spark-feed", daemon=True)
    sender.start()
    try:
        create()
    except BaseException:
        for a in actors:  # (the job's tasks then fail to connect, or end unread)
            a.stop.remote("the run's topics could not be created")
        raise
    feed_plan = replace(plan, part_column=None)  # (the executors route on it and drop it)
    calls = {a.run_feed.remote(feed_plan): a for a in actors}
    try:
        report = _run_publishers(feed_plan, calls, None, progress)
    except ScopecastError as exc:
        sender.join()
        if failed:
            failed[0].report = getattr(exc, "report", None)
            raise failed[0] from exc
        raise
    sender.join()
    return report


def spark_blocks(df, timeout: float | None = None) -> tuple[list, int]:
    """References to the DataFrame's rows as Arrow tables in Ray's object store (Spark's
    executors compute them, Ray tasks fetch them: no rows travel inside a Spark task), and the
    row count; `release(df)` unpins what Spark cached for it. SparkUnavailable as for
    publish_dataframe's conversion."""
    def convert():
        # RayDP calls APIs that Ray and PySpark call deprecated (`parallelism`, `sql_ctx`): their
        # warnings tell the user nothing they can act on
        warnings.filterwarnings("ignore", message=r"DataFrame\.sql_ctx is an internal property")
        read_api = logging.getLogger("ray.data.read_api")
        read_api.addFilter(_deprecated_parallelism)
        try:
            ds = ray.data.from_spark(df)
            return ds.to_arrow_refs(), ds.count()
        finally:
            read_api.removeFilter(_deprecated_parallelism)

    return _spark_job("converting the DataFrame to Ray blocks", convert, timeout)


def _deprecated_parallelism(record: logging.LogRecord) -> bool:
    return "``parallelism`` is deprecated" not in record.getMessage()


def _spark_job(what: str, job: Callable[[], Any], timeout: float | None = None,
               outcome: str = "nothing was published") -> Any:
    """Run a Spark job for publish_dataframe; its failure (typically a lost executor), or its
    running past `timeout` seconds, as SparkUnavailable saying `outcome`."""
    try:
        return job() if timeout is None else _bounded(what, job, timeout, outcome)
    except ScopecastError:
        raise
    except Exception as exc:
        java = getattr(exc, "java_exception", None)  # py4j's error: the JVM's exception says more
        text = str(java) if java is not None else str(exc)
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise SparkUnavailable(f"{what} failed ({type(exc).__name__}: {first[:300]}); {outcome}. "
                               "If a Spark executor was lost, restart Spark (stop_spark(), "
                               "init_spark()) and publish again") from exc


def _bounded(what: str, job: Callable[[], Any], timeout: float, outcome: str) -> Any:
    """`job()` on a thread of its own, given up after `timeout` seconds (a py4j call cannot be
    cancelled: the thread is a daemon, and Spark may need a restart)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = job()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="scopecast-spark-job", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise SparkUnavailable(f"{what} did not finish within {timeout} s; {outcome}. "
                               "A Spark executor lost while its blocks were fetched leaves RayDP "
                               "retrying: restart Spark (stop_spark(), init_spark()) and publish "
                               "again")
    if "error" in box:
        raise box["error"]
    return box["result"]


def release(df) -> None:
    """Unpin what `from_spark` cached in Spark to rebuild lost blocks (they are published now)."""
    try:
        from raydp.spark.dataset import release_spark_recoverable

        release_spark_recoverable(df)
    except Exception as exc:  # another RayDP, or Spark gone (its cache went with it)
        log.debug("releasing the converted DataFrame: %s", exc)


def _run_publishers(plan: RunPlan, pending: dict, total: int | None, progress) -> PublishReport:
    """Wait for the publishers' run calls (`pending`: call -> actor), showing progress; the
    report (the first error, with the report on it, once every publisher has ended)."""
    callback = progress if callable(progress) else None
    bar = _progress_bar(progress, total, f"publishing to {plan.base}")
    results: dict[int, dict] = {}
    error: BaseException | None = None
    shown = 0
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.25)
            for ref in done:
                del pending[ref]
                try:
                    out = ray.get(ref)
                except Exception as exc:
                    cause = typed_cause(exc) if isinstance(exc, ray.exceptions.RayTaskError) else None
                    partial = getattr(cause, "counts", None)
                    if partial:
                        results[partial["publisher"]] = partial
                    if error is None:
                        error = cause or exc
                        for other in pending.values():
                            other.stop.remote(f"another publisher failed: {error}")
                else:
                    results[out["publisher"]] = out
            if bar is not None or callback is not None:
                rows = sum(r["rows"] for r in results.values()) + _progress(pending.values())
                if bar is not None and rows > shown:
                    bar.update(rows - shown)
                if callback is not None and rows != shown:
                    callback(rows)
                shown = rows
    finally:
        if bar is not None:
            bar.close()
    report = PublishReport.of(results.values())
    destinations = [t for t in plan.topics if t != plan.base] if plan.topic_column else [plan.base]
    report.topics = {t: report.topics.get(t, 0) for t in destinations}
    if error is not None:
        if isinstance(error, ScopecastError):
            error.report = report  # what was published before the run stopped
        raise error
    return report


def _progress_bar(progress, total: int, desc: str):
    """A tqdm bar on stderr when it is a terminal, unless `progress` is False or a callback."""
    if progress is False or callable(progress) or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="rows", desc=desc)


def _progress(actors) -> int:
    """Rows the running publishers have published so far."""
    total = 0
    for ref in [a.progress.remote() for a in actors]:
        try:
            total += ray.get(ref, timeout=5)
        except Exception:  # gone or busy: counted when its result comes
            pass
    return total
