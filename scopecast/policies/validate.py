"""Validation of a submitted plug-in, in a process of its own (`python -m
scopecast.policies.validate DIR MODULE`, run by the cluster scope manager under CPU and memory
limits): the module imports, its manifest is well formed for this API version, it defines exactly the
classes the manifest lists, and each passes a self-check on a synthetic scope. Prints one JSON line:
{"ok": true, "manifest": ...} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

from scopecast.agents.api import DomainContext, RecoveryProtocol
from scopecast.policies.api import (
    API_VERSION,
    MULTICAST,
    Connect,
    Disconnect,
    ForwardingPolicy,
    PolicyContext,
)
from scopecast.policies.registry import check_manifest

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


def _check_recovery(cls) -> None:
    protocol = cls(DomainContext("selfcheck", 1, {}))
    for out in (protocol.on_view(SELF_CHECK_MEMBERS, 1), protocol.on_summary("a", {})):
        if not isinstance(out, list):
            raise ValueError(f"{cls.__name__} returned {out!r:.100}, not a list of instructions")
    if not isinstance(protocol.aggregate(), dict):
        raise ValueError(f"{cls.__name__}.aggregate() is not a dict")


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
