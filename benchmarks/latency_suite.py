"""The latency suite: send-to-delivery time at fixed offered rates, scopecast beside ZeroMQ and
NATS in one run.

Latency is the time from a message's `publish()` call (its sender stamps CLOCK_MONOTONIC into the
payload as it hands the message over) to the subscriber's `receive()` returning it, on one
machine's clock. A case is one system, one rate, one subscriber count, 1 KB messages: the sender
offers `rate` msgs/s in 1 ms steps (rate / 1000 messages back to back each millisecond, each
stamped at its own call: every system alike), long enough that each subscriber times at least
`messages` of them after `warmup` seconds. The case reports its *worst* subscriber's p50, p99 and
p99.9. Every case runs `repeats` times, interleaved (each repetition goes through every case
before the next begins: a shared machine's slow minute hits all systems, not one), and the row
reports the median of the repetitions.

Targets (reported, never asserted; the best peer is the lowest value among the peers that
delivered at least 99.9% to every subscriber in that case, having offered the case's rate: a
sender that publishes slower than `KEEP_RATE` of it, as NATS's Python client does at 20,000
msgs/s, measured another case):

- p50 at most max(1 ms, 1.5x the best peer's p50); p99 at most max(2 ms, 2x the best peer's p99);
- at `CPU_RATE` msgs/s to `CPU_SUBSCRIBERS` subscribers, CPU per delivered message of the
  publisher, the subscribers and scopecast's actors (scope managers, agent hosts, policy hosts) at
  most 2x ZeroMQ's publisher and subscribers; Ray's own processes are reported beside it.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from pathlib import Path

from benchmarks import peers
from benchmarks.cases import Case, Placement
from benchmarks.peer_suite import KEEP_UP, run_one
from benchmarks.report import num

SYSTEMS = ("scopecast", "zmq", "nats")
RATES = (1_000, 5_000, 20_000)
SUBSCRIBERS = (1, 4, 8)
REPEATS = 3
MESSAGES = 20_000
WARMUP = 1.0
SIZE = 1000
CPU_RATE, CPU_SUBSCRIBERS, CPU_RATIO = 5_000, 8, 2.0
KEEP_RATE = 0.95  # of the offered rate a sender must publish at for its case to count
P50_FLOOR_MS, P50_RATIO = 1.0, 1.5
P99_FLOOR_MS, P99_RATIO = 2.0, 2.0


def run(cluster, stamp: str, log_dir: Path, *, systems=SYSTEMS, rates=RATES,
        subscribers=SUBSCRIBERS, repeats: int = REPEATS, messages: int = MESSAGES,
        warmup: float = WARMUP, case_timeout: float = 300.0, policy: str = "lan_multicast",
        placement: Placement = Placement()) -> dict:
    """Every system at every rate and subscriber count, `repeats` times interleaved; returns the
    rows (median of the repetitions, each repetition kept), the targets, the peers skipped."""
    skipped = {s: why for s in systems if s in peers.PEERS and (why := peers.missing(s))}
    systems = [s for s in systems if s not in skipped]
    tries: dict[tuple, list[dict]] = {}
    with ExitStack() as stack:
        ports = {}
        for system in list(systems):
            try:
                ports[system] = stack.enter_context(peers.server(system, log_dir))
            except RuntimeError as exc:
                skipped[system] = str(exc)
                systems.remove(system)
        for rep in range(repeats):
            for n in subscribers:
                for rate in rates:
                    for system in systems:
                        seconds = warmup + messages / rate * 1.05 + 0.3
                        case = Case(system, SIZE, n, seconds, warmup, ready_timeout=120.0,
                                    timeout=case_timeout + seconds, rate=float(rate), latency=True)
                        result = run_one(cluster, stamp, log_dir, case, ports.get(system), policy,
                                         f"latency{rate}-{rep}", placement=placement)
                        tries.setdefault((system, rate, n), []).append(_summary(result))
    for system, why in skipped.items():
        print(f"[latency] {system} skipped: {why}", flush=True)
    rows = [_row(system, rate, n, got) for (system, rate, n), got in tries.items()]
    return {"rows": rows, "targets": targets(rows), "cpu_target": cpu_target(rows),
            "skipped": skipped, "repeats": repeats, "messages": messages, "warmup": warmup,
            "size": SIZE}


def _summary(result: dict) -> dict:
    """What a repetition keeps of its case: the worst subscriber's percentiles, what every
    subscriber got, CPU (case processes, scopecast's actors, Ray's own processes)."""
    out = {"error": result.get("error"), "delivered_share": result.get("delivered_share"),
           "published": result.get("published"), "publish_rate": result.get("publish_rate")}
    per_sub = [r.get("latency") or {} for r in result.get("receivers", ())]
    for q in ("p50_ms", "p99_ms", "p999_ms"):
        values = [x[q] for x in per_sub if x.get(q) is not None]
        out[q] = max(values) if values else None
    out["samples"] = min((x.get("count", 0) for x in per_sub), default=0)
    worst = max(per_sub, key=lambda x: x.get("p99_ms") or 0.0, default={})
    out["cdf_ms"] = worst.get("cdf_ms", [])
    out["cpu_us_per_msg"] = result.get("cpu_us_per_msg")
    cpu, background = result.get("cpu") or {}, result.get("background_cpu") or {}
    window = cpu.get("window") or [0.0, 0.0]
    msgs = cpu.get("window_msgs") or 0
    wall = background.get("wall_s") or 0.0
    share = (window[1] - window[0]) / wall if wall > 0 else 0.0  # of the case spent in the window
    out["actors_us_per_msg"] = (background.get("scopecast_cpu_s", 0.0) * share / msgs * 1e6
                                if msgs else None)
    out["ray_us_per_msg"] = (background.get("ray_cpu_s", 0.0) * share / msgs * 1e6
                             if msgs else None)
    return out


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _row(system: str, rate: int, n: int, got: list[dict]) -> dict:
    ok = [g for g in got if not g["error"]]
    row = {"system": system, "rate": rate, "subscribers": n, "size": SIZE, "tries": got,
           "failed": len(got) - len(ok)}
    for key in ("p50_ms", "p99_ms", "p999_ms", "cpu_us_per_msg", "actors_us_per_msg",
                "ray_us_per_msg"):
        row[key] = _median(g[key] for g in ok)
    row["delivered_share"] = min((g["delivered_share"] or 0.0 for g in ok), default=None)
    row["publish_rate"] = _median(g["publish_rate"] for g in ok)
    row["kept_rate"] = (row["publish_rate"] or 0.0) >= KEEP_RATE * rate
    row["samples"] = min((g["samples"] for g in ok), default=0)
    return row


def targets(rows: list[dict]) -> list[dict]:
    """scopecast's p50 and p99 against the best peer's, per rate and subscriber count."""
    out = []
    for rate, n in sorted({(r["rate"], r["subscribers"]) for r in rows}):
        here = {r["system"]: r for r in rows if (r["rate"], r["subscribers"]) == (rate, n)}
        ours = here.pop("scopecast", None)
        kept = [r for r in here.values() if r["p50_ms"] is not None
                and (r["delivered_share"] or 0.0) >= KEEP_UP and r["kept_rate"]]
        t = {"rate": rate, "subscribers": n,
             "best_p50": min((r["p50_ms"] for r in kept), default=None),
             "best_p99": min((r["p99_ms"] for r in kept), default=None)}
        t["p50_limit"] = max(P50_FLOOR_MS, P50_RATIO * t["best_p50"]) if kept else P50_FLOOR_MS
        t["p99_limit"] = max(P99_FLOOR_MS, P99_RATIO * t["best_p99"]) if kept else P99_FLOOR_MS
        if ours is None or ours["p50_ms"] is None:
            t["status"] = "not run"
        else:
            t.update(p50=ours["p50_ms"], p99=ours["p99_ms"], p999=ours["p999_ms"],
                     delivered_share=ours["delivered_share"])
            t["p50_status"] = "met" if ours["p50_ms"] <= t["p50_limit"] else "missed"
            t["p99_status"] = "met" if ours["p99_ms"] <= t["p99_limit"] else "missed"
            t["status"] = "met" if (t["p50_status"], t["p99_status"]) == ("met", "met") \
                and (ours["delivered_share"] or 0.0) >= 1.0 else "missed"
        out.append(t)
    return out


def cpu_target(rows: list[dict]) -> dict:
    """At CPU_RATE msgs/s to CPU_SUBSCRIBERS: scopecast's CPU per delivered message (case
    processes and its actors) against ZeroMQ's."""
    by = {r["system"]: r for r in rows
          if (r["rate"], r["subscribers"]) == (CPU_RATE, CPU_SUBSCRIBERS)}
    ours, zmq = by.get("scopecast"), by.get("zmq")
    if not ours or not zmq or ours["cpu_us_per_msg"] is None or zmq["cpu_us_per_msg"] is None:
        return {"status": "not run"}
    total = ours["cpu_us_per_msg"] + (ours["actors_us_per_msg"] or 0.0)
    ratio = total / zmq["cpu_us_per_msg"]
    return {"rate": CPU_RATE, "subscribers": CPU_SUBSCRIBERS, "scopecast_us": total,
            "scopecast_processes_us": ours["cpu_us_per_msg"],
            "scopecast_actors_us": ours["actors_us_per_msg"],
            "scopecast_ray_us": ours["ray_us_per_msg"], "zmq_us": zmq["cpu_us_per_msg"],
            "ratio": ratio, "status": "met" if ratio <= CPU_RATIO else "missed"}


def table(result: dict) -> str:
    """Markdown: every case's median percentiles side by side, then the verdicts."""
    rows = result.get("rows") if result else None
    if not rows:
        return ""
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    by = {(r["system"], r["rate"], r["subscribers"]): r for r in rows}
    lines = ["| rate msgs/s | subs | " + " | ".join(f"{s} p50 / p99 / p99.9 ms" for s in systems)
             + " | target |", "|---:|---:|" + "---:|" * len(systems) + "---|"]
    for t in result["targets"]:
        cells = []
        for s in systems:
            r = by.get((s, t["rate"], t["subscribers"]))
            if r is None or r["p50_ms"] is None:
                cells.append("failed" if r is not None else "-")
                continue
            got = "" if (r["delivered_share"] or 0.0) >= KEEP_UP else \
                f" (got {r['delivered_share']:.1%})"
            if not r["kept_rate"]:
                got += f" (sent {r['publish_rate'] or 0:,.0f}/s)"
            cells.append(f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f} / {r['p999_ms']:.2f}{got}")
        verdict = t["status"] if "p50_status" not in t else (
            f"{t['status']} (p50 <= {t['p50_limit']:.2f}: {t['p50_status']}, p99 <= "
            f"{t['p99_limit']:.2f}: {t['p99_status']})")
        lines.append(f"| {t['rate']:,} | {t['subscribers']} | " + " | ".join(cells)
                     + f" | {verdict} |")
    c = result["cpu_target"]
    cpu = "" if c["status"] == "not run" else (
        f"\nCPU per delivered message at {c['rate']:,} msgs/s to {c['subscribers']} subscribers: "
        f"scopecast {c['scopecast_us']:.1f} µs (publisher and subscribers "
        f"{c['scopecast_processes_us']:.1f}, its actors {num(c['scopecast_actors_us'], '.1f')}; "
        f"Ray's own processes {num(c['scopecast_ray_us'], '.1f')} more), ZeroMQ "
        f"{c['zmq_us']:.1f} µs: {c['ratio']:.2f}x (target at most {CPU_RATIO:g}x: "
        f"{c['status']})\n")
    skipped = "".join(f"\n{s} skipped: {why}" for s, why in result.get("skipped", {}).items())
    return (f"\nLatency at fixed rates: {result['size']} B messages, publish() to receive(), the "
            f"worst subscriber's percentiles, median of {result['repeats']} interleaved "
            f"repetitions of at least {result['messages']:,} messages each after "
            f"{result['warmup']:g} s of warm-up (targets: p50 <= max({P50_FLOOR_MS:g} ms, "
            f"{P50_RATIO:g}x the best peer), p99 <= max({P99_FLOOR_MS:g} ms, {P99_RATIO:g}x the "
            "best peer)):\n\n" + "\n".join(lines) + "\n" + cpu + skipped)


def plot(result: dict, path: Path, title: str) -> None:
    """p50 and p99 against the offered rate, a panel per subscriber count, a line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["p50_ms"] is not None]
    counts = sorted({r["subscribers"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.0 * len(counts), 4.2), squeeze=False)
    for ax, n in zip(axes[0], counts, strict=True):
        for system in SYSTEMS:
            points = sorted((r["rate"], r["p50_ms"], r["p99_ms"]) for r in rows
                            if r["system"] == system and r["subscribers"] == n)
            if points:
                x, p50, p99 = zip(*points, strict=True)
                line, = ax.plot(x, p50, marker="o", label=f"{system} p50")
                ax.plot(x, p99, marker="^", linestyle="--", color=line.get_color(),
                        label=f"{system} p99")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"1 KB, 1 -> {n}", fontsize=9)
        ax.set_xlabel("offered msgs/s")
        ax.set_ylabel("publish -> receive ms (worst subscriber)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

