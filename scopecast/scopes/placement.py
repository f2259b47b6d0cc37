"""Where a scope's helper actors run (policy actors, agent hosts): found or made by name, pinned to
a node; a plug-in's policy actor imports its module from the node's plug-in cache, a recovery
plug-in's agent host (which may run on another node) gets it shipped in its runtime_env."""

from __future__ import annotations

import asyncio
from pathlib import Path

import ray

from scopecast.actors import declare
from scopecast.actors.errors import PluginRejected
from scopecast.policies.library import materialize, shipped
from scopecast.policies.registry import PLUGIN_PREFIX, digest

__all__ = ["PLUGIN_PREFIX", "named_actor", "node_id", "pinned", "plugin_env", "plugin_package"]


def pinned(node: str) -> dict:
    """Ray options that place an actor on `node`. Hard affinity: Ray's soft one did not hold for
    actors that ask for no resources (on three nodes, most landed on another node); and an actor
    named for a node that is gone is not wanted elsewhere (its successor is named for its new
    node)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)} if node else {}


async def named_actor(cls: type, name: str, *args, ray_options: dict):
    """`declare.get_or_create` off the event loop (a named-actor lookup is a blocking GCS call)."""
    return await asyncio.to_thread(declare.get_or_create, cls, name, *args,
                                   ray_options=ray_options)


async def plugin_package(root_call, ref: str) -> tuple[str, str, Path]:
    """(module, class, package directory in this node's plug-in cache) of plug-in `ref`
    ("sha256:<hex>"): fetched from the root's library (`root_call`), checked against its digest."""
    sha = ref[len(PLUGIN_PREFIX):]
    module, cls, files = await root_call("plugin_files", sha)
    if digest(files) != sha:
        raise PluginRejected(f"plug-in {sha[:12]} does not match its digest")
    return module, cls, materialize(files, sha, module)


async def plugin_env(root_call, ref: str) -> tuple[str, str, dict]:
    """(module, class, runtime_env) of plug-in `ref`: its package shipped in the runtime_env, for
    an actor that may run on another node."""
    module, cls, package = await plugin_package(root_call, ref)
    return module, cls, shipped(package)


def node_id() -> str:
    """The Ray node this process runs on ("" outside Ray)."""
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""
