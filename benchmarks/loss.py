"""Real packet loss for tests and the benchmark's loss suite: iptables `statistic` rules dropping
UDP datagrams at random.

The rules match loopback UDP to the ephemeral port range, where every socket scopecast opens for
data, tokens and repairs lives (member sockets, agent sockets, multicast group ports), and nothing
else on these machines listens. Each rule carries a comment naming this process, and is removed on
the way out, also when the test fails. A process killed outright (kill -9, a CI time-out) cannot
remove its rule, and a rule left behind silently drops datagrams of every later run, so rules whose
process is gone are swept before a new one is added and when a test session starts."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess

PORTS = "32768:60999"
_TAG = re.compile(r"scopecast-loss-(\d+)")


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("iptables") is not None


def _rule(probability: float, pid: int | None = None) -> list[str]:
    return ["INPUT", "-i", "lo", "-p", "udp", "--dport", PORTS, "-m", "statistic", "--mode",
            "random", "--probability", f"{probability:.4f}", "-m", "comment", "--comment",
            f"scopecast-loss-{pid or os.getpid()}", "-j", "DROP"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> int:
    """Remove the loss rules of processes that no longer exist; how many were removed."""
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    removed = 0
    for rule in rules:
        tag = _TAG.search(rule)
        if rule.startswith("-A ") and tag and not _alive(int(tag.group(1))):
            subprocess.run(["iptables", "-D", *shlex.split(rule)[1:]], check=True)
            removed += 1
    return removed


@contextlib.contextmanager
def udp_loss(probability: float):
    """Drop `probability` of loopback UDP datagrams while the block runs."""
    sweep_stale()
    subprocess.run(["iptables", "-A", *_rule(probability)], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *_rule(probability)], check=True)


def dropped() -> int:
    """Datagrams the rules of this process dropped so far (from iptables' counters)."""
    out = subprocess.run(["iptables", "-L", "INPUT", "-v", "-n", "-x"], capture_output=True,
                         text=True, check=True).stdout
    tag = f"scopecast-loss-{os.getpid()}"
    return sum(int(line.split()[0]) for line in out.splitlines() if tag in line)
