"""The policy actors: one per node hosts every scope's instances of the built-in policies; each
plug-in has one per scope, confined, on the scope's node (importing from its plug-in cache).

A scope manager never runs policy code itself; it sends a policy actor one batch per policy and
re-layout (`apply`) with, per topic, the events since the last batch and the entry/exit choices it
needs, and gets back the operations and choices. Instances keep their state between batches,
except for topics asked alike (one item for many topics: `had` names the state they had, and a
fresh instance is brought to it and dropped after). The built-ins are our own code, so the
scopes of a node share their actor (an actor per scope cost every scope another Ray worker
process); a restarted actor has lost its instances and answers `lost` for a topic it is sent
changes of, and the scope sends that topic's whole state again (`reset`).
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import sys
import threading
import time

import psutil

from scopecast.policies.api import Connect, Disconnect, ForwardingPolicy, PolicyContext

log = logging.getLogger(__name__)

EVENTS = ("member_added", "member_removed", "source_added", "source_removed")
PLUGIN_MEMORY = 1 << 30  # what a plug-in's actor may allocate beyond its start-up size


class PolicyHost:
    """The built-ins' actor of a node (`module` None), or one plug-in's actor of a scope."""

    def __init__(self, module: str | None = None, cls: str | None = None,
                 path: str | None = None) -> None:
        if module is None:
            from scopecast.policies.builtin import BUILTIN_POLICIES
            self._classes: dict[str, type[ForwardingPolicy]] = dict(BUILTIN_POLICIES)
        else:  # a plug-in: its package is in `path`, this node's plug-in cache (`materialize`)
            confine(PLUGIN_MEMORY)
            if path is not None:
                sys.path.insert(0, path)
            self._classes = {"": getattr(importlib.import_module(module), cls)}
        self._instances: dict[tuple[str, str, int], ForwardingPolicy] = {}

    def apply(self, scope: str, policy: str, batch: list[dict]) -> list[dict]:
        """Scope `scope`'s batch for `policy` (a built-in's name; "" in a plug-in's actor)."""
        cls = self._classes.get(policy) or self._classes.get("")
        return [self._apply_one(scope, cls, policy, item) for item in batch]

    def _apply_one(self, scope: str, cls: type[ForwardingPolicy] | None, policy: str,
                   item: dict) -> dict:
        topic = item["topic"]
        key = (scope, policy, topic)
        if item.get("drop"):
            self._instances.pop(key, None)
            return {"topic": topic, "ops": []}
        alike = "had" in item  # for topics alike (see ForwardingPolicy.topic_independent)
        inst = None if alike else self._instances.get(key)
        events = item.get("events")
        if inst is None and events is not None and not item.get("reset") and not alike:
            return {"topic": topic, "ops": [], "lost": True}  # changes to an instance not here
        try:
            if cls is None:
                raise LookupError(f"no built-in policy {policy!r}")
            if alike:  # a fresh instance brought to the state the topics had; nothing kept
                inst = cls(PolicyContext(**item["context"]))
                members, sources = item["had"]
                for source in sources:
                    inst.source_added(source)
                for member in members:
                    inst.member_added(member)
            elif inst is None or item.get("reset"):
                inst = cls(PolicyContext(**item["context"]))
                if events is not None:  # only a whole state makes an instance worth keeping
                    self._instances[key] = inst
            ops = []
            for kind, member in item.get("events", ()):
                if kind in EVENTS:
                    ops += getattr(inst, kind)(member) or []
            out = {"topic": topic, "ops": [_encode(op) for op in ops]}
            if item.get("members"):
                members = item["members"]
                out["entry"] = inst.entry(members)
                split = inst.split(members)
                out["split"] = None if split is None else list(split)  # (checked by the scope)
                out["exits"] = [inst.exits(members, n) for n in item.get("replicas", ())]
            return out
        except Exception as exc:  # a faulty policy must not take the scope down with it
            log.exception("policy %s for topic %d in scope %r failed",
                          getattr(cls, "name", policy), topic, scope)
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
