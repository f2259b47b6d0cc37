"""The private Ray APIs scopecast uses (scopecast/actors/ray_private.py): each is present in the
Ray this project pins, and each has its fallback or typed error when a Ray version lacks it."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

from scopecast.actors import ray_private
from scopecast.actors.errors import ScopecastError

USED = [("ray._private.runtime_env.py_modules", "upload_py_modules_if_needed"),
        ("ray._private.authentication.authentication_token_setup",
         "maybe_enable_token_auth_if_token_available"),
        ("ray._private.services", "get_webui_url_from_internal_kv"),
        ("ray._raylet", "GcsClient"),
        ("ray._private.worker", "_global_node"),
        ("ray._private.worker", "global_worker"), ("ray._private.worker", "SCRIPT_MODE")]


@pytest.mark.parametrize("module, name", USED)
def test_each_private_api_is_there_in_the_pinned_ray(module, name):
    assert hasattr(importlib.import_module(module), name)


def test_without_them_each_falls_back_or_says_why(monkeypatch, tmp_path):
    for module, _name in USED:
        monkeypatch.setitem(sys.modules, module, None)  # `import` of it raises ImportError
    assert ray_private.dashboard_url() is None
    assert ray_private.session_dir() == ""
    ray_private.use_token_if_present()  # nothing to do, nothing raised
    with pytest.raises(ScopecastError, match="cannot ship plug-in files"):
        ray_private.upload_py_modules(str(tmp_path), str(tmp_path))
    with pytest.raises(ScopecastError, match="no GcsClient"):
        ray_private.dashboard_url_at("127.0.0.1:1")


def test_the_log_threads_lazy_import_is_the_one_connect_preloads(monkeypatch):
    """Ray's driver log thread imports `ray.autoscaler.v2.utils` at the autoscaler's first event
    line (`filter_autoscaler_events`); connect() imports it first so no member process pays for
    it mid-stream. A Ray without it: the preload does nothing and raises nothing."""
    from ray._private import worker

    assert "from ray.autoscaler.v2.utils import" in inspect.getsource(worker.filter_autoscaler_events)
    monkeypatch.setitem(sys.modules, "ray.autoscaler.v2.utils", None)
    ray_private.preload_log_thread_imports()


def test_rays_console_notices_are_logged_not_printed_and_other_lines_print(monkeypatch, capsys):
    """Ray's driver prints the raylet's messages and its workers' output with
    `print_worker_logs`, looked up for each batch; connect() routes to the log the notice about
    many worker processes (scopecast's zero-CPU actors, by design) and the INFO lines of Ray's C++
    core a Java worker (RayDP's) writes to its stderr. Other lines still print, also from a batch
    that had core lines in it."""
    from ray._private import worker

    source = inspect.getsource(worker.listen_error_messages)
    assert "print_to_stdstream(" in source and '"pid": "raylet"' in source
    assert "print_worker_logs(batch" in inspect.getsource(worker.print_to_stdstream)
    monkeypatch.setattr(worker, "print_worker_logs", worker.print_worker_logs)  # restored after
    ray_private.route_console_notices()
    ray_private.route_console_notices()  # idempotent: wrapped once
    notice = ("WARNING: 14 PYTHON worker processes have been started on node: 1aab with address: "
              "127.0.0.1, which is 7x the maximum expected startup concurrency (2).")
    core = ("[2026-12-06 17:42:20,491 I 7983 8000] gcs_client.cc:96: GcsClient has no Cluster ID "
            "set, and won't fetch from GCS.")
    worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False},
                              ignore_prefix=False)
    worker.print_to_stdstream({"lines": ["some other trouble"], "pid": "raylet", "is_err": False},
                              ignore_prefix=False)
    worker.print_to_stdstream({"lines": [core, "executor says hello", core], "pid": 7983,
                               "is_err": True, "actor_name": "RayDPSparkMaster"},
                              ignore_prefix=False)
    worker.print_to_stdstream({"lines": [core.replace(" I 7983", " W 7983")], "pid": 7984,
                               "is_err": True}, ignore_prefix=False)
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "some other trouble" in shown and "PYTHON worker processes" not in shown
    assert "executor says hello" in shown and " I 7983 8000]" not in shown
    assert " W 7983 8000] gcs_client.cc:96" in shown  # (a warning of the core prints)
