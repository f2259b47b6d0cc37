"""The default hierarchy on a multi-node Ray cluster (`ray.cluster_utils.Cluster`, in a process of
its own): scopes from node labels (a data center above LANs), host scope managers pinned to their
node, a node that joins later gets its host scope, and a dead host scope is removed by its LAN
after missed heartbeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

SCRIPT = textwrap.dedent('''
    import json, sys, time
    import ray
    from ray.cluster_utils import Cluster
    import scopecast
    from scopecast.scopes.status import walk

    def scopes(cl):
        return {s["path"]: s for s in walk(cl.status())}

    def wait_for(pred, what, timeout=90):
        deadline = time.monotonic() + timeout
        while not (v := pred()):
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out: {what}")
            time.sleep(0.3)
        return v

    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "labels": {"dc": "east", "lan": "a"}})
    cl = scopecast.connect(address=c.address, levels=["dc", "lan"],
                           settings={"heartbeat_period": 0.2, "scope_timeout": 2.0,
                                     "member_timeout": 4.0})
    head = ray.get_runtime_context().get_node_id()
    wait_for(lambda: f"east/a/host-{head[:8]}" in scopes(cl), "head host scope")
    late = c.add_node(num_cpus=4, labels={"dc": "east", "lan": "b"})
    late_id = late.node_id
    path = f"east/b/host-{late_id[:8]}"
    joined = wait_for(lambda: scopes(cl).get(path), "late node host scope")
    tree = scopes(cl)
    out = {"head": head, "late": late_id, "kinds": {p: s["kind"] for p, s in tree.items()},
           "nodes": {p: s["node"] for p, s in tree.items()}}
    c.remove_node(late, allow_graceful=False)
    wait_for(lambda: path not in scopes(cl), "dead host scope removed")
    out["removed"] = True
    print(json.dumps(out), flush=True)
    cl.shutdown()
    ray.shutdown()
    c.shutdown()
''')


def test_hierarchy_from_node_labels_late_nodes_and_dead_host_scopes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SCOPECAST_HOME"] = str(tmp_path)
    env["RAY_AUTH_MODE"] = "disabled"  # nodes started here, not by `ray start`: no token
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=400, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    head, late = got["head"], got["late"]
    host_a, host_b = f"east/a/host-{head[:8]}", f"east/b/host-{late[:8]}"
    assert got["kinds"]["/"] == "cluster" and got["kinds"]["east"] == "level"
    assert got["kinds"]["east/a"] == got["kinds"]["east/b"] == "lan"
    assert got["kinds"][host_a] == got["kinds"][host_b] == "host"
    assert got["nodes"][host_a] == head and got["nodes"][host_b] == late  # pinned to their node
    assert got["removed"]
