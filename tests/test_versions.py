"""Versions that meet: members and scopes state the datagram wire version they speak, and one of
another version is refused with a typed error naming both, never silently misread (the state
database's schema migrations are in test_scope_state)."""

from __future__ import annotations

import os

import pytest
import ray

from scopecast.actors.errors import IncompatibleVersion
from scopecast.netio import wire
from scopecast.scopes.controlled_element import call
from scopecast.scopes.paths import scope_actor
from scopecast.scopes.reports import ScopeReport


def test_a_wire_version_other_than_this_ones_is_refused_naming_both():
    wire.check_version(wire.VERSION, "the cluster")
    for found in (wire.VERSION - 1, wire.VERSION + 1, None):
        with pytest.raises(IncompatibleVersion) as refused:
            wire.check_version(found, "member m")
        e = refused.value
        assert (e.what, e.found, e.supported) == ("member m speaks the datagram wire", found,
                                                  wire.VERSION)
        assert f"version {found} where this scopecast reads version {wire.VERSION}" in str(e)


def test_a_scope_report_states_its_wire_version():
    body = ScopeReport(1, 2, 3, None).to_wire()
    assert body["wire"] == wire.VERSION
    assert ScopeReport.from_wire(body).wire_version == wire.VERSION
    del body["wire"]  # a scope of a scopecast from before it was stated
    assert ScopeReport.from_wire(body).wire_version is None


@pytest.mark.ray
def test_a_member_or_scope_of_another_wire_version_is_refused_by_its_scope(cluster, ray_address):
    assert cluster._hello["wire_version"] == wire.VERSION  # what a connecting process checks
    node = ray.get_runtime_context().get_node_id()
    path = call(cluster._manager.host_scope, node)
    manager = scope_actor(path)
    me = ("old-member", "127.0.0.1", 9, os.getpid(), node, "member", 0)
    for found in (wire.VERSION - 1, None):  # None: a member that does not say (older)
        with pytest.raises(IncompatibleVersion) as refused:
            call(manager.register_member, *me, *([found] if found is not None else []))
        assert (refused.value.found, refused.value.supported) == (found, wire.VERSION)
    assert "old-member" not in str(call(manager.status, False)["members"])

    old = ScopeReport(1, 1, 0, None, None, wire.VERSION - 1).to_wire()
    with pytest.raises(IncompatibleVersion) as refused:
        call(cluster._manager.report, "old-scope", old, None)
    assert refused.value.found == wire.VERSION - 1
    tree = call(cluster._manager.status, False)["scopes"]  # (the root scope's own part)
    assert tree["dropped"]["wire_version"] >= 1
    assert "old-scope" not in str(tree["scopes"])
