"""Scope paths: `/`-separated names relative to the cluster scope ("" is the cluster scope itself),
checked like any other untrusted input before a scope is created for them."""

from __future__ import annotations

import re

from scopecast.actors import declare
from scopecast.actors.errors import InvalidConfig

_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
MAX_DEPTH = 8


def check_scope_path(path: str) -> str:
    """The path normalised (no leading or trailing '/'), or InvalidConfig saying what is wrong."""
    if not isinstance(path, str) or len(path) > 600:
        raise InvalidConfig(f"a scope path is a string of at most 600 characters, not {path!r:.80}")
    parts = path.strip("/").split("/") if path.strip("/") else []
    for part in parts:
        if not _PART.match(part):
            raise InvalidConfig(f"bad scope path {path!r}: part {part!r} must be 1-64 letters, "
                                "digits, '_', '-' or '.', not starting with '.' or '-'")
    if len(set(parts)) != len(parts):
        raise InvalidConfig(f"bad scope path {path!r}: it names the same scope twice (a cycle)")
    if len(parts) > MAX_DEPTH:
        raise InvalidConfig(f"bad scope path {path!r}: at most {MAX_DEPTH} levels")
    return "/".join(parts)


def parent_path(path: str) -> str | None:
    """The parent's path; None for the cluster scope."""
    if path == "":
        return None
    return path.rsplit("/", 1)[0] if "/" in path else ""


def child_path(path: str, name: str) -> str:
    """The path of child scope `name` of scope `path`."""
    return f"{path}/{name}" if path else name


def scope_name(path: str) -> str:
    """The scope's own name, the last part of its path ("" for the cluster scope): what its
    parent calls it."""
    return path.rsplit("/", 1)[-1]


def scope_actor_name(path: str) -> str:
    return declare.CLUSTER_SCOPE_MANAGER if path == "" else f"scopecast:scope:{path}"


def scope_actor(path: str):
    """The scope manager of `path` (ValueError if it does not run)."""
    return declare.find(scope_actor_name(path))
