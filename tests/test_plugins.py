"""Plug-in policies (thesis 3.2.3): submitted to a running cluster, validated in a process of their
own, stored by digest, downloaded by the scopes that need them and run in policy actors; bad ones
are refused at submission or, failing at run time, replaced by the scope's default policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ray
from session_stream import stream_across_a_session_change

from scopecast.actors.errors import InvalidConfig, PluginRejected
from scopecast.policies.registry import collect, digest
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import members, scope

pytestmark = pytest.mark.ray

RING = Path(__file__).parent.parent / "examples" / "ring_policy.py"
Consumer = ray.remote(num_cpus=0)(TopicConsumer)


def stream(cluster, topic: str, path: str, n: int = 2_000) -> dict:
    """Three subscribers and a publisher in scope `path`; returns the scope's status after."""
    actors = [Consumer.remote(topic, scope=path, name=f"s{i}") for i in range(3)]
    ray.get([a.ready.remote() for a in actors])
    with cluster.publisher(topic, scope=path) as pub:
        pending = [a.consume.remote(n, 120.0) for a in actors]
        for i in range(n):
            pub.publish(b"%d" % i)
        pub.flush(timeout=60)
        status = scope(cluster.status(), path)
    for got in ray.get(pending, timeout=240):
        assert (got["count"], got["gaps"], got["out_of_order"]) == (n, 0, 0)
    ray.get([a.close.remote() for a in actors])
    return status


def test_ring_plugin_is_submitted_downloaded_and_lays_a_ring(cluster):
    ref = cluster.submit_plugin(str(RING))
    assert (ref.kind, ref.name, ref.version) == ("policy", "ring", "1.0")
    assert ref.sha256 == digest(collect(RING))
    assert cluster.submit_plugin(str(RING)) == ref  # same content, same digest: idempotent
    info = cluster.create_topic("plugins/ring", policy="ring@1.0")
    assert info.plugin == ref.sha256
    status = stream(cluster, info.name, "ringscope")
    me = next(m["name"] for m in members(status) if m["pid"] == os.getpid())
    ring = sorted(["s0", "s1", "s2", me])
    start = ring.index(me)
    order = ring[start:] + ring[:start]
    mine = [c for c in status["topics"][str(info.id)]["channels"] if c.endswith(f"(origin {me})")]
    assert sorted(mine) == sorted(
        f"{a}->{b} (origin {me})" for a, b in zip(order, order[1:], strict=False))
    assert any(p["sha256"] == ref.sha256 for p in cluster.plugins())
    # every topic on it (the demo's test, earlier in the session, puts its topics on it too)
    users = [t.name for t in cluster.topics() if t.policy == "ring@1.0"]
    assert info.name in users and sorted(cluster.plugin("ring@1.0")["used_by"]) == sorted(users)
    with pytest.raises(PluginRejected, match="used by"):
        cluster.remove_plugin("ring@1.0")
    cluster.update_topic(info.name, policy="tree")
    assert cluster.remove_plugin(f"sha256:{ref.sha256}") == ref


def write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


MANIFEST = '''
from scopecast.policies.api import API_VERSION, Connect, LayoutPolicy  # noqa: F401
__scopecast_plugin__ = {"kind": "policy", "name": "NAME", "version": "1.0",
                        "api_version": API_VERSION, "classes": ["P"]}
'''


@pytest.mark.parametrize("body, why", [
    ("import no_such_module_anywhere\n", "ModuleNotFoundError"),
    ("x = 1\n", "manifest"),
    (MANIFEST.replace('"api_version": API_VERSION', '"api_version": 99')
     + "class P(LayoutPolicy):\n    def layout(self, m, s): return []\n", "API version"),
    (MANIFEST + "class Q(LayoutPolicy):\n    def layout(self, m, s): return []\n", "defines"),
    (MANIFEST + "class P(LayoutPolicy):\n    def layout(self, m, s): return [Connect('a', 'zz', 'a')]\n",
     "non-member"),
    (MANIFEST + "import time\nclass P(LayoutPolicy):\n    def layout(self, m, s):\n"
     "        while True: pass\n", "validation did not finish|CPU|died"),
])
def test_bad_plugins_are_rejected_at_submission(cluster, tmp_path, body, why):
    path = write(tmp_path, "bad_plugin", body.replace("NAME", "bad"))
    with pytest.raises(PluginRejected, match=why):
        cluster.submit_plugin(path)


def test_unknown_plugin_reference_is_a_typed_error(cluster):
    with pytest.raises(PluginRejected, match="submit it"):
        cluster.create_topic("plugins/nope", policy="nope@9")
    with pytest.raises(InvalidConfig):
        cluster.create_topic("plugins/nope", policy="no_such_policy")


BAD_AT_RUN_TIME = {
    "raises": "raise RuntimeError('I do not like members named s...')",
    "malformed": "return [Connect('zz', member, 'zz'), ('not', 'an', 'operation')]",
    "never_returns": "time.sleep(3600)",
    "allocates": "hoard = []\n        while True: hoard.append(bytearray(50 << 20))",
    "kills_itself": "os._exit(3)",
}


@pytest.mark.parametrize("misdeed", sorted(BAD_AT_RUN_TIME))
def test_a_plugin_that_misbehaves_falls_back_to_the_default_policy(cluster, tmp_path, misdeed):
    """Passes its self-check (members a, b, c), then misbehaves on the members of a real scope:
    the scope reports why and lays the topic with its default policy; delivery goes on and no
    scope manager dies."""
    path = write(tmp_path, f"bad_{misdeed}", MANIFEST.replace("NAME", f"bad_{misdeed}") + f'''
import os, time
from scopecast.policies.api import ForwardingPolicy

class P(ForwardingPolicy):
    def member_added(self, member):
        if not member.startswith("s"):
            return []
        {BAD_AT_RUN_TIME[misdeed]}
''').replace("LayoutPolicy", "ForwardingPolicy", 1)
    ref = cluster.submit_plugin(path)
    info = cluster.create_topic(f"plugins/{misdeed}", policy=f"sha256:{ref.sha256}")
    status = stream(cluster, info.name, f"bad-{misdeed.replace('_', '-')}")
    why = status["failed_policies"][f"sha256:{ref.sha256} topic {info.id}"]
    assert why, status["failed_policies"]
    assert status["topics"][str(info.id)]["policy"] == "tree"
    if misdeed == "malformed":
        assert "malformed" in why
    elif misdeed == "never_returns":
        assert "did not answer" in why


def test_a_plugin_whose_actor_fails_to_start_is_reported_with_its_cause(cluster, tmp_path):
    """Passes validation, then its module refuses to load in the scope's policy actor: the scope
    names the cause (not only that the actor died) and lays the topic with its default policy."""
    path = write(tmp_path, "bad_start", MANIFEST.replace("NAME", "bad_start") + '''
import ray
if ray.is_initialized():  # in the policy actor (the validator runs without Ray)
    raise RuntimeError("no licence on this node")

class P(LayoutPolicy):
    def layout(self, members, sources):
        return []
''')
    ref = cluster.submit_plugin(path)
    info = cluster.create_topic("plugins/bad-start", policy=f"sha256:{ref.sha256}")
    status = stream(cluster, info.name, "bad-start", n=200)
    why = status["failed_policies"][f"sha256:{ref.sha256} topic {info.id}"]
    assert "failed to start" in why and "RuntimeError: no licence on this node" in why, why
    assert status["topics"][str(info.id)]["policy"] == "tree"


def test_cli_plugin_commands(ray_address):
    env = {**os.environ, "RAY_ADDRESS": ray_address}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "scopecast.cli", "plugin", *args], env=env,
                              capture_output=True, text=True, timeout=180)
    out = cli("submit", str(RING))
    assert out.returncode == 0, out.stderr
    assert digest(collect(RING)) in out.stdout and "ring@1.0" in out.stdout
    assert "ring@1.0" in cli("list").stdout  # a table for people,
    assert {"name": "ring", "version": "1.0"}.items() <= next(  # JSON for programs
        p for p in json.loads(cli("list", "--json").stdout) if p["name"] == "ring").items()
    assert '"used_by"' in cli("show", "ring@1.0", "--json").stdout
    assert "used_by:" in cli("show", "ring@1.0").stdout


def test_a_package_plugin_is_digested_without_its_bytecode(cluster, tmp_path):
    pkg = tmp_path / "star_pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text(MANIFEST.replace("NAME", "star_pkg")
                                     + "from star_pkg.layouts import P\n")
    (pkg / "layouts.py").write_text(
        "from scopecast.policies.api import Connect, LayoutPolicy\n"
        "class P(LayoutPolicy):\n"
        "    def layout(self, members, sources):\n"
        "        return [Connect(s, m, s) for s in sources for m in members if m != s]\n")
    (pkg / "__pycache__" / "layouts.cpython-311.pyc").write_bytes(b"stale")
    files = collect(pkg)
    assert sorted(files) == ["star_pkg/__init__.py", "star_pkg/layouts.py"]
    ref = cluster.submit_plugin(str(pkg))
    (pkg / "__pycache__" / "layouts.cpython-311.pyc").write_bytes(b"other")
    assert digest(collect(pkg)) == ref.sha256
    info = cluster.create_topic("plugins/star_pkg", policy="star_pkg@1.0")
    status = stream(cluster, info.name, "pkgscope")
    assert status["failed_policies"] == {}
    me = next(m["name"] for m in members(status) if m["pid"] == os.getpid())
    mine = {c for c in status["topics"][str(info.id)]["channels"] if c.endswith(f"(origin {me})")}
    assert mine == {f"{me}->s{i} (origin {me})" for i in range(3)}


def test_a_hung_topic_is_cut_off_and_the_plugins_other_topics_are_rehosted(cluster, tmp_path):
    """One plug-in actor hosts two topics of a scope; one topic's handler never returns: the actor
    is killed, that topic falls back, and the other topic goes on under the plug-in in a new
    actor."""
    path = write(tmp_path, "moody", MANIFEST.replace("NAME", "moody") + '''
import time

class P(LayoutPolicy):
    def layout(self, members, sources):
        if self.context.topic.endswith("hang") and any(m.startswith("s") for m in members):
            time.sleep(3600)
        return [Connect(s, m, s) for s in sources for m in members if m != s]
''')
    ref = cluster.submit_plugin(path)
    key = f"sha256:{ref.sha256}"
    calm = cluster.create_topic("plugins/moody-calm", policy=key)
    stream(cluster, calm.name, "moodyscope")
    hung = cluster.create_topic("plugins/moody-hang", policy=key)
    status = stream(cluster, hung.name, "moodyscope")
    assert "did not answer" in status["failed_policies"][f"{key} topic {hung.id}"]
    status = stream(cluster, calm.name, "moodyscope")   # re-hosted in a fresh actor
    assert f"{key} topic {calm.id}" not in status["failed_policies"]
    assert status["topics"][str(calm.id)]["policy"] == key


def test_version_two_of_a_plugin_in_use_takes_over_in_a_new_session_without_loss(
        cluster, topic_name, tmp_path):
    """Thesis 3.2.7: switching a topic to version 2 of its plug-in policy starts a new session;
    the publisher moves to it once every member knows it, and subscribers lose nothing."""
    v2 = tmp_path / "ring_policy.py"
    v2.write_text(RING.read_text().replace('"version": "1.0"', '"version": "2.0"')
                  .replace("order = ring[start:] + ring[:start]",
                           "order = ring[start:] + ring[:start]\n"
                           "            order = order[:1] + order[:0:-1]  # v2: the other way"))
    assert cluster.submit_plugin(str(RING)).version == "1.0"
    assert cluster.submit_plugin(str(v2)).version == "2.0"
    cluster.create_topic(topic_name, policy="ring@1.0")
    actors = [Consumer.remote(topic_name, scope="ringv2", name=f"s{i}") for i in range(3)]
    ray.get([a.ready.remote() for a in actors])
    with cluster.publisher(topic_name, scope="ringv2") as pub:
        total = stream_across_a_session_change(
            pub, lambda: cluster.update_topic(topic_name, policy="ring@2.0"))
        pub.flush(timeout=60)
        status = scope(cluster.status(), "ringv2")
    for got in ray.get([a.consume.remote(total, 120.0) for a in actors], timeout=240):
        assert (got["count"], got["gaps"], got["out_of_order"]) == (total, 0, 0)
        assert {int(k.rsplit("|", 1)[1]) for k in got["last_seq"]} == {1, 2}
    me = next(m["name"] for m in members(status) if m["pid"] == os.getpid())
    ring = sorted(["s0", "s1", "s2", me])
    start = ring.index(me)
    order = ring[start:] + ring[:start]
    order = order[:1] + order[:0:-1]
    channels = status["topics"][str(cluster.topic(topic_name).id)]["channels"]
    assert sorted(c for c in channels if c.endswith(f"(origin {me})")) == sorted(
        f"{a}->{b} (origin {me})" for a, b in zip(order, order[1:], strict=False))
    ray.get([a.close.remote() for a in actors])
