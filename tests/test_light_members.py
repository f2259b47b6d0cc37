"""Light and regular members (thesis 3.2.14, issue 44 item 4), on a real cluster: a joiner stopped
with SIGSTOP before it could catch up holds back neither stability nor the publisher's window;
once it runs again it catches up, is promoted, and its application's stream has no gap (what its
socket dropped meanwhile was let go by the others: its stream starts past it)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import ray

from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.scope_manager import DEFAULT_SETTINGS
from scopecast.scopes.status import members, walk

pytestmark = pytest.mark.ray

MEMBER_TIMEOUT = DEFAULT_SETTINGS["member_timeout"]
PAD = b"." * 991  # 1 KB messages: what comes while the joiner is stopped overflows its socket
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # (workers cannot import tests)


class Joiner(TopicConsumer):
    """A subscriber that stops itself the moment its subscription is in place: light, it has not
    caught up with anything yet. Its pid goes to `pidfile` first."""

    def __init__(self, topic: str, pidfile: str) -> None:
        super().__init__(topic)
        Path(pidfile).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)


def _counters(cluster, topic: str) -> dict:
    """The data-plane counters of this process's member that publishes `topic` (the process
    may have members in other scopes, from other tests)."""
    tid = cluster.topic(topic).id
    me = next(m["id"] for m in members(cluster.status())
              if m["pid"] == os.getpid() and tid in m["publishes"])
    return next(c for c in cluster.counters().values() if c["member"] == me)


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _agent_light(cluster, pid: int) -> bool | None:
    """Whether the agents of member process `pid` take it as light (None: none placed yet)."""
    status = cluster.status()
    name = next((m["name"] for m in members(status) if m["pid"] == pid), None)
    flags = [a.get("bottom_light") for s in walk(status)
             for d in (s.get("recovery") or {}).values()
             for n, a in (d.get("agents") or {}).items() if n == name]
    return None if not flags else all(flags)


def test_a_joiner_stopped_while_light_holds_nobody_back_then_catches_up_and_is_promoted(
        cluster, topic_name, tmp_path):
    cluster.create_topic(topic_name, policy="star")
    steady = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(steady.ready.remote())
    steady_got = steady.consume.remote(None, 300.0, until=b"end")
    n = 0
    with cluster.publisher(topic_name) as pub:
        def publish(k: int) -> None:
            nonlocal n
            for _ in range(k):
                n += 1
                pub.publish(b"m%08d" % n + PAD)

        publish(2_000)
        pub.flush(timeout=60)
        for attempt in range(5):
            pidfile = tmp_path / f"joiner{attempt}.pid"
            joiner = ray.remote(num_cpus=0)(Joiner).remote(topic_name, str(pidfile))
            deadline = time.monotonic() + 120
            while not (pidfile.exists() and pidfile.read_text()
                       and _stopped(int(pidfile.read_text()))):
                assert time.monotonic() < deadline, "the joiner never stopped"
                publish(50)  # the stream goes on while it joins
                time.sleep(0.01)
            pid = int(pidfile.read_text())
            while (light := _agent_light(cluster, pid)) is None:
                assert time.monotonic() < deadline, "the joiner's agent was never placed"
                time.sleep(0.05)
            if light:
                break
            # (a loaded machine let it catch up, a round trip, before it stopped: again)
            os.kill(pid, signal.SIGCONT)
            ray.kill(joiner)
        else:
            pytest.fail("every joiner caught up before it could stop itself")
        timeouts = _counters(cluster, topic_name)["stats"].get("receiver_timeouts", 0)
        try:
            publish(5_000)
            pub.flush(timeout=MEMBER_TIMEOUT / 2)  # returns while the joiner is stopped ...
            joiner_id = next(m["id"] for m in members(cluster.status()) if m["pid"] == pid)
            # ... and the publisher's window does not wait for it (added mid-stream, it never
            # said it was regular), with no receiver timed out
            mine = _counters(cluster, topic_name)
            assert any(joiner_id in f["light"] for f in mine["feeds"].values()), mine["feeds"]
            publish(5_000)
            pub.flush(timeout=MEMBER_TIMEOUT / 2)
            assert _stopped(pid)
            assert _counters(cluster, topic_name)["stats"].get("receiver_timeouts", 0) == timeouts
        finally:
            os.kill(pid, signal.SIGCONT)
        ray.get(joiner.ready.remote(), timeout=60)
        joiner_got = joiner.consume.remote(None, 300.0, until=b"end")
        publish(5_000)
        n += 1
        pub.publish(b"end")
        pub.flush(timeout=120)
    got = ray.get(joiner_got, timeout=300)
    assert (got["gaps"], got["out_of_order"]) == (0, 0)
    assert list(got["last_seq"].values()) == [n] and got["count"] > 5_000
    counters = ray.get(joiner.counters.remote())
    assert counters["stats"]["joined_light"] == counters["stats"]["promotions"] == 1
    assert not counters["recovery"]["light"]
    deadline = time.monotonic() + 30  # (its scope and agents hear of it with its next reports)
    while next(m for m in members(cluster.status()) if m["pid"] == pid)["counters"]["role"] \
            != "regular" or _agent_light(cluster, pid):
        assert time.monotonic() < deadline, "the scope never showed the joiner promoted"
        time.sleep(0.2)
    whole = ray.get(steady_got, timeout=300)
    assert (whole["count"], whole["gaps"], whole["out_of_order"]) == (n, 0, 0)
    ray.get([steady.close.remote(), joiner.close.remote()])
