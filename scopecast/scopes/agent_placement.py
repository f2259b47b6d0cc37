"""Placing a scope's recovery agents (thesis 3.2.13): one per member of each recovery domain,
delegated down to the node where it belongs.

A member process's agent runs in the `AgentHost` of that member's node. A child scope's agent
goes where the child places it: on the node of the member that leads the child's own domain the
agent stands for, whatever protocol that one runs (the child asks its leader, down to a
member). The recovery domains
(`recovery_domain`) decide when an agent is needed or misplaced; this part places it. Placement
runs beside the heartbeat, never in its way: a slow child scope or a burst of agents starting must
not make the scope look dead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from scopecast.scopes.membership import Membership
from scopecast.scopes.paths import scope_name
from scopecast.scopes.placement import PLUGIN_PREFIX, named_actor, node_id, pinned, plugin_env
from scopecast.scopes.planner import Planner
from scopecast.scopes.recovery_domain import AgentRecord, RecoveryDomains, agent_name
from scopecast.scopes.scope_admin import protocol_of

log = logging.getLogger(__name__)


class AgentPlacement:
    """Keeps a scope's recovery domains' agents placed. `hello()` gives the cluster's key,
    authenticator and interface; `holding()` whether the domains hold stability back (the scope
    is rebuilding); `on_changed()` runs when agents changed (members' tables name them)."""

    def __init__(self, path: str, members: Membership, planner: Planner,
                 recovery: RecoveryDomains, settings: dict,
                 hello: Callable[[], Awaitable[dict]], root_call,
                 holding: Callable[[], bool], on_changed: Callable[[], None]) -> None:
        self.path = path
        self.name = scope_name(path)
        self.members = members
        self.planner = planner
        self.recovery = recovery
        self.settings = settings
        self._hello = hello
        self._root_call = root_call
        self._holding = holding
        self._on_changed = on_changed
        self._task: asyncio.Task | None = None
        self._again = False
        self._reported: set[str] = set()  # faulty recovery plug-ins told to the root

    def start(self) -> None:
        """Bring the agents in line soon: every tick, and right after a re-layout (so that a new
        subscriber holds stability back as soon as it can). One pass runs at a time; a change
        during one makes it run again."""
        if self._task is not None and not self._task.done():
            self._again = True  # the running one may have missed this change
            return
        self._task = asyncio.get_running_loop().create_task(self._passes())

    async def _passes(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await self._pass()

    async def _pass(self) -> None:
        try:
            changed = await self.recovery.update(self.planner.domain_members(), self.place_for,
                                                 self.planner.belongs, hold=self._holding(),
                                                 options=self.planner.choices.caching())
        except Exception as exc:  # a child placing an agent timed out or died: next tick again
            log.warning("scope %r: recovery domain update failed: %r", self.path, exc)
            return
        self._report_faults()
        if changed:
            self._on_changed()

    def _report_faults(self) -> None:
        """A domain of a recovery plug-in whose agents faulted (raised, hung, outgrew their
        memory, or their host kept dying): the root replaces the plug-in everywhere
        (`scope_admin.FALLBACK_RECOVERY`, a new session of its topics), as a faulty policy
        plug-in is replaced by the default policy."""
        for key, domain in self.recovery.domains.items():
            protocol = protocol_of(key)
            if not domain.fault or not protocol.startswith(PLUGIN_PREFIX) \
                    or protocol in self._reported:
                continue
            self._reported.add(protocol)
            log.error("scope %r: recovery protocol %s is faulty (%s); the cluster replaces it",
                      self.path, protocol[:23], domain.fault)
            asyncio.get_running_loop().create_task(self._tell_root(protocol, domain.fault))

    async def _tell_root(self, protocol: str, why: str) -> None:
        try:
            await self._root_call("recovery_failed", protocol, self.path, why)
        except Exception as exc:  # told again at the next pass
            self._reported.discard(protocol)
            log.warning("scope %r: could not tell the root that %s is faulty: %r", self.path,
                        protocol[:23], exc)

    async def place_for(self, key: str, name: str) -> AgentRecord:
        """Delegate the agent of member `name` of this scope's domain `key`: a member process's
        to its node, a child scope's domain's (`Planner.source`) along the child's chain."""
        below = self.planner.source(key, name)
        child = below[0] if below is not None else self.members.children.get(name)
        if child is None or child.name not in self.members.children:
            # silent: its agent stays where it was, holding stability back
            raise LookupError(f"child {name!r} is silent")
        hello = await self._hello()
        protocol = protocol_of(key)
        spec = {"name": agent_name(self.path, name, key),
                "domain": f"{self.path or '/'}|{name}",
                "level": 1 if child.kind == "member" else child.depth, "protocol": protocol,
                "domain_key": key,
                "options": {"active_period": self.settings["token_period"],
                            "idle_period": self.settings["idle_token_period"],
                            **self.planner.choices.caching()},
                "key": hello["key"], "keys": self.recovery.keys.to_wire(), "mac": hello["mac"],
                "interface": hello.get("interface")}
        if child.kind == "member":
            return AgentRecord(await self.agent_host(child.node, protocol), spec,
                               [self.path or "/", name])
        spec["below"] = below[1] if below is not None else key
        host, chain = await asyncio.wait_for(child.handle.place_agent.remote(spec),
                                             self.settings["scope_timeout"])
        return AgentRecord(host, spec, [self.path or "/", *chain])

    async def place_agent(self, spec: dict) -> list:
        """Place an agent of the parent's domain on the host of the leader of this scope's
        domain it stands for (`spec["below"]`, whatever protocol that one runs): delegated
        down to the child that leads, and run by the AgentHost of its member's node. Returns
        [agent host, chain]."""
        below = spec.get("below") or spec["protocol"]
        first = self.recovery.leader(below) or ""
        source = self.planner.source(below, first)
        if source is not None and source[0].kind == "scope":
            child, child_key = source
            host, chain = await child.handle.place_agent.remote({**spec, "below": child_key})
            return [host, [self.name, *chain]]
        leader = self.members.children.get(first)
        if leader is not None and leader.kind != "member":
            # the domain's leader as last laid is a child scope the planner no longer finds
            # standing for `below` (it re-laid meanwhile): the parent delegates again later
            raise LookupError(f"scope {self.path!r}: domain {below!r} is led by child scope "
                              f"{first!r}, which no longer stands for it")
        node = leader.node if leader is not None else node_id()
        return [await self.agent_host(node, spec["protocol"]),
                [self.name, *([leader.name] if leader is not None else [])]]

    async def agent_host(self, node: str, protocol: str):
        """The AgentHost of `node` for `protocol` (created on first use, pinned there): the
        built-ins share one per node; each plug-in protocol runs in one of its own."""
        from scopecast.agents.agent import AgentHost, host_name

        node = node or node_id()
        opts = pinned(node)
        args: tuple = ()
        if protocol.startswith(PLUGIN_PREFIX):
            module, cls, opts["runtime_env"] = await plugin_env(self._root_call, protocol)
            args = (module, cls)
        return await named_actor(AgentHost, host_name(node, protocol), *args, ray_options=opts)
