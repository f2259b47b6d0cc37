"""Credentials (scopes/credentials): tokens and what they allow (pure logic; members holding
credentials for real:
test_permissions, and a forbidden publisher's runs on the wire: test_bad_input; the planner
keeping topics a member may not read away from it: test_scope_parts)."""

from __future__ import annotations

import os

import pytest

from scopecast.actors.errors import PermissionDenied
from scopecast.scopes import credentials
from scopecast.scopes.credentials import Credential

KEY = os.urandom(32)


def test_a_token_carries_its_credential_and_only_this_cluster_takes_it():
    token = credentials.issue(KEY, "alice", ["prices/*"], ["news/*", "weather"])
    assert credentials.verify(KEY, token) == Credential("alice", ("prices/*",),
                                                        ("news/*", "weather"))
    prefix, body, mac = token.split(".")
    for bad in [credentials.issue(os.urandom(32), "alice", ["prices/*"], []),  # another cluster
                f"{prefix}.{body[:-2]}xx.{mac}",                             # altered
                f"{prefix}.{body}", "", "x" * 20_000, None]:
        with pytest.raises(PermissionDenied):
            credentials.verify(KEY, bad)
    assert credentials.derive(KEY) != KEY  # the cluster key itself signs nothing here


def test_what_a_credential_allows():
    c = Credential("bob", ("prices/*", "orders/eu"), ("news/*", "x/a?", "t/*/live"))
    assert c.may_publish("prices/IBM") and c.may_publish("orders/eu")
    assert not c.may_publish("orders/us") and not c.may_publish("prices/IBM/late")
    assert c.may_read("news/today") and not c.may_read("prices/IBM")
    # a pattern is taken only where an allowed one covers it whole
    assert c.may_subscribe("news/*") and c.may_subscribe("news/b*") and c.may_subscribe("x/ab")
    assert c.may_subscribe("t/*/live") and c.may_subscribe("t/eu/live")
    for wider in ["*/*", "news/*/x", "x/a*", "x/*", "t/*/*", "prices/*"]:
        assert not c.may_subscribe(wider), wider
    with pytest.raises(ValueError):
        Credential("bad", ("a/[",), ())
    with pytest.raises(PermissionDenied):
        Credential("", (), ())

