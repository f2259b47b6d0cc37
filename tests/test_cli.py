"""The `scopecast` command against the test session's running cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scopecast.cli import _status_text
from scopecast.scopes.status import members, walk

pytestmark = pytest.mark.ray


def scopecast(*args: str, address: str | None, stdin: str | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env["RAY_ADDRESS"] = address
    return subprocess.run([sys.executable, "-m", "scopecast.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_topic_publish_subscribe_status(ray_address, topic_name):
    out = scopecast("topic", "create", topic_name, address=ray_address)
    assert out.returncode == 0, out.stderr
    listed = scopecast("topic", "list", address=ray_address)
    assert topic_name in listed.stdout
    sub = subprocess.Popen([sys.executable, "-m", "scopecast.cli", "subscribe", topic_name,
                            "--count", "3", "--timeout", "60"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "RAY_ADDRESS": ray_address})
    # wait until the subscriber is a member of the topic before publishing
    for _ in range(300):
        status = json.loads(scopecast("status", "--json", address=ray_address).stdout)
        tid = next(t["id"] for t in status["topics"] if t["name"] == topic_name)
        if any(tid in m["subscribes"] for m in members(status)):
            break
    else:
        pytest.fail("the subscriber never joined")
    pub = scopecast("publish", topic_name, "one", "two", address=ray_address)
    assert pub.returncode == 0, pub.stderr
    pub = scopecast("publish", topic_name, address=ray_address, stdin="three\n")
    assert pub.returncode == 0, pub.stderr
    out, err = sub.communicate(timeout=120)
    assert sub.returncode == 0, err
    lines = [line.split("\t") for line in out.splitlines()]
    # (two publishing processes: two sources, each numbered from 1)
    assert [(t, seq, text) for t, _src, seq, text in lines] == [
        (topic_name, "1", "one"), (topic_name, "2", "two"), (topic_name, "1", "three")]
    assert lines[0][1] == lines[1][1] != lines[2][1]


def test_topic_describe_and_list_as_json(cluster, ray_address, topic_name):
    cluster.create_topic(topic_name, policy="chain")
    with cluster.subscriber(topic_name, scope="describe/S"):
        out = scopecast("topic", "describe", topic_name, "--json", address=ray_address)
        assert out.returncode == 0, out.stderr
        described = json.loads(out.stdout)
        assert (described["name"], described["policy"]) == (topic_name, "chain")
        assert any("describe/S" in s for s in described["subscribers"])
        text = scopecast("topic", "describe", topic_name, address=ray_address).stdout
        assert "policy:" in text and "chain" in text
    listed = json.loads(scopecast("topic", "list", "--json", address=ray_address).stdout)
    assert topic_name in {t["name"] for t in listed}
    missing = scopecast("topic", "describe", "no/such", address=ray_address)
    assert missing.returncode == 1 and "TopicNotFound" in missing.stderr


def test_commands_do_not_start_ray_when_there_is_no_cluster():
    out = scopecast("status", "--address", "127.0.0.1:1", address=None, timeout=120)
    assert out.returncode == 1
    assert "NotConnected" in out.stderr


def test_version_exit_codes_and_flags_anywhere():
    out = scopecast("--version", address=None)
    assert out.returncode == 0 and out.stdout.startswith("scopecast ")
    helped = scopecast("--help", address=None)
    assert "exit codes:" in helped.stdout and "130" in helped.stdout
    # -v after the command is the global flag, not an unknown argument (exit 2)
    out = scopecast("status", "--address", "127.0.0.1:1", "-v", address=None)
    assert out.returncode == 1 and "NotConnected" in out.stderr


@pytest.mark.parametrize("address, says", [("127.0.0.1", "HOST:PORT"), ("ray://h:10001", "Ray Client"),
                                           ("h:99999", "HOST:PORT")])
def test_an_address_that_is_no_clusters_host_and_port_is_a_typed_error(address, says):
    out = scopecast("status", "--address", address, address=None, timeout=30)
    assert out.returncode == 1 and "InvalidConfig" in out.stderr and says in out.stderr


def test_subscribe_with_a_count_fails_when_fewer_messages_came(ray_address, topic_name):
    assert scopecast("topic", "create", topic_name, address=ray_address).returncode == 0
    out = scopecast("subscribe", topic_name, "--count", "1", "--timeout", "2", "--json",
                    address=ray_address)
    assert out.returncode == 1 and "received 0 of 1" in out.stderr and out.stdout == ""
    listed = scopecast("plugin", "list", "--json", address=ray_address)
    assert listed.returncode == 0 and isinstance(json.loads(listed.stdout), list)


def test_unknown_topic_is_a_typed_error(ray_address):
    out = scopecast("publish", "no/such/topic", address=ray_address, stdin="x\n")
    assert out.returncode == 1
    assert "TopicNotFound" in out.stderr and "create_topic" in out.stderr


def test_status_shows_each_members_channels(cluster, topic_name):
    info = cluster.create_topic(topic_name)
    with cluster.subscriber(topic_name), cluster.publisher(topic_name):
        status = cluster.status()
    me = next(m for m in members(status) if m["pid"] == os.getpid())
    assert me["scope"].startswith("lan0/host-")   # a member's default scope is its host's
    assert topic_name in me["subscriptions"] and info.id in me["publishes"]
    text = _status_text(status)
    assert "scopes:" in text and me["name"] in text
    # the first line says how datagrams are protected and where the root's state is kept
    assert "gmac, state " in text.splitlines()[0] and "mirrored to the GCS" in text
    # a LAN scope's line says whether multicast passes among its hosts (here: one host)
    lan = next(s for s in walk(status) if s["kind"] == "lan")
    line = next(x for x in text.splitlines() if x.strip().startswith(f"{lan['path']}  [lan"))
    assert line.endswith(f"multicast {lan['multicast_probe']['state']}]"), line


def test_status_text_shows_a_scope_whose_manager_did_not_answer(cluster, topic_name):
    """A scope manager gone or restarting is one line saying so, not a crash of `status`."""
    cluster.create_topic(topic_name)
    with cluster.subscriber(topic_name):  # (a LAN scope and a host scope below the root)
        status = cluster.status()
    lan = status["scopes"]["scopes"][0]
    status["scopes"]["scopes"][0] = {"name": lan["name"], "path": lan["path"],
                                     "error": "ActorDiedError: the actor died"}
    lines = _status_text(status).splitlines()
    assert f"    {lan['path']}  [did not answer: ActorDiedError: the actor died]" in lines


def test_status_text_says_what_a_scopes_stability_waits_for(cluster, topic_name):
    """A scope Ray restarted (rebuilding from its children) and the silent child scopes its
    recovery domains still wait for are on its line."""
    cluster.create_topic(topic_name)
    with cluster.subscriber(topic_name):
        status = cluster.status()
    lan = status["scopes"]["scopes"][0]
    assert lan["rebuilding"] is False and lan["silent_scopes"] == []  # as it is here
    lan.update(rebuilding=True, silent_scopes=["host-0badcafe"])
    line = next(x for x in _status_text(status).splitlines()
                if x.strip().startswith(f"{lan['path']}  [lan"))
    assert line.endswith(", rebuilding after a restart, waiting for silent host-0badcafe]"), line


def test_reset_asks_refuses_a_running_cluster_and_removes_the_state(tmp_path, monkeypatch):
    """`scopecast reset` removes $SCOPECAST_HOME's state database and `up` record: never without
    --yes when it cannot ask, and never while the cluster `up` recorded still answers."""
    import socket

    def reset(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "SCOPECAST_HOME": str(tmp_path)}
        return subprocess.run([sys.executable, "-m", "scopecast.cli", "reset", *args],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60, env=env)

    assert reset("--yes").stdout.startswith("nothing to reset")
    state = [tmp_path / "state.db", tmp_path / "state.db-wal", tmp_path / "up.json"]
    for f in state:
        f.write_text("{}")
    out = reset()  # no terminal to ask on: refused, nothing removed
    assert out.returncode == 2 and "--yes" in out.stderr and all(f.exists() for f in state)
    with socket.socket() as listening:  # the recorded cluster answers: refused
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        (tmp_path / "up.json").write_text(json.dumps(
            {"address": f"127.0.0.1:{listening.getsockname()[1]}"}))
        out = reset("--yes")
        assert out.returncode == 1 and "scopecast down --ray" in out.stderr, out.stderr
        assert all(f.exists() for f in state)
    out = reset("--yes")  # stopped: removed
    assert out.returncode == 0 and not any(f.exists() for f in state), out.stderr
    assert out.stdout.count("removed ") == 3


def test_up_settings_are_key_value_pairs_with_json_values():
    from scopecast.cli_deploy import setting

    assert setting("member_timeout=20") == ("member_timeout", 20)
    assert setting("token_period=0.02") == ("token_period", 0.02)
    assert setting("name=lan-a") == ("name", "lan-a")
    with pytest.raises(Exception, match="KEY=VALUE"):
        setting("member_timeout")
