"""Pipelines as Ray jobs: `scopecast pipeline submit|status|logs|list|stop`.

A pipeline is a Python script submitted to a Ray cluster through Ray's Jobs API
(`ray.job_submission.JobSubmissionClient`, served by the head's dashboard). The script's directory
is shipped as the job's `runtime_env={"working_dir": ...}`; the job's driver runs
`PYTHON SCRIPT ARGS...` on the head node, with `RAY_ADDRESS` set to the cluster, so a plain
`scopecast.connect()` in the script attaches to the cluster it runs on.

Which cluster: `address` (a dashboard URL `http://HOST:8265`, or the head's GCS `HOST:PORT`, whose
dashboard is looked up in the cluster), else `RAY_ADDRESS`, else the cluster `scopecast up` started
(recorded in `$SCOPECAST_HOME/up.json`), else `NotConnected`.

Which Python runs the driver: the job's shell resolves a bare `python` on the head's `PATH`, which is
rarely the environment scopecast is installed in, so the entrypoint names an interpreter: `python=`
if given; else the one the cluster was started with, when `scopecast up` started it here (it runs
the head, so scopecast imports in it); else, for a head on this machine, this process's
(`sys.executable`); else `python` on the head's `PATH` (a remote head: pass `python=` when its
environment is elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

from scopecast.actors import ray_private
from scopecast.actors.errors import NotConnected, PipelineError, PipelineNotFound
from scopecast.ray_cluster.cluster import check_reachable
from scopecast.ray_cluster.launch import record_path

log = logging.getLogger(__name__)

# never shipped: environments, version control, caches
EXCLUDED_DIRS = (".venv", "venv", ".git", "__pycache__", ".mypy_cache", ".pytest_cache",
                 ".ruff_cache", ".ipynb_checkpoints", "node_modules", ".tox")
LARGE_FILE_BYTES = 10 << 20       # larger files are left out (Ray warns about them too)
MAX_WORKING_DIR_BYTES = 100 << 20  # Ray refuses packages over 512 MiB; code belongs here, data not
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
UNREACHABLE_HELP = "start one with `scopecast up` or pass --address"


# ----------------------------------------------------------------------------------- addresses

def _record() -> dict | None:
    """What `scopecast up` recorded about the local cluster it started, if anything."""
    path = record_path()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _is_http(address: str) -> bool:
    """Whether host:port answers HTTP (a dashboard) rather than gRPC (a GCS)."""
    try:
        urllib.request.urlopen(f"http://{address}/api/version", timeout=3).close()
    except urllib.error.HTTPError:
        return True  # an HTTP answer, e.g. 401 without a token: still a dashboard
    except Exception:  # no HTTP answer: a GCS (gRPC), or nothing
        return False
    return True


def _dashboard_of_gcs(gcs: str) -> str:
    """The dashboard URL of the Ray cluster whose GCS is at `gcs` (host:port)."""
    check_reachable(gcs)
    ray_private.use_token_if_present()
    try:
        url = ray_private.dashboard_url_at(gcs)
    except Exception as exc:
        raise NotConnected(f"could not ask the Ray cluster at {gcs} for its dashboard: {exc}. "
                           f"Pass the dashboard URL instead (--address http://HOST:8265)") from None
    if not url:
        raise NotConnected(f"the Ray cluster at {gcs} runs no dashboard, which Ray's Jobs API needs: "
                           "restart it with one (`scopecast down --ray && scopecast up`, or "
                           "`ray start --head --include-dashboard=true`)")
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    gcs_host = gcs.rpartition(":")[0]
    if host in ("127.0.0.1", "localhost", "0.0.0.0", "::", "::1", "") and not _is_local(gcs_host):
        host = gcs_host  # a dashboard bound to all interfaces reports a local name
    return f"{parts.scheme}://{host}:{parts.port}"


def _is_local(host: str) -> bool:
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", ""):
        return True
    try:
        import psutil

        return any(a.address == host for addrs in psutil.net_if_addrs().values() for a in addrs)
    except Exception:
        return False


def resolve(address: str | None = None) -> tuple[str, str | None]:
    """(dashboard URL, interpreter of the cluster's head if known) of the cluster to use."""
    record = _record()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        address = address.rstrip("/")
        if address.startswith("ray://"):
            raise NotConnected(f"{address} is a Ray Client address; jobs go to the head's dashboard: "
                               "pass --address http://HOST:8265 (or the head's HOST:PORT)")
        if record and address in (record.get("address"), record.get("dashboard")):
            return _recorded(record)
        if "://" in address:
            return address, None
        if address == "auto":
            raise NotConnected(f"RAY_ADDRESS=auto does not name a cluster: {UNREACHABLE_HELP}")
        check_reachable(address)
        if _is_http(address):
            return f"http://{address}", None
        return _dashboard_of_gcs(address), None
    if record is None:
        raise NotConnected(f"no cluster to run the pipeline on: {UNREACHABLE_HELP} (a Ray dashboard "
                           "URL http://HOST:8265, or the head's HOST:PORT)")
    return _recorded(record)


def _recorded(record: dict) -> tuple[str, str | None]:
    address = record["address"]
    try:
        check_reachable(address)
    except NotConnected:
        raise NotConnected(f"the cluster `scopecast up` started at {address} (recorded in "
                           f"{record_path()}) is not running: "
                           f"{UNREACHABLE_HELP}") from None
    return record.get("dashboard") or _dashboard_of_gcs(address), record.get("python")


def _client(address: str | None):
    """A JobSubmissionClient for the cluster `address` resolves to, and its dashboard URL."""
    dashboard, _ = resolve(address)
    return _client_at(dashboard), dashboard


def _client_at(dashboard: str):
    # the dashboard of a cluster in token mode wants Ray's token in a header
    ray_private.use_token_if_present()
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(dashboard)
    except Exception as exc:
        raise NotConnected(f"no Ray dashboard (Jobs API) at {dashboard}: {exc}; "
                           f"{UNREACHABLE_HELP}") from None


def _request(call, job_id: str, dashboard: str):
    """Run a Jobs API call; a 404 becomes PipelineNotFound, other failures PipelineError."""
    try:
        return call()
    except RuntimeError as exc:
        if "status code 404" in str(exc):
            raise PipelineNotFound(f"no pipeline {job_id!r} on the cluster at {dashboard}: "
                                   "`scopecast pipeline list` shows the ones there are") from None
        raise PipelineError(f"pipeline {job_id!r}: {exc}") from None
    except OSError as exc:  # requests' ConnectionError is one
        raise NotConnected(f"lost the Ray dashboard at {dashboard}: {exc}") from None


# ------------------------------------------------------------------------------- working dir

def working_dir_excludes(root: Path) -> list[str]:
    """Ray `excludes` patterns for `root`: environments, VCS and caches, plus every file over
    LARGE_FILE_BYTES (named in a warning). Raises PipelineError if what is left is still over
    MAX_WORKING_DIR_BYTES."""
    excludes = [f"{d}/" for d in EXCLUDED_DIRS]
    total = 0
    large: list[tuple[int, str]] = []
    biggest: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        for name in filenames:
            path = Path(dirpath, name)
            try:
                size = path.lstat().st_size
            except OSError:
                continue
            rel = path.relative_to(root).as_posix()
            if size > LARGE_FILE_BYTES:
                large.append((size, rel))
            else:
                total += size
                biggest.append((size, rel))
    for _size, rel in sorted(large, reverse=True):
        # an anchored gitignore-style pattern; glob characters in the name escaped
        excludes.append("/" + "".join("\\" + c if c in "*?[]!#\\" else c for c in rel))
    if large:
        log.warning("left out of the pipeline's working directory (over %d MiB each): %s",
                    LARGE_FILE_BYTES >> 20, ", ".join(f"{rel} ({size >> 20} MiB)"
                                                      for size, rel in sorted(large, reverse=True)))
    if total > MAX_WORKING_DIR_BYTES:
        top = ", ".join(f"{rel} ({size >> 10} KiB)" for size, rel in sorted(biggest, reverse=True)[:5])
        raise PipelineError(
            f"the pipeline's working directory {root} holds {total >> 20} MiB (without "
            f"{', '.join(EXCLUDED_DIRS)} and files over {LARGE_FILE_BYTES >> 20} MiB): more than "
            f"the {MAX_WORKING_DIR_BYTES >> 20} MiB shipped to a Ray job (Ray's own limit is 512 MiB). "
            f"Largest: {top}. Move data out (the job can read it from shared storage), list files "
            f"in a .rayignore, or pass a smaller working_dir")
    return excludes


# ---------------------------------------------------------------------------------- the API

def submit_pipeline(script: str | os.PathLike, *, address: str | None = None,
                    args: Sequence[str] = (), working_dir: str | os.PathLike | None = None,
                    env: dict[str, str] | None = None, job_id: str | None = None,
                    python: str | None = None) -> str:
    """Submit `script` as a Ray job and return its id (the submission id).

    The job runs `python script args...` on the head node, in a copy of `working_dir` (default:
    the script's directory, which must contain the script), without virtual environments, VCS
    directories, caches and files over LARGE_FILE_BYTES. `env` adds environment variables;
    `job_id` names the job (default: Ray's `raysubmit_...`); `python` is the interpreter on the
    head (default: see the module's docstring). Raises NotConnected without a cluster and
    PipelineError if the submission fails."""
    script_path = Path(script).expanduser().resolve()
    if not script_path.is_file():
        raise PipelineError(f"no pipeline script {script}")
    root = Path(working_dir).expanduser().resolve() if working_dir else script_path.parent
    if not root.is_dir():
        raise PipelineError(f"working_dir {working_dir} is not a directory")
    try:
        rel = script_path.relative_to(root)
    except ValueError:
        raise PipelineError(f"the script {script_path} is not inside the working_dir {root}: the job "
                            "runs it from there") from None
    dashboard, head_python = resolve(address)
    if python is None:
        python = head_python or (sys.executable if _is_local(urlsplit(dashboard).hostname or "")
                                 else "python")
    entrypoint = shlex.join([python, rel.as_posix(), *map(str, args)])
    runtime_env: dict = {"working_dir": str(root), "excludes": working_dir_excludes(root)}
    if env:
        runtime_env["env_vars"] = {str(k): str(v) for k, v in env.items()}
    client = _client_at(dashboard)
    log.info("submitting %s to %s (working dir %s)", entrypoint, dashboard, root)
    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                                 submission_id=job_id,
                                 metadata={"scopecast": "pipeline", "script": rel.as_posix()})
    except (RuntimeError, ValueError) as exc:
        text = str(exc)
        if "exceeds the maximum size" in text:
            raise PipelineError(f"the working directory {root} is too large for a Ray job: {text}") \
                from None
        if "already" in text and job_id:
            raise PipelineError(f"a pipeline {job_id!r} exists already on the cluster at "
                                f"{dashboard}: choose another id") from None
        raise PipelineError(f"submitting {script_path.name} to {dashboard} failed: {text}") from None
    except OSError as exc:
        raise NotConnected(f"lost the Ray dashboard at {dashboard}: {exc}") from None


def _when(ms: int | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).astimezone().isoformat(timespec="seconds")


def _details(info) -> dict:
    status = getattr(info.status, "value", str(info.status))
    return {"job_id": info.submission_id or info.job_id, "status": status, "message": info.message,
            "entrypoint": info.entrypoint, "start_time": _when(info.start_time),
            "end_time": _when(info.end_time),
            "exit_code": getattr(info, "driver_exit_code", None),
            "error_type": getattr(info, "error_type", None), "metadata": info.metadata or {}}


def pipeline_status(job_id: str, *, address: str | None = None) -> dict:
    """job_id, status (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED), message, entrypoint,
    start_time and end_time (ISO 8601, local time), exit_code, error_type, metadata.
    Raises PipelineNotFound for an unknown id."""
    client, dashboard = _client(address)
    return _details(_request(lambda: client.get_job_info(job_id), job_id, dashboard))


def wait_pipeline(job_id: str, *, address: str | None = None, timeout: float | None = None,
                  period: float = 1.0) -> dict:
    """Poll until the job has ended (or `timeout` seconds: then its current status)."""
    client, dashboard = _client(address)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = _details(_request(lambda: client.get_job_info(job_id), job_id, dashboard))
        if info["status"] in TERMINAL or (deadline is not None and time.monotonic() >= deadline):
            return info
        time.sleep(period)


def pipeline_logs(job_id: str, *, address: str | None = None,
                  follow: bool = False) -> str | Iterator[str]:
    """The job's output so far (stdout and stderr of its driver); with `follow`, an iterator of
    chunks of it, from the start, that ends when the job ends."""
    client, dashboard = _client(address)
    if not follow:
        return _request(lambda: client.get_job_logs(job_id), job_id, dashboard)
    _request(lambda: client.get_job_info(job_id), job_id, dashboard)  # an unknown id: say so now
    return _follow(client, job_id, dashboard)


def _follow(client, job_id: str, dashboard: str) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    chunks = client.tail_job_logs(job_id)
    try:
        while True:
            try:
                chunk = loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                return
            except (RuntimeError, OSError) as exc:
                raise PipelineError(f"following the logs of {job_id!r} at {dashboard} failed: {exc} "
                                    f"(`scopecast pipeline logs {job_id}` shows them)") from None
            yield chunk
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        try:
            loop.run_until_complete(chunks.aclose())
        except BaseException:  # an interrupted generator cannot be closed cleanly: drop it
            pass
        loop.close()


def list_pipelines(*, address: str | None = None) -> list[dict]:
    """The jobs submitted to the cluster (through the Jobs API), oldest first."""
    client, dashboard = _client(address)
    jobs = _request(client.list_jobs, "*", dashboard)
    subs = [j for j in jobs if j.submission_id]
    return [_details(j) for j in sorted(subs, key=lambda j: j.start_time or 0)]


def stop_pipeline(job_id: str, *, address: str | None = None) -> bool:
    """Ask the job to stop (SIGTERM to its driver, SIGKILL later); False if it had ended already."""
    client, dashboard = _client(address)
    return bool(_request(lambda: client.stop_job(job_id), job_id, dashboard))
