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

from scopecast.ray_cluster.local_hosts import in_netns

PORTS = "32768:60999"
_TAG = re.compile(r"scopecast-loss-(\d+)")


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("iptables") is not None


def _iptables(netns: str, *args: str) -> list[str]:
    return in_netns(netns, ["iptables", *args])


def _rule(probability: float, pid: int | None = None, loopback: bool = True) -> list[str]:
    """The DROP rule; inside a host namespace of a local multi-host cluster every interface's UDP
    (the bridge's and the host's own loopback), in this namespace loopback only."""
    return ["INPUT", *(["-i", "lo"] if loopback else []), "-p", "udp", "--dport", PORTS,
            "-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}",
            "-m", "comment", "--comment", f"scopecast-loss-{pid or os.getpid()}", "-j", "DROP"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(netns: str = "") -> int:
    """Remove the loss rules of processes that no longer exist; how many were removed."""
    rules = subprocess.run(_iptables(netns, "-S", "INPUT"), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    removed = 0
    for rule in rules:
        tag = _TAG.search(rule)
        if rule.startswith("-A ") and tag and not _alive(int(tag.group(1))):
            subprocess.run(_iptables(netns, "-D", *shlex.split(rule)[1:]), check=True)
            removed += 1
    return removed


@contextlib.contextmanager
def udp_loss(probability: float, namespaces: list[str] = ()):
    """Drop `probability` of loopback UDP datagrams while the block runs; with `namespaces`, of
    every UDP datagram each of those hosts receives (each host loses on its own, as on a LAN)."""
    where = list(namespaces) or [""]
    rule = _rule(probability, loopback=not namespaces)
    added = []
    try:
        for netns in where:
            sweep_stale(netns)
            subprocess.run(_iptables(netns, "-A", *rule), check=True)
            added.append(netns)
        yield
    finally:
        for netns in added:
            subprocess.run(_iptables(netns, "-D", *rule), check=True)


def dropped(namespaces: list[str] = ()) -> int:
    """Datagrams the rules of this process dropped so far (from iptables' counters), summed over
    `namespaces` when given."""
    tag = f"scopecast-loss-{os.getpid()}"
    total = 0
    for netns in list(namespaces) or [""]:
        out = subprocess.run(_iptables(netns, "-L", "INPUT", "-v", "-n", "-x"),
                             capture_output=True, text=True, check=True).stdout
        total += sum(int(line.split()[0]) for line in out.splitlines() if tag in line)
    return total
