"""The encryption suite (issue 45 item 6): scopecast's 1 KB cases with every datagram encrypted
(AES-256-GCM, `scopecast up --encrypt`) beside the same cases authenticated only (GMAC, the
harness's own cluster), in one run. The cluster key is the cluster's, so an encrypting cluster is
a second cluster: a Ray head of its own on this machine (its own port and SCOPECAST_HOME), made by
`scopecast up --encrypt` and removed by `scopecast down --ray` after the suite. Each pair runs off
then on, back to back; the ratio is the median over the pairs of on / off (delivered msgs/s, the
slowest subscriber). Target: at least TARGET."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import machine
from benchmarks.cases import Case, Placement, Wiring, run_case

TARGET = 0.8
SIZE = 1000
SCOPECAST = str(Path(sys.executable).with_name("scopecast"))


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def encrypting_cluster(log_dir: Path):
    """The address of a Ray head of its own running an encrypting scopecast cluster."""
    home = tempfile.mkdtemp(prefix="scopecast-bench-encrypted-")
    env = {**os.environ, "SCOPECAST_HOME": home}
    env.pop("RAY_ADDRESS", None)
    port = _free_tcp_port()
    log = (log_dir / "encrypting-cluster.log").open("a")
    up = subprocess.run([SCOPECAST, "up", "--port", str(port), "--encrypt"], env=env,
                        stdout=log, stderr=subprocess.STDOUT, timeout=300)
    try:
        if up.returncode != 0:
            raise RuntimeError(f"scopecast up --encrypt failed ({up.returncode}): see {log.name}")
        yield f"127.0.0.1:{port}", env
    finally:
        subprocess.run([SCOPECAST, "down", "--ray", "--address", f"127.0.0.1:{port}"], env=env,
                       stdout=log, stderr=subprocess.STDOUT, timeout=300)
        log.close()


def run(cluster, address: str, placement: Placement, stamp: str, log_dir: Path,
        subscribers: list[int], seconds: float, warmup: float, case_timeout: float,
        policy: str, pairs: int) -> dict:
    if not pairs:
        return {}
    out: dict = {"size": SIZE, "pairs": pairs, "target": TARGET, "rows": []}
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        with encrypting_cluster(log_dir) as (encrypted, env):
            for n in subscribers:
                out["rows"].append(_pairs(cluster, address, encrypted, env, placement, stamp,
                                          log_dir, n, seconds, warmup, case_timeout, policy,
                                          pairs))
    except (RuntimeError, subprocess.SubprocessError) as exc:
        out["error"] = str(exc)
        print(f"encryption suite failed: {exc}", flush=True)
    met = [r["status"] for r in out["rows"]]
    out["status"] = "not run" if not met or "not run" in met else \
        "met" if all(s == "met" for s in met) else "missed"
    return out


def _pairs(cluster, address, encrypted, env, placement, stamp, log_dir, n, seconds, warmup,
           case_timeout, policy, pairs) -> dict:
    rates: dict[str, list] = {"off": [], "on": []}
    lost = 0
    for i in range(pairs):
        for mode in ("off", "on"):
            topic = f"bench/{stamp}/encrypt-{mode}-{n}-{i}"
            if mode == "off":
                cluster.create_topic(topic, policy=policy)
                at = address
            else:
                subprocess.run([SCOPECAST, "topic", "create", topic, "--address", encrypted,
                                "--policy", policy], env=env, check=True, capture_output=True,
                               timeout=120)
                at = encrypted
            case = Case("scopecast", SIZE, n, seconds, warmup,
                        ready_timeout=min(120.0, case_timeout), timeout=case_timeout)
            machine.settle(5.0)
            result = run_case(case, Wiring(address=at, topic=topic, placement=placement),
                              log_dir / f"encrypt-{mode}-{n}-{i}")
            ok = not result.get("error")
            rates[mode].append(result["min_rate"] if ok else None)
            lost += sum(result.get("lost") or []) if ok else 0
            print(f"[encryption {mode} 1->{n} {i + 1}/{pairs}] "
                  + (f"{result['min_rate']:,.0f} msgs/s" if ok else "failed"), flush=True)
    ratios = [on / off for off, on in zip(rates["off"], rates["on"], strict=True)
              if off and on]
    ratio = statistics.median(ratios) if ratios else None
    return {"subscribers": n, "off": rates["off"], "on": rates["on"], "ratios": ratios,
            "ratio": ratio, "lost": lost,
            "status": "not run" if ratio is None or len(ratios) < pairs else
            "met" if ratio >= TARGET and lost == 0 else "missed"}


def table(suite: dict) -> str:
    if not suite:
        return ""
    if suite.get("error") and not suite["rows"]:
        return f"\nEncryption suite: failed ({suite['error']}).\n"
    lines = []
    for r in suite["rows"]:
        rates = " / ".join(", ".join("failed" if x is None else f"{x:,.0f}" for x in r[m])
                           for m in ("off", "on"))
        pairs = ", ".join(f"{x:.2f}" for x in r["ratios"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f} ({pairs})"
        lines.append(f"| 1 -> {r['subscribers']} | {rates} | {ratio} | {r['lost']} | {r['status']} |")
    return (f"\nEncryption ({suite['size']} B; every datagram AES-256-GCM-encrypted after its "
            f"header, beside authenticated only (GMAC), {suite['pairs']} pairs back to back; "
            f"target encrypted >= {suite['target']:g}x: {suite['status']}):\n\n"
            "| case | msgs/s per subscriber (slowest), off / on | on / off (pairs) | lost | target |\n"
            "|---|---|---:|---:|---|\n" + "\n".join(lines) + "\n")
