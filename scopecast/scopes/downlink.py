"""Sending each child of a scope its part of the layout (thesis 3.2.5): a child scope its
delegation (`install`), a member process its view (the answer to its standing `watch` call: a Ray
actor cannot call into a user's process). Only what changed goes out, each time under a new
version, which grows across restarts too (it starts at the clock)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from scopecast.netio.auth import STEPS, ClusterKeys
from scopecast.scopes.delegation import NO_PART, Delegation, Part
from scopecast.scopes.membership import ChildScope, MemberProcess, Membership
from scopecast.scopes.paths import child_path
from scopecast.scopes.planner import Planner
from scopecast.scopes.recovery_domain import RecoveryDomains
from scopecast.scopes.scope_admin import ScopeChoices
from scopecast.scopes.topic_view import ScopeTopics

log = logging.getLogger(__name__)


class Downlink:
    """The versions and contents sent to a scope's children."""

    def __init__(self, members: Membership, planner: Planner, topics: ScopeTopics,
                 recovery: RecoveryDomains, settings: dict, choices: ScopeChoices) -> None:
        self.members = members
        self.planner = planner
        self.topics = topics
        self.recovery = recovery
        self.settings = settings
        self.choices = choices
        self.version = time.time_ns()
        self.delegated: dict[str, Part] = {}   # the last layout's part for each child
        self.keys = ClusterKeys()  # the cluster's keys, sent along with everything (rotation)

    def take_keys(self, keys: ClusterKeys) -> bool:
        """The cluster's keys from now on, if `keys` supersedes what this scope has (a
        rotation: scopes/key_rotation): to the children with everything sent from now on, to
        the agent hosts running this scope's agents at once. True if taken."""
        if not keys.supersedes(self.keys):
            return False
        self.keys = keys
        self.recovery.rekey(keys)
        log.info("scope %r: cluster keys of generation %d, step %s", self.planner.path,
                 keys.generation, STEPS[keys.step])
        return True

    def send(self) -> bool:
        """Send every child its part of the last layout. True if a member's groups changed
        with it: the senders to those groups wait for it, so the scope lays its channels again."""
        again = False
        for child in list(self.members.children.values()):
            part = self.delegated.get(child.name, NO_PART)
            if child.kind == "member":
                again |= self._send_view(child, part)
            else:
                self._send_install(child, part)
        return again

    def _send_install(self, child: ChildScope, part: Part) -> None:
        table = self.topics.table
        content = Delegation(dict(self.settings), dict(table.early), part,
                             self.planner.upper_addresses(child.name, self.recovery.address),
                             self.choices.subtree(child_path(self.planner.path, child.name)),
                             tuple(sorted(self.choices.failed)), self.keys)
        piece = table.piece(child.table)  # (what it lacks: sent along, not compared)
        if content == child.sent and piece is None:
            return
        self.version += 1
        child.sent, child.sent_version, child.sent_at = content, self.version, time.monotonic()
        if piece is not None:
            child.table = table.position
        child.handle.install.remote(content.to_wire(self.version, piece))

    def _send_view(self, child: MemberProcess, part: Part) -> bool:
        view = replace(self.planner.member_view(child, part, self.recovery.addresses(child.name)),
                       keys=self.keys)
        if view == child.sent and child.table == self.topics.table.position:
            return False
        self.version += 1
        child.sent, child.sent_version, child.sent_at = view, self.version, time.monotonic()
        # a member joins its groups for the senders once it can also hold their messages back:
        # with reliable topics, once its recovery agent is in place
        listed = child.regular and set(view.protocols.values()) <= set(view.agents)
        joined = {"%s:%d" % g: [child.id] for g in view.groups} if listed else {}
        changed = joined != child.joined
        child.joined = joined
        child.wake.set()
        return changed
