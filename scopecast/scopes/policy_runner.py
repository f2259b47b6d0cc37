"""Runs a scope's forwarding policies (thesis 3.2.4) in policy actors and hands their answers to
the policy container.

The built-in policies of a node share one policy actor (`BUILTIN_HOST`); each plug-in policy runs
in one of the scope's own, made from the module in the root's library. A plug-in that fails for a
topic (raises, hangs, dies, returns malformed operations) no longer lays that topic in this scope:
the default policy does, and status says why. A built-in that does not answer is slow, not wrong,
and is asked again after `POLICY_RETRY`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import ray

from scopecast.actors.errors import actor_fault
from scopecast.policies.host import PolicyHost
from scopecast.scopes.container import PolicyContainer
from scopecast.scopes.placement import PLUGIN_PREFIX, named_actor, node_id, pinned, plugin_package
from scopecast.scopes.scope_admin import ScopeChoices
from scopecast.scopes.topics import TopicInfo
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

POLICY_TIMEOUT = TIMING.policy_timeout
POLICY_STARTUP = TIMING.policy_startup
POLICY_RETRY = TIMING.policy_retry
DEFAULT_POLICY = "tree"  # what a topic falls back to where its plug-in policy failed
BUILTIN_HOST = "builtin"  # the key of the node's policy actor that hosts the built-in policies


class PolicyRunner:
    """The policy actors of one scope and the (plug-in, topic) pairs that failed here.
    `root_call` reaches the cluster scope (for plug-in modules); `kick` lays channels again."""

    def __init__(self, path: str, container: PolicyContainer, root_call,
                 kick: Callable[[], None], choices: ScopeChoices) -> None:
        self.path = path
        self.container = container
        self.choices = choices
        self._root_call = root_call
        self._kick = kick
        self._hosts: dict[str, object] = {}
        # (plug-in policy, topic) -> why the plug-in no longer lays that topic here
        self.failed: dict[tuple[str, int], str] = {}

    def policy_key(self, info: TopicInfo) -> str:
        """Which policy actor hosts the topic here: a built-in's name or a plug-in's digest, as
        the topic or the scopes' administrators chose (`scope_admin`); a plug-in that failed in
        this scope is replaced by the default policy."""
        key = self.choices.policy_key(info)
        return DEFAULT_POLICY if (key, info.id) in self.failed else key

    async def lay(self, wanted_of: Callable[[], dict[int, dict]]) -> bool:
        """A re-layout's two phases: the entry and exit choices, then the events (the choices
        decide sources and members of topics entering from outside). `wanted_of()`, the
        planner's wanted state, is made again for the events only where the choices moved an
        entry, split or exits, a policy failed, or the scope's multicast changed meanwhile (its
        probe cleared every layout: topics laid afresh must get contexts that say so): at
        100,000 topics it takes a second or more. True if the topics must be laid again (a
        plug-in failed, or a policy lost state)."""
        again, wanted = False, wanted_of()
        for phase in ("choices", "events"):
            self.container.choices_moved = False
            multicast = self.container.multicast
            failed = await self.run(self.container.requests(wanted, phase))
            again |= failed
            if phase == "choices" and (failed or self.container.choices_moved
                                       or self.container.multicast != multicast):
                wanted = wanted_of()
        return again

    async def run(self, batches: dict[str, list[dict]]) -> bool:
        """Ask each policy actor for its batch of topics; True if a topic must be laid again
        (its plug-in failed, or the policy lost state)."""
        again = await asyncio.gather(*(self._one(p, items) for p, items in batches.items()
                                       if items))
        return any(again)

    async def _one(self, policy: str, items: list[dict]) -> bool:
        public = [{k: v for k, v in it.items() if not k.startswith("_")} for it in items]
        plugin = policy.startswith(PLUGIN_PREFIX)
        host, retry, again = None, False, False
        try:
            host = await self.host(policy)
            results = await asyncio.wait_for(
                host.apply.remote(self.path, "" if plugin else policy, public), POLICY_TIMEOUT)
        except Exception as exc:  # hung, died, or never came up (a plug-in's topics here
            # fall back to the default policy; a built-in is ours: slow, not wrong, asked again)
            why = ("did not answer in time" if isinstance(exc, asyncio.TimeoutError)
                   else actor_fault(exc))
            if host is None:
                why = f"failed to start: {why}"
            log.warning("scope %r: policy actor %s failed: %s", self.path, policy, why)
            key = host_key(policy)
            self._hosts.pop(key, None)
            if host is not None:  # its topics here get their whole state again next time
                self.container.host_lost(lambda p: host_key(p) == key)
                if plugin:  # a fresh actor hosts the plug-in's other topics
                    ray.kill(host, no_restart=True)
            results = [{"topic": it["topic"], "ops": [], "error": f"policy actor {why}"}
                       for it in items]
            retry = not plugin
        for item, result in zip(items, results, strict=True):
            rejected = self.container.apply(item, result)
            if result.get("lost"):
                again = True
            why = result.get("error") or (
                f"returned malformed operations ({', '.join(rejected)})" if rejected else None)
            if why and policy != DEFAULT_POLICY and not retry:
                for topic in self.container.topics_of(item):
                    self.failed[(policy, topic)] = why[:500]
                again = True  # lay the topics again with the default policy
        if retry:
            asyncio.get_running_loop().call_later(POLICY_RETRY, self._kick)
        return again

    async def host(self, policy: str):
        """The policy actor for a built-in policy (the node's, shared by its scopes) or for a
        plug-in (this scope's own). Made on first use."""
        key = host_key(policy)
        handle = self._hosts.get(key)
        if handle is not None:
            return handle
        node = node_id()
        if key == BUILTIN_HOST:
            handle = await named_actor(PolicyHost, f"scopecast:policy:{node}",
                                       ray_options=pinned(node))
        else:
            # on this node, importing from the node's plug-in cache: a worker without a
            # runtime_env of its own starts in a fraction of the time (the first channels of a
            # plug-in topic in a scope wait for it)
            module, cls, package = await plugin_package(self._root_call, policy)
            handle = await named_actor(PolicyHost, f"scopecast:policy:{self.path}:{key[:23]}",
                                       module, cls, str(package.parent), ray_options=pinned(node))
        await asyncio.wait_for(handle.__ray_ready__.remote(), POLICY_STARTUP)
        self._hosts[key] = handle
        return handle

    def end_plugins(self) -> None:
        """End this scope's plug-in policy actors (the scope retires; the node's built-in one
        serves other scopes)."""
        for key, handle in self._hosts.items():
            if key != BUILTIN_HOST:
                ray.kill(handle, no_restart=True)

    def describe(self) -> dict:
        return {f"{p} topic {t}": why for (p, t), why in self.failed.items()}


def host_key(policy: str) -> str:
    """Which policy actor runs `policy`: the node's built-ins' or the plug-in's own."""
    return policy if policy.startswith(PLUGIN_PREFIX) else BUILTIN_HOST
