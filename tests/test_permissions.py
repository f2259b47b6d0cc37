"""Credentials for real (issue 45 item 6, permissions): a process connected with a credential
publishes and subscribes where it lets it, gets PermissionDenied elsewhere, and its scope shows
the credential. Runs such a member publishes where it may not are dropped on the wire:
test_bad_input; tokens and coverage of patterns: test_credentials."""

from __future__ import annotations

import pytest

import scopecast
from scopecast.actors.errors import PermissionDenied
from scopecast.scopes.status import members, scope

pytestmark = pytest.mark.ray

N = 500


def test_a_credential_bounds_what_its_holder_publishes_and_reads(cluster):
    for name in ("perm/ok/a", "perm/ok/b", "perm/no"):
        cluster.create_topic(name)
    token = cluster.issue_credential("alice", publish=["perm/ok/*"], subscribe=["perm/ok/a"])
    alice = scopecast.connect(credential=token, name="alice")
    try:
        with pytest.raises(PermissionDenied, match="publish to 'perm/no'"):
            alice.publisher("perm/no", scope="perm-a")
        for refused in ("perm/no", "perm/ok/b", "perm/*", "perm/ok/*"):
            with pytest.raises(PermissionDenied, match="subscribe"):
                alice.subscriber(refused, scope="perm-a")
        # what it may do, it does: read perm/ok/a, publish perm/ok/b
        with alice.subscriber("perm/ok/a", scope="perm-a") as mine, \
                cluster.subscriber("perm/ok/b", scope="perm-b") as theirs, \
                cluster.publisher("perm/ok/a", scope="perm-b") as pub_a, \
                alice.publisher("perm/ok/b", scope="perm-a") as pub_b:
            for i in range(N):
                pub_a.publish(b"a %d" % i)
                pub_b.publish(b"b %d" % i)
            pub_a.flush(timeout=60.0)
            pub_b.flush(timeout=60.0)
            for sub, tag in ((mine, b"a"), (theirs, b"b")):
                got = [sub.receive(timeout=30.0) for _ in range(N)]
                assert [m.payload for m in got] == [b"%s %d" % (tag, i) for i in range(N)]
            inside = {m["name"]: m for m in members(scope(cluster.status(), "perm-a"))}
            assert inside["alice"]["credential"] == {"name": "alice", "publish": ["perm/ok/*"],
                                                     "subscribe": ["perm/ok/a"]}
    finally:
        alice.shutdown()
    forged = token.rsplit(".", 1)[0] + "." + "A" * 43
    other = scopecast.connect(credential=forged, name="mallory")
    try:
        with pytest.raises(PermissionDenied, match="not issued by this cluster"):
            other.subscriber("perm/ok/a", scope="perm-a")
    finally:
        other.shutdown()
