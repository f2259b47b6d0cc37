"""Liveness under load: a scope whose event loop is held by a long install (5x scope_timeout, as
installing a very large delegation holds it) is not declared dead by its parent, and it expires
none of its members: a thread of its own tells the parent it lives, and the time its loop was held
is not counted against its members. An embedded cluster of its own (scope_timeout 1 s), in a
process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent('''
    import json, time
    import ray
    import scopecast
    from scopecast.scopes.paths import scope_actor
    from scopecast.scopes.status import walk

    HOLD = 5.0
    cl = scopecast.connect(settings={"heartbeat_period": 0.2, "scope_timeout": 1.0,
                                     "member_timeout": 2.0})

    def tree():
        return {s["path"]: s for s in walk(cl.status())}

    cl.create_topic("busy/a")
    sub = cl.subscriber("busy/a")
    pub = cl.publisher("busy/a")
    pub.publish(b"before")
    pub.flush(timeout=60)
    assert sub.receive(timeout=60).payload == b"before"
    before = tree()
    host = next(p for p, s in before.items() if s["kind"] == "host")
    lan = host.rsplit("/", 1)[0]
    ray.get(scope_actor(host).inject_delay.remote(HOLD))
    cl.create_topic("busy/b")  # the table moves: the host scope installs it, its loop held
    deadline = time.monotonic() + 120
    while tree()[host]["liveness"]["delays_injected"] < 1:
        assert time.monotonic() < deadline, "the install never came"
        time.sleep(0.5)
    time.sleep(2.0)  # past member_timeout after the hold: what was to expire has expired
    pub.publish(b"after")
    pub.flush(timeout=60)
    got = sub.receive(timeout=60).payload
    after = tree()
    print(json.dumps({
        "got": got.decode(), "host": host, "lan": lan,
        "liveness": after[host]["liveness"],
        "lan_expired": after[lan]["expired"], "host_expired": after[host]["expired"],
        "incarnations": [before[host]["incarnation"], after[host]["incarnation"]],
        "host_in_lan": [s["name"] for s in after[lan]["scopes"]],
        "members": [sorted((m["name"], m["id"]) for m in t[host]["members"])
                    for t in (before, after)]}), flush=True)
    cl.shutdown()
''')


def test_a_scope_held_by_a_long_install_is_not_declared_dead_nor_expires_members(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SCOPECAST_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert got["liveness"]["delays_injected"] == 1  # the loop was held, 5x scope_timeout
    assert got["liveness"]["beats_outside_loop"] >= 1  # and the scope said it lived meanwhile
    assert got["lan_expired"].get("scope", 0) == 0, got
    assert got["host"].rsplit("/", 1)[1] in got["host_in_lan"]
    assert got["incarnations"][0] == got["incarnations"][1]  # the same scope, not a new one
    assert got["host_expired"].get("member", 0) == 0, got
    assert got["members"][0] == got["members"][1]  # every member kept its id: none rejoined
    assert got["got"] == "after"
