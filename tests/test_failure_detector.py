"""The scope's failure detector (pure logic, no Ray): a member is removed after `member_timeout`
without a heartbeat, but not for the time the scope itself was too busy to hear one (a re-layout of
thousands of topics holds its event loop for seconds)."""

from __future__ import annotations

import time

from scopecast.scopes.membership import MemberProcess, Membership
from scopecast.scopes.scope_manager import DEFAULT_SETTINGS


def _members_with_one(silent_for: float) -> tuple[Membership, MemberProcess, list[str]]:
    members = Membership("lan0/host-x", dict(DEFAULT_SETTINGS), lambda: None, lambda _id: None)
    member = MemberProcess("m", id=7)
    member.last_seen = time.monotonic() - silent_for
    members.children["m"] = member
    removed: list[str] = []
    members.remove = lambda child, why: removed.append(f"{child.name}: {why}")
    return members, member, removed


def test_time_the_scope_itself_was_stalled_is_not_held_against_its_members():
    timeout = DEFAULT_SETTINGS["member_timeout"]
    members, _member, removed = _members_with_one(timeout + 5)  # last heard just before the stall
    members.credit_stall(timeout + 5)  # a tick that came that late
    members.expire()
    assert removed == []


def test_a_member_silent_beyond_the_stall_is_still_removed():
    timeout = DEFAULT_SETTINGS["member_timeout"]
    members, _member, removed = _members_with_one(3 * timeout)
    members.credit_stall(timeout / 2)
    members.expire()
    assert removed == [f"m: silent for {timeout:.0f}s"]


def test_a_tick_late_by_less_than_a_period_credits_nothing():
    members, member, _removed = _members_with_one(1.0)
    seen = member.last_seen
    members.credit_stall(members.settings["heartbeat_period"] / 2)
    assert member.last_seen == seen
