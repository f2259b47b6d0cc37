"""The Spark pipeline suite: rows/s from a Spark DataFrame through `publish_dataframe` to a subscriber
actor, at parallelism 1 and 2, beside the conversion ceiling measured in the same run — the same
DataFrame through `ray.data.from_spark` (materialisation included) and iterated without publishing.

Rows are about 1 KB (an id and a 1000-character string). A pipeline case's time runs from the call to
`publish_dataframe` (conversion included, as in the ceiling) until the subscriber has every row and
every publisher's end message; its rate is rows / that time, and its ratio is that rate over the
ceiling's (target: >= 0.5). Every case runs ROUNDS times, interleaved, and its fastest run counts:
`from_spark` alone varies by 2-4x from one call to the next here (its Spark jobs, Ray Data's warm-up),
and one sample per case would compare that noise.
"""

from __future__ import annotations

import time

import ray

ROW_CHARS = 1000
TARGET_RATIO = 0.5
PARALLELISMS = (1, 2)
ROUNDS = 2


def _dataframe(spark, rows: int):
    from pyspark.sql import functions as F

    df = spark.range(rows).select(
        F.col("id"), F.expr(f"repeat(substr(md5(cast(id as string)), 1, 10), {ROW_CHARS // 10})")
        .alias("text"))
    return df.cache()


def _ceiling(df, rows: int) -> dict:
    start = time.monotonic()
    ds = ray.data.from_spark(df)
    seen = sum(b.num_rows for b in ds.iter_batches(batch_format="pyarrow", batch_size=4096))
    seconds = time.monotonic() - start
    if seen != rows:
        raise RuntimeError(f"conversion ceiling: {seen} rows came back of {rows}")
    return {"case": "ceiling: from_spark + iterate", "rows": rows, "seconds": seconds,
            "rows_per_s": rows / seconds}


def _pipeline(cluster, df, rows: int, topic: str, parallelism: int, timeout: float) -> dict:
    from scopecast.ray_cluster.consumers import TopicConsumer
    from scopecast.ray_cluster.dataframes import publish_dataframe

    cluster.create_topic(topic)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(topic)
    try:
        ray.get(consumer.ready.remote(), timeout=timeout)
        expect = rows + parallelism  # and one end message per publisher
        pending = consumer.consume.remote(expect, timeout, None, False)
        start = time.monotonic()
        report = publish_dataframe(df, topic, parallelism=parallelism, progress=False,
                                   cluster=cluster, flush_timeout=timeout)
        got = ray.get(pending, timeout=timeout)
        seconds = time.monotonic() - start
    finally:
        ray.get(consumer.close.remote(), timeout=timeout)
        ray.kill(consumer)
    complete = got["count"] == expect and got["gaps"] == 0 and got["out_of_order"] == 0
    return {"case": f"pipeline: publish_dataframe parallelism {parallelism} -> 1 subscriber",
            "parallelism": parallelism, "rows": report.rows, "delivered": got["count"] - parallelism,
            "complete": complete, "seconds": seconds, "rows_per_s": rows / seconds,
            "publish_seconds": report.seconds, "bytes": report.bytes}


def run(cluster, stamp: str, rows: int, timeout: float = 600.0) -> dict:
    """Measure the ceiling and the pipeline cases on the harness's cluster; a dict for the JSON."""
    from scopecast.ray_cluster.spark import init_spark, stop_spark

    spark = init_spark("scopecast-bench", executor_memory="2G",
                       configs={"spark.ui.showConsoleProgress": "false"})
    try:
        df = _dataframe(spark, rows)
        df.count()  # cached before any case, so every case reads the same materialised rows
        runs: list[list[dict]] = [[] for _ in range(1 + len(PARALLELISMS))]
        for r in range(ROUNDS):
            runs[0].append(_ceiling(df, rows))
            for i, p in enumerate(PARALLELISMS, 1):
                runs[i].append(_pipeline(cluster, df, rows, f"bench/{stamp}/spark-p{p}-r{r}", p,
                                         timeout))
        best = [max(rs, key=lambda c: c["rows_per_s"]) for rs in runs]
        for case, rs in zip(best, runs, strict=True):
            case["runs_rows_per_s"] = [c["rows_per_s"] for c in rs]
        for case, rs in zip(best[1:], runs[1:], strict=True):
            case["complete"] = all(c["complete"] for c in rs)
        ceiling, pipelines = best[0], best[1:]
        cases = [ceiling]
        print(f"[spark] {ceiling['case']}: {ceiling['rows_per_s']:,.0f} rows/s", flush=True)
        for case in pipelines:
            case["ratio"] = case["rows_per_s"] / ceiling["rows_per_s"]
            cases.append(case)
            print(f"[spark] {case['case']}: {case['rows_per_s']:,.0f} rows/s "
                  f"({case['ratio']:.2f}x the ceiling){'' if case['complete'] else ', INCOMPLETE'}",
                  flush=True)
    finally:
        stop_spark()
    best = max(c["ratio"] for c in cases[1:])
    return {"rows": rows, "row_bytes": ROW_CHARS + 8, "cases": cases, "best_ratio": best,
            "target": f">= {TARGET_RATIO}x the ceiling",
            "met": best >= TARGET_RATIO and all(c["complete"] for c in cases[1:])}


def table(result: dict) -> str:
    """The suite as a markdown table."""
    if not result:
        return ""
    lines = [f"\nSpark pipeline suite ({result['rows']:,} rows of ~{result['row_bytes']} B; target "
             f"{result['target']}: {'met' if result['met'] else 'missed'}):\n",
             "| case | rows/s | vs ceiling | complete |", "|---|---:|---:|---|"]
    for c in result["cases"]:
        ratio = f"{c['ratio']:.2f}" if "ratio" in c else "1.00"
        complete = {True: "yes", False: "NO"}.get(c.get("complete"), "")
        lines.append(f"| {c['case']} | {c['rows_per_s']:,.0f} | {ratio} | {complete} |")
    return "\n".join(lines) + "\n"
