"""The root scope's durable state: SQLite persistence, and a killed cluster scope manager that Ray
restarts with its topics, sessions, key and members intact."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import ray

from scopecast.actors.errors import IncompatibleVersion
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.state import SCHEMA_VERSION, ScopeStore
from scopecast.scopes.status import members


def test_store_survives_reopen(tmp_path):
    path = tmp_path / "state.db"
    store = ScopeStore(path)
    assert [store.next_id("member") for _ in range(3)] == [1, 2, 3]
    store.put_topic("a", 1, {"name": "a", "id": 1, "session": 4})
    store.put_member(7, {"id": 7, "name": "m"})
    store.put("cluster", {"key": "ab"})
    store.close()
    again = ScopeStore(path)
    assert again.next_id("member") == 4  # ids are never reused
    assert again.topics() == [{"name": "a", "id": 1, "session": 4}]
    assert again.members() == [{"id": 7, "name": "m"}]
    assert again.get("cluster") == {"key": "ab"}
    again.delete_topic("a")
    again.delete_member(7)
    assert again.topics() == [] and again.members() == []


def test_state_file_is_private(tmp_path):
    path = tmp_path / "home" / "state.db"
    ScopeStore(path).close()
    assert path.stat().st_mode & 0o777 == 0o600  # the cluster key lives there
    assert path.parent.stat().st_mode & 0o077 == 0


# what scopecast's first state schema wrote (version 1), as it wrote it
SCHEMA_1 = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE topics (name TEXT PRIMARY KEY, id INTEGER UNIQUE NOT NULL, body TEXT NOT NULL);
CREATE TABLE members (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE plugins (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL,
                      body TEXT NOT NULL, files BLOB NOT NULL);
INSERT INTO meta VALUES ('schema', '"1"'), ('cluster', '{"key": "ab"}'), ('member', '5');
INSERT INTO topics VALUES ('a', 1, '{"name": "a", "id": 1, "session": 4}');
INSERT INTO plugins VALUES ('d1', 'ring', '1.0', '{"name": "ring"}', x'0102');
"""


def test_a_version_1_database_migrates_forward_with_its_state(tmp_path):
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_1)
    db.close()
    store = ScopeStore(path)
    assert store.get("schema") == SCHEMA_VERSION > 1
    assert store.get("cluster") == {"key": "ab"} and store.next_id("member") == 6
    assert store.topics() == [{"name": "a", "id": 1, "session": 4}]
    assert store.plugin_files("d1") == b"\x01\x02"
    indexes = {n for (n,) in store._db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "plugins_by_name" in indexes  # version 2's change
    store.close()
    assert ScopeStore(path).get("schema") == SCHEMA_VERSION  # and opens again as it is


@pytest.mark.parametrize("stored", ['"99"', "99", '"x"'])
def test_a_database_of_a_newer_schema_is_refused_naming_both_versions(tmp_path, stored):
    path = tmp_path / "state.db"
    ScopeStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (stored,))
    db.commit()
    db.close()
    with pytest.raises(IncompatibleVersion) as refused:
        ScopeStore(path)
    assert refused.value.supported == SCHEMA_VERSION
    assert refused.value.found == (99 if "99" in stored else "x")
    assert f"version {refused.value.found} " in str(refused.value)
    assert f"reads version {SCHEMA_VERSION}" in str(refused.value)


def _receive(actor, n: int) -> dict:
    return ray.get(actor.consume.remote(n, 60.0), timeout=120)


@pytest.mark.ray
def test_killed_root_scope_manager_restarts_with_its_state(cluster, ray_address, topic_name):
    info = cluster.create_topic(topic_name)
    administered = f"{topic_name.replace('/', '_')[:40]}/Q"
    cluster.configure_scope(administered, policy="star", recovery="ack_tree", cachers=2)
    before = cluster.status()
    sub = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(sub.ready.remote())
    pub = cluster.publisher(topic_name)
    for i in range(100):
        pub.publish(b"before %d" % i)
    pub.flush()
    assert _receive(sub, 100)["count"] == 100

    present = members(cluster.status())  # (with this test's own members)
    os.kill(before["manager"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:  # Ray restarts the actor (max_restarts=-1); calls wait for it
        try:
            after = cluster.status()
            if after["manager"]["pid"] != before["manager"]["pid"]:
                break
        except ray.exceptions.RayActorError:
            pass
        assert time.monotonic() < deadline, "the cluster scope manager was not restarted"
        time.sleep(0.5)

    assert after["cluster_id"] == before["cluster_id"]
    assert cluster.topic(topic_name) == info              # same id, group, session
    assert after["scope_settings"] == before["scope_settings"]  # each scope's administration
    assert after["scope_settings"][administered]["default"]["recovery"] == "ack_tree"
    cluster.configure_scope(administered)
    assert after["directory"] >= before["directory"]  # member ids and addresses kept
    # the child scopes report again within a heartbeat, and the tree is whole again: every
    # member present at the kill, but for those of earlier tests that may leave meanwhile and
    # never come back (a process gone, or an unused member of this one's)
    old = {m["id"] for m in members(before)}
    wanted = {m["id"] for m in present if m["id"] not in old
              or (m["pid"] != os.getpid() and _lives(m["pid"]))}
    while not {m["id"] for m in members(after)} >= wanted:
        assert time.monotonic() < deadline + 30, "the scope tree did not re-form"
        time.sleep(0.2)
        after = cluster.status()

    # the data plane did not notice; a publisher that joins after the restart is heard too
    for i in range(100):
        pub.publish(b"during %d" % i)
    pub.flush(timeout=60)  # (stability waits while the restarted root rebuilds: member_timeout)
    got = _receive(sub, 100)
    assert got["count"] == 100 and got["gaps"] == 0
    late = subprocess.run([sys.executable, "-m", "scopecast.cli", "publish", topic_name],
                          input="".join(f"late {i}\n" for i in range(50)), text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ray_address})
    assert late.returncode == 0, late.stderr
    got = _receive(sub, 50)
    assert got["count"] == 50 and got["sources"] == 1 and got["gaps"] == 0
    pub.close()
    ray.get(sub.close.remote())



@pytest.mark.ray
def test_an_embedded_cluster_keeps_its_state_apart_from_scopecast_home(cluster, scopecast_home):
    """The session's cluster is embedded (its Ray ends with the test process): its root's state
    is a directory of its own, so a fresh embedded cluster never loads an earlier run's topics
    and members from $SCOPECAST_HOME, which belongs to persistent clusters."""
    from pathlib import Path

    state = Path(cluster.status(topics=False)["manager"]["state"])
    assert state.parent.name.startswith("scopecast-embedded-") and state.exists()
    assert Path(scopecast_home) not in state.parents


def _lives(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
