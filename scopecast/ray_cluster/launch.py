"""`scopecast up` and `scopecast down`: a persistent local cluster (a Ray head started with
`ray start`, plus the scope managers) that later commands and drivers attach to, or scopecast
deployed onto an existing Ray cluster; and its removal. A head `up` starts runs Ray's dashboard
(the Jobs API `scopecast pipeline` uses); `$SCOPECAST_HOME/up.json` records its address, its
dashboard and the Python it runs."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import ray

from scopecast.actors import declare, ray_private
from scopecast.actors.errors import NotConnected, ScopecastError
from scopecast.ray_cluster.cluster import (
    RAY_CURRENT_CLUSTER,
    attach_ray,
    connect,
    embedded_ray_options,
    local_ray_address,
    reachable,
)
from scopecast.scopes.state import state_path

log = logging.getLogger(__name__)

DEFAULT_PORT = 6390  # not Ray's 6379, which a Redis server on the same machine may hold


def record_path() -> Path:
    """Where `up` records the local cluster it started (read by `scopecast pipeline` too)."""
    return state_path().parent / "up.json"


def up(address: str | None = None, port: int = DEFAULT_PORT, mac: str = "gmac",
       encrypt: bool = False,
       trusted_keys: list[str] | None = None, datagram_bytes: int | None = None,
       settings: dict | None = None, levels: list[str] | None = None,
       max_message_bytes: int | None = None) -> dict:
    """Deploy scopecast onto the Ray cluster at `address`, or start a local Ray head on `port`
    (loopback only) and deploy onto it. Idempotent: an existing deployment is reused.
    `trusted_keys` (public key files) make it accept only plug-ins signed by one of them;
    `datagram_bytes`, `max_message_bytes`, `settings` and `levels`: see `connect`."""
    started_ray = False
    interface = None  # on a real cluster every member uses its own node's address
    if address is None:
        address = f"127.0.0.1:{port}"
        interface = "127.0.0.1"
        if not reachable(address):
            _start_head(port)
            started_ray = True
    cluster = connect(address=address, start=True, mac=mac, encrypt=encrypt, interface=interface,
                      trusted_keys=trusted_keys, datagram_bytes=datagram_bytes,
                      settings=settings, levels=levels, max_message_bytes=max_message_bytes)
    try:
        status = cluster.status()
        # a head up started is attached to where it was asked for (loopback), not at the
        # address Ray reports for its node (the host's first interface)
        info = {"address": address if interface else cluster.address, "started_ray": started_ray,
                # what a plain Ray driver must set to attach (scopecast's own commands do it)
                "ray_auth": os.environ.get("RAY_AUTH_MODE", "disabled").lower(),
                "session_dir": ray_private.session_dir(), "cluster_id": status["cluster_id"],
                "state": status["manager"]["state"],
                # what `scopecast pipeline` needs: the Jobs API's address, and the Python the
                # head (hence a job's driver) runs
                "dashboard": _dashboard_url(wait=30.0 if started_ray else 0.0),
                "python": sys.executable if started_ray else None}
    finally:
        cluster.shutdown()
    if started_ray:
        # what `down --ray` stops, and nothing else: these processes and that session's
        info["pids"] = _session_processes(info["session_dir"])
        record_path().write_text(json.dumps(info))
    return info


def state_files() -> list[Path]:
    """What `reset` removes: the root scope's state database (and its WAL files) and the record
    of the cluster `up` started, where they exist."""
    db = state_path()
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), record_path()]
    return [f for f in files if f.exists()]


def reset() -> list[Path]:
    """Remove `state_files()` (topics, sessions, members, plug-ins and the cluster key of a
    persistent cluster); refused while the cluster `up` recorded still answers."""
    record = record_path()
    if record.exists():
        try:
            address = json.loads(record.read_text()).get("address")
        except (OSError, ValueError):
            address = None
        if address and reachable(address):
            raise ScopecastError(f"the cluster `scopecast up` started is running at {address}: "
                                 "stop it first (`scopecast down --ray`), then reset")
    removed = state_files()
    for f in removed:
        f.unlink(missing_ok=True)
    return removed


def down(address: str | None = None, stop_ray: bool = False) -> dict:
    """Remove every scopecast actor (and nothing else) from the cluster; with `stop_ray`, also
    stop the local Ray head that `up` started (only that one)."""
    removed = []
    try:
        attach_ray(address, start=False)
    except NotConnected:
        if not stop_ray:
            raise
    else:
        from ray.util import list_named_actors

        names = sorted(e["name"] for e in list_named_actors(all_namespaces=True)
                       if e.get("namespace") == declare.NAMESPACE)
        # the root first, so that it deploys no scope while the others go
        for name in sorted(names, key=lambda n: n != declare.CLUSTER_SCOPE_MANAGER):
            ray.kill(declare.find(name), no_restart=True)
            removed.append(name)
        ray.shutdown()
    stopped = _stop_head() if stop_ray else 0
    return {"removed_actors": sorted(removed), "stopped_ray_processes": stopped}


def _head_environment(ray_bin: Path) -> dict:
    """The environment `ray start` runs in: Ray's token authentication on, with a token made by
    Ray's own `ray get-auth-token --generate` where none exists yet (~/.ray/auth_token, where every
    Ray driver and tool of this user finds it). Ray 2.60 cannot bind its gRPC servers, agents and
    workers to loopback (they listen on every interface, whatever --node-ip-address says), so the
    token is what keeps another host out: without it every port but the read-only metrics
    endpoint refuses the request. An explicit RAY_AUTH_MODE is the user's choice and kept."""
    env = dict(os.environ)
    mode = env.get("RAY_AUTH_MODE")
    if mode is not None:
        if mode.lower() != "token":
            log.warning("RAY_AUTH_MODE=%s: the Ray head answers anyone who can reach this host's "
                        "addresses (Ray listens on all of them)", mode)
        return env
    env["RAY_AUTH_MODE"] = "token"
    if not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
        made = subprocess.run([str(ray_bin), "get-auth-token", "--generate"], env=env,
                              capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            raise ScopecastError("could not make a Ray authentication token "
                                 f"(`ray get-auth-token --generate`): {made.stderr[-1000:]}")
    return env


def _start_head(port: int) -> None:
    opts = embedded_ray_options()
    ray_bin = Path(sys.executable).parent / "ray"
    env = _head_environment(ray_bin)
    # the dashboard serves Ray's Jobs API (`scopecast pipeline`): on loopback, on the first free
    # port from 8265 (Ray's choice), its agent on any free port (a fixed one may be taken by
    # another Ray on this machine, which would silently disable job submission)
    cmd = [str(ray_bin), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
           f"--num-cpus={opts['num_cpus']}", f"--object-store-memory={opts['object_store_memory']}",
           "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           "--dashboard-agent-listen-port=0", "--disable-usage-stats",
           f"--system-config={json.dumps(opts['_system_config'])}"]  # (a hidden flag of Ray's)
    log.info("starting a local Ray head: %s", " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    if out.returncode != 0:
        raise ScopecastError(f"`ray start` failed ({out.returncode}): {out.stderr[-2000:]}")


def _dashboard_url(wait: float = 0.0) -> str | None:
    """The URL of the Ray dashboard of the cluster this process is attached to (None if it runs
    none), waiting up to `wait` seconds for a dashboard that is still starting."""
    deadline = time.monotonic() + wait
    while True:
        url = ray_private.dashboard_url()
        if url or time.monotonic() >= deadline:
            return (url if "://" in url else f"http://{url}") if url else None
        time.sleep(0.5)


def _session_processes(session_dir: str) -> list[list]:
    """[pid, start time] of the processes of the Ray session in `session_dir` (those that name
    it on their command line, and their children: Ray's workers rename themselves)."""
    return [[p.pid, p.create_time()] for p in _session_victims(session_dir, []).values()]


def _session_victims(session_dir: str, recorded: list) -> dict[int, psutil.Process]:
    """The processes of one Ray session: `recorded` ([pid, start time], still the same
    processes), those whose command line or output (Ray's client server names only the port,
    and logs into the session) names `session_dir`, and their children."""
    found: dict[int, psutil.Process] = {}
    for pid, started in recorded:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - started) < 1.0:  # (not a later process given its pid)
                found[pid] = proc
        except psutil.Error:
            pass
    if session_dir:
        # the directory itself or a path in it (not another session's whose name extends it)
        named = re.compile(re.escape(session_dir.rstrip("/")) + r"(?![\w.-])")
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.info["pid"] != os.getpid() and any(
                    named.search(arg) for arg in (*(proc.info["cmdline"] or ()),
                                                  *_outputs(proc.pid))):
                found[proc.pid] = proc
    for proc in list(found.values()):
        try:
            found.update((c.pid, c) for c in proc.children(recursive=True))
        except psutil.Error:
            pass
    found.pop(os.getpid(), None)
    return found


def _outputs(pid: int) -> list[str]:
    """Where a process's standard output and error go (Linux)."""
    out = []
    for fd in (1, 2):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return out


def _stop_head() -> int:
    """Kill the processes of the Ray head `up` started: those it recorded, and any other of
    that Ray session (named by its session directory, which no other session shares). Nothing
    is matched by address or port: another driver or tool may name the same port. Returns how
    many it killed."""
    path = record_path()
    if not path.exists():
        return 0
    info = json.loads(path.read_text())
    victims = _session_victims(info.get("session_dir") or "", info.get("pids") or [])
    killed = 0
    for proc in victims.values():
        try:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        except psutil.Error:
            pass
    path.unlink()
    # like `ray stop`: forget the head's address, or the next ray.init() would try to attach to it
    if local_ray_address() == info["address"]:
        Path(RAY_CURRENT_CLUSTER).unlink(missing_ok=True)
    return killed
