"""Several Ray hosts on one machine: each host a network namespace with its own address, hosts of a
LAN on one Linux bridge, LANs joined by a routed namespace.

Layout for `LocalHosts(hosts=N, lans=K, prefix=P)` (root only)::

    namespace P-h<i>   eth0 10.<net>.<lan>.<i>/24, default route via 10.<net>.<lan>.254
    bridge    P-br<lan>  (multicast snooping off: every port of the LAN hears every group)
    namespace P-rt     one leg 10.<net>.<lan>.254/24 per LAN, IPv4 forwarding on; no multicast
                       routing, so IP multicast stays inside its LAN and unicast crosses LANs

Host 1 runs the Ray head, the others `ray start --address`; every node is labelled
`scopecast-lan=lan<k>`, has a temp dir of its own (and in it a SCOPECAST_HOME of its own, as a
machine has its own disk: a root Ray restarts on another host does not find the state file it
wrote), token authentication off (Ray turns it on when
~/.ray/auth_token exists, and nodes started here would not share it) and the GCS's node health
check tuned so that a dead host is declared dead in seconds (HEALTH_CHECK). What was made is
written to `<state dir>/<prefix>.json` before it is made, so `down()` removes it all, also after
a crash half-way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scopecast.actors.errors import InvalidConfig, ScopecastError
from scopecast.ray_cluster.cluster import NODE_IPS_ENV
from scopecast.scopes.cluster_manager import LAN_LABEL

RAY_PORT = 6379
HEALTH_CHECK = {  # GCS: probe every second, dead after 3 missed probes (Ray's default: ~30 s)
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
MAX_HOSTS = 200
CPUS_PER_HOST = 4  # logical: more than the cores, as for an embedded Ray (Spark's executors and
                   # scopecast's actors must not starve each other)


class LocalHostsError(ScopecastError):
    """The namespaces, bridges or Ray nodes of a local multi-host cluster could not be made."""


@dataclass(frozen=True)
class Host:
    name: str        # its network namespace
    lan: int
    address: str
    gateway: str


def state_dir() -> Path:
    home = os.environ.get("SCOPECAST_HOME") or os.path.expanduser("~/.scopecast")
    return Path(home) / "local-hosts"


class LocalHosts:
    """N hosts in K LANs on this machine (see module docstring)."""

    def __init__(self, hosts: int = 3, lans: int = 1, prefix: str = "sc", net: int = 77,
                 python: str | None = None) -> None:
        if not 1 <= lans <= hosts <= MAX_HOSTS:
            raise InvalidConfig(f"need 1 <= lans <= hosts <= {MAX_HOSTS}; got hosts={hosts}, "
                             f"lans={lans}")
        if not prefix.isalnum() or len(prefix) > 6:
            raise InvalidConfig("prefix: up to 6 letters or digits (interface names are short)")
        if not 0 <= net <= 255:
            raise InvalidConfig("net: the second octet of 10.<net>.<lan>.<host>, 0..255")
        self.prefix = prefix
        self.lans = lans
        self.net = net
        self.python = python or sys.executable
        self.hosts = [Host(f"{prefix}-h{i}", lan, f"10.{net}.{lan}.{i}", f"10.{net}.{lan}.254")
                      for i, lan in enumerate(self._lan_of(hosts, lans), 1)]
        self.router = f"{prefix}-rt"
        self.state = state_dir() / f"{prefix}.json"

    @staticmethod
    def _lan_of(hosts: int, lans: int) -> list[int]:
        """Hosts in consecutive blocks per LAN: 3 hosts in 2 LANs are 1, 1, 2."""
        return [i * lans // hosts + 1 for i in range(hosts)]

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def address(self) -> str:
        """The Ray address of the head (reachable from inside any of the hosts)."""
        return f"{self.head.address}:{RAY_PORT}"

    def bridge(self, lan: int) -> str:
        return f"{self.prefix}-br{lan}"

    # ------------------------------------------------------------------------------ up

    def up(self, progress=print) -> dict:
        """Make the network and start a Ray node per host; a description of what runs."""
        _check_root()
        if self.state.exists():
            raise LocalHostsError(f"a local cluster {self.prefix!r} exists already ({self.state}); "
                                  "remove it first: scopecast cluster local --down")
        self.state.parent.mkdir(parents=True, exist_ok=True)
        self._write_state()  # before anything is made: down() finds even a half-made cluster
        try:
            self._network()
            progress(f"network: {len(self.hosts)} hosts in {self.lans} LAN(s), router "
                     f"{self.router}")
            for host in self.hosts:
                self._start_ray(host)
                progress(f"ray node on {host.name} ({host.address}, lan{host.lan}) started")
        except BaseException:
            self.down(quiet=True)
            raise
        return self.describe()

    def describe(self) -> dict:
        return {"prefix": self.prefix, "address": self.address, "router": self.router,
                "hosts": [asdict(h) for h in self.hosts],
                "bridges": [self.bridge(k) for k in range(1, self.lans + 1)],
                "exec": f"{self._command()} exec -- CMD", "down": f"{self._command()} --down"}

    def _command(self) -> str:
        return "scopecast cluster local" + ("" if self.prefix == "sc" else f" --prefix {self.prefix}")

    def _write_state(self) -> None:
        self.state.write_text(json.dumps({"hosts": len(self.hosts), "lans": self.lans,
                                          "prefix": self.prefix, "net": self.net,
                                          "python": self.python}))

    def _network(self) -> None:
        for k in range(1, self.lans + 1):
            br = self.bridge(k)
            _ip("link", "add", br, "type", "bridge", "mcast_snooping", "0")
            _ip("link", "set", br, "up")
        _ip("netns", "add", self.router)
        _ip("-n", self.router, "link", "set", "lo", "up")
        _run(in_netns(self.router, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]))
        for k in range(1, self.lans + 1):
            self._leg(self.router, f"{self.prefix}-r{k}", f"lan{k}", k, f"10.{self.net}.{k}.254")
        for host in self.hosts:
            _ip("netns", "add", host.name)
            _ip("-n", host.name, "link", "set", "lo", "up")
            self._leg(host.name, self._veth(host), "eth0", host.lan, host.address)
            _ip("-n", host.name, "route", "add", "default", "via", host.gateway)

    def _leg(self, netns: str, outside: str, inside: str, lan: int, address: str) -> None:
        """A veth pair from bridge `lan` into `netns`, addressed inside."""
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", netns)
        _ip("link", "set", outside, "master", self.bridge(lan), "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", inside)
        _ip("-n", netns, "link", "set", inside, "up")

    def _temp_dir(self, host: Host) -> str:
        return f"/tmp/scopecast-{host.name}"

    def home(self, host: Host) -> str:
        """The SCOPECAST_HOME of the processes Ray runs on `host` (its own disk)."""
        return f"{self._temp_dir(host)}/home"

    def _start_ray(self, host: Host) -> None:
        ray = str(Path(self.python).with_name("ray"))
        cmd = [ray, "start", "--node-ip-address", host.address,
               "--temp-dir", self._temp_dir(host), "--disable-usage-stats",
               "--object-store-memory", str(512 << 20), "--num-cpus", str(CPUS_PER_HOST),
               "--labels", f"{LAN_LABEL}=lan{host.lan}"]
        if host is self.head:
            cmd += ["--head", "--port", str(RAY_PORT), "--dashboard-host", "0.0.0.0"]
        else:
            cmd += ["--address", self.address]
        out = self.run(host, cmd, capture=True,
                       extra_env={**HEALTH_CHECK, "SCOPECAST_HOME": self.home(host)})
        if out.returncode != 0:
            raise LocalHostsError(f"ray start on {host.name} failed ({out.returncode}):\n"
                                  f"{out.stdout[-2000:]}{out.stderr[-2000:]}")

    # ----------------------------------------------------------------------------- use

    def env(self, extra: dict | None = None) -> dict:
        """The environment of a process inside a host: this cluster's Ray, no token auth, and
        where each host's Ray node is (a driver attaches to its own host's: see
        cluster.namespace_node_ip)."""
        env = dict(os.environ, RAY_ADDRESS=self.address, RAY_AUTH_MODE="disabled")
        nodes = self.node_ips()
        if nodes:
            env[NODE_IPS_ENV] = nodes
        env.update(extra or {})
        return env

    def node_ips(self) -> str:
        """NODE_IPS_ENV's value: "inode=address" per host whose namespace exists."""
        out = []
        for host in self.hosts:
            try:
                out.append(f"{os.stat(f'/run/netns/{host.name}').st_ino}={host.address}")
            except OSError:
                continue
        return ",".join(out)

    def run(self, host: Host, cmd: list[str], capture: bool = False,
            extra_env: dict | None = None, timeout: float | None = 300.0):
        """Run `cmd` inside `host`'s namespace (to completion)."""
        return subprocess.run(in_netns(host.name, cmd), env=self.env(extra_env),
                              capture_output=capture, text=True, timeout=timeout)

    def popen(self, host: Host, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` inside `host`'s namespace."""
        kwargs.setdefault("env", self.env())
        return subprocess.Popen(in_netns(host.name, cmd), **kwargs)

    def kill_host(self, host: Host) -> int:
        """kill -9 every process of `host` (its raylet, workers, actors): a host that died."""
        pids = _pids(host.name)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        return len(pids)

    def cut_host(self, host: Host) -> None:
        """Take `host`'s link to its bridge down: it runs on, unreachable (a cut cable)."""
        _ip("link", "set", self._veth(host), "down")

    def block_multicast(self, host: Host, blocked: bool = True) -> None:
        """The bridge stops (or resumes) flooding IP multicast to `host`'s port, as networks
        that forbid multicast do; unicast passes as before."""
        _ip("link", "set", "dev", self._veth(host), "type", "bridge_slave", "mcast_flood",
            "off" if blocked else "on")

    def restart_host(self, host: Host) -> None:
        """A cut or killed host back: its leftover processes killed, its link up, a fresh Ray
        node (a new node id) joined to the head."""
        self.kill_host(host)
        _ip("link", "set", self._veth(host), "up")
        self._start_ray(host)

    def _veth(self, host: Host) -> str:
        return f"{self.prefix}-v{self.hosts.index(host) + 1}"

    # ---------------------------------------------------------------------------- down

    def down(self, quiet: bool = False) -> list[str]:
        """Stop every process in the namespaces and remove namespaces, bridges and temp dirs;
        what was removed."""
        _check_root()
        removed = []
        names = [h.name for h in self.hosts] + [self.router]
        for name in names:  # TERM first (Ray writes its logs), then KILL what is left
            for pid in _pids(name):
                _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while any(_pids(n) for n in names) and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in names:
            for pid in _pids(name):
                _signal(pid, signal.SIGKILL)
            if name in _netns_names():
                _ip("netns", "del", name)
                removed.append(f"namespace {name}")
        links = _link_names()
        # a veth goes with its namespace, but the kernel may keep a deleted namespace (and so
        # the veth's outside end) a while after its last process: removed here, or the next
        # up() of this prefix finds the name taken
        legs = [self._veth(h) for h in self.hosts] + [f"{self.prefix}-r{k}"
                                                     for k in range(1, self.lans + 1)]
        for leg in [n for n in legs if n in links]:
            try:
                _ip("link", "del", leg)
                removed.append(f"link {leg}")
            except LocalHostsError:  # gone meanwhile, with its namespace
                if leg in _link_names():
                    raise
        for k in range(1, self.lans + 1):
            if self.bridge(k) in links:
                _ip("link", "del", self.bridge(k))
                removed.append(f"bridge {self.bridge(k)}")
        for host in self.hosts:
            shutil.rmtree(self._temp_dir(host), ignore_errors=True)
        self.state.unlink(missing_ok=True)
        if not quiet:
            print("removed: " + (", ".join(removed) or "nothing (no such cluster)"))
        return removed

    @classmethod
    def existing(cls, prefix: str = "sc") -> LocalHosts:
        """The cluster `up()` made with this prefix (from its state file)."""
        path = state_dir() / f"{prefix}.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise LocalHostsError(f"no local cluster {prefix!r} (no {path}); start one: "
                                  "scopecast cluster local --hosts N") from None
        return cls(state["hosts"], state["lans"], state["prefix"], state["net"], state["python"])


def in_netns(netns: str, cmd: list[str]) -> list[str]:
    """`cmd` run inside network namespace `netns` ("": this process's own)."""
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def _check_root() -> None:
    if os.geteuid() != 0:
        raise LocalHostsError("a local multi-host cluster needs root (network namespaces, "
                              "bridges): run as root, or use an embedded cluster")
    if shutil.which("ip") is None:
        raise LocalHostsError("`ip` not found: install iproute2 (apt-get install iproute2)")


def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise LocalHostsError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _link_names() -> set[str]:
    """Interfaces of this namespace ("5: sc-v1@if2: <...>" -> "sc-v1")."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
