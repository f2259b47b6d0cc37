"""Spark DataFrames to topics and back: `publish_dataframe` streams a DataFrame's rows to topics
through publisher actors; `TopicCollector` / `collect_topic` / `to_dataset` turn what subscribers
received back into a Spark DataFrame or a Ray Dataset with the schema recorded on the topic.

A public facade over private Ray actors (`num_cpus=0`, like `consumers.TopicConsumer`): each
publisher and each collector is a Ray actor that is a scopecast member of its own.

Wire format. mode="rows": one msgpack map `{column: value}` per row, values in a msgpack-native
form that the recorded Spark schema turns back into the exact value: timestamps as integer
microseconds since the epoch (UTC), dates as days since the epoch, decimals as strings, binary as
msgpack bin, structs as maps, arrays as lists. mode="arrow": one Arrow IPC stream holding one
record batch per message, sliced to fit the maximum message size.

End of stream. Every publisher ends its stream on every topic of the run with one in-band *end
message*, a msgpack list `["scopecast.end", run, publisher, publishers, messages, rows, status]`,
then closes (flush until stable, then the runtime's own end-of-stream marker). The in-band
message is what collectors wait for: it is numbered, repaired and forwarded like any message, and
FIFO delivery puts it after everything the publisher sent before it. The runtime's marker is not
enough here: it is a single datagram, not repaired when lost, sent only along the publisher's own
channels and not forwarded (with the tree policy, subscribers below the first level never see it).
Other subscribers of these topics see the end messages too: lists, where rows are maps (rows mode)
or Arrow (arrow mode).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import ray

from scopecast.actors.errors import (
    CollectIncomplete,
    DataFrameRejected,
    FlushTimeout,
    InvalidConfig,
    MessageTooLarge,
    ScopecastError,
    SparkUnavailable,
    TopicNotFound,
    typed_cause,
)
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.wire import ContentType
from scopecast.scopes.cluster_manager import MAX_SCHEMA_BYTES
from scopecast.scopes.topics import MAX_TOPIC_NAME, check_topic_name, is_pattern, topic_matcher

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from ray.data import Dataset

    from scopecast.ray_cluster.cluster import Cluster

log = logging.getLogger(__name__)

MODES = ("rows", "arrow")
MAX_NESTING = 32            # levels of struct/array (msgpack-python packs at most 511)
MAX_ROUTED_TOPICS = 10_000  # distinct topic_column values
MAX_PARALLELISM = 256
NULL_PART = "__null__"      # the topic part of a null topic_column value
EMPTY_PART = "__empty__"    # ... and of an empty string
END_TAG = "scopecast.end"
ARROW_MESSAGE_BYTES = 1 << 20  # arrow mode aims at messages of this size (a single row may be larger)
ROWS_PER_BATCH = 4096
_PART_COLUMN = "__scopecast_publisher"
_VALID_PART = re.compile(r"[A-Za-z0-9_.\-]")


@dataclass
class PublishReport:
    """What `publish_dataframe` published: rows, messages (end messages not counted), payload bytes,
    wall-clock seconds, and rows per destination topic."""

    rows: int = 0
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    topics: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- Spark schema checks

_ATOMIC = {"boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary",
           "date", "timestamp", "timestamp_ntz", "void", "null"}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)\Z")
_CHARS = re.compile(r"(var)?char\(\d+\)\Z")


def check_schema(schema: dict, max_nesting: int = MAX_NESTING) -> None:
    """Refuse (DataFrameRejected) a Spark schema (`df.schema.jsonValue()`) that topics cannot carry:
    a map anywhere, nesting deeper than `max_nesting` levels of struct/array, types without an Arrow
    form (intervals, user-defined types), duplicate field names."""
    _check_type(schema, "", 0, max_nesting)


def _check_type(t: Any, path: str, depth: int, max_nesting: int) -> None:
    where = f"column {path!r}" if path else "the DataFrame"
    if isinstance(t, str):
        if t in _ATOMIC or _DECIMAL.match(t) or _CHARS.match(t):
            return
        raise DataFrameRejected(f"{where} has type {t!r}, which topics cannot carry; cast it "
                                "(e.g. to string or long) before publishing")
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "map":
        raise DataFrameRejected(f"{where} is a map ({_type_name(t)}): maps are not supported; turn it "
                                "into an array of structs first, e.g. with map_entries()")
    if kind not in ("struct", "array"):
        raise DataFrameRejected(f"{where} has type {_type_name(t)}, which topics cannot carry")
    if path and depth + 1 > max_nesting:
        top = re.split(r"[.\[]", path, maxsplit=1)[0]
        raise DataFrameRejected(f"column {top!r} nests structs/arrays deeper than {max_nesting} "
                                "levels; flatten it (or serialize it, e.g. with to_json()) before "
                                "publishing")
    inner = depth + 1 if path else depth
    if kind == "array":
        _check_type(t["elementType"], f"{path}[]" if path else "[]", inner, max_nesting)
        return
    names = [f["name"] for f in t["fields"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DataFrameRejected(f"{where} has duplicate field names {dupes}; rename them (rows are "
                                "maps keyed by name)")
    for f in t["fields"]:
        _check_type(f["type"], f"{path}.{f['name']}" if path else f["name"], inner, max_nesting)


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    kind = t.get("type")
    if kind == "map":
        return f"map<{_type_name(t['keyType'])},{_type_name(t['valueType'])}>"
    if kind == "array":
        return f"array<{_type_name(t['elementType'])}>"
    if kind == "struct":
        return "struct<" + ",".join(f"{f['name']}:{_type_name(f['type'])}" for f in t["fields"]) + ">"
    return str(kind)


def arrow_schema(spark_schema: dict) -> pa.Schema:
    """The Arrow schema of a Spark schema (as JSON), the way Spark converts it: timestamps in
    microseconds (with a UTC zone; timestamp_ntz without), decimals as decimal128."""
    import pyarrow as pa

    return pa.schema([pa.field(f["name"], _arrow_type(f["type"]), f.get("nullable", True))
                      for f in spark_schema["fields"]])


def _arrow_type(t: Any) -> pa.DataType:
    import pyarrow as pa

    if isinstance(t, str):
        simple = {"boolean": pa.bool_(), "byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(),
                  "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
                  "string": pa.string(), "binary": pa.binary(), "date": pa.date32(),
                  "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
                  "void": pa.null(), "null": pa.null()}
        if t in simple:
            return simple[t]
        m = _DECIMAL.match(t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        if _CHARS.match(t):
            return pa.string()
    elif t.get("type") == "array":
        return pa.list_(pa.field("element", _arrow_type(t["elementType"]), t.get("containsNull", True)))
    elif t.get("type") == "struct":
        return pa.struct([pa.field(f["name"], _arrow_type(f["type"]), f.get("nullable", True))
                          for f in t["fields"]])
    raise DataFrameRejected(f"type {_type_name(t)} has no Arrow form")


def wire_type(t: pa.DataType) -> pa.DataType:
    """The msgpack-native Arrow type rows mode sends a value of type `t` as (every field nullable):
    timestamp -> int64 microseconds, date -> int32 days, decimal -> string."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_decimal(t):
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(wire_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, wire_type(f.type)) for f in t])
    return t


def wire_schema(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(f.name, wire_type(f.type)) for f in schema])


def cast_array(arr: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Cast an Arrow array (or chunked array) to `target` field by field: unlike pyarrow's struct
    cast, the children of a null struct are masked first (they hold placeholders such as "" that a
    string -> decimal cast refuses)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([cast_array(c, target) for c in arr.chunks], type=target)
    if arr.type.equals(target):
        return arr
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(target):
        children = [cast_array(child, f.type) for child, f in zip(arr.flatten(), target, strict=True)]
        if not children:
            return pa.array([None if m else {} for m in mask.to_pylist()] if mask is not None
                            else [{}] * len(arr), type=target)
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) and pa.types.is_list(arr.type):
        values = cast_array(arr.values, target.value_type)
        return pa.ListArray.from_arrays(arr.offsets, values, type=target, mask=mask)
    return arr.cast(target)


def cast_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with the columns, types and field nullability of `schema` (same column names)."""
    import pyarrow as pa

    columns = [cast_array(table.column(f.name), f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def to_msgpack_rows(batch: pa.RecordBatch | pa.Table, wire: pa.Schema) -> list[dict]:
    """Rows of `batch` as dicts of msgpack-native values (see `wire_type`)."""
    import pyarrow as pa

    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    return table.cast(wire).to_pylist()


def from_msgpack_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """The rows `to_msgpack_rows` made, back as an Arrow table of `schema`."""
    import pyarrow as pa

    return cast_table(pa.Table.from_pylist(rows, schema=wire_schema(schema)), schema)


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
                      key_column: str | None = None, parallelism: int = 2, mode: str = "rows",
                      progress: bool | Callable[[int], None] | None = None,
                      cluster: Cluster | None = None, config: RuntimeConfig | None = None,
                      flush_timeout: float = 120.0) -> PublishReport:
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
    - `key_column`: all rows of one key go through one publisher (Spark's hash of the key modulo
      `parallelism`), so subscribers get a key's rows in the DataFrame's order. Each publisher then
      reads every block and keeps its keys: the whole DataFrame is read `parallelism` times.
    - `progress`: a tqdm bar over rows when stderr is a terminal (False: never); a callable gets
      the number of rows published so far, about four times a second.
    - `config`: the publishers' RuntimeConfig (its max_message_bytes bounds a message).

    Before anything is created or published the schema is checked (DataFrameRejected for a map
    anywhere, nesting deeper than 32 struct/array levels, intervals and user-defined types,
    duplicate names) and the DataFrame is converted; then the topics are created and the schema
    recorded on each (`TopicInfo.schema`: Spark schema JSON, mode, publishers, topic_column,
    key_column, run id).

    A row larger than the maximum message size (say a binary value of 20 MB) is found while
    publishing: that publisher stops before the row, the others stop after their current batch,
    every publisher still ends its streams (status "aborted"), and DataFrameRejected names the
    column and the row's size; its `report` attribute holds what was published. Subscribers get
    every message published before the abort exactly once, in order, and collectors end.

    A Spark executor that dies while the DataFrame is converted (Spark computes and caches the
    partitions, then Ray tasks fetch them from the executors: `ray.data.from_spark` returns only
    once every block is in Ray's object store) makes the conversion fail: SparkUnavailable, raised
    before any topic is created or anything published, and Spark on Ray may need a restart
    (stop_spark() / init_spark()). Once converted, the executors are no longer needed: one that
    dies while the blocks are published changes nothing. (RayDP retries a failed fetch without
    end; an executor lost during the short fetch phase may leave the conversion waiting.)
    """
    from scopecast.ray_cluster.cluster import connect

    started = time.monotonic()
    if mode not in MODES:
        raise InvalidConfig(f"unknown mode {mode!r}: {' or '.join(MODES)}")
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
        raise DataFrameRejected(f"key_column {key_column!r} is a {_type_name(columns[key_column])}; "
                                "use an atomic column")
    max_bytes = (config or RuntimeConfig()).max_message_bytes

    routes: dict[Any, str] = {}
    if topic_column is not None:
        if columns[topic_column] not in ("string", "byte", "short", "integer", "long", "boolean") \
                and not _CHARS.match(str(columns[topic_column])):
            raise DataFrameRejected(f"topic_column {topic_column!r} is a {_type_name(columns[topic_column])}"
                                    "; use a string, integer or boolean column")
        values = _spark_job("finding the topic_column values", lambda: [
            r[0] for r in df.select(topic_column).distinct().limit(MAX_ROUTED_TOPICS + 1).collect()])
        if len(values) > MAX_ROUTED_TOPICS:
            raise DataFrameRejected(f"topic_column {topic_column!r} has more than {MAX_ROUTED_TOPICS} "
                                    "distinct values; route on a coarser column")
        routes = routed_topics(topic, values)
    destinations = sorted(set(routes.values())) if topic_column is not None else [topic]
    run_topics = sorted({topic, *destinations})

    run = uuid.uuid4().hex[:16]
    schema = {"spark": df.schema.json(), "mode": mode, "publishers": parallelism,
              "topic_column": topic_column, "key_column": key_column, "run": run}
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise DataFrameRejected(f"the DataFrame's schema takes {size} bytes as JSON, more than a topic "
                                f"records ({MAX_SCHEMA_BYTES}); publish fewer columns")

    source = df
    part = None
    if key_column is not None and parallelism > 1:
        from pyspark.sql import functions as F

        part = _PART_COLUMN
        while part in columns:
            part += "_"
        source = df.withColumn(part, F.pmod(F.hash(F.col(key_column)), F.lit(parallelism)))
    refs, total = _convert(source)
    try:
        for name in destinations:
            if name != topic:
                cluster.create_topic(name, policy=base.policy, recovery=base.recovery, root=base.root,
                                     options=base.options, history=base.history)
        for name in run_topics:
            cluster.set_topic_schema(name, schema)
        plan = _Plan(run=run, mode=mode, publishers=parallelism, topics=run_topics, base=topic,
                     topic_column=topic_column, routes=routes, part_column=part,
                     max_message_bytes=max_bytes, flush_timeout=flush_timeout,
                     spark_schema=spark_schema)
        if part is not None:
            shares = [refs] * parallelism  # every publisher reads every block and keeps its keys
        else:
            shares = [refs[i::parallelism] for i in range(parallelism)]
        report = _run_publishers(plan, shares, total, progress, config)
    finally:
        _release(source)
    report.seconds = time.monotonic() - started
    log.info("published %d rows of a DataFrame to %d topic(s) in %d messages (%.1f s, run %s)",
             report.rows, len(report.topics), report.messages, report.seconds, run)
    return report


def _convert(df) -> tuple[list, int]:
    """Block references of the DataFrame in Ray's object store, and the row count."""
    def convert():
        ds = ray.data.from_spark(df)
        return ds.to_arrow_refs(), ds.count()

    return _spark_job("converting the DataFrame to Ray blocks", convert)


def _spark_job(what: str, job: Callable[[], Any]) -> Any:
    """Run a Spark job for publish_dataframe (before anything is created or published); its failure
    (typically a lost executor) as SparkUnavailable."""
    try:
        return job()
    except ScopecastError:
        raise
    except Exception as exc:
        java = getattr(exc, "java_exception", None)  # py4j's error: the JVM's exception says more
        text = str(java) if java is not None else str(exc)
        first = text.strip().splitlines()[0] if text.strip() else ""
        raise SparkUnavailable(f"{what} failed ({type(exc).__name__}: {first[:300]}); nothing was "
                               "published. If a Spark executor was lost, restart Spark (stop_spark(), "
                               "init_spark()) and publish again") from exc


def _release(df) -> None:
    """Unpin what `from_spark` cached in Spark to rebuild lost blocks (they are published now)."""
    try:
        from raydp.spark.dataset import release_spark_recoverable

        release_spark_recoverable(df)
    except Exception as exc:  # another RayDP, or Spark gone (its cache went with it)
        log.debug("releasing the converted DataFrame: %s", exc)


@dataclass
class _Plan:
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


def _run_publishers(plan: _Plan, shares: list[list], total: int, progress, config) -> PublishReport:
    remote = ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(_DataFramePublisher)
    actors = [remote.options(scheduling_strategy="SPREAD").remote(plan, i, config)
              for i in range(plan.publishers)]
    callback = progress if callable(progress) else None
    bar = None
    if progress is not False and callback is None and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, unit="rows", desc=f"publishing to {plan.base}")
    pending = {a.run.remote(share): a for a, share in zip(actors, shares, strict=True)}
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
        for a in actors:
            ray.kill(a, no_restart=True)
    report = PublishReport()
    counts: dict[str, int] = {}
    for out in results.values():
        report.rows += out["rows"]
        report.messages += out["messages"]
        report.bytes += out["bytes"]
        for name, n in out["topics"].items():
            counts[name] = counts.get(name, 0) + n
    destinations = [t for t in plan.topics if t != plan.base] if plan.topic_column else [plan.base]
    report.topics = {t: counts.get(t, 0) for t in destinations}
    if error is not None:
        if isinstance(error, ScopecastError):
            error.report = report  # what was published before the run stopped
        raise error
    return report


def _progress(actors) -> int:
    """Rows the running publishers have published so far."""
    total = 0
    for ref in [a.progress.remote() for a in actors]:
        try:
            total += ray.get(ref, timeout=5)
        except Exception:  # gone or busy: counted when its result comes
            pass
    return total


class _DataFramePublisher:
    """One publisher of a `publish_dataframe` run: a scopecast member that publishes its share of
    the blocks to the run's topics and ends every one of them (a private Ray actor)."""

    def __init__(self, plan: _Plan, index: int, config: RuntimeConfig | None) -> None:
        import scopecast

        self._plan = plan
        self._index = index
        self._stop: str | None = None
        self._rows = 0
        self._cluster = scopecast.connect(config=config, name=f"dataframe-{plan.run}-p{index}")
        self._pubs = {}
        try:
            for name in plan.topics:
                self._pubs[name] = self._cluster.publisher(name)
        except BaseException:
            self._cluster.shutdown()
            raise
        self._messages = dict.fromkeys(plan.topics, 0)
        self._topic_rows = dict.fromkeys(plan.topics, 0)
        self._bytes = 0
        self._wire = wire_schema(arrow_schema(plan.spark_schema)) if plan.mode == "rows" else None

    def progress(self) -> int:
        return self._rows

    def stop(self, reason: str) -> None:
        self._stop = reason

    def run(self, refs: list) -> dict:
        """Publish the blocks `refs` (in order), then end every topic of the run."""
        error: BaseException | None = None
        try:
            for ref in refs:
                if self._stop is not None:
                    break
                self._publish_block(ray.get(ref))
        except BaseException as exc:
            error = exc
        if error is not None:
            status = f"aborted: {error}"
        elif self._stop is not None:
            status = f"aborted: {self._stop}"
        else:
            status = "ok"
        try:
            self._end(status)
        except BaseException as exc:
            error = error or exc
        finally:
            self._cluster.shutdown()
        counts = self._counts()
        if error is not None:
            if isinstance(error, ScopecastError):
                error.counts = counts  # travels with the error to the driver
            raise error
        return counts

    def _counts(self) -> dict:
        plan = self._plan
        return {"publisher": self._index, "rows": self._rows, "messages": sum(self._messages.values()),
                "bytes": self._bytes, "topics": {t: n for t, n in self._topic_rows.items()
                                                 if t != plan.base or not plan.topic_column}}

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

    def _route(self, batch) -> list[str]:
        plan = self._plan
        if plan.topic_column is None:
            return [plan.base] * batch.num_rows
        routes = plan.routes
        return [routes[v] for v in batch.column(plan.topic_column).to_pylist()]

    def _publish_rows(self, batch, wire) -> None:
        packb = msgpack.packb
        pubs = self._pubs
        names = self._route(batch)
        for name, row in zip(names, to_msgpack_rows(batch, wire), strict=True):
            size = len(packb(row, use_bin_type=True))
            if size > self._plan.max_message_bytes:
                raise _too_large(row, size, self._plan.max_message_bytes, self._rows)
            pubs[name].publish(row)
            self._bytes += size
            self._messages[name] += 1
            self._topic_rows[name] += 1
            self._rows += 1

    def _groups(self, batch):
        """(topic, rows of the batch routed to it), rows in their order."""
        plan = self._plan
        if plan.topic_column is None:
            yield plan.base, batch
            return
        import numpy as np
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(batch.column(plan.topic_column), null_encoding="encode")
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        values = encoded.dictionary.to_pylist()
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        ends = np.r_[starts[1:], len(ordered)]
        for s, e in zip(starts, ends, strict=True):
            yield plan.routes[values[ordered[s]]], batch.take(order[s:e])

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
        for pub in self._pubs.values():
            try:
                pub.close(plan.flush_timeout)
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
        f"{sizes.get(column, 0)} bytes of it; split or shrink that column (or raise "
        f"RuntimeConfig.max_message_bytes). This publisher had published {before} rows; the run "
        "stopped and every publisher ended its streams")


# -------------------------------------------------------------------------------- collecting


class _Stream:
    """What a collector got from one publisher on one topic."""

    __slots__ = ("payloads", "ctypes", "last", "first", "gaps", "dups", "end", "after_end")

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.ctypes: list[int] = []
        self.last: dict[int, int] = {}   # session -> last seq
        self.first: int | None = None
        self.gaps = 0
        self.dups = 0
        self.end: list | None = None
        self.after_end = 0


def _end_message(msg) -> list | None:
    """The decoded end message, if `msg` is one."""
    payload = msg.payload
    if msg.content_type != ContentType.MSGPACK or not payload or (payload[0] & 0xF0) != 0x90:
        return None
    try:
        value = msgpack.unpackb(payload, raw=False)
    except Exception:
        return None
    if isinstance(value, list) and len(value) == 7 and value[0] == END_TAG:
        return value
    return None


class _TopicCollectorActor:
    """A subscriber actor that keeps every message of the topics it owns (a private Ray actor)."""

    def __init__(self, names: list[str], index: int, count: int, name: str,
                 scope: str | None) -> None:
        import scopecast

        self._index = index
        self._count = count
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._ends: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._messages = 0
        self._cluster = scopecast.connect(name=name)
        self._sub = self._cluster.subscriber(names, scope=scope)
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="scopecast-collector", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        return True

    def _owns(self, topic: str) -> bool:
        return self._count == 1 or zlib.crc32(topic.encode()) % self._count == self._index

    def _drain(self) -> None:
        sub = self._sub
        while not self._closed:
            try:
                batch = sub.receive_batch(0.2)
            except Exception:
                if self._closed:
                    return
                log.exception("collector receive failed")
                time.sleep(0.2)
                continue
            if not batch:
                continue
            with self._lock:
                for m in batch:
                    if self._owns(m.topic):
                        self._take(m)

    def _take(self, m) -> None:
        self._messages += 1
        s = self._streams.get((m.topic, m.source))
        if s is None:
            s = self._streams[(m.topic, m.source)] = _Stream()
        if s.end is not None:
            s.after_end += 1
            return
        prev = s.last.get(m.session)
        if prev is not None and m.seq <= prev:
            s.dups += 1
            return
        if prev is not None and m.seq > prev + 1:
            s.gaps += m.seq - prev - 1
        if s.first is None:
            s.first = m.seq
        s.last[m.session] = m.seq
        end = _end_message(m)
        if end is not None:
            s.end = end
            self._ends.append((time.time(), m.topic, m.source))
            return
        s.payloads.append(m.payload)
        s.ctypes.append(m.content_type)

    def state(self) -> dict:
        """Per stream: (topic, source, received, first seq, gaps, duplicates, end message)."""
        with self._lock:
            streams = [{"topic": t, "source": src, "received": len(s.payloads), "first": s.first,
                        "gaps": s.gaps, "dups": s.dups, "end": s.end, "after_end": s.after_end}
                       for (t, src), s in self._streams.items()]
            first_end = self._ends[0] if self._ends else None
            return {"streams": streams, "messages": self._messages, "first_end": first_end}

    def table(self, run: str, topics: dict[str, dict]):
        """The rows of run `run` on `topics` (topic -> recorded schema) as one Arrow table, in
        topic, publisher and sequence order."""
        import pyarrow as pa

        with self._lock:
            chosen = sorted(((t, s.end[2], s) for (t, _src), s in self._streams.items()
                             if t in topics and s.end is not None and s.end[1] == run),
                            key=lambda x: (x[0], x[1]))
            parts = []
            schema = None
            for name, _index, s in chosen:
                meta = topics[name]
                schema = arrow_schema(json.loads(meta["spark"]))
                parts.append(_decode(s.payloads, s.ctypes, schema))
        if schema is None:
            return None
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def close(self) -> None:
        self._closed = True
        try:
            self._sub.close()
        finally:
            self._cluster.shutdown()


def _decode(payloads: list[bytes], ctypes: list[int], schema: pa.Schema) -> pa.Table:
    import pyarrow as pa

    if not payloads:
        return schema.empty_table()
    if ctypes[0] == ContentType.ARROW:
        tables = [pa.ipc.open_stream(pa.BufferReader(p)).read_all() for p in payloads]
        return cast_table(pa.concat_tables(tables), schema)
    unpack = msgpack.unpackb
    rows = [unpack(p, raw=False) for p in payloads]
    return from_msgpack_rows(rows, schema)


class TopicCollector:
    """Collects one `publish_dataframe` run from topics (names and/or patterns such as "flights/*")
    into a Spark DataFrame or a Ray Dataset with the schema recorded on the topics.

    Start it *before* publishing: its `parallelism` subscriber actors are members of the topics
    when the constructor returns, so they get every message (the publishers' flush also waits for
    them). Topic names must exist; patterns also cover topics created later (publish_dataframe's
    routed topics). With parallelism > 1, each topic is owned by one actor (by a hash of its name):
    a name is subscribed by its owner only, a pattern by every actor (each keeping its topics).

    `scope` is the subscriber actors' parent scope path (default: their host's scope).

    A collector collects the first run whose end it sees, on the topics whose recorded schema names
    that run; messages of other publishers are left out. The run is complete when every topic of
    the run has an end message from each of the run's publishers and every message before it.
    """

    def __init__(self, topics: str | list[str], *, parallelism: int = 1, scope: str | None = None,
                 cluster: Cluster | None = None, timeout: float = 60.0) -> None:
        from scopecast.ray_cluster.cluster import connect

        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise InvalidConfig("a TopicCollector needs at least one topic or pattern")
        for n in names:
            topic_matcher(n) if is_pattern(n) else check_topic_name(n)
        if not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_PARALLELISM:
            raise InvalidConfig(f"parallelism must be an integer from 1 to {MAX_PARALLELISM}")
        self._cluster = cluster or connect(start=False)
        self.names = names
        self._patterns = [topic_matcher(n) for n in names if is_pattern(n)]
        self._exact = {n for n in names if not is_pattern(n)}
        known = self._cluster.topics()
        missing = sorted(self._exact - {t.name for t in known})
        if missing:
            raise TopicNotFound(missing[0])
        # a topic whose schema already names the run collected is joined mid-run (see wait())
        self._runs_at_start = {t.name: (t.schema or {}).get("run") for t in known}
        self._run: str | None = None
        self._summary: dict | None = None
        self._tables: list | None = None
        tag = uuid.uuid4().hex[:12]
        remote = ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(_TopicCollectorActor)
        self._actors = []
        for i in range(parallelism):
            mine = [n for n in self._exact if parallelism == 1
                    or zlib.crc32(n.encode()) % parallelism == i]
            subscribed = sorted(mine) + [n for n in names if is_pattern(n)]
            if subscribed:
                self._actors.append(remote.options(scheduling_strategy="SPREAD").remote(
                    subscribed, i, parallelism, f"collector-{tag}-c{i}", scope))
        try:
            ray.get([a.ready.remote() for a in self._actors], timeout=timeout)
        except BaseException:
            self.close()
            raise

    def _covers(self, name: str) -> bool:
        return name in self._exact or any(p.match(name) for p in self._patterns)

    def status(self) -> dict:
        """Everything received so far: total messages, and per stream (topic, source): messages
        received, first seq, gaps, duplicates and the end message if seen."""
        states = ray.get([a.state.remote() for a in self._actors])
        streams = [s for st in states for s in st["streams"]]
        firsts = [st["first_end"] for st in states if st["first_end"] is not None]
        return {"messages": sum(st["messages"] for st in states), "streams": streams,
                "first_end": min(firsts) if firsts else None}

    def wait(self, timeout: float = 60.0) -> dict:
        """Wait until the run is complete; returns a summary (run, topics with their publishers,
        messages and rows, aborted publishers). FlushTimeout names what did not end in time;
        CollectIncomplete is raised when an end message came but messages before it are missing
        (a topic without recovery)."""
        if self._summary is not None:
            return self._summary
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            verdict = self._verdict(status)
            if verdict["complete"]:
                self._summary = verdict
                for name, why in verdict["aborted"].items():
                    log.warning("collected %s: %s", name, why)
                return verdict
            if time.monotonic() >= deadline:
                raise FlushTimeout(f"the DataFrame run on {self.names} did not end within {timeout}s: "
                                   f"{verdict['missing']}")
            time.sleep(0.1)

    def _verdict(self, status: dict) -> dict:
        streams = status["streams"]
        if self._run is None:
            first = status["first_end"]
            if first is None:
                return {"complete": False, "aborted": {},
                        "missing": f"no publisher has ended yet ({status['messages']} messages "
                                   "received)"}
            _, topic, source = first
            self._run = next(s["end"][1] for s in streams
                             if s["topic"] == topic and s["source"] == source)
        run = self._run
        infos = {t.name: t for t in self._cluster.topics()
                 if self._covers(t.name) and (t.schema or {}).get("run") == run}
        by_topic: dict[str, dict[int, dict]] = {name: {} for name in infos}
        for s in streams:
            end = s["end"]
            if end is not None and end[1] == run and s["topic"] in by_topic:
                by_topic[s["topic"]][end[2]] = s
        missing = []
        aborted = {}
        topics = {}
        for name, info in sorted(infos.items()):
            publishers = int(info.schema.get("publishers", 1))
            late = self._runs_at_start.get(name) == run
            rows = messages = 0
            for i in range(publishers):
                s = by_topic[name].get(i)
                if s is None:
                    missing.append(f"{name!r}: publisher {i} of {publishers} has not ended")
                    continue
                expected = s["end"][4]
                if s["gaps"] or (s["received"] != expected and not late):
                    raise CollectIncomplete(
                        f"{name!r}: publisher {i} ({s['source']}) ended after {expected} messages "
                        f"but {s['received']} arrived (gaps {s['gaps']}); the topic's recovery "
                        f"({info.recovery}) did not repair them")
                if s["end"][6] != "ok":
                    aborted[f"{name} publisher {i}"] = s["end"][6]
                messages += s["received"]
                rows += s["end"][5]
            topics[name] = {"publishers": publishers, "messages": messages, "rows": rows,
                            "schema": info.schema}
        return {"complete": not missing and bool(infos), "run": run, "topics": topics,
                "aborted": aborted, "missing": "; ".join(missing[:20]) or "no topic records the run"}

    @property
    def aborted(self) -> dict[str, str]:
        """Publishers of the collected run that ended with an error (after wait())."""
        return dict(self._summary["aborted"]) if self._summary else {}

    def _table_refs(self, timeout: float) -> tuple[list, dict]:
        summary = self.wait(timeout)
        if self._tables is None:
            meta = {name: t["schema"] for name, t in summary["topics"].items()}
            refs = [a.table.remote(summary["run"], meta) for a in self._actors]
            self._tables = [r for r, t in zip(refs, ray.get(refs), strict=True) if t is not None]
        first = next(iter(summary["topics"].values()))["schema"]
        return self._tables, first

    def to_arrow(self, timeout: float = 60.0) -> pa.Table:
        """The run's rows as one Arrow table (in the driver)."""
        import pyarrow as pa

        refs, schema = self._table_refs(timeout)
        tables = ray.get(refs)
        if not tables:
            return arrow_schema(json.loads(schema["spark"])).empty_table()
        return pa.concat_tables(tables)

    def to_spark(self, spark: SparkSession, timeout: float = 60.0) -> DataFrame:
        """The run's rows as a Spark DataFrame with the recorded schema."""
        from pyspark.sql.types import StructType

        _, schema = self._table_refs(timeout)
        spark_schema = StructType.fromJson(json.loads(schema["spark"]))
        return arrow_to_spark(spark, self.to_arrow(timeout), spark_schema)

    def to_dataset(self, timeout: float = 60.0) -> Dataset:
        """The run's rows as a Ray Dataset (blocks stay in the object store)."""
        refs, schema = self._table_refs(timeout)
        if not refs:
            return ray.data.from_arrow(arrow_schema(json.loads(schema["spark"])).empty_table())
        return ray.data.from_arrow_refs(refs)

    def close(self) -> None:
        """Stop the subscriber actors."""
        actors, self._actors = self._actors, []
        if actors:
            try:
                ray.get([a.close.remote() for a in actors], timeout=30)
            except Exception as exc:
                log.debug("closing collectors: %s", exc)
        for a in actors:
            ray.kill(a, no_restart=True)

    def __enter__(self) -> TopicCollector:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def arrow_to_spark(spark: SparkSession, table: pa.Table, schema) -> DataFrame:
    """A Spark DataFrame of `schema` (a StructType) holding `table` (whose Arrow types are Spark's:
    see `arrow_schema`), handed to the JVM as Arrow batches the way pyspark's createDataFrame does
    from pandas, without pandas (which turns nullable integers into floats and NaN into null)."""
    import pyarrow as pa
    from pyspark.sql import DataFrame as SparkDataFrame

    table = cast_table(table, arrow_schema(schema.jsonValue()))
    batches = table.to_batches(max_chunksize=10_000)
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    try:
        from pyspark.sql.pandas.serializers import ArrowStreamSerializer

        jvm = spark._jvm
        jiter = spark.sparkContext._serialize_to_jvm(
            batches, ArrowStreamSerializer(), lambda path: jvm.PythonSQLUtils.readArrowStreamFromFile(path),
            lambda: jvm.ArrowIteratorServer())
        jdf = jvm.PythonSQLUtils.toDataFrame(jiter, schema.json(), spark._jsparkSession)
    except (ImportError, AttributeError, TypeError) as exc:  # another pyspark: the slow, exact way
        log.debug("Arrow hand-over to Spark unavailable (%s); creating the DataFrame from rows", exc)
        return spark.createDataFrame(table.to_pylist(), schema=schema)
    return SparkDataFrame(jdf, spark)


def collect_topic(spark: SparkSession, topic: str | list[str] | TopicCollector, *,
                  timeout: float = 60.0) -> DataFrame:
    """The rows of a `publish_dataframe` run as a Spark DataFrame with the schema recorded on the
    topic, once every publisher has ended (FlushTimeout after `timeout` seconds).

    Pass the TopicCollector started before publish_dataframe (the normal use). Given a topic name
    or pattern, a collector is started now and sees only what is published from now on: a run
    already under way is collected from this point (its earlier rows are missing), one already
    ended is never seen (FlushTimeout). The collector is closed afterwards."""
    collector = topic if isinstance(topic, TopicCollector) else TopicCollector(topic)
    try:
        return collector.to_spark(spark, timeout)
    finally:
        collector.close()


def to_dataset(topic: str | list[str] | TopicCollector, *, timeout: float = 60.0) -> Dataset:
    """Like `collect_topic`, as a Ray Dataset."""
    collector = topic if isinstance(topic, TopicCollector) else TopicCollector(topic)
    try:
        return collector.to_dataset(timeout)
    finally:
        collector.close()
