"""Real packet loss for tests and the benchmark's loss suite: iptables `statistic` rules dropping
UDP datagrams at random.

The rules match loopback UDP to the ephemeral port range, where every socket scopecast opens for
data, tokens and repairs lives (member sockets, agent sockets, multicast group ports), and nothing
else on these machines listens. Each rule carries a comment naming this process, and is removed on
the way out, also when the test fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

PORTS = "32768:60999"


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("iptables") is not None


def _rule(probability: float) -> list[str]:
    return ["INPUT", "-i", "lo", "-p", "udp", "--dport", PORTS, "-m", "statistic", "--mode",
            "random", "--probability", f"{probability:.4f}", "-m", "comment", "--comment",
            f"scopecast-loss-{os.getpid()}", "-j", "DROP"]


@contextlib.contextmanager
def udp_loss(probability: float):
    """Drop `probability` of loopback UDP datagrams while the block runs."""
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
