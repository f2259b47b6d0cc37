"""`TopicCollector` / `collect_topic` / `to_dataset`: what subscriber actors received of a
`publish_dataframe` run, back as a Spark DataFrame or a Ray Dataset with the schema recorded on the
topic (a public facade over private collector actors, each a scopecast member of its own).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import zlib
from typing import TYPE_CHECKING

import ray

from scopecast.actors.errors import (
    CollectIncomplete,
    FlushTimeout,
    InvalidConfig,
    TopicNotFound,
)
from scopecast.extras import require
from scopecast.netio.topic_names import check_topic_name, is_pattern, topic_matcher
from scopecast.ray_cluster.dataframe_codec import (
    MAX_PARALLELISM,
    arrow_schema,
    cast_table,
    decode_payloads,
    end_message,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from ray.data import Dataset

    from scopecast.ray_cluster.cluster import Cluster

log = logging.getLogger(__name__)



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
        end = end_message(m)
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
                parts.append(decode_payloads(s.payloads, s.ctypes, schema))
        if schema is None:
            return None
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def close(self) -> None:
        self._closed = True
        try:
            self._sub.close()
        finally:
            self._cluster.shutdown()


class TopicCollector:
    """Collects one `publish_dataframe` run from topics (names and/or patterns such as "flights/*")
    into a Spark DataFrame or a Ray Dataset with the schema recorded on the topics.

    Start it *before* publishing: its `parallelism` subscriber actors are members of the topics
    when the constructor returns, so they get every message (the publishers' flush also waits for
    them). Topic names must exist; patterns also cover topics created later (publish_dataframe's
    routed topics). With parallelism > 1, each topic is owned by one actor (by a hash of its name):
    a name is subscribed by its owner only, a pattern by every actor (each keeping its topics).

    `scope` is the subscriber actors' parent scope path (default: their host's scope); `lan` places
    them on the hosts of one LAN (Ray nodes labelled `scopecast-lan=<lan>`, as `scopecast cluster
    local` labels them), in their hosts' scopes.

    A collector collects the first run whose end it sees, on the topics whose recorded schema names
    that run; messages of other publishers are left out. The run is complete when every topic of
    the run has an end message from each of the run's publishers and every message before it.
    """

    def __init__(self, topics: str | list[str], *, parallelism: int = 1, scope: str | None = None,
                 lan: str | None = None, cluster: Cluster | None = None,
                 timeout: float = 60.0) -> None:
        from scopecast.ray_cluster.cluster import connect

        require("data", "TopicCollector")
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            raise InvalidConfig("a TopicCollector needs at least one topic or pattern")
        for n in names:
            topic_matcher(n) if is_pattern(n) else check_topic_name(n)
        if not isinstance(parallelism, int) or not 1 <= parallelism <= MAX_PARALLELISM:
            raise InvalidConfig(f"parallelism must be an integer from 1 to {MAX_PARALLELISM}")
        self._cluster = cluster or connect(start=False)
        self.names = names
        self._exact = {n for n in names if not is_pattern(n)}
        known = self._cluster.topics(names)
        missing = sorted(self._exact - {t.name for t in known})
        if missing:
            raise TopicNotFound(missing[0])
        # a topic whose schema already names the run collected is joined mid-run (see wait())
        self._runs_at_start = {t.name: (t.schema or {}).get("run") for t in known}
        self._run: str | None = None
        self._summary: dict | None = None
        self._tables: list | None = None
        placement = _on_lan(lan) if lan is not None else "SPREAD"
        tag = uuid.uuid4().hex[:12]
        remote = ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(_TopicCollectorActor)
        self._actors = []
        for i in range(parallelism):
            mine = [n for n in self._exact if parallelism == 1
                    or zlib.crc32(n.encode()) % parallelism == i]
            subscribed = sorted(mine) + [n for n in names if is_pattern(n)]
            if subscribed:
                self._actors.append(remote.options(scheduling_strategy=placement).remote(
                    subscribed, i, parallelism, f"collector-{tag}-c{i}", scope))
        try:
            ray.get([a.ready.remote() for a in self._actors], timeout=timeout)
        except BaseException:
            self.close()
            raise

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
        pause = 0.005  # the run is often complete a moment after the publishers return
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
            time.sleep(pause)
            pause = min(0.1, pause * 2)

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
        # (only the topics it collects: every poll listing a cluster of 10,000 topics took
        # 0.1-0.2 s, which the run then waited for)
        infos = {t.name: t for t in self._cluster.topics(self.names)
                 if (t.schema or {}).get("run") == run}
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
    # an empty batch would end the stream for Spark's reader: the rows after it were lost
    batches = [b for b in table.to_batches(max_chunksize=10_000) if b.num_rows]
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
    require("spark", "collect_topic")
    collector = topic if isinstance(topic, TopicCollector) else TopicCollector(topic)
    try:
        return collector.to_spark(spark, timeout)
    finally:
        collector.close()


def to_dataset(topic: str | list[str] | TopicCollector, *, timeout: float = 60.0) -> Dataset:
    """The rows of a run as a Ray Dataset: a TopicCollector's, once the run is complete (the
    collector is closed afterwards); given topic names or patterns, `read_topic`'s streaming
    Dataset of the next run (the one Ray Data reading API; call it before publishing)."""
    if not isinstance(topic, TopicCollector):
        from scopecast.ray_cluster.dataset_read import read_topic

        return read_topic(topic, timeout=timeout)
    try:
        return topic.to_dataset(timeout)
    finally:
        topic.close()


def alive_lans() -> list[str]:
    """The LANs the cluster's alive Ray nodes are labelled with (none on one machine)."""
    from scopecast.scopes.cluster_manager import LAN_LABEL

    return sorted({(n.get("Labels") or {}).get(LAN_LABEL) for n in ray.nodes() if n["Alive"]}
                  - {None})


def _on_lan(lan: str):
    """Ray's scheduling strategy for the hosts of LAN `lan` (InvalidConfig if none is alive)."""
    from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

    from scopecast.scopes.cluster_manager import LAN_LABEL

    if lan not in alive_lans():
        raise InvalidConfig(f"no alive Ray node is labelled {LAN_LABEL}={lan}")
    return NodeLabelSchedulingStrategy(hard={LAN_LABEL: In(lan)})
