"""What the numbers were measured on: CPU, cores, kernel, Python, Ray, and the code's commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

from benchmarks.procs import REPO_ROOT


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def describe() -> dict:
    import psutil

    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = None
    try:
        import scopecast

        scopecast_version = scopecast.__version__
    except ImportError:
        scopecast_version = None
    return {
        "cpu_model": cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "ray": ray_version,
        "scopecast": scopecast_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "root": os.geteuid() == 0,
    }


def busy_elsewhere(interval: float = 0.5) -> dict:
    """How busy the machine is before the run (percent of all cores), and its busiest processes:
    other work on a 2-core machine skews every number."""
    import psutil

    procs = list(psutil.process_iter(["pid", "name"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    total = psutil.cpu_percent(interval=interval)
    busy = []
    for p in procs:
        try:
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if pct >= 5.0 and p.pid != os.getpid():
            busy.append({"pid": p.pid, "name": p.info["name"], "cpu_percent": pct})
    busy.sort(key=lambda b: -b["cpu_percent"])
    return {"cpu_percent": total, "loadavg": list(os.getloadavg()), "busy_processes": busy[:5]}


def settle(max_wait: float, threshold: float = 25.0, interval: float = 0.5) -> float:
    """Wait (up to `max_wait` seconds) until the machine is less than `threshold` percent busy, so
    that Ray's start-up or a previous case's tear-down does not run into the next measurement.
    Returns the last busy percentage seen."""
    import time

    import psutil

    deadline = time.monotonic() + max_wait
    busy = psutil.cpu_percent(interval=interval)
    while busy >= threshold and time.monotonic() < deadline:
        busy = psutil.cpu_percent(interval=interval)
    return busy
