"""`scopecast doctor`: the host preflight runs every check on a real interface, says what it found
and what to fix, and fails only where scopecast cannot work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

NAMES = ["interface", "multicast", "ports", "firewall", "buffers", "batch calls", "compiled parts",
         "java"]


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scopecast.cli", "doctor", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_every_check_runs_on_loopback_and_multicast_passes_there():
    out = doctor("--interface", "127.0.0.1", "--json")
    assert out.returncode == 0, out.stderr
    checks = json.loads(out.stdout)
    assert [c["name"] for c in checks] == NAMES
    assert all(c["status"] in ("ok", "warn") and c["found"] for c in checks), checks
    assert all(c["fix"] for c in checks if c["status"] == "warn"), checks  # says what to change
    by_name = {c["name"]: c for c in checks}
    assert by_name["multicast"]["status"] == "ok"  # loopback multicast works on this machine
    assert by_name["compiled parts"]["status"] == "ok"  # `make` built the C extensions
    assert "65,000 bytes" in by_name["interface"]["found"]  # loopback's MTU, capped
    text = doctor("--interface", "127.0.0.1")
    assert text.returncode == 0 and all(name in text.stdout for name in NAMES)


def test_the_pure_python_fallback_forced_is_reported():
    out = doctor("--interface", "127.0.0.1", "--json", env={"SCOPECAST_PURE_PYTHON": "1"})
    (check,) = [c for c in json.loads(out.stdout) if c["name"] == "compiled parts"]
    assert check["status"] == "warn" and "SCOPECAST_PURE_PYTHON" in check["found"], check


def test_an_address_not_on_this_host_fails():
    out = doctor("--interface", "192.0.2.254", "--json")
    (check,) = json.loads(out.stdout)
    assert out.returncode == 1 and check["name"] == "interface" and check["status"] == "fail"
    assert check["fix"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None,
                    reason="needs root and iptables")
def test_a_firewall_rule_that_drops_udp_is_named():
    rule = ["INPUT", "-p", "udp", "--dport", "9", "-m", "comment", "--comment",
            "scopecast-doctor-test", "-j", "DROP"]
    subprocess.run(["iptables", "-A", *rule], check=True)
    try:
        checks = {c["name"]: c for c in json.loads(doctor("--interface", "127.0.0.1",
                                                          "--json").stdout)}
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)
    firewall = checks["firewall"]
    assert firewall["status"] == "warn" and "scopecast-doctor-test" in firewall["found"]
    assert "--dport 9" in firewall["found"] and firewall["fix"]
