"""Scale in members for scopecast (issue 7 item 3): one publisher to 1 .. 16 subscriber processes,
1 KB messages, one topic, flat out, with its control traffic and token rounds read meanwhile
(`ControlWatch`); and the table that sets these beside the peer suite's scopecast rows at 1 ..
10,000 topics, so both axes read the same way.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.cases import Case
from benchmarks.peer_suite import in_sweep, run_one, scale_row
from benchmarks.report import num

MEMBER_COUNTS = (1, 2, 4, 8, 16)
SIZE = 1000


def run(cluster, stamp: str, log_dir: Path, *, counts: list[int], seconds: float,
        warmup: float, case_timeout: float, policy: str) -> list[dict]:
    rows = []
    for n in counts:
        case = Case("scopecast", SIZE, n, seconds, warmup,
                    ready_timeout=min(120.0, case_timeout), timeout=case_timeout)
        rows.append(scale_row(run_one(cluster, stamp, log_dir, case, None, policy, f"members{n}",
                                      watch=True)))
    return rows


def table(member_rows: list[dict], topic_rows: list[dict]) -> str:
    ours = member_rows + [r for r in topic_rows if r["system"] == "scopecast" and in_sweep(r)]
    if not ours:
        return ""
    lines = ["| members | topics | msgs/s (min/sub) | subscriber RSS MB | token round ms "
             "| member control datagrams/s (KB/s) | agent datagrams/s (KB/s) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ours:
        c = r.get("control") or {}
        rss = r["subscriber_rss_bytes"] / 2**20 if r["subscriber_rss_bytes"] else None
        lines.append(
            f"| {r['subscribers'] + 1} | {r['topics']:,} | {num(r['rate'], ',.0f')} "
            f"| {num(rss, '.0f')} | {num(c.get('token_round_ms_p50'), '.1f')} "
            f"| {num(c.get('member_datagrams_per_s'), ',.0f')} "
            f"({num(_kb(c.get('member_bytes_per_s')), ',.1f')}) "
            f"| {num(c.get('agent_datagrams_per_s'), ',.0f')} "
            f"({num(_kb(c.get('agent_bytes_per_s')), ',.1f')}) |")
    return ("\nScale in members and topics (scopecast, 1 KB, flat out; members = subscriber "
            "processes + the publisher; control traffic is every member's and every recovery "
            "agent's UDP datagrams besides data, read from status() while the case runs):\n\n"
            + "\n".join(lines) + "\n")


def _kb(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / 1024
