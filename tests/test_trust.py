"""Signed plug-ins: a cluster that trusts keys accepts only plug-ins signed by one of them, and
says why it refuses the others; a cluster without keys accepts unsigned plug-ins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scopecast.actors.errors import PluginRejected
from scopecast.policies import trust

RING = Path(__file__).parent.parent / "examples" / "ring_policy.py"


def test_signatures_cover_the_digest(tmp_path):
    private, public = trust.keygen(tmp_path / "k")
    assert private.stat().st_mode & 0o777 == 0o600
    sha = "ab" * 32
    key = trust.public_key(str(public))
    assert trust.check(sha, trust.sign(sha, private), [key]) == trust.fingerprint(key)
    with pytest.raises(PluginRejected, match="not by any key"):
        trust.check("cd" * 32, trust.sign(sha, private), [key])  # another digest
    with pytest.raises(PluginRejected, match="only signed"):
        trust.check(sha, None, [key])
    assert trust.check(sha, None, []) is None  # no trusted keys: unsigned is fine


SCRIPT = textwrap.dedent('''
    import json, sys
    import scopecast
    from scopecast.policies import trust
    tmp, ring = sys.argv[1], sys.argv[2]
    trust.keygen(f"{tmp}/trusted")
    trust.keygen(f"{tmp}/stranger")
    cluster = scopecast.connect(trusted_keys=[f"{tmp}/trusted.pub"])
    out = {}
    for label, key in (("unsigned", None), ("stranger", f"{tmp}/stranger"),
                       ("trusted", f"{tmp}/trusted")):
        try:
            out[label] = str(cluster.submit_plugin(ring, sign=key))
        except scopecast.PluginRejected as exc:
            out[label] = f"rejected: {exc}"
    out["status_keys"] = cluster.status()["trusted_keys"]
    print(json.dumps(out), flush=True)
    cluster.shutdown()
''')


@pytest.mark.ray
def test_a_cluster_with_trusted_keys_accepts_only_their_signatures(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["SCOPECAST_HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(RING)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert got["unsigned"].startswith("rejected: this cluster accepts only signed plug-ins")
    assert got["stranger"].startswith("rejected: the plug-in's signature is not by any key")
    assert got["trusted"].startswith("ring@1.0")
    assert len(got["status_keys"]) == 1
