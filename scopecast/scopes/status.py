"""Reading the scope tree that `Cluster.status()` returns."""

from __future__ import annotations

from collections.abc import Iterator


def walk(status: dict) -> Iterator[dict]:
    """Every scope of the tree, parents before children (`status` is the whole status or a
    scope's subtree)."""
    stack = [status.get("scopes") if "cluster_id" in status else status]
    while stack:
        scope = stack.pop()
        yield scope
        stack.extend(reversed(scope.get("scopes", [])))


def members(status: dict) -> list[dict]:
    """Every member process of the tree, each with the path of its scope."""
    return [{**m, "scope": s["path"]} for s in walk(status) for m in s.get("members", [])]


def scope(status: dict, path: str) -> dict:
    """The scope `path` ("" or "/" for the cluster scope); KeyError if the tree has none."""
    want = path.strip("/") or "/"
    for s in walk(status):
        if s["path"] == want:
            return s
    raise KeyError(path)
