"""`make bench HOSTS=N`: the throughput and loss suites on N hosts of a local multi-host cluster.

The harness makes a `LocalHosts` cluster of N hosts in one LAN (network namespaces on one bridge,
a Ray node in each; root only), runs itself inside the head host with `--on-hosts PREFIX` (a Ray
driver needs a raylet in its own network namespace), and removes the cluster afterwards, whatever
happened. Inside, `placement()` puts each case's sender on the head host and its receivers
round-robin on the other hosts, so every datagram crosses the bridge; the baseline sends and joins
on each host's own address, and loss rules go into every host's namespace (each host loses on its
own, as on a real LAN).
"""

from __future__ import annotations

import signal
import subprocess
import sys

from benchmarks.cases import Placement, Where
from benchmarks.procs import REPO_ROOT

PREFIX = "scb"
NET = 79  # addresses 10.79.1.<i>: apart from the tests' clusters


class _Stop(BaseException):
    pass


def _stop(signum, frame):
    raise _Stop(f"signal {signum}")


def run(argv: list[str], n: int, prefix: str) -> int:
    """Make the cluster, run the harness (`argv`) inside its head host, remove the cluster."""
    from scopecast.ray_cluster.local_hosts import LocalHosts, LocalHostsError

    hosts = LocalHosts(hosts=n, lans=1, prefix=prefix, net=NET)
    old = signal.signal(signal.SIGTERM, _stop)
    made = False  # a cluster of this prefix made by someone else is never removed here
    try:
        hosts.up(progress=lambda line: print(f"[hosts] {line}", flush=True))
        made = True
        inner = hosts.popen(hosts.head, [sys.executable, "-m", "benchmarks.harness", *argv,
                                         "--on-hosts", prefix], cwd=REPO_ROOT,
                            env=hosts.env({"PYTHONPATH": str(REPO_ROOT)}))
        try:
            return inner.wait()
        except (KeyboardInterrupt, _Stop):
            inner.send_signal(signal.SIGTERM)  # it kills its case processes and stops its driver
            try:
                inner.wait(60)
            except subprocess.TimeoutExpired:
                inner.kill()
            print("interrupted; the hosts are being removed", file=sys.stderr, flush=True)
            return 130
    except LocalHostsError as exc:
        print(f"--hosts: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if made:
            hosts.down(quiet=True)
            print(f"[hosts] {n} hosts ({prefix}) removed", flush=True)
        signal.signal(signal.SIGTERM, old)


def placement(prefix: str) -> tuple[Placement, str, dict]:
    """Inside the head host: where case processes go, the Ray address, a description."""
    from scopecast.ray_cluster.local_hosts import LocalHosts

    hosts = LocalHosts.existing(prefix)
    head, *others = hosts.hosts
    spread = Placement(Where(head.name, head.address),
                       tuple(Where(h.name, h.address) for h in others or [head]))
    info = {"hosts": [{"netns": h.name, "address": h.address} for h in hosts.hosts],
            "sender": head.name, "receivers": [w.netns for w in spread.receivers],
            "network": "one Linux bridge (veth pairs), multicast snooping off"}
    return spread, hosts.address, info
