"""Shared fixtures: one embedded Ray + scopecast cluster per test session."""

from __future__ import annotations

import gc
import json
import os
import sys

import pytest


def pytest_sessionstart(session) -> None:
    """A loss rule left by a killed run would drop datagrams in tests that expect none."""
    from benchmarks import loss

    if loss.available() and loss.sweep_stale():
        print("removed iptables loss rules left by processes that are gone")


def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests marked quiet_machine run first: they hold a whole job (the wheel's demo) to a
    bound set for a machine that runs nothing else, and later the session's own Ray, Spark and
    leftover worker processes take a share of 2 cores."""
    items.sort(key=lambda item: item.get_closest_marker("quiet_machine") is None)


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the session's cluster reports each member's counters and each scope's
    recovery agents as they were: a CI failure can then be read, not only rerun."""
    try:
        report = yield
    except SystemError:
        # CPython 3.11.7's ast.parse, which pytest's traceback formatting calls, can fail with
        # "AST constructor recursion depth mismatch" (gh-106905): an INTERNALERROR then ends
        # the whole session and hides the failure. Python's own traceback format parses nothing.
        item.config.option.tbstyle = "native"
        report = pytest.TestReport.from_item_and_call(item, call)
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
        cluster = item.funcargs.get("cluster")
        if cluster is not None:
            report.sections.append(("scopecast status at the failure", _status_digest(cluster)))
    return report


@pytest.fixture(autouse=True)
def _release_a_failed_tests_actors(request):
    """A failed test's frames stay referenced (`sys.last_traceback`, kept for post-mortem
    debugging, or a reference cycle through its exception), and with them the handles of the
    Ray actors it started, which then keep running and loading the machine for every later
    test. Dropping the reference and collecting lets Ray stop them."""
    yield
    if request.node.stash.get(_FAILED, False):
        sys.last_type = sys.last_value = sys.last_traceback = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


def _status_digest(cluster, limit: int = 60_000) -> str:
    from scopecast.scopes.status import members, walk

    try:
        status = cluster.status(topics=False)
    except Exception as exc:  # the failure may be the cluster's
        return f"status failed: {exc!r}"
    # the agents first (the cut takes the members' counters, not them), each in brief
    digest = {"recovery": {s["path"]: _domains_in_brief(s.get("recovery", s.get("error")))
                           for s in walk(status)},
              "members": [{k: m.get(k) for k in ("scope", "name", "pid", "role", "counters")}
                          for m in members(status)]}
    text = json.dumps(digest, default=str)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


_AGENT_BRIEF = ("view", "index", "missing", "upper", "period", "bottom_age", "protocol_stats",
                "state", "drops", "error")


def _domains_in_brief(domains):
    """A scope's recovery domains with what says whether each agent's rounds go on."""
    if not isinstance(domains, dict):
        return domains
    return {p: {"version": d.get("version"), "members": d.get("members"),
                "agents": {n: {k: a[k] for k in _AGENT_BRIEF if k in a}
                           for n, a in d.get("agents", {}).items()}}
            for p, d in domains.items() if isinstance(d, dict)}


@pytest.fixture(scope="session")
def scopecast_home(tmp_path_factory) -> str:
    """A state directory of the test session's own (inherited by the embedded Ray's workers)."""
    home = str(tmp_path_factory.mktemp("scopecast-home"))
    os.environ["SCOPECAST_HOME"] = home
    return home


TOKEN_PERIOD = 0.04  # not the default: the agents' status shows the setting reached them
EMPTY_SCOPE_TIMEOUT = 20.0  # the scopes a test made go soon after it (each is a process)


@pytest.fixture(scope="session")
def cluster(scopecast_home):
    import scopecast

    c = scopecast.connect(settings={"token_period": TOKEN_PERIOD,
                                    "empty_scope_timeout": EMPTY_SCOPE_TIMEOUT})
    yield c
    c.shutdown()


@pytest.fixture(scope="session")
def ray_address(cluster) -> str:
    return cluster.address


@pytest.fixture
def topic_name(request) -> str:
    """A topic name unique to the test."""
    return "t/" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")[:120]


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(scope="session")
def spark(cluster):
    """One Spark (RayDP) on the session's Ray, shared by every test that uses DataFrames: starting
    Spark takes seconds, and RayDP allows one per process."""
    from scopecast.ray_cluster.spark import init_spark, stop_spark

    session = init_spark("scopecast-tests", num_executors=1, executor_cores=1, executor_memory="1G")
    yield session
    stop_spark()
