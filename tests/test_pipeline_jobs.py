"""`scopecast pipeline`: scripts run as Ray jobs on a cluster `scopecast up` started.

The cluster is a Ray head of its own (`scopecast up` in a subprocess, with a SCOPECAST_HOME and a
RAY_TMPDIR of its own, so neither the test session's embedded Ray nor other Rays on this machine
see it or are seen by it), torn down with `scopecast down --ray` even when a test fails."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from scopecast import PipelineError
from scopecast.ray_cluster import jobs

pytestmark = pytest.mark.ray

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pipeline.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    exe = Path(sys.executable).parent / "scopecast"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "scopecast.cli"]


def _env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SCOPECAST_HOME"] = str(home)
    env.update(extra)
    return env


def _run(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*_command(), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


class UpCluster:
    def __init__(self, env: dict, port: int) -> None:
        self.env = env
        self.port = port

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return _run(self.env, *args, timeout=timeout)


@pytest.fixture(scope="module")
def up_cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("pipeline-home")
    ray_tmp = tempfile.mkdtemp(prefix="sc-")  # short: Ray's unix sockets live under it
    port = _free_port()
    cluster = UpCluster(_env(home, RAY_TMPDIR=ray_tmp), port)
    try:
        up = cluster("up", "--port", str(port))
        assert up.returncode == 0, up.stderr
        assert json.loads((home / "up.json").read_text())["dashboard"].startswith("http://")
        yield cluster
    finally:
        down = cluster("down", "--ray", "--address", f"127.0.0.1:{port}", timeout=300)
        left = _processes_of(ray_tmp, port)  # whatever `down` could not find (e.g. `up` failed)
        for proc in left:
            try:
                proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert down.returncode == 0, down.stderr


def _processes_of(ray_tmp: str, port: int) -> list[psutil.Process]:
    """The processes of our head only: its session lives under ray_tmp, its GCS on port."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] != os.getpid() and (ray_tmp in cmdline or f":{port}" in cmdline):
            found[proc.pid] = proc
            try:
                found.update((c.pid, c) for c in proc.children(recursive=True))
            except psutil.Error:
                pass
    return list(found.values())


def test_example_pipeline_runs_as_a_job_and_succeeds(up_cluster):
    out = up_cluster("pipeline", "submit", EXAMPLE, "--", "--messages", "200")
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.splitlines()[0].strip()
    assert "all delivered" in out.stdout  # the followed logs
    assert f"{job_id} SUCCEEDED" in out.stderr

    status = up_cluster("pipeline", "status", job_id, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["status"] == "SUCCEEDED" and info["exit_code"] == 0
    assert info["entrypoint"].endswith("pipeline.py --messages 200")
    assert info["start_time"] and info["end_time"]

    logs = up_cluster("pipeline", "logs", job_id)
    assert logs.returncode == 0 and "published 200 messages" in logs.stdout
    listed = up_cluster("pipeline", "list")
    assert any(line.split()[:2] == [job_id, "SUCCEEDED"] for line in listed.stdout.splitlines())
    # the head's GCS address works too: its dashboard is looked up in the cluster
    by_gcs = up_cluster("pipeline", "status", job_id, "--address", f"127.0.0.1:{up_cluster.port}")
    assert by_gcs.returncode == 0 and "SUCCEEDED" in by_gcs.stdout, by_gcs.stderr


def test_failing_pipeline_fails(up_cluster, tmp_path):
    script = tmp_path / "failing.py"
    script.write_text("import sys\nprint('failing on purpose', sys.argv[1:])\nsys.exit(1)\n")
    out = up_cluster("pipeline", "submit", script, "--", "x", "y z")
    assert out.returncode == 1, out.stdout + out.stderr
    job_id = out.stdout.splitlines()[0].strip()
    assert "failing on purpose ['x', 'y z']" in out.stdout
    assert f"{job_id} FAILED" in out.stderr
    status = up_cluster("pipeline", "status", job_id)
    assert status.returncode == 0 and "FAILED" in status.stdout

    # --no-wait: the id at once; `logs --follow` then ends with the job
    nowait = up_cluster("pipeline", "submit", "--no-wait", script)
    assert nowait.returncode == 0, nowait.stderr
    second = nowait.stdout.strip()
    followed = up_cluster("pipeline", "logs", second, "--follow")
    assert followed.returncode == 0 and "failing on purpose" in followed.stdout
    assert json.loads(up_cluster("pipeline", "status", second, "--json").stdout)["status"] == "FAILED"


def test_unknown_job_id_is_a_clear_error(up_cluster):
    for action in ("status", "logs", "stop"):
        out = up_cluster("pipeline", action, "raysubmit_nosuchjob")
        assert out.returncode == 1, out.stdout
        assert "PipelineNotFound" in out.stderr and "raysubmit_nosuchjob" in out.stderr
        assert "Traceback" not in out.stderr


def test_no_cluster_is_not_connected(tmp_path):
    env = _env(tmp_path)  # an empty SCOPECAST_HOME: no `scopecast up` record, no RAY_ADDRESS
    for args in (("pipeline", "submit", EXAMPLE), ("pipeline", "list"),
                 ("pipeline", "status", "x", "--address", "127.0.0.1:1")):
        out = _run(env, *args, timeout=120)
        assert out.returncode == 1, out.stdout
        assert "NotConnected" in out.stderr and "scopecast up" in out.stderr
        assert "Traceback" not in out.stderr


def test_working_dir_leaves_out_environments_and_large_files(tmp_path, monkeypatch):
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "big").write_bytes(b"x" * 100)
    with open(tmp_path / "data[1].bin", "wb") as f:
        f.truncate(jobs.LARGE_FILE_BYTES + 1)  # sparse: big to stat, cheap to write
    (tmp_path / "code.py").write_text("x = 1\n" * 1000)
    excludes = jobs.working_dir_excludes(tmp_path)
    assert ".venv/" in excludes and ".git/" in excludes and "__pycache__/" in excludes
    assert "/data\\[1\\].bin" in excludes
    monkeypatch.setattr(jobs, "MAX_WORKING_DIR_BYTES", 1000)
    with pytest.raises(PipelineError, match="code.py"):
        jobs.working_dir_excludes(tmp_path)
