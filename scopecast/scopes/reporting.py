"""A scope's reports to its parent (thesis 3.2.3, cascading subscription): its state when it
changed, else a heartbeat.

A report carries what the subtree subscribes to and publishes, where each topic's traffic enters
it (offers), the groups its members joined and the chains to the leaders of its recovery domains,
with a revision number. A heartbeat names only the revision: the state of thousands of topics, sent
every period, kept both scopes busy parsing and comparing it. A parent that answers a heartbeat
with False lacks that state (it restarted, or dropped a malformed report) and gets it at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import ray

from scopecast.actors import declare
from scopecast.actors.errors import IncompatibleVersion, typed_cause
from scopecast.scopes.paths import scope_name
from scopecast.scopes.reports import ScopeReport, SubtreeState

log = logging.getLogger(__name__)


class Reporter:
    """Reports up for one scope. `state()` is the state to report; `where()` what the scope has
    in place: (the parent's delegation version, its topic table position); `me()` the scope's own
    actor handle (the parent calls it back)."""

    def __init__(self, path: str, parent_name: str | None, settings: dict, incarnation: int,
                 state: Callable[[], SubtreeState],
                 where: Callable[[], tuple[int, tuple[int, int] | None]],
                 me: Callable[[], object] | None = None) -> None:
        self.path = path
        self.name = scope_name(path)
        self.parent_name = parent_name
        self.settings = settings
        self.incarnation = incarnation
        self.stopped = False           # the scope retired
        self._state = state
        self._where = where
        self._me = me or (lambda: ray.get_runtime_context().current_actor)
        self._parent = None
        self._reported: SubtreeState | None = None  # the state last reported
        self._rev = 0
        self._ref = None  # the last report's call: done once the parent has taken it in
        self.refused = ""  # why the parent refuses this scope's reports (another wire version)
        self.beats_outside_loop = 0  # heartbeats the beat thread sent while the loop was held
        self._beating: threading.Thread | None = None

    def parent(self):
        if self._parent is None:
            self._parent = declare.find(self.parent_name)
        return self._parent

    def report(self, force: bool = False) -> None:
        """Send the state up if it changed, else a heartbeat; `force`: a heartbeat."""
        if self.parent_name is None or self.stopped:
            return
        if not force or self._reported is None:  # (what it depends on changes by re-layouts)
            state = self._state()
            if state != self._reported:
                self._reported = state
                self._rev += 1
                self._send(state)
                return
        self._send(None)  # also says what it has in place now

    def start_beating(self, ticked: Callable[[], float]) -> None:
        """Heartbeats that do not wait for the scope's event loop. A long install or re-layout
        holds the loop (thousands of topics: seconds of CPU), and a parent that heard nothing
        for `scope_timeout` would remove the scope. A thread of its own looks every heartbeat
        period at `ticked()` (when the loop last ticked) and, when the loop is late, tells the
        parent the scope lives (`alive`: no state, so nothing of the loop's is read here)."""
        if self.parent_name is None or self._beating is not None:
            return
        self._beating = threading.Thread(target=self._beat, args=(ticked,), daemon=True,
                                         name="scopecast-scope-beat")
        self._beating.start()

    def _beat(self, ticked: Callable[[], float]) -> None:
        while not self.stopped:
            period = self.settings["heartbeat_period"]
            time.sleep(period)
            if time.monotonic() - ticked() <= period or self.stopped:
                continue  # the loop ticks: its own heartbeats go
            try:
                self.parent().alive.remote(self.name, self.incarnation)
                self.beats_outside_loop += 1
            except Exception as exc:  # the parent restarts: looked up again next time
                log.debug("scope %r: beat to %r failed: %s", self.path, self.parent_name, exc)
                self._parent = None

    def _send(self, state: SubtreeState | None) -> None:
        acked, table = self._where()
        report = ScopeReport(self.incarnation, self._rev, acked, table, state)
        try:
            ref = self.parent().report.remote(self.name, report.to_wire(), self._me())
        except Exception as exc:
            log.warning("scope %r: cannot report to %r: %s", self.path, self.parent_name, exc)
            self._parent = None
            return
        self._ref = ref
        if state is None:
            asyncio.get_running_loop().create_task(self._resend_if_unknown(ref))

    async def _resend_if_unknown(self, ref) -> None:
        try:
            known = await ref
        except Exception as exc:  # the parent is gone: the next heartbeat finds out
            cause = exc if isinstance(exc, IncompatibleVersion) else typed_cause(exc)
            if isinstance(cause, IncompatibleVersion) and str(cause) != self.refused:
                self.refused = str(cause)
                log.error("scope %r: its parent %r refuses it: %s", self.path, self.parent_name,
                          cause)
            return
        if known is False and ref is self._ref:
            self._send(self._reported)

    async def taken_in(self) -> bool:
        """Whether the parent has taken in the last report (so a layout it asks for is under
        way there, and the parent's own check sees it)."""
        if self._ref is None:
            return True
        try:
            known = await asyncio.wait_for(self._ref, self.settings["scope_timeout"])
            return known is not False  # (False: the state is on its way again)
        except Exception:  # the parent is gone or restarting: its check cannot pass either
            return False
