"""The scope's failure detector (pure logic, no Ray): a member is removed after `member_timeout`
without a heartbeat, but not for the time the scope itself was too busy to hear one (a re-layout of
thousands of topics holds its event loop for seconds)."""

from __future__ import annotations

import time

from scopecast.scopes.scope_manager import Child, ScopeManager


def _scope_with_member(silent_for: float) -> tuple[ScopeManager, Child, list[str]]:
    scope = ScopeManager("lan0/host-x", "host", "lan0")
    member = Child("m", "member", id=7)
    member.last_seen = time.monotonic() - silent_for
    scope.children["m"] = member
    removed: list[str] = []
    scope._remove = lambda child, why: removed.append(f"{child.name}: {why}")
    return scope, member, removed


def test_time_the_scope_itself_was_stalled_is_not_held_against_its_members():
    timeout = ScopeManager("x", "host", None).settings["member_timeout"]
    scope, _member, removed = _scope_with_member(timeout + 5)  # last heard just before the stall
    scope._credit_own_stall(timeout + 5)  # a tick that came that late
    scope._expire()
    assert removed == []


def test_a_member_silent_beyond_the_stall_is_still_removed():
    timeout = ScopeManager("x", "host", None).settings["member_timeout"]
    scope, _member, removed = _scope_with_member(3 * timeout)
    scope._credit_own_stall(timeout / 2)
    scope._expire()
    assert removed == [f"m: silent for {timeout:.0f}s"]


def test_a_tick_late_by_less_than_a_period_credits_nothing():
    scope, member, _removed = _scope_with_member(1.0)
    seen = member.last_seen
    scope._credit_own_stall(scope.settings["heartbeat_period"] / 2)
    assert member.last_seen == seen
