"""A scope's life beyond its members: retiring when empty, rebuilding after Ray restarted it.

- A user's scope (such as `X/Q`) without members, child scopes and agents for
  `empty_scope_timeout` asks the cluster scope to retire it: scopes that a job or a test named once
  would otherwise keep a process each, ticking, for the cluster's life. A member naming it again has
  it made again (`ensure_scope`).
- A scope that Ray restarted rebuilds its state from its children's reports. Until they have all
  had the time to report again, its recovery domains do not know all their members: they hold
  stability back, and its parent keeps counting the domains it had (`rebuilding`). A child scope
  gone silent stays in the domains until it reports again or Ray says it is gone for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Callable

import ray

from scopecast.scopes.membership import Membership, ask_all
from scopecast.scopes.recovery_domain import GONE

log = logging.getLogger(__name__)


class Retirement:
    """When an empty user scope may end. `root_call` reaches the cluster scope."""

    def __init__(self, path: str, settings: dict, incarnation: int, root_call) -> None:
        self.path = path
        self.settings = settings
        self.incarnation = incarnation
        self.retired = False
        self._root_call = root_call
        self._empty_since: float | None = time.monotonic()
        self._asking: asyncio.Task | None = None

    def touch(self) -> None:
        """A member is about to join: the scope waits for it a whole `empty_scope_timeout`."""
        self._empty_since = time.monotonic()

    def tick(self, empty: bool) -> None:
        if not empty:
            self._empty_since = None
            return
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        elif now - self._empty_since > self.settings["empty_scope_timeout"] and (
                self._asking is None or self._asking.done()):
            self._asking = asyncio.get_running_loop().create_task(self._ask())

    async def _ask(self) -> None:
        try:
            await self._root_call("retire_scope", self.path, self.incarnation)
        except Exception as exc:  # asked again next tick
            log.warning("scope %r: retiring failed: %r", self.path, exc)

    def retire(self, incarnation: int, empty: bool) -> float | None:
        """Retire now if still empty and `incarnation` is this scope's: the seconds it has been
        empty; None if anything arrived meanwhile (a member, a child, a `start`)."""
        empty_for = time.monotonic() - (self._empty_since or time.monotonic())
        if (incarnation != self.incarnation or not empty
                or empty_for < self.settings["empty_scope_timeout"]):
            return None
        self.retired = True
        return empty_for


class Rebuild:
    """Whether the scope is rebuilding after a restart, and which silent child scopes are gone
    for good. `on_change` lays channels again (the report up says what changed)."""

    def __init__(self, path: str, settings: dict, members: Membership,
                 on_change: Callable[[], None]) -> None:
        self.path = path
        self.settings = settings
        self.members = members
        self._on_change = on_change
        self._rebuilt_at: float | None = time.monotonic() if reconstructed() else None
        self._watching: asyncio.Task | None = None

    @property
    def rebuilding(self) -> bool:
        return self._rebuilt_at is not None

    def tick(self) -> None:
        grace = max(self.settings["member_timeout"], self.settings["scope_timeout"])
        if self._rebuilt_at is not None and time.monotonic() - self._rebuilt_at > grace:
            self._rebuilt_at = None
            log.info("scope %r: rebuilt from %d children after its restart", self.path,
                     len(self.members.children))
            self._on_change()
        if self.members.silent and (self._watching is None or self._watching.done()):
            self._watching = asyncio.get_running_loop().create_task(self._ask_silent())

    async def _ask_silent(self) -> None:
        """A silent child scope leaves the recovery domains once Ray has given it up (a host
        scope whose node died: its members died with it); one that is restarting, or only
        slow, stays until it reports again."""
        silent = list(self.members.silent.values())
        answers = await ask_all(silent, lambda c: c.handle.incarnation_now.remote(),
                                self.settings["scope_timeout"])
        for child, answer in zip(silent, answers, strict=True):
            if isinstance(answer, GONE) and self.members.silent.get(child.name) is child:
                del self.members.silent[child.name]
                log.warning("scope %r: child scope %s is gone for good: its recovery domains "
                            "no longer wait for it", self.path, child.name)
                self._on_change()


def reconstructed() -> bool:
    """Whether Ray restarted this actor (True where that cannot be told: holding stability
    back a while is safe, passing it too early is not)."""
    try:
        with warnings.catch_warnings():  # (Ray's own method reads a property it deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return True
