"""A faulty recovery plug-in is contained as a faulty policy plug-in is (issue: hardening): one that
raises in a handler, hangs in `on_tick`, allocates without bound, or kills its own process. Contained
means: `flush()` succeeds afterwards and everything is delivered, status names the fault, the
topic's domains fall back to the built-in `token_ring` everywhere (a new session), and the other
protocols' agent hosts run on untouched."""

from __future__ import annotations

import textwrap
import uuid

import pytest
import ray

from scopecast.scopes.status import walk
from tests.test_reliability import _consumers
from tests.test_scopes import wait_for

pytestmark = pytest.mark.ray

N = 2_000  # per topic

# a token ring that, past the submission's self-check, does its misdeed from its first summary on
# (so that nothing it handles ever becomes stable by it)
TEMPLATE = '''
import os
import time

from scopecast.agents.token_ring import TokenRing

__scopecast_plugin__ = {"kind": "recovery", "name": "NAME", "version": "1.0", "api_version": 1,
                        "classes": ["Faulty"]}
MISDEED = "FAULT"


class Faulty(TokenRing):
    name = "NAME"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.real = not context.domain.startswith("selfcheck|")
        self.summaries = 0
        self.hog = []

    def on_summary(self, summary, now):
        self.summaries += 1
        if self.real and self.summaries:
            if MISDEED == "raise":
                raise RuntimeError("a faulty protocol raised")
            if MISDEED == "exit":
                os._exit(3)
        return super().on_summary(summary, now)

    def on_tick(self, now):
        if self.real and self.summaries:
            if MISDEED == "hang":
                time.sleep(3600)
            if MISDEED == "hog":
                self.hog.append(bytearray(64 << 20))
        return super().on_tick(now)
'''
# what status says of each: an allocation past the bound fails (MemoryError), or the RSS watchdog
# ends the process first and Ray keeps restarting it
SAYS = {"raise": ("RuntimeError",), "hang": ("no progress",),
        "hog": ("MemoryError", "restarted"), "exit": ("restarted",)}


def _builtin_hosts(status: dict) -> set[int]:
    return {a["pid"] for s in walk(status) for d in (s.get("recovery") or {}).values()
            for a in d["agents"].values() if a.get("protocol") == "token_ring"}


@pytest.mark.parametrize("misdeed", list(SAYS))
def test_a_faulty_recovery_plugin_is_replaced_and_nothing_is_lost(cluster, topic_name,
                                                                   tmp_path, misdeed):
    name = f"faulty_{misdeed}_{uuid.uuid4().hex[:6]}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(TEMPLATE).replace("NAME", name).replace("FAULT", misdeed))
    ref = cluster.submit_plugin(str(path))
    plugged, ring = f"{topic_name}/plug", f"{topic_name}/ring"
    cluster.create_topic(plugged, policy="lan_multicast", recovery=f"{ref.name}@{ref.version}")
    cluster.create_topic(ring, policy="lan_multicast")
    consumers = _consumers([plugged, ring], 2)
    hosts = _builtin_hosts(cluster.status())
    pending = [c.consume.remote(2 * N, 180.0) for c in consumers]
    with cluster.publisher(plugged) as p_plug, cluster.publisher(ring) as p_ring:
        for i in range(N):
            p_plug.publish(b"p%d" % i)
            p_ring.publish(b"r%d" % i)
        p_ring.flush(timeout=120)
        p_plug.flush(timeout=120)   # once the plug-in's domains fell back
        status = cluster.status()
    for got in ray.get(pending, timeout=240):
        assert (got["count"], got["gaps"], got["out_of_order"]) == (2 * N, 0, 0), got
    failed = status["failed_recovery"][f"sha256:{ref.sha256}"]
    assert any(says in failed["why"] for says in SAYS[misdeed]), failed
    # every scope's domains run token_ring once its next tick dropped the plug-in's
    wait_for(lambda: not any("sha256:" in k for s in walk(cluster.status())
                             for k in (s.get("recovery") or {})),
             "every domain of the topic running token_ring")
    assert hosts <= _builtin_hosts(status)  # the built-in hosts ran on, the same processes
    ray.get([c.close.remote() for c in consumers])
