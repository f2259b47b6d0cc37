"""The chaos soak's workload and fault injector (`benchmarks.chaos` runs it inside the head host of
a local multi-host cluster): publishers that flush periodically, subscribers that check what they
get as it comes, topic churn, joins and leaves, junk datagrams at every member socket, and kills
at random moments of a member, an agent host, a host scope manager, the root scope manager and a
whole host. Prints one JSON line: what every subscriber got, every flush, every fault."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import scopecast
from scopecast import FlushTimeout
from scopecast.scopes.status import walk

STABLE = "chaos/stable/"   # topics published the whole run
CHURN = "chaos/churn/"     # topics made, used and deleted during it
FAULTS = ("member", "agent_host", "host_scope", "root", "host")
FLUSH_TIMEOUT = 120.0      # a flush still waiting after this has hung
JOINED_LATE = 5.0          # s: a joiner of the run's last seconds may not meet the streams


class Recorder:
    """A subscriber (a Ray actor) that checks what it gets as it comes: per (topic, source), the
    publisher's counter in each payload goes up by one, and the payload is the one published."""

    def __init__(self, topics: list[str]) -> None:
        self._cluster = scopecast.connect()
        self._sub = self._cluster.subscriber(topics)
        self._keys: dict[str, list[int]] = {}  # "topic|source" -> [first, last, gaps, bad]
        self._stop = False
        self._error = ""  # why its loop ended, if it did before close (a finding)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._take()
        except BaseException:
            self._error = traceback.format_exc(limit=6)
            raise

    def _take(self) -> None:
        keys = self._keys
        while not self._stop:
            for m in self._sub.receive_batch(0.2):
                topic, _, counter = m.payload.decode().rpartition("|")
                k = keys.get(key := f"{m.topic}|{m.source}")
                n = int(counter)
                if topic != m.topic:
                    n = -1
                if k is None:
                    keys[key] = [n, n, 0, int(n < 0)]
                elif n != k[1] + 1:
                    k[2 if n > k[1] else 3] += 1
                    k[1] = max(k[1], n)
                else:
                    k[1] = n

    def pid(self) -> int:
        return os.getpid()

    def report(self) -> dict:
        (counters,) = self._cluster.counters().values()
        return {"keys": {k: dict(zip(("first", "last", "gaps", "bad"), v, strict=True))
                         for k, v in list(self._keys.items())},
                "light": counters["recovery"]["light"], "drops": counters["drops"],
                "member": _member_digest(counters),
                **({"loop_error": self._error} if self._error else {})}

    def close(self) -> dict:
        self._stop = True
        self._thread.join(5)
        report = self.report()
        self._sub.close()
        self._cluster.shutdown()
        return report


@dataclass
class Fault:
    kind: str
    at: float                  # seconds into the run
    target: str
    recovered: float | None = None  # seconds until every stable publisher flushed again


@dataclass
class Flush:
    topic: str
    counter: int               # every message up to this one was published before the flush
    seconds: float             # how long it took
    ok: bool                   # False: FlushTimeout
    at: float                  # when it returned (seconds into the run)


@dataclass
class Run:
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    flushes: list[Flush] = field(default_factory=list)
    churned: int = 0
    joins: int = 0
    leaves: int = 0
    junk_sent: int = 0
    rss: dict = field(default_factory=dict)             # "mid"/"end" -> {pid: [what, kB]}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)


MEMBER_STATS = ("naks_sent", "nak_retries", "unrecoverable", "summaries_sent", "pushes",
                "datagrams_in", "handovers", "receive_leads")


def _member_digest(counters: dict) -> dict:
    """What says why a subscriber stopped getting a stream (shown for one that lags): its id
    and address, its agents and their view of it, held holes, a few counters."""
    rec = counters["recovery"]
    return {"id": counters["member"], "address": "%s:%d" % tuple(counters["address"]),
            "agents": rec["agents"], "gaps": rec["gaps"], "light": rec["light"],
            "senders_known": rec["senders_known"], "held_early_bytes": rec["held_early_bytes"],
            "backlog_bytes": counters["backlog_bytes"],
            "stats": {k: counters["stats"].get(k, 0) for k in MEMBER_STATS}}


def _payload(topic: str, n: int) -> bytes:
    return f"{topic}|{n}".encode()


class Workload:
    def __init__(self, seconds: float, topics: int, rate: float, seed: int, hosts) -> None:
        self.seconds, self.rate = seconds, rate
        self.rng = random.Random(seed)
        self.hosts = hosts  # LocalHosts
        self.run = Run()
        self.stop = threading.Event()
        self.cluster = scopecast.connect(address="auto")
        self.topics = [f"{STABLE}{i}" for i in range(topics)]
        self.cluster.create_topics(self.topics, policy="lan_multicast")
        self.counters = dict.fromkeys(self.topics, 0)
        self.nodes = self._nodes()
        # originals: two per host, for the whole run (those on the host that is lost die with it)
        self.where: dict[str, str] = {}  # subscriber -> its host's address
        self.originals = {f"orig{i}": self._recorder(f"orig{i}", ip) for i, ip in
                          enumerate(ip for ip in self.nodes for _ in range(2))}
        self.joiners: dict[str, object] = {}
        self.joined: dict[str, float] = {}  # joiner -> when (seconds into the run)
        self.killed: set[str] = set()
        self.left: dict[str, dict] = {}

    def _nodes(self) -> dict[str, str]:
        return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

    def _recorder(self, name: str, ip: str):
        """A Recorder on the host `ip`, started (None: the run stopped first). A host killed
        meanwhile leaves it unschedulable: its wait gives way to the stop, or ends in 120 s."""
        actor = ray.remote(num_cpus=0)(Recorder).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.nodes[ip], soft=False)
        ).remote([*self.topics, CHURN + "*"])
        started = actor.pid.remote()
        deadline = time.monotonic() + 120
        while not ray.wait([started], timeout=1.0)[0]:
            if self.stop.is_set() or time.monotonic() > deadline:
                ray.kill(actor)
                if self.stop.is_set():
                    return None
                raise TimeoutError(f"{name} did not start on {ip} within 120 s")
        ray.get(started)
        self.where[name] = ip
        return actor

    # ----------------------------------------------------------------------- the threads

    def publish(self, topic: str) -> None:
        """Paced publishing, a flush every two seconds (its counter is what must not be lost)."""
        gap = 1.0 / self.rate
        try:
            with self.cluster.publisher(topic) as pub:
                last_flush = time.monotonic()
                while not self.stop.is_set():
                    pub.publish(_payload(topic, self.counters[topic] + 1))
                    self.counters[topic] += 1
                    time.sleep(gap)
                    if time.monotonic() - last_flush >= 2.0:
                        self._flush(pub, topic)
                        last_flush = time.monotonic()
                self._flush(pub, topic)
        except Exception as exc:  # a check fails on it
            self._note("publish_errors", f"{topic}: {type(exc).__name__}: {exc}")

    def _flush(self, pub, topic: str) -> None:
        n, t0 = self.counters[topic], time.monotonic()
        try:
            pub.flush(timeout=FLUSH_TIMEOUT)
            ok = True
        except FlushTimeout:
            ok = False
        with self.run.lock:
            self.run.flushes.append(Flush(topic, n, round(time.monotonic() - t0, 3), ok,
                                          self.run.now()))

    def churn(self) -> None:
        """A topic made, published (and flushed), closed and deleted, every few seconds."""
        k = 0
        while not self.stop.wait(3.0):
            topic = f"{CHURN}{k}"
            k += 1
            policy = self.rng.choice(["lan_multicast", "tree", "chain"])
            try:
                self.cluster.create_topic(topic, policy=policy)
                with self.cluster.publisher(topic) as pub:
                    for n in range(1, 101):
                        pub.publish(_payload(topic, n))
                    pub.flush(timeout=60)
                self.cluster.delete_topic(topic)
                self.run.churned += 1
            except Exception as exc:  # reported: a churn step that failed is a finding
                self._note("churn_errors", f"{topic}: {type(exc).__name__}: {exc}")

    def joins_and_leaves(self) -> None:
        """A subscriber joins on a random host every few seconds; then the oldest other one leaves."""
        i = 0
        while not self.stop.wait(4.0):
            try:
                self.nodes = self._nodes()
                name = f"join{i}"
                i += 1
                joiner = self._recorder(name, self.rng.choice(list(self.nodes)))
                if joiner is None:
                    break
                if self.stop.is_set():  # (the run ended meanwhile: nothing to join)
                    ray.get(joiner.close.remote(), timeout=60)
                    break
                self.joiners[name] = joiner
                self.joined[name] = self.run.now()
                self.run.joins += 1
                # (two at most: on a loaded machine a join can take 15 s, and a short run
                # still sees leaves)
                alive = [n for n in self.joiners if n not in self.killed and n not in self.left]
                if len(alive) > 1:
                    old = alive[0]
                    self.left[old] = ray.get(self.joiners[old].close.remote(), timeout=60)
                    self.run.leaves += 1
            except Exception as exc:
                self._note("join_errors", f"{type(exc).__name__}: {exc}")

    def junk(self) -> None:
        """Random datagrams (and truncated headers) at every member's socket, 50 a second."""
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        targets: list[tuple[str, int]] = []
        refreshed = 0.0
        while not self.stop.wait(0.02):
            if time.monotonic() - refreshed > 5.0:
                with contextlib.suppress(Exception):
                    targets = [(h, int(p)) for s_ in walk(self.cluster.status(topics=False))
                               for m in s_.get("members", [])
                               for h, p in [m["address"].rsplit(":", 1)]]
                refreshed = time.monotonic()
            for address in targets:
                n = self.rng.randrange(1, 1500)
                with contextlib.suppress(OSError):
                    s.sendto(os.urandom(n), address)
                    self.run.junk_sent += 1

    def faults(self) -> None:
        """Each kind in turn at a random moment of its slot, until the run's last fifth."""
        kinds = list(FAULTS)
        slot = (self.seconds * 0.75 - 10) / max(len(kinds), 1)
        rounds = max(1, int(slot // 20))  # a 10-minute run: every kind several times
        slot /= rounds
        t = 10.0
        for _ in range(rounds):
            for kind in kinds:
                at = t + self.rng.uniform(0.1, 0.6) * slot
                t += slot
                if self.stop.wait(max(0.0, at - self.run.now())):
                    return
                try:
                    target = getattr(self, f"_kill_{kind}")()
                except Exception as exc:
                    target = f"failed: {type(exc).__name__}: {exc}"
                fault = Fault(kind, self.run.now(), target)
                _say(f"{fault.at:.1f} s: {kind} fault ({target})")
                self.run.faults.append(fault)
                threading.Thread(target=self._recovered, args=(fault,), daemon=True).start()

    def _recovered(self, fault: Fault) -> None:
        """When every stable publisher has flushed successfully since the fault."""
        while not self.stop.wait(0.5):
            with self.run.lock:
                done = {f.topic for f in self.run.flushes if f.ok and f.at - f.seconds > fault.at}
            if done >= set(self.topics):
                fault.recovered = round(self.run.now() - fault.at, 2)
                _say(f"{self.run.now():.1f} s: every publisher flushed again, "
                     f"{fault.recovered:.1f} s after the {fault.kind} fault")
                return

    # ------------------------------------------------------------------------- the kills

    def _status(self) -> dict:
        return self.cluster.status(topics=False)

    def _kill_member(self) -> str:
        deadline = time.monotonic() + 20
        while not (alive := [n for n in self.joiners
                             if n not in self.killed and n not in self.left]):
            if time.monotonic() > deadline or self.stop.wait(0.5):
                return "failed: no joiner to kill"
        name = self.rng.choice(alive)
        pid = ray.get(self.joiners[name].pid.remote(), timeout=30)
        os.kill(pid, signal.SIGKILL)
        self.killed.add(name)
        return f"{name} pid {pid}"

    def _kill_agent_host(self) -> str:
        pids = [p for p in _pids_titled("ray::AgentHost")]
        if not pids:
            return "none running"
        pid = self.rng.choice(pids)
        os.kill(pid, signal.SIGKILL)
        return f"pid {pid}"

    def _kill_host_scope(self) -> str:
        scopes = [s for s in walk(self._status()) if s.get("kind") == "host" and "pid" in s]
        s = self.rng.choice(scopes)
        os.kill(s["pid"], signal.SIGKILL)
        return f"{s['path']} pid {s['pid']}"

    def _kill_root(self) -> str:
        root = next(s for s in walk(self._status()) if s["path"] == "/")
        os.kill(root["pid"], signal.SIGKILL)
        return f"/ pid {root['pid']}"

    def _kill_host(self) -> str:
        """The last host dies (every process, -9) and comes back 10 s later as a new Ray node
        (its link is outside this namespace: `benchmarks.chaos` restarts it when asked)."""
        host = self.hosts.hosts[-1]
        self.killed |= {n for n, ip in self.where.items() if ip == host.address}
        self.hosts.kill_host(host)
        threading.Timer(10.0, print, (f"restart {host.name}",), {"flush": True}).start()
        return host.name

    def _note(self, what: str, line: str) -> None:
        with self.run.lock:
            self.run.__dict__.setdefault(what, []).append(line)

    # ------------------------------------------------------------------------- the run

    def rss(self, when: str) -> None:
        """RSS of every scopecast process: the driver, subscribers, scope managers, agent hosts."""
        out = {}
        for title in ("ray::Recorder", "ray::ScopeManager", "ray::AgentHost",
                      "ray::ClusterScopeManager"):
            for pid in _pids_titled(title):
                out[pid] = [title.split("::")[1], _rss_kb(pid)]
        out[os.getpid()] = ["driver", _rss_kb(os.getpid())]
        self.run.rss[when] = out

    def go(self) -> dict:
        threads = [threading.Thread(target=self.publish, args=(t,), daemon=True, name=f"publish {t}")
                   for t in self.topics]
        threads += [threading.Thread(target=f, daemon=True, name=f.__name__)
                    for f in (self.churn, self.joins_and_leaves, self.junk, self.faults)]
        for t in threads:
            t.start()
        mid = max(self.seconds - 300.0, self.seconds / 2)
        time.sleep(mid)
        self.rss("mid")
        time.sleep(self.seconds - mid)
        self.rss("end")
        self.stop.set()
        _say(f"{self.run.now():.1f} s: stopping")
        deadline = time.monotonic() + FLUSH_TIMEOUT + 30  # (for them all, not each)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        frames = sys._current_frames()
        for t in threads:
            if t.is_alive():  # what it was doing says which step hung
                where = "".join(traceback.format_stack(frames[t.ident])[-4:])
                _say(f"{t.name} still running after the stop:\n{where}")
        return self.collect(hung)

    def collect(self, hung: list[str]) -> dict:
        """Wait until every live subscriber has every stable topic's last message (or 120 s)."""
        live = {n: a for n, a in [*self.originals.items(), *self.joiners.items()]
                if n not in self.killed and n not in self.left}
        _say(f"{self.run.now():.1f} s: stopped; waiting for the subscribers")
        deadline = time.monotonic() + 120
        while True:
            reports = {}
            for n, a in live.items():
                try:
                    reports[n] = ray.get(a.report.remote(), timeout=30)
                except Exception as exc:
                    reports[n] = {"error": f"{type(exc).__name__}: {exc}"}
            recent = {n for n, at in self.joined.items() if at > self.seconds - JOINED_LATE}
            if all(_has_all(r, self.counters, partial=n in recent) for n, r in reports.items()) \
                    or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        in_scopes: list[str] = []  # (a subscriber that lags: is it still a member?)
        with contextlib.suppress(Exception):
            in_scopes = sorted(m["address"] for s in walk(self._status())
                               for m in s.get("members", []))
        for a in live.values():
            with contextlib.suppress(Exception):
                ray.get(a.close.remote(), timeout=30)
        run = self.run
        return {"seconds": self.seconds, "published": self.counters, "subscribers": reports,
                "originals": sorted(self.originals), "joined": self.joined,
                "killed": sorted(self.killed),
                "left": self.left, "hung": hung, "faults": [asdict(f) for f in run.faults],
                "flushes": [asdict(f) for f in run.flushes], "churned": run.churned, "joins": run.joins,
                "leaves": run.leaves, "junk_sent": run.junk_sent, "rss": run.rss,
                "errors": {k: v for k, v in run.__dict__.items() if k.endswith("_errors")},
                "counters": _drops(self.cluster, reports), "scope_members": in_scopes}


def _say(line: str) -> None:
    print(f"[chaos] {line}", flush=True)


def _has_all(report: dict, counters: dict[str, int], partial: bool = False) -> bool:
    """Whether a subscriber has every stable topic's last message (`partial`, a joiner of the
    run's last seconds: of the topics it met)."""
    if "error" in report:
        return True  # (nothing more will come)
    last = {k.split("|")[0]: v["last"] for k, v in report["keys"].items()}
    return all(last.get(t, 0) >= n for t, n in counters.items() if not partial or t in last)


def _drops(cluster, reports: dict) -> dict:
    """Datagrams the driver's members and the live subscribers dropped, by reason (the junk
    among them), summed."""
    total: dict[str, int] = {}
    drops = [r.get("drops", {}) for r in reports.values()]
    with contextlib.suppress(Exception):
        drops += [c["drops"] for c in cluster.counters().values()]
    for d in drops:
        for reason, n in d.items():
            total[reason] = total.get(reason, 0) + n
    return total


def _pids_titled(title: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(title.encode()):
                        out.append(int(pid))
    return out


def _rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    return 0


def main() -> None:
    from scopecast.ray_cluster.local_hosts import LocalHosts

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--topics", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0, help="messages/s per stable topic")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    work = Workload(args.seconds, args.topics, args.rate, args.seed,
                    LocalHosts.existing(args.prefix))
    print("running", flush=True)
    print(json.dumps(work.go()), flush=True)
    os._exit(0)  # (threads of killed actors' handles must not hold the exit)


if __name__ == "__main__":
    main()
