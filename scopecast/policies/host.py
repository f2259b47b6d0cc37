"""The policy actor: hosts every topic's instance of one policy module for one scope.

A scope manager never runs policy code itself; it sends each policy actor one batch per re-layout
(`apply`) with, per topic, the events since the last batch and the entry/exit choices it needs, and
gets back the operations and choices. Instances keep their state between batches; a restarted actor
gets the whole current state again (`reset=True`) and rebuilds it from the events.
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import threading
import time

import psutil

from scopecast.policies.api import Connect, Disconnect, ForwardingPolicy, PolicyContext

log = logging.getLogger(__name__)

EVENTS = ("member_added", "member_removed", "source_added", "source_removed")
PLUGIN_MEMORY = 1 << 30  # what a plug-in's actor may allocate beyond its start-up size


class PolicyHost:
    """One Ray actor per (scope, policy module)."""

    def __init__(self, scope: str, policy: str, module: str | None = None,
                 cls: str | None = None) -> None:
        if module is None:
            from scopecast.policies.builtin import BUILTIN_POLICIES
            self._cls: type[ForwardingPolicy] = BUILTIN_POLICIES[policy]
        else:  # a plug-in: its package came with this actor's runtime_env (py_modules)
            confine(PLUGIN_MEMORY)
            self._cls = getattr(importlib.import_module(module), cls)
        self._scope = scope
        self._instances: dict[int, ForwardingPolicy] = {}

    def apply(self, batch: list[dict]) -> list[dict]:
        return [self._apply_one(item) for item in batch]

    def _apply_one(self, item: dict) -> dict:
        topic = item["topic"]
        if item.get("drop"):
            self._instances.pop(topic, None)
            return {"topic": topic, "ops": []}
        try:
            inst = self._instances.get(topic)
            if inst is None or item.get("reset"):
                inst = self._instances[topic] = self._cls(PolicyContext(**item["context"]))
            ops = []
            for kind, member in item.get("events", ()):
                if kind in EVENTS:
                    ops += getattr(inst, kind)(member) or []
            out = {"topic": topic, "ops": [_encode(op) for op in ops]}
            if item.get("members"):
                members = item["members"]
                out["entry"] = inst.entry(members)
                out["exits"] = [inst.exits(members, n) for n in item.get("replicas", ())]
            return out
        except Exception as exc:  # a faulty policy must not take the scope down with it
            log.exception("policy %s for topic %d in scope %r failed", self._cls.name, topic,
                          self._scope)
            return {"topic": topic, "ops": [], "error": f"{type(exc).__name__}: {exc}"}


def confine(limit: int) -> None:
    """Bound a plug-in's memory: RLIMIT_DATA (allocations beyond it fail with MemoryError) and a
    watchdog that ends the process if its resident size still grows past the bound (the scope
    then lays the plug-in's topics with its default policy)."""
    proc = psutil.Process()
    start = proc.memory_info()
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    want = start.vms + limit
    if hard == resource.RLIM_INFINITY or want <= hard:
        resource.setrlimit(resource.RLIMIT_DATA, (want, hard))

    def watch() -> None:
        while True:
            if proc.memory_info().rss > start.rss + limit:
                log.error("plug-in exceeded %d MiB; ending its process", limit >> 20)
                os._exit(70)
            time.sleep(0.2)

    threading.Thread(target=watch, name="scopecast-plugin-watchdog", daemon=True).start()


def _encode(op) -> tuple:
    if isinstance(op, Connect):
        return ("connect", op.src, op.dst, op.origin, op.filter, op.replicas)
    if isinstance(op, Disconnect):
        return ("disconnect", op.src, op.dst, op.origin)
    return ("bad", repr(op)[:200])
