"""Validation of a submitted plug-in, in a process of its own (`python -m
scopecast.scopes.plugin_check DIR MODULE`, run by the cluster scope manager's plug-in library under
CPU and memory limits). It knows every plug-in kind (forwarding policies and recovery protocols), so
it sits above both packages that define them. The module imports, its manifest is well formed for
this API version, it defines exactly the classes the manifest lists, and each passes a self-check
on a synthetic scope. Prints one JSON line: {"ok": true, "manifest": ...} or
{"ok": false, "error": "..."}.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol
from scopecast.policies.api import (
    API_VERSION,
    MULTICAST,
    Connect,
    Disconnect,
    ForwardingPolicy,
    PolicyContext,
)
from scopecast.policies.registry import check_manifest
from scopecast.scopes import policy_filters

BASES = {"policy": ForwardingPolicy, "recovery": RecoveryProtocol}
SELF_CHECK_MEMBERS = ["a", "b", "c"]


def validate(module_name: str) -> dict:
    module = importlib.import_module(module_name)
    manifest = check_manifest(getattr(module, "__scopecast_plugin__", None), API_VERSION)
    base = BASES[manifest["kind"]]
    defined = {name for name, obj in vars(module).items()
               if inspect.isclass(obj) and issubclass(obj, base) and obj is not base
               and obj.__module__.split(".")[0] == module_name}
    if defined != set(manifest["classes"]):
        raise ValueError(f"the manifest lists classes {sorted(manifest['classes'])} but the module "
                         f"defines {sorted(defined)} ({base.__name__} subclasses)")
    for name in manifest["classes"]:
        cls = getattr(module, name)
        if getattr(cls, "api_version", None) != API_VERSION:
            raise ValueError(f"{name}.api_version is {getattr(cls, 'api_version', None)!r}, "
                             f"not {API_VERSION}")
        (_check_policy if base is ForwardingPolicy else _check_recovery)(cls)
    return manifest


def _check_policy(cls) -> None:
    """Events on a synthetic scope of three members; every operation must name them."""
    policy = cls(PolicyContext("selfcheck", "selfcheck/T", 1, True, {}))
    ops = []
    for m in SELF_CHECK_MEMBERS:
        ops += policy.member_added(m) or []
    ops += policy.source_added("a") or []
    ops += policy.member_removed("c") or []
    ops += policy.source_removed("a") or []
    names = set(SELF_CHECK_MEMBERS) | {MULTICAST}
    for op in ops:
        if not isinstance(op, (Connect, Disconnect)):
            raise ValueError(f"{cls.__name__} returned {op!r:.100}, not Connect or Disconnect")
        if {op.src, op.dst, op.origin} - names:
            raise ValueError(f"{cls.__name__} returned {op!r:.100}, naming a non-member")
    if policy.entry(SELF_CHECK_MEMBERS) not in SELF_CHECK_MEMBERS:
        raise ValueError(f"{cls.__name__}.entry() chose a non-member")
    exits = policy.exits(SELF_CHECK_MEMBERS, 2)
    if not isinstance(exits, list) or set(exits) - set(SELF_CHECK_MEMBERS):
        raise ValueError(f"{cls.__name__}.exits() chose non-members")
    for op in ops:
        if isinstance(op, Connect):
            policy_filters.check(op.filter)
    split = policy.split(SELF_CHECK_MEMBERS)
    if split is not None:
        if not isinstance(split, list) or not split:
            raise ValueError(f"{cls.__name__}.split() returned {split!r:.100}, not a list of "
                             "(member, filter) pairs")
        for member, flt in split:
            if member not in SELF_CHECK_MEMBERS:
                raise ValueError(f"{cls.__name__}.split() chose a non-member")
            policy_filters.check(flt)


def _check_recovery(cls) -> None:
    """A synthetic group of three agents, each told of a sender with unstable messages: replies
    must be instruction dicts, and what it sends must be (peer index, body) pairs of the view."""
    agents = [cls(DomainContext(f"selfcheck|{m}", 1, {})) for m in SELF_CHECK_MEMBERS]
    summary = {"acks": {9: 10}, "seen": {9: 10}, "naks": [],
               "recs": {9: [10, [[1, 1, 1, 1, 10, 10]]]}}
    for i, agent in enumerate(agents):
        agent.on_view(PeerView(1, tuple(SELF_CHECK_MEMBERS), i, False))
        if not isinstance(agent.on_summary(summary, 0.0), dict):
            raise ValueError(f"{cls.__name__}.on_summary() did not return an instructions dict")
    for now in (0.5, 1.0, 2.0):
        queue = [(i, out) for i, a in enumerate(agents) for out in a.on_tick(now)]
        for _ in range(1000):  # a bounded exchange: a protocol that never goes quiet is fine
            if not queue:
                break
            src, out = queue.pop(0)
            if not (isinstance(out, (tuple, list)) and len(out) == 2 and out[0] in range(len(agents))):
                raise ValueError(f"{cls.__name__} sent {out!r:.100}, not (peer index, body)")
            queue += [(out[0], o) for o in agents[out[0]].on_peer(src, out[1], now)]
    for agent in agents:
        if not isinstance(agent.on_summary(summary, 3.0), dict):
            raise ValueError(f"{cls.__name__}.on_summary() did not return an instructions dict")


def main(argv: list[str]) -> int:
    directory, module_name = argv
    sys.path.insert(0, directory)
    try:
        out = {"ok": True, "manifest": validate(module_name)}
    except BaseException as exc:  # noqa: BLE001 - whatever the plug-in does is reported
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
