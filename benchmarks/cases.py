"""One benchmark case: start its receiving processes, wait until every one is READY, start the sender,
collect every process's `RESULT`, and hand the raw summaries to `analysis`.

Whatever happens (error, timeout, Ctrl-C) every process of the case is killed before `run_case`
returns or raises; a failed case comes back as a result with an "error" and the stderr tails.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from benchmarks import analysis
from benchmarks.peers import PEERS
from benchmarks.procs import READY, CaseError, ChildGroup, module_argv
from scopecast.ray_cluster.local_hosts import in_netns


@dataclass(slots=True, frozen=True)
class Case:
    system: str          # "scopecast", "baseline" or a peer (`peers.PEERS`)
    size: int            # payload bytes
    subscribers: int     # receiving processes
    seconds: float       # how long the sender sends
    warmup: float        # receiver warm-up before the measured window
    ready_timeout: float
    timeout: float       # whole case, from the first process start
    rate: float = 0.0    # offered msgs/s (0: flat out); scopecast is paced only with latency
    latency: bool = False  # stamped payloads, receivers report send-to-delivery percentiles
    topics: int = 1      # the sender publishes to this many topics in turn; receivers take all
    ready: bool = False  # receivers subscribe once the sender is publishing (a readiness case),
    #                      each ready once it had a message of every topic, within `seconds`

    @property
    def label(self) -> str:
        paced = f" at {self.rate:,.0f}/s" if self.rate else ""
        paced += " (latency)" if self.latency else ""
        paced += f" over {self.topics:,} topics" if self.topics > 1 else ""
        paced += " (readiness)" if self.ready else ""
        return f"{self.system} {self.size}B 1->{self.subscribers}{paced}"


@dataclass(slots=True, frozen=True)
class Where:
    """The host a case process runs on: a network namespace of a local multi-host cluster ("" for
    the harness's own) and the host's address (the baseline's multicast interface)."""

    netns: str = ""
    interface: str = "127.0.0.1"


@dataclass(slots=True, frozen=True)
class Placement:
    """Where a case's sender runs and where its receivers run (receiver i on receivers[i % n])."""

    sender: Where = Where()
    receivers: tuple[Where, ...] = (Where(),)

    def receiver(self, i: int) -> Where:
        return self.receivers[i % len(self.receivers)]

    @property
    def namespaces(self) -> list[str]:
        return sorted({w.netns for w in (self.sender, *self.receivers) if w.netns})


@dataclass(slots=True, frozen=True)
class Wiring:
    """Where a case's processes meet: the scopecast cluster, a multicast group (baseline), a
    peer's server or PUB port, or the Ray cluster (the Ray peer)."""

    address: str = ""            # Ray GCS address (scopecast, ray)
    topic: str = ""              # fresh topic / channel / subject per case
    group: str = ""              # fresh multicast group per case (baseline)
    port: int = 0                # baseline group port, peer server port, ZeroMQ PUB port
    placement: Placement = Placement()
    ttl: int = 1
    loop: bool = True
    rcvbuf: int = 32 << 20
    sndbuf: int = 4 << 20


def run_case(case: Case, wiring: Wiring, log_dir: Path) -> dict:
    """Run one case; never raises for a failure of the case itself (see the module docstring)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    load = os.getloadavg()
    namespaces = wiring.placement.namespaces
    snmp_before = analysis.udp_counters(namespaces)
    try:
        with ChildGroup(log_dir) as group:
            sender, receivers, background = _run(case, wiring, group, started + case.timeout)
        result = analysis.summarize_case(case, sender, receivers)
    except CaseError as exc:
        return failed_result(case, str(exc), started)
    except Exception as exc:  # a harness bug: report it with the case, keep the run going
        return failed_result(case, f"{exc!r}\n{traceback.format_exc()}", started)
    result["background_cpu"] = background
    result["loadavg_before"] = list(load)
    result["udp_counters"] = analysis.counter_delta(snmp_before,
                                                     analysis.udp_counters(namespaces))
    result["case_seconds"] = round(time.monotonic() - started, 2)
    return result


def _run(case: Case, wiring: Wiring, group: ChildGroup,
         deadline: float) -> tuple[dict, list[dict], dict]:
    """The receivers, READY, then the sender; a readiness case: the sender, READY (publishing),
    then the receivers."""
    if case.ready:
        sender = _start_sender(case, wiring, group)
        sender.expect(READY, deadline)
        others: list = []  # (its background CPU is not measured)
        before, t0 = {}, time.monotonic()
    receivers = [group.start(f"{case.system}-{case.size}-{case.subscribers}-recv{i}",
                             _argv(case, wiring, sender=False, index=i))
                 for i in range(case.subscribers)]
    ready_by = min(deadline, time.monotonic() + case.ready_timeout)
    for r in receivers:
        r.expect(READY, ready_by)
    if not case.ready:
        others = analysis.other_processes(set(group.pids()))
        before, t0 = analysis.cpu_snapshot(others), time.monotonic()
        sender = _start_sender(case, wiring, group)
    sender_result = sender.result(deadline)
    receiver_results = [r.result(deadline) for r in receivers]
    background = analysis.background_cpu(before, analysis.cpu_snapshot(others),
                                         time.monotonic() - t0)
    for child in [sender, *receivers]:
        code = child.wait(deadline)
        if code != 0:
            raise CaseError(f"{child.name}: exited with code {code}{child.diagnostics()}")
    return sender_result, receiver_results, background


def _start_sender(case: Case, wiring: Wiring, group: ChildGroup):
    return group.start(f"{case.system}-{case.size}-{case.subscribers}-send",
                       _argv(case, wiring, sender=True))


def _argv(case: Case, wiring: Wiring, sender: bool, index: int = 0) -> list[str]:
    """The command line of a case's sender or of its receiver `index`, on its host."""
    where = wiring.placement.sender if sender else wiring.placement.receiver(index)
    return in_netns(where.netns, _command(case, wiring, sender, where.interface))


def _command(case: Case, wiring: Wiring, sender: bool, interface: str) -> list[str]:
    parent = ["--parent-pid", str(os.getpid())]
    if sender:
        role = ["--size", str(case.size), "--seconds", str(case.seconds), *parent]
    else:
        role = ["--warmup", str(case.warmup), "--timeout", str(case.timeout), *parent]
        role += ["--latency"] if case.latency else []
        role += ["--ready-within", str(case.seconds)] if case.ready else []
    role += ["--topics", str(case.topics)] if case.topics > 1 else []
    if case.system == "scopecast":
        paced = ["--rate", str(case.rate)] if sender and case.latency else []
        return module_argv("benchmarks.throughput", "publish" if sender else "subscribe",
                           "--address", wiring.address, "--topic", wiring.topic, *paced, *role)
    if case.system == "baseline":
        where = ["--group", wiring.group, "--port", str(wiring.port), "--interface", interface]
        extra = (["--ttl", str(wiring.ttl), "--loop", str(int(wiring.loop)), "--sndbuf",
                  str(wiring.sndbuf)] if sender else ["--rcvbuf", str(wiring.rcvbuf)])
        return module_argv("benchmarks.baseline", "send" if sender else "receive", *where, *extra,
                           *role)
    where = ["--address", wiring.address] if case.system == "ray" else ["--port", str(wiring.port)]
    extra = ["--rate", str(case.rate), "--subscribers", str(case.subscribers),
             *(["--stamped"] if case.latency else [])] if sender else []
    return module_argv(PEERS[case.system], "send" if sender else "receive", *where,
                       "--topic", wiring.topic, *extra, *role)


def failed_result(case: Case, error: str, started: float | None = None) -> dict:
    return {"system": case.system, "size": case.size, "subscribers": case.subscribers,
            "seconds": case.seconds, "error": error,
            "case_seconds": round(time.monotonic() - started, 2) if started else 0.0}
