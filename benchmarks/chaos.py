"""`make chaos`: the chaos soak (issue 45 item 5). Three local hosts in one LAN (network namespaces
on a bridge, a Ray node each; root only), 5% UDP loss in every host, and inside the head host
`benchmarks.chaos_workload`: publishers that flush every two seconds, topic churn, joins and
leaves, junk datagrams at every member socket, and kills at random moments of a member, an agent
host, a host scope manager, the root scope manager and a whole host (which comes back).

Checked at the end (`verdict`): every surviving subscriber has a gap-free prefix from every
publisher, the survivors agree, nothing flushed was lost, no flush hung or failed, every fault
kind was injected and the cluster recovered from each (every publisher flushed again), and (runs
of 10 minutes or more) no process's RSS grew by more than 5% over the last 5 minutes. Writes
`benchmarks/results/latest-chaos.json`; exits 1 when a check fails.

    python -m benchmarks.chaos               # 10 minutes (make chaos)
    python -m benchmarks.chaos --seconds 60  # the suite's short version
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading

from benchmarks.chaos_workload import FAULTS, JOINED_LATE, STABLE
from benchmarks.loss import dropped, udp_loss
from benchmarks.procs import REPO_ROOT

PREFIX = "scchao"
NET = 81           # addresses 10.81.1.<i>: apart from the tests' and the bench's clusters
LOSS = 0.05
EXIT_WAIT = 300.0  # s: the workload's report is out; its exit (closing its cluster) takes this at most
RSS_GROWTH = 0.05  # at most, over the last 5 minutes of a run of 10 or more
OUT = REPO_ROOT / "benchmarks" / "results" / "latest-chaos.json"


def run(seconds: float, seed: int = 1, progress=print, hosts=None) -> dict:
    """Run the workload under loss inside the head host of `hosts` (a `LocalHosts` of one or
    more LANs, its last host the one lost; by default three hosts made here and removed
    afterwards); the workload's report with `checks` added."""
    from scopecast.ray_cluster.local_hosts import LocalHosts

    made = hosts is None
    if made:
        hosts = LocalHosts(hosts=3, lans=1, prefix=PREFIX, net=NET)
        hosts.down(quiet=True)  # what a killed run may have left
    namespaces = [h.name for h in hosts.hosts]
    try:
        if made:
            hosts.up(progress=lambda line: progress(f"[hosts] {line}"))
        with udp_loss(LOSS, namespaces):
            report = _workload(hosts, seconds, seed, progress)
            report["datagrams_dropped_by_loss"] = dropped(namespaces)
    finally:
        if made:
            hosts.down(quiet=True)
    report["checks"] = verdict(report)
    return report


def _workload(hosts, seconds: float, seed: int, progress) -> dict:
    proc = hosts.popen(hosts.head, [sys.executable, "-m", "benchmarks.chaos_workload",
                                    "--seconds", str(seconds), "--prefix", hosts.prefix,
                                    "--seed", str(seed)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=hosts.env({"PYTHONPATH": str(REPO_ROOT)}), cwd=REPO_ROOT)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    report = None
    try:
        for line in proc.stdout:  # "running", "restart HOST" (its link is in this namespace)
            if line.startswith("restart "):
                name = line.split()[1]
                host = next(h for h in hosts.hosts if h.name == name)
                threading.Thread(target=hosts.restart_host, args=(host,), daemon=True).start()
                progress(f"[chaos] {name} back")
            elif line.startswith("{"):
                report = json.loads(line)
            elif line.strip() == "running":
                progress(f"[chaos] running for {seconds:.0f} s")
            elif line.startswith("["):
                progress(line.rstrip())
        proc.wait(timeout=EXIT_WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    if report is None:
        raise RuntimeError("the chaos workload reported nothing:\n" + "".join(err[-60:]))
    report["log"] = [line.rstrip() for line in err if "Traceback" not in line][-400:]
    return report


def verdict(r: dict) -> dict[str, str]:
    """Each check: "ok" or what failed."""
    checks = {}
    broken = [f"{n}: {rep['error']}" for n, rep in r["subscribers"].items() if "error" in rep]
    live = {n: rep["keys"] for n, rep in r["subscribers"].items() if "error" not in rep}
    light = {n for n, rep in r["subscribers"].items() if rep.get("light")}
    holes = [f"{n} {k}: {v}" for n, keys in live.items() for k, v in keys.items()
             if v["gaps"] or v["bad"]]
    late = [f"{n} {k}: first {v['first']}" for n, keys in live.items() if n in r["originals"]
            for k, v in keys.items() if k.startswith(STABLE) and v["first"] != 1]
    checks["gap-free prefix"] = _ok(broken + holes + late)
    published = r["published"]
    disagree = [f"{n} {k}: last {v['last']} of {published[k.split('|')[0]]}"
                for n, keys in live.items() for k, v in _short(keys, published)]
    # (a joiner of the run's last seconds may have subscribed after the last message)
    recent = {n for n, at in r["joined"].items() if at > r["seconds"] - JOINED_LATE}
    missing = [f"{n}: no {t}" + (" (still light)" if n in light else "")
               for n, keys in live.items() if n not in recent
               for t in published if not any(k.startswith(t + "|") for k in keys)]
    checks["survivors agree"] = _ok(disagree + missing)
    flushed: dict[str, int] = {}
    for f in r["flushes"]:
        if f["ok"]:
            flushed[f["topic"]] = max(flushed.get(f["topic"], 0), f["counter"])
    lost = [f"{n} {k}: last {v['last']} < flushed {flushed[t]}" for n, keys in live.items()
            for k, v in keys.items()
            if (t := k.split("|")[0]) in flushed and v["last"] < flushed[t]]
    checks["nothing flushed lost"] = _ok(lost + ([] if flushed else ["no flush succeeded"]))
    failed = [f"{f['topic']} at {f['at']} s after {f['seconds']} s" for f in r["flushes"]
              if not f["ok"]]
    checks["no flush hung"] = _ok([f"thread {t} still running" for t in r["hung"]] + failed
                                  + r["errors"].get("publish_errors", []))
    kinds = {f["kind"] for f in r["faults"] if not f["target"].startswith("failed")}
    unsurvived = [f"{f['kind']} at {f['at']} s ({f['target']})" for f in r["faults"]
                  if f["recovered"] is None or f["target"].startswith("failed")]
    checks["every fault injected and survived"] = _ok(
        [f"{k} never injected" for k in FAULTS if k not in kinds] + unsurvived)
    if r["seconds"] >= 600:
        mid, end = r["rss"].get("mid", {}), r["rss"].get("end", {})
        grown = [f"{mid[p][0]} pid {p}: {mid[p][1]} -> {end[p][1]} kB" for p in mid
                 if p in end and mid[p][1] and end[p][1] > (1 + RSS_GROWTH) * mid[p][1]]
        checks["RSS over the last 5 minutes"] = _ok(grown)
    return checks


def _short(keys: dict, published: dict) -> list[tuple[str, dict]]:
    """A subscriber's stable (topic, source) keys whose last message is not the last published."""
    return [(k, v) for k, v in keys.items()
            if k.startswith(STABLE) and v["last"] != published[k.split("|")[0]]]


def _ok(problems: list[str]) -> str:
    return "ok" if not problems else f"{len(problems)} failed: " + "; ".join(problems[:5])


def injected(r: dict) -> dict[str, list]:
    """Per fault kind: [injected, survived]."""
    out = {k: [0, 0] for k in FAULTS}
    for f in r["faults"]:
        out[f["kind"]][0] += 1
        out[f["kind"]][1] += f["recovered"] is not None and not f["target"].startswith("failed")
    return out


def summary(r: dict) -> str:
    lines = [f"chaos soak: {r['seconds']:.0f} s on 3 hosts, {LOSS:.0%} loss "
             f"({r.get('datagrams_dropped_by_loss', 0)} datagrams dropped)"]
    for kind, (n, ok) in injected(r).items():
        took = [f["recovered"] for f in r["faults"] if f["kind"] == kind and f["recovered"]]
        lines.append(f"  {kind:<11} injected {n}, survived {ok}"
                     + (f" (recovered in {max(took):.1f} s at most)" if took else ""))
    flushes = r["flushes"]
    lines.append(f"  flushes {len(flushes)} ({sum(1 for f in flushes if f['ok'])} ok, longest "
                 f"{max((f['seconds'] for f in flushes), default=0):.1f} s); topics churned "
                 f"{r['churned']}; joins {r['joins']}, leaves {r['leaves']}, members killed "
                 f"{len(r['killed'])}; junk datagrams sent {r['junk_sent']}, dropped by members "
                 f"{sum(r['counters'].values())}")
    for what, errors in r.get("errors", {}).items():
        lines.append(f"  {what}: {len(errors)} ({'; '.join(errors[:3])})")
    for check, result in r["checks"].items():
        lines.append(f"  {'PASS' if result == 'ok' else 'FAIL'} {check}"
                     + ("" if result == "ok" else f": {result}"))
    if any(result != "ok" for result in r["checks"].values()):
        lines += _lagging(r)
    return "\n".join(lines)


def _lagging(r: dict) -> list[str]:
    """What the subscribers that lack stable messages said of themselves (a failure's clues):
    their member state, whether a scope still lists them, their loop's error; and the
    workload's log lines that warn."""
    lines = []
    in_scopes = set(r.get("scope_members", ()))
    for n, rep in r["subscribers"].items():
        if "error" in rep or not _short(rep["keys"], r["published"]):
            continue
        member = rep.get("member", {})
        listed = member.get("address") in in_scopes
        lines.append(f"  lagging {n}: {'listed' if listed else 'NOT listed'} by a scope; "
                     f"{json.dumps(member)}")
        if rep.get("loop_error"):
            lines.append(f"    its loop ended: {rep['loop_error']}")
    warned = [line for line in r.get("log", []) if "WARNING" in line or "ERROR" in line
              or "Error" in line]
    lines += [f"  log: {line[:300]}" for line in warned[-40:]]
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=600.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=1, help="the faults' random moments and targets")
    p.add_argument("--out", default=str(OUT), help=f"the JSON report (default {OUT})")
    args = p.parse_args()
    r = run(args.seconds, args.seed, progress=lambda line: print(line, flush=True))
    with open(args.out, "w") as f:
        json.dump(r, f, indent=1)
    print(summary(r), flush=True)
    return 0 if all(v == "ok" for v in r["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
