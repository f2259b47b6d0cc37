"""The human side of a run: a markdown summary table (with the targets) and a PNG plot."""

from __future__ import annotations

from pathlib import Path

from benchmarks.analysis import REPAIR_SAMPLES, REPAIR_TARGET_MS


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _lost(lost: list[int], published: int) -> str:
    parts = []
    for n in lost:
        pct = 100.0 * n / published if published else 0.0
        parts.append(f"{n}" if n == 0 else f"{n} ({pct:.1f}%)")
    return ", ".join(parts)


def loss_table(rows: list[dict], on_hosts: bool = False) -> str:
    """The loss suite: throughput under random datagram loss relative to lossless, repair times."""
    if not rows:
        return ""
    lines = ["| loss | size | subs | delivered msgs/s min | vs lossless right before (pairs) "
             "| vs the throughput suite's | lost | packets dropped | datagrams lost, measured "
             "| datagrams per send call | repairs | NAKs to senders (asked again) "
             "| repair p50 / p99 / p99.9 ms | target |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        pairs = ", ".join(f"{x:.2f}" for x in r.get("pair_ratios", ()))
        ratio = f"{r['ratio']:.2f} ({pairs})" if r["ratio"] is not None else "-"
        lines.append(f"| {r['loss']:.0%} | {r['size']} | {r['subscribers']} | {r['rate']:,.0f} | "
                     f"{ratio} | {num(r.get('suite_ratio'), '.2f')} | {r['lost']} | "
                     f"{r['dropped_datagrams']} | {num(r.get('datagram_loss'), '.2%')}"
                     f"{' (every subscriber the same)' if r.get('loss_shared') else ''} | "
                     f"{num(r.get('datagrams_per_send_call'), '.1f')} | {r['repairs']} | "
                     f"{r.get('naks_sent', '-')} ({r.get('nak_retries', '-')}) | "
                     f"{r['repair_p50_ms']} / {r['repair_p99_ms']} / "
                     f"{r.get('repair_p999_ms', '-')} | {r.get('target', '')}"
                     + (f" (error: {r['error'][:80]})" if r.get("error") else "") + " |")
    paced = ["", "Paced (the publisher at a fixed rate, below saturation; repair times "
             "where no process waits for a CPU), same loss:", "",
             "| loss | offered msgs/s | delivered min/sub | lost | repairs | NAKs to senders "
             "(asked again) | repair p50 / p99 / p99.9 ms | target |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if (q := r.get("paced")) is not None:
            paced.append(f"| {r['loss']:.0%} | {q['rate']:,.0f} | {num(q['delivered'], ',.0f')} "
                         f"| {q['lost']} | {q['repairs']} | {q['naks_sent']} ({q['nak_retries']}) "
                         f"| {q['repair_p50_ms']} / {q['repair_p99_ms']} / {q['repair_p999_ms']} "
                         f"| {q['target']} (p99 <= {REPAIR_TARGET_MS:g} ms over >= "
                         f"{REPAIR_SAMPLES} repairs) |")
    if len(paced) == 5:
        paced = []
    where = ("of the UDP datagrams each host receives" if on_hosts
             else "of loopback UDP datagrams")
    return (f"\nLoss suite (iptables drops that share {where}, data, tokens and "
            "repairs alike; each lossy case runs right after a lossless one, and the ratio is "
            "the median over those pairs, each pair's in brackets; rates are medians, repair "
            "times over every pair; packets dropped counts iptables' drops of every kind, "
            "datagrams lost what the subscribers measured of the publisher's data datagrams; "
            "target at 1%: >= 0.8x lossless, nothing lost, p99 repair <= "
            f"{REPAIR_TARGET_MS:g} ms):\n\n"
            + "\n".join(lines + paced))


def curves_table(curves: dict) -> str:
    """Token round time against peer-group size; publisher memory against bytes in flight."""
    if not curves:
        return ""
    rounds = ["| members | token round p50 ms | max ms | samples |", "|---:|---:|---:|---:|"]
    rounds += [f"| {r['members']} | {num(r['round_ms_p50'], '.1f')} | "
               f"{num(r['round_ms_max'], '.1f')} | {r['samples']} |"
               for r in curves.get("token_rounds", ())]
    memory = ["| in flight MiB | publisher RSS growth MiB | bytes per payload byte |",
              "|---:|---:|---:|"]
    memory += [f"| {m['in_flight_mb']} | {m['rss_growth_mb']} | {m['bytes_per_payload_byte']} |"
               for m in curves.get("memory_in_flight", ())]
    return ("\n\nToken round time in one peer group (1 KB stream; partitions of 5, a regional "
            "ring above 5):\n\n" + "\n".join(rounds)
            + "\n\nPublisher memory while one subscriber is stopped (nothing becomes stable):\n\n"
            + "\n".join(memory))


def markdown_table(cases: list[dict], targets: list[dict]) -> str:
    head = ("| size | subs | system | published | delivered msgs/s min (mean) per sub | MB/s min "
            "| ratio vs baseline | CPU µs/msg | lost per sub |")
    lines = [head, "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for c in cases:
        key = f"| {c['size']} | {c['subscribers']} | {c['system']} "
        if c.get("error"):
            first = c["error"].strip().splitlines()[0][:100] if c["error"].strip() else "error"
            lines.append(key + f"| FAILED: {first.replace('|', '/')} | | | | | |")
            continue
        lines.append(
            key + f"| {c['published']:,} "
            f"| {_rate(c['min_rate'])} ({_rate(c['mean_rate'])}) "
            f"| {c['min_mb_s']:.1f} "
            f"| {num(c.get('ratio'), '.2f')} "
            f"| {num(c['cpu_us_per_msg'], '.2f')} "
            f"| {_lost(c['lost'], c['published'])} |")
    lines.append("")
    lines.append("Targets (checked, not asserted):")
    lines.append("")
    for t in targets:
        if t["status"] == "not run":
            lines.append(f"- {t['name']}: not run")
            continue
        extra = ""
        if "scopecast_lost" in t:
            extra = f", scopecast lost {t['scopecast_lost']}"
        lines.append(f"- {t['name']}: **{t['status']}** (scopecast {_rate(t['scopecast_rate'])}/s"
                     f" vs baseline {_rate(t['baseline_rate'])}/s = {t['ratio']:.2f}x, need "
                     f"{t['required_ratio']:.1f}x{extra})")
    return "\n".join(lines) + "\n"


def plot(cases: list[dict], path: Path, title: str) -> None:
    """Delivered msgs/s (min per subscriber) and CPU µs/msg per case, scopecast beside baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = []
    for c in cases:
        k = (c["size"], c["subscribers"])
        if k not in keys:
            keys.append(k)
    by = {(c["system"], c["size"], c["subscribers"]): c for c in cases if not c.get("error")}
    labels = [f"{s} B\n1→{n}" for s, n in keys]
    x = list(range(len(keys)))
    width = 0.38
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(keys) + 2), 7.5),
                                   sharex=True)
    for i, (system, color) in enumerate((("scopecast", "tab:blue"), ("baseline", "tab:gray"))):
        xs = [v + (i - 0.5) * width for v in x]
        rates = [by.get((system, s, n), {}).get("min_rate") or 0.0 for s, n in keys]
        cpu = [by.get((system, s, n), {}).get("cpu_us_per_msg") or 0.0 for s, n in keys]
        ax1.bar(xs, rates, width, label=system, color=color)
        ax2.bar(xs, cpu, width, label=system, color=color)
        for xv, (s, n) in zip(xs, keys, strict=True):
            c = by.get((system, s, n))
            if not c:
                continue
            notes = []
            if system == "scopecast" and c.get("ratio") is not None:
                notes.append(f"{c['ratio']:.2f}x")
            if c["lost_total"] and c["published"]:
                notes.append(f"lost {100.0 * c['lost_total'] / (c['published'] * n):.0f}%")
            if notes:
                ax1.annotate("\n".join(notes), (xv, c["min_rate"]), ha="center", va="bottom",
                             fontsize=7, color="tab:red" if c["lost_total"] else "black")
    ax1.set_ylabel("delivered msgs/s\n(min over subscribers)")
    ax1.set_ylim(0, max([c.get("min_rate") or 0.0 for c in by.values()] + [1.0]) * 1.2)
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)
    ax1.set_title(title, fontsize=8)
    ax1.set_xlim(-0.8, len(keys) - 0.2)
    ax2.set_ylabel("CPU µs per delivered msg\n(all processes)")
    ax2.grid(axis="y", alpha=0.3)
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def standalone(run, table, path: Path) -> int:
    """A suite run on its own (`python -m benchmarks.<suite>`): `run(cluster)` on an embedded
    cluster, its result written to `path` with the time and the machine, its `table` printed;
    the exit status 0 if its target was met."""
    import json
    import time

    import scopecast
    from benchmarks import machine
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cluster = scopecast.connect()
    try:
        result = run(cluster)
    finally:
        cluster.shutdown()
    result = {"timestamp": stamp, "machine": machine.describe(), **result}
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0 if result.get("met") else 1
