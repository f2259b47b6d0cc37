"""Repair without loss (issue 40 item 6): the main job (`make demo`) on the harness's cluster, no
loss injected, and the NAKs its members sent per LAN scope (to agents and to senders) against a
target of at most TARGET_PER_LAN. Each LAN's NAKs are broken down by what they asked for and on
what evidence (see `scopecast.ray_cluster.demo.NAK_KINDS`), so a missed target says which path
asked."""

from __future__ import annotations

import io
import time

TARGET_PER_LAN = 10


def run(rows: int | None, timeout: float = 600.0) -> dict:
    """Run the demo (all its flights when `rows` is None) on the cluster this process is
    attached to; a dict for the JSON."""
    from scopecast.ray_cluster import demo
    from scopecast.ray_cluster.spark import init_spark, stop_spark

    spark = init_spark("scopecast-bench-demo", executor_memory="2G",
                       configs={"spark.ui.showConsoleProgress": "false"})
    out = io.StringIO()
    began = time.monotonic()
    try:
        result = demo.run(out=out, plot="", rows=rows, spark=spark, timeout=timeout)
    finally:
        stop_spark()
    met = result.ok and all(c["naks"] <= TARGET_PER_LAN for c in result.lans.values())
    for lan, c in result.lans.items():
        print(f"[demo] {lan}: {c['naks']:,} NAKs without loss (target <= {TARGET_PER_LAN})",
              flush=True)
    return {"rows": result.rows, "ok": result.ok, "lans": result.lans,
            "seconds": round(time.monotonic() - began, 1), "target_per_lan": TARGET_PER_LAN,
            "met": met, "output": out.getvalue()}


def table(result: dict) -> str:
    """The suite as a markdown table."""
    if not result:
        return ""
    from scopecast.ray_cluster.demo import NAK_KINDS

    lines = [f"\nRepair without loss (`make demo`'s job, {result['rows']:,} flights, no loss "
             f"injected; target <= {result['target_per_lan']} NAKs per LAN: "
             f"{'met' if result['met'] else 'missed'}"
             + ("" if result["ok"] else "; ROWS MISSING") + "):\n",
             "| LAN | NAKs | repair datagrams in | asked for, and on what evidence |",
             "|---|---:|---:|---|"]
    for lan, c in result["lans"].items():
        kinds = ", ".join(f"{k.removeprefix('nak_')} {c[k]:,}" for k in NAK_KINDS if c.get(k))
        lines.append(f"| {lan} | {c['naks']:,} | {c['repair_datagrams_in']:,} | {kinds or '-'} |")
    return "\n".join(lines) + "\n"
