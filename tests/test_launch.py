"""`scopecast up` / `scopecast down`: a persistent local cluster other commands attach to."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import psutil
import pytest

from scopecast.ray_cluster.cluster import WORKER_REGISTER_TIMEOUT

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(pid: int) -> list:
    """The TCP sockets process `pid` listens on ([] if it is gone)."""
    try:
        return [c for c in psutil.Process(pid).net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def _other_address() -> str | None:
    """An IPv4 address of this host that is not loopback (None: it has none)."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


# a method of each Ray service a head process serves: its auth check runs before the call
_RAY_METHODS = ("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
                "/ray.rpc.NodeManagerService/GetNodeStats", "/ray.rpc.ObjectManagerService/Pull",
                "/ray.rpc.CoreWorkerService/GetCoreWorkerStats",
                "/ray.rpc.ReporterService/ReportOCMetrics", "/ray.rpc.RayletDriver/ClusterInfo")


def _answer_to_stranger(ip: str, port: int) -> str:
    """What the server at ip:port does with a request that carries no Ray token: "refused" (HTTP
    401 or gRPC UNAUTHENTICATED), "metrics" (Prometheus text, read-only), or what it said."""
    import grpc  # Ray's own dependency

    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5) as r:
            body = r.read(4096).decode(errors="replace")
        if body.startswith("# HELP") or body.startswith("# TYPE"):
            return "metrics"
        return f"HTTP {r.status}: {body[:80]!r}"
    except urllib.error.HTTPError as e:
        if e.code == 401:
            return "refused"
    except (OSError, ValueError, http.client.HTTPException):
        pass  # not HTTP/1.1: gRPC
    codes = []
    with grpc.insecure_channel(f"{ip}:{port}") as channel:
        for method in _RAY_METHODS:
            try:
                channel.unary_unary(method)(b"", timeout=5)
                codes.append("OK")
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    return "refused"
                codes.append(e.code().name)
    return f"gRPC {codes}"


def test_up_then_commands_attach_then_down_removes_it(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SCOPECAST_HOME"] = str(tmp_path)

    def scopecast(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "scopecast.cli", *args], env=env,
                              capture_output=True, text=True, timeout=180)

    # a process that names the same address (another driver attached to some-host:<port>, a
    # tool with it in its arguments) is none of up's business: down --ray leaves it alone
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                              f"other-host:{port}", f"127.0.0.1:{port}"])
    try:
        up = scopecast("up", "--port", str(port))
        assert up.returncode == 0, up.stderr
        assert "started a local Ray head" in up.stdout
        # Ray waits for its workers as long as an embedded Ray does (a small loaded machine)
        (config,) = [arg.split("=", 1)[1] for p in psutil.process_iter(["cmdline"])
                     if f"--gcs_server_port={port}" in (args := p.info["cmdline"] or [])
                     for arg in args if arg.startswith("--config_list=")]
        assert json.loads(base64.b64decode(config))["worker_register_timeout_seconds"] == \
            WORKER_REGISTER_TIMEOUT
        address = f"127.0.0.1:{port}"
        # Ray 2.60 listens on every interface whatever --node-ip-address says; the token up
        # turns on is what keeps another host out: from this host's other address, every port of
        # the head's processes refuses a request without it, the read-only metrics aside
        record = json.loads((tmp_path / "up.json").read_text())
        other = _other_address()
        exposed = {(ip, c.laddr.port) for p, _t in record["pids"]
                   if psutil.pid_exists(p) for c in _listening(p)
                   if (ip := c.laddr.ip.removeprefix("::ffff:")) not in ("127.0.0.1", "::1")}
        if other is not None:
            assert exposed
            answers = {port_: _answer_to_stranger(other if ip in ("0.0.0.0", "::") else ip, port_)
                       for ip, port_ in exposed}
            assert set(answers.values()) <= {"refused", "metrics"}, answers
            assert "refused" in answers.values()
        assert f"attach with: scopecast status --address {address}" in up.stdout  # (run below)
        # the attach line's environment is enough for a plain Ray driver too
        (line,) = [x for x in up.stdout.splitlines() if x.startswith("attach with:")]
        ray_env = dict(kv.split("=", 1) for kv in line.rsplit("|", 1)[1].split())
        assert ray_env["RAY_ADDRESS"] == address
        plain = subprocess.run([sys.executable, "-c", "import ray; ray.init(); "
                                "print(ray.cluster_resources()['CPU'])"],
                               env={**env, **ray_env}, capture_output=True, text=True, timeout=120)
        assert plain.returncode == 0 and float(plain.stdout.split()[-1]) > 0, plain.stderr[-2000:]
        again = scopecast("up", "--port", str(port))  # idempotent: reuses what is there
        assert again.returncode == 0 and "started" not in again.stdout
        assert scopecast("topic", "create", "kept", "--address", address).returncode == 0
        status = json.loads(scopecast("status", "--json", "--address", address).stdout)
        assert [t["name"] for t in status["topics"]] == ["kept"]
        assert status["manager"]["state"] == str(tmp_path / "state.db")
        down = scopecast("down", "--ray", "--address", address)
        assert down.returncode == 0, down.stderr
        assert "removed 3 scopecast actors" in down.stdout  # cluster, LAN and host scopes
        assert decoy.poll() is None, "down --ray killed a process it did not start"
    finally:
        decoy.kill()
        decoy.wait()
        left = [p for p in psutil.process_iter(["cmdline"])
                if f":{port}" in " ".join(p.info["cmdline"] or []) and p.pid != decoy.pid]
        for p in left:
            p.kill()
    assert not left, "down --ray left processes of the head behind"
    after = scopecast("status", "--address", f"127.0.0.1:{port}")
    assert after.returncode == 1 and "NotConnected" in after.stderr
