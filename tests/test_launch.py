"""`scopecast up` / `scopecast down`: a persistent local cluster other commands attach to."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys

import psutil
import pytest

from scopecast.ray_cluster.cluster import WORKER_REGISTER_TIMEOUT

pytestmark = pytest.mark.ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
