"""Every private Ray API scopecast uses, in one place, each with a fallback or a clear error: the
next Ray version may move or drop any of them, and this module is what to look at then (the
package's Ray range, in pyproject.toml, is the one these are tested with).

- `upload_py_modules`: ships a plug-in's files to whichever node runs its actor (an actor's own
  runtime_env takes URIs only). Without it: a typed error, the plug-in cannot run.
- `use_token_if_present`: a driver attaching by address sends the token a `ray start` head
  requires when ~/.ray/auth_token exists. Without it: nothing (RAY_AUTH_MODE is the documented
  switch).
- `quiet_token_notice`: the name of the logger Ray's token notice comes from. Without it: the
  notice shows.
- `dashboard_url`, `dashboard_url_at`: where the Jobs API (`scopecast pipeline`) is served.
  Without them: None, and the caller asks for the URL.
- `preload_log_thread_imports`: the modules Ray's driver log thread imports the first time the
  autoscaler logs an event. Without them: that import happens then, in every member process.
- `route_console_notices`: the function Ray's driver prints the raylet's error messages and its
  workers' output with (`print_worker_logs`). Without it: Ray's notice about many worker
  processes, and the INFO lines of Java workers' Ray core, show on the console.
- `session_dir`: the Ray session `scopecast up` started, so `down --ray` stops only its
  processes. Without it: "".
- `kv_get`, `kv_put`, `kv_delete`, `kv_keys`: Ray's GCS key-value store, where the root keeps the
  image of its state (scopes/state_mirror). Without them: a typed error; the root then runs on
  its node-local state alone and says so.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from scopecast.actors.errors import ScopecastError

log = logging.getLogger(__name__)


def upload_py_modules(package: str, scratch_dir: str) -> dict:
    """A runtime_env whose py_modules is `package`, uploaded to Ray's GCS under a content-addressed
    URI (as `ray.init` does for job-level py_modules)."""
    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    except ImportError as exc:
        raise ScopecastError(f"this Ray version cannot ship plug-in files to actors ({exc}); "
                             "scopecast is tested with the Ray range pyproject.toml names") from exc
    # Ray's upload says at INFO what it packs and pushes (its packaging module's own logger, and
    # the one given), which the actor's log brought to the user's console at every plug-in
    # submitted; its warnings still show
    packaging = logging.getLogger("ray._private.runtime_env.packaging")
    level = packaging.level
    packaging.setLevel(max(level, logging.WARNING))
    try:
        return upload_py_modules_if_needed({"py_modules": [package]}, include_gitignore=False,
                                           scratch_dir=scratch_dir, logger=packaging)
    finally:
        packaging.setLevel(level)


def use_token_if_present() -> None:
    """Send Ray's token when one exists (Ray's own rule for `ray start`; a no-op when
    RAY_AUTH_MODE is set: it decides)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return
    with quiet_token_notice():  # its "token authentication is enabled" line, on every command
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


@contextlib.contextmanager
def quiet_token_notice() -> Iterator[None]:
    """Without Ray's WARNING that token authentication is on (a new local cluster turns it on by
    default; a driver turns it on where a token exists): a normal run prints no WARNING. Only a
    logger's name: if Ray moves it, the line shows again and nothing else changes."""
    quiet = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def preload_log_thread_imports() -> None:
    """Import now what Ray's log thread (`ray_print_logs`, in every driver) imports lazily at the
    autoscaler's first event line: `ray.autoscaler.v2.utils`, and through it click and the
    autoscaler's CLI logger, about 17 ms of CPU on an idle core. Lazily, that import ran in every
    member process of a machine at the same moment, mid-stream: in `make bench` it starved the
    members' I/O threads for 40-90 ms and was the whole p99 of the latency cases it hit. Drivers
    only: a Ray worker (a scopecast actor) has no such thread."""
    try:
        from ray._private.worker import SCRIPT_MODE, global_worker

        if global_worker.mode == SCRIPT_MODE:
            import ray.autoscaler.v2.utils  # noqa: F401
    except ImportError:  # moved in another Ray: the first event line pays for it, as before
        log.debug("ray.autoscaler.v2.utils not found; Ray's log thread imports its own")


WORKER_POOL_NOTICE = "PYTHON worker processes have been started on node"

# A line of Ray's C++ core at INFO ("[2026-12-06 17:42:20,491 I 7983 8000] gcs_client.cc:96:
# ..."). A Python worker's core writes these to its log file; a Java worker's (RayDP's app master
# and executors) writes them to its stderr, which Ray forwards to every driver's console.
CORE_INFO_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+ I \d+ \d+\] \S+\.(cc|h):\d+: ")


def route_console_notices() -> None:
    """Two kinds of Ray's console output go to this module's log at INFO instead:

    * the raylet's notice, sent to every driver, that its node runs four times as many worker
      processes as CPUs ("(raylet) WARNING ... This could be a result of using a large number of
      actors"): a scopecast cluster runs that many by design (its scopes, agents, subscribers and
      publishers are zero-CPU actors, a process each);
    * INFO lines of Ray's C++ core forwarded from a worker's output (`CORE_INFO_LINE`: Java
      workers', e.g. "GcsClient has no Cluster ID set" twice per JVM): at INFO, Ray's own
      processes keep them in their log files.

    Everything else prints as before. Both reach the console through `print_worker_logs`, which
    Ray's driver looks up for each batch of lines (its log thread's handler is bound at
    `ray.init`, the function it calls is not). Drivers only (they print); idempotent."""
    try:
        from ray._private import worker

        printer = worker.print_worker_logs
    except (ImportError, AttributeError):  # another Ray: its notices show
        return
    if getattr(printer, "scopecast_routed", False):
        return

    def print_or_log(data, *args, **kwargs):
        lines = data.get("lines") if isinstance(data, dict) else None
        if not lines:
            return printer(data, *args, **kwargs)
        if data.get("pid") == "raylet" and any(WORKER_POOL_NOTICE in str(line) for line in lines):
            shown, routed = [], lines
        else:
            shown, routed = [], []
            for line in lines:
                (routed if CORE_INFO_LINE.match(str(line)) else shown).append(line)
        if routed:
            for line in routed:
                log.info("ray (pid %s): %s", data.get("pid"), line)
            if not shown:
                return None
            data = {**data, "lines": shown}
        return printer(data, *args, **kwargs)

    print_or_log.scopecast_routed = True  # type: ignore[attr-defined]
    worker.print_worker_logs = print_or_log


def dashboard_url() -> str | None:
    """The dashboard address the cluster this process is attached to published (None: none, or
    not found)."""
    try:
        from ray._private.services import get_webui_url_from_internal_kv

        return get_webui_url_from_internal_kv() or None
    except Exception as exc:  # ImportError included: never fail a command over it
        log.info("could not read the dashboard's address: %s", exc)
        return None


def dashboard_url_at(gcs: str, timeout: float = 10.0) -> str | None:
    """The dashboard address published in the GCS at `gcs` (host:port), without attaching; None if
    it publishes none. Raises ScopecastError when the GCS cannot be asked."""
    try:
        from ray._raylet import GcsClient
    except ImportError as exc:
        raise ScopecastError(f"this Ray version has no GcsClient ({exc})") from exc
    url = GcsClient(address=gcs).internal_kv_get(b"webui:url", b"dashboard", timeout=timeout)
    if not url:
        return None
    return url.decode() if isinstance(url, bytes) else str(url)


def session_dir() -> str:
    """The session directory of the Ray this process started or attached to ("" if unknown)."""
    try:
        import ray._private.worker as worker

        return worker._global_node.get_session_dir_path()
    except (ImportError, AttributeError):
        return ""


KV_NAMESPACE = b"scopecast"


def _kv():
    try:
        from ray.experimental import internal_kv
    except ImportError as exc:
        raise ScopecastError(f"this Ray version has no GCS key-value store here ({exc})") from exc
    if not internal_kv._internal_kv_initialized():
        raise ScopecastError("Ray's GCS key-value store is not reachable from this process "
                             "(not a Ray driver or worker)")
    return internal_kv


def kv_get(key: bytes) -> bytes | None:
    """The value of `key` in scopecast's namespace of the GCS store (None: no such key)."""
    return _kv()._internal_kv_get(key, namespace=KV_NAMESPACE)


def kv_put(key: bytes, value: bytes) -> None:
    _kv()._internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def kv_delete(key: bytes) -> None:
    _kv()._internal_kv_del(key, namespace=KV_NAMESPACE)


def kv_keys(prefix: bytes) -> list[bytes]:
    """Every key of scopecast's namespace that starts with `prefix`."""
    return list(_kv()._internal_kv_list(prefix, namespace=KV_NAMESPACE))
