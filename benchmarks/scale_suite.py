"""Scale in members for scopecast: one publisher to 1 .. 16 subscriber processes, 1 KB messages,
one topic, flat out, with its control traffic, token rounds and the peers' messages each member
holds until stable read meanwhile (`ControlWatch`); the cases of 4, 8 and 16 subscribers again with
cooperative caching (QSM: partitions of CACHING_PARTITION agents, CACHERS of each keep peers'
messages; `configure_scope("", cachers=, partition=)`), against the target that a member then holds
at most (cachers / partition) x what it holds when every member caches, + 10% of that; and the
table that sets these beside the peer suite's scopecast rows at 1 .. 10,000 topics, so both axes
read the same way.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.cases import Case
from benchmarks.peer_suite import in_sweep, run_one, scale_row
from benchmarks.report import num

MEMBER_COUNTS = (1, 2, 4, 8, 16)
SIZE = 1000
CACHING_COUNTS = (4, 8, 16)
CACHERS, CACHING_PARTITION = 1, 5
COOPERATIVE = f"{CACHERS}/{CACHING_PARTITION}"  # the rows' caching label ("all": every member)
CACHING_SLACK = 0.10  # of what a member holds when every member caches


def run(cluster, stamp: str, log_dir: Path, *, counts: list[int], seconds: float,
        warmup: float, case_timeout: float, policy: str) -> list[dict]:
    rows = []
    for n in counts:
        case = Case("scopecast", SIZE, n, seconds, warmup,
                    ready_timeout=min(120.0, case_timeout), timeout=case_timeout)
        rows.append({**scale_row(run_one(cluster, stamp, log_dir, case, None, policy,
                                         f"members{n}", watch=True)), "caching": "all"})
    cooperative = [n for n in CACHING_COUNTS if n in counts]
    if cooperative:
        cluster.configure_scope("", cachers=CACHERS, partition=CACHING_PARTITION)
        try:
            for n in cooperative:
                case = Case("scopecast", SIZE, n, seconds, warmup,
                            ready_timeout=min(120.0, case_timeout), timeout=case_timeout)
                rows.append({**scale_row(run_one(cluster, stamp, log_dir, case, None, policy,
                                                 f"members{n}-cachers", watch=True)),
                             "caching": COOPERATIVE})
        finally:
            cluster.configure_scope("")
    return rows


def caching_target(rows: list[dict]) -> dict | None:
    """At the most subscribers run both ways: peers' messages held per member with cooperative
    caching over with every member caching, against CACHERS / CACHING_PARTITION + the slack."""
    held = {(r["subscribers"], r.get("caching")): (r.get("control") or {}).get(
        "cached_messages_per_member") for r in rows}
    both = [n for n in sorted({n for n, _ in held}, reverse=True)
            if held.get((n, "all")) and held.get((n, COOPERATIVE)) is not None]
    if not both:
        return None
    n = both[0]
    ratio = held[(n, COOPERATIVE)] / held[(n, "all")]
    bound = CACHERS / CACHING_PARTITION + CACHING_SLACK
    return {"subscribers": n, "ratio": round(ratio, 3), "bound": bound,
            "status": "met" if ratio <= bound else "missed"}


def table(member_rows: list[dict], topic_rows: list[dict]) -> str:
    ours = member_rows + [r for r in topic_rows if r["system"] == "scopecast" and in_sweep(r)]
    if not ours:
        return ""
    lines = ["| members | topics | caching | msgs/s (min/sub) | subscriber RSS MB "
             "| peers' msgs held per member (per cacher, cachers) | token round ms "
             "| member control datagrams/s (KB/s) | agent datagrams/s (KB/s) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in ours:
        c = r.get("control") or {}
        rss = r["subscriber_rss_bytes"] / 2**20 if r["subscriber_rss_bytes"] else None
        lines.append(
            f"| {r['subscribers'] + 1} | {r['topics']:,} | {r.get('caching', 'all')} "
            f"| {num(r['rate'], ',.0f')} "
            f"| {num(rss, '.0f')} | {num(c.get('cached_messages_per_member'), ',.0f')} "
            f"({num(c.get('cached_messages_per_cacher'), ',.0f')}, {c.get('cachers', '-')}) "
            f"| {num(c.get('token_round_ms_p50'), '.1f')} "
            f"| {num(c.get('member_datagrams_per_s'), ',.0f')} "
            f"({num(_kb(c.get('member_bytes_per_s')), ',.1f')}) "
            f"| {num(c.get('agent_datagrams_per_s'), ',.0f')} "
            f"({num(_kb(c.get('agent_bytes_per_s')), ',.1f')}) |")
    target = caching_target(member_rows)
    verdict = "" if target is None else (
        f"\nCooperative caching at {target['subscribers']} subscribers: a member holds "
        f"{target['ratio']:.2f}x the peers' messages it holds when every member caches (target "
        f"at most {target['bound']:.2f}x: {target['status']}).\n")
    return ("\nScale in members and topics (scopecast, 1 KB, flat out; members = subscriber "
            "processes + the publisher; control traffic is every member's and every recovery "
            "agent's UDP datagrams besides data, read from status() while the case runs; "
            "caching 'all': every member keeps its peers' messages until stable, "
            f"'{COOPERATIVE}': {CACHERS} of each partition of "
            f"{CACHING_PARTITION}):\n\n" + "\n".join(lines) + "\n" + verdict)


def _kb(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / 1024
