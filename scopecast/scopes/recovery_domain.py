"""A scope's recovery domain (thesis 3.2.10, 3.2.13): its members, their agents, the peer-group view.

The domain's members are the children with a reliable interest: member processes that subscribe (as
members, not clients) to or publish a topic with a recovery protocol, and child scopes whose own
domain is not empty (cascading subscription: a child's report says so). For each member the scope
keeps one recovery agent, delegated through a chain: a member process's agent goes to that member's
node; a child scope's agent wherever that child places it, which is the node of the member leading
the peer group below (the child asks its own leader, down to a member). Each level records the
chain; the chain ends at the node's `AgentHost`, which runs the agent. The scope reaches its agents
through that host: it ensures they exist (a recreated agent has a new address and incarnation, so
the ring is laid again) and installs versioned views; views go one level down only (an agent learns
its peers, never their members). A version names one view and an agent gets it once: protocols
take a message of the same version as of the same view (token_ring's rounds, ack_tree's downs), so a
view installed again under its version, on one agent before another, mixed two. The agents outlive
a scope that Ray restarted, so its domains go on from the latest version their agents were sent.

A scope has one domain per recovery chain its topics use (`RecoveryDomains`; `scope_admin` says
what a chain is: where nobody configured a scope, one per protocol): a domain's agents all run the
same protocol, and a member takes part in the domain of each chain among its topics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import ray
from ray.exceptions import ActorDiedError, ActorUnschedulableError

from scopecast.netio.auth import ClusterKeys
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

AGENT_PREFIX = "scopecast:agent:"
PING_TIMEOUT = TIMING.agent_ping_timeout
REPLACE_AFTER = TIMING.agent_replace_after
RESTARTS_WITHIN = TIMING.agent_restarts  # a plug-in host restarted 3 times within: faulty
FAULTY_RESTARTS = 3
# What a call to an agent host raises once Ray has given it up (its node is dead, or it died
# for good); a host that is merely slow or restarting times out instead.
GONE = (ActorDiedError, ActorUnschedulableError)
MAX_HAD = 65536  # member processes a domain remembers having had


@dataclass(slots=True)
class AgentRecord:
    """A delegated agent: the node's AgentHost that runs it, what it was created from, and the
    chain of scopes (and member) it was delegated along."""

    host: object
    spec: dict
    chain: list[str]
    address: tuple[str, int] | None = None
    incarnation: int = 0
    pid: int = 0
    sent: tuple | None = field(default=None)
    gone: bool = False  # its last ping failed with GONE
    placed_at: float = field(default_factory=time.monotonic)

    def describe(self) -> dict:
        return {"chain": self.chain, "address": "%s:%d" % self.address if self.address else None,
                "incarnation": f"{self.incarnation:012x}", "pid": self.pid}


def _by_host(agents: dict[str, AgentRecord]) -> dict:
    """Agent names grouped by the host that runs them: actor id -> (host, names)."""
    hosts: dict = {}
    for name, rec in agents.items():
        hosts.setdefault(rec.host._actor_id, (rec.host, []))[1].append(name)
    return hosts


def agent_name(path: str, member: str, protocol: str) -> str:
    return f"{AGENT_PREFIX}{path}|{member}|{protocol}"


class RecoveryDomain:
    """The domain of one protocol one scope owns (see the module docstring); driven by the
    scope's tick."""

    def __init__(self, path: str, protocol: str, top: bool) -> None:
        self.path = path
        self.protocol = protocol
        self.top = top  # the root's domain decides stability; any other waits for its upper
        self.members: list[str] = []
        self.regions: dict[str, int] = {}  # member -> its region (identical subscription sets)
        self.agents: dict[str, AgentRecord] = {}
        self.version = 0
        self.upper: list | None = None  # [host, port] of this domain's agent in the parent's group
        self._installed: tuple | None = None  # what the views of `version` say
        self.options: dict | None = None  # the administrator's options its agents were made with
        self.fault = ""  # the first fault its agents reported (a plug-in's: the scope replaces it)
        self._restarts: list[float] = []  # when its agents' hosts restarted lately
        # member processes this domain has had (bounded, oldest forgotten first): one that comes
        # back (dropped while stalled, then rejoined) is no joiner, and its process is regular
        # (netio/promotion: light once per process, from its first subscription)
        self._had: dict[str, None] = {}
        self._host_pids: dict = {}  # host's actor id -> the process it answered from last
        self._pings: dict = {}  # host's actor id -> (its unanswered ensure_all, agent names)

    def address(self, member: str) -> list | None:
        rec = self.agents.get(member)
        return list(rec.address) if rec is not None and rec.address else None

    async def update(self, members: list[tuple[str, int]], place, belongs,
                     hold: bool = False, options: dict | None = None) -> bool:
        """Bring agents and views in line with `members`, (name, region) in ring order;
        `place(name)` delegates a new member's agent and returns its AgentRecord; `belongs(name)`
        is the chain below the member its agent should now be delegated along (None: any);
        `hold`: members may be missing from the list (the scope is rebuilding), so nothing
        counts as held by the group. True when an agent's address changed (the members'
        tables name their agents). Agents made with other `options` than these (the scope's
        administrator changed them) are made again."""
        if options is not None and self.options is not None and options != self.options:
            log.info("scope %r: %s agents made again with options %s", self.path,
                     self.protocol, options)
            for rec in self.agents.values():
                rec.host.drop.remote(rec.spec["name"])
            self.agents.clear()
        if options is not None:
            self.options = options
        regions = dict(members)
        members = [name for name, _ in members]
        joining = bool(self.agents)  # (a domain's first members are regular: thesis 3.2.14)
        new = [name for name in members if name not in self.agents]
        placed = await asyncio.gather(*(place(name) for name in new), return_exceptions=True)
        for name, rec in zip(new, placed, strict=True):
            if isinstance(rec, BaseException):  # a slow or dying child: missing until next tick
                log.warning("scope %r: placing the %s agent for %s failed: %r", self.path,
                            self.protocol, name, rec)
                continue
            self.agents[name] = rec
            if rec.spec.get("level") == 1:
                if joining and name not in self._had:
                    rec.spec["light"] = True  # a member process joining: light until it reports
                self._had.pop(name, None)  # (the latest had last: forgotten last)
                self._had[name] = None
                if len(self._had) > MAX_HAD:
                    del self._had[next(iter(self._had))]
            log.info("scope %r: %s agent for %s placed along %s", self.path, self.protocol,
                     name, " > ".join(rec.chain))
        for name in [n for n in self.agents if n not in members]:
            rec = self.agents.pop(name)
            rec.host.drop.remote(rec.spec["name"])
        changed = await self._ping()
        changed |= await self._replace_misplaced(place, belongs)
        live = [n for n in members if n in self.agents and self.agents[n].address]
        peers = [[n, *self.agents[n].address, regions[n]] for n in live]
        missing = len(members) - len(live) + hold  # (they hold the group's stability back)
        view = (members, peers, tuple(self.upper or ()), missing)
        if changed or view != self._installed:
            self.version += 1
            self.members, self.regions, self._installed = members, regions, view
        self._install_views(live, peers, missing)
        return changed

    async def _ping(self) -> bool:
        """Ask each host whether this domain's agents there run (it makes those that do not):
        one call per host, and none while the last one is unanswered. An unanswered call stays
        queued at its host; asked again each tick, a host slower than PING_TIMEOUT (a loaded
        node) only fell further behind, until no call to it answered in time."""
        for key, (host, names) in _by_host(self.agents).items():
            if key not in self._pings:
                call = host.ensure_all.remote([self.agents[n].spec for n in names])
                self._pings[key] = (asyncio.ensure_future(call), names)
        if self._pings:
            await asyncio.wait([f for f, _ in self._pings.values()], timeout=PING_TIMEOUT)
        changed = False
        for key, (fut, names) in list(self._pings.items()):
            if not fut.done():
                continue
            del self._pings[key]
            exc = None if fut.cancelled() else fut.exception()
            for i, name in enumerate(names):
                rec = self.agents.get(name)
                if rec is None or rec.host._actor_id != key:
                    continue  # left, or delegated elsewhere meanwhile
                rec.gone = isinstance(exc, GONE)
                if exc is None and not fut.cancelled():  # else starting, restarting, or gone
                    changed |= self._answered(name, rec, fut.result()[i])
        return changed

    def _answered(self, name: str, rec: AgentRecord, res: list) -> bool:
        """Take a host's answer for agent `name`; True when it is new (restarted, or first)."""
        address, incarnation = (res[0], int(res[1])), int(res[2])
        rec.spec.pop("light", None)  # (made: one made again later stands for a regular member)
        if len(res) > 5 and res[5] and not self.fault:
            self.fault = f"agent of {name}: {res[5]}"[:400]
        self._host_answered(rec.host._actor_id, int(res[3]))
        if int(res[4]) > self.version:  # sent by this scope before Ray restarted it: go on
            self.version, self._installed = int(res[4]), None  # past it (module docstring)
        if (address, incarnation) == (rec.address, rec.incarnation):
            return False
        if rec.address is not None:
            log.warning("scope %r: agent of %s restarted at %s:%d; laying the ring again",
                        self.path, name, *address)
        rec.address, rec.incarnation, rec.pid = address, incarnation, int(res[3])
        rec.sent = None
        return True

    def _host_answered(self, host: object, pid: int) -> None:
        """A host answered from process `pid`: another than before is a restart (Ray restarts
        a host that died); FAULTY_RESTARTS within RESTARTS_WITHIN make this domain faulty (a
        plug-in that kills its process, or outgrows its memory and is ended)."""
        before = self._host_pids.get(host)
        self._host_pids[host] = pid
        if before is None or before == pid:
            return
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTARTS_WITHIN] + [now]
        if len(self._restarts) >= FAULTY_RESTARTS and not self.fault:
            self.fault = (f"its agents' host restarted {len(self._restarts)} times within "
                          f"{RESTARTS_WITHIN:.0f} s")

    async def _replace_misplaced(self, place, belongs) -> bool:
        """Delegate again the agents whose host Ray has given up, and those of child scopes whose
        domain is led by another member than the one the agent was placed beside (3.2.13: it
        runs on the host of the member leading the peer group below; that host may have died,
        or the agent was placed before the child's domain had a leader). The chain is followed
        anew. A host that is only slow (a loaded machine, a worker starting) keeps its agents:
        the same chain would lead to it again, and a new agent would lay the ring again and
        hold stability back for nothing. Until a new agent answers it counts as missing, which
        holds the group's stability back."""
        changed = False
        now = time.monotonic()
        for name, rec in list(self.agents.items()):
            settled = now - rec.placed_at >= REPLACE_AFTER  # (a dead end is not retried at once)
            silent = rec.gone and settled
            want = belongs(name)
            placed = tuple(rec.chain[2:])  # () where the child had no leader yet: at once
            moved = want is not None and placed != want and (not placed or settled)
            if not (silent or moved):
                continue
            try:
                new = await place(name)
            except Exception as exc:  # the chain's end may be going or slow: again in a while
                rec.placed_at = now
                log.warning("scope %r: %s agent for %s: delegating it again failed: %r",
                            self.path, self.protocol, name, exc)
                continue
            # (a domain led elsewhere now is the normal course as members come and go; an agent
            # that stopped answering needs attention)
            log.log(logging.WARNING if silent else logging.INFO,
                    "scope %r: %s agent for %s %s; delegated again along %s", self.path,
                    self.protocol, name, "unanswering" if silent else "led elsewhere now",
                    " > ".join(new.chain))
            if new.host._actor_id == rec.host._actor_id and not silent:
                # the same agent (one host per node): only its chain is new. Taken as a new
                # one, it counted as missing until a ping answered, and on a loaded node pings
                # time out: its group held everything back meanwhile
                rec.chain, rec.placed_at = new.chain, new.placed_at
                continue
            if new.host._actor_id != rec.host._actor_id:
                rec.host.drop.remote(rec.spec["name"])
            self.agents[name] = new
            changed = True
        return changed

    def _install_views(self, live: list[str], peers: list[list], missing: int) -> None:
        for index, name in enumerate(live):
            rec = self.agents[name]
            content = (self.version, index, tuple(self.upper) if self.upper else None, missing)
            if rec.sent != content:
                rec.sent = content
                rec.host.view.remote(rec.spec["name"], self.version, peers, index, self.upper,
                                     self.top, missing)

    async def agent_status(self, timeout: float) -> dict:
        # (from the records taken before the wait: a member may have left meanwhile)
        recs = dict(self.agents)
        hosts = list(_by_host(recs).values())
        got = await asyncio.gather(*(asyncio.wait_for(
            host.statuses.remote([recs[n].spec["name"] for n in names]), timeout)
            for host, names in hosts), return_exceptions=True)
        out = {}
        for (_host, names), g in zip(hosts, got, strict=True):
            for i, name in enumerate(names):
                status = g[i] if isinstance(g, list) else {"error": repr(g)}
                out[name] = {**recs[name].describe(), **status}
        return out

    def hosts(self) -> list:
        """The agent hosts that run this domain's agents (one handle each)."""
        return [host for host, _names in _by_host(self.agents).values()]

    def describe(self) -> dict:
        return {"version": self.version, "members": self.members, "upper": self.upper,
                "regions": [self.regions[n] for n in self.members],
                **({"fault": self.fault} if self.fault else {})}


class RecoveryDomains:
    """A scope's domains, one per recovery protocol (key: a built-in's name or a plug-in's
    "sha256:<hex>"), made when a protocol's first member appears and dropped with its last."""

    def __init__(self, path: str, top: bool) -> None:
        self.path = path
        self.top = top
        self.domains: dict[str, RecoveryDomain] = {}
        self.upper: dict[str, list] = {}  # per protocol: this scope's agent in the parent's group
        self.keys = ClusterKeys()  # the cluster's keys its agents are made with (see rekey)

    def leader(self, protocol: str) -> str | None:
        d = self.domains.get(protocol)
        return d.members[0] if d is not None and d.members else None

    def addresses(self, member: str) -> dict[str, list]:
        """The agents of member process `member`, per domain (only those placed and
        reachable)."""
        return {p: a for p, d in self.domains.items() if (a := d.address(member)) is not None}

    def address(self, key: str, member: str) -> list | None:
        """The agent of `member` in domain `key` (None: not placed or not reachable)."""
        d = self.domains.get(key)
        return d.address(member) if d is not None else None

    def rekey(self, keys: ClusterKeys) -> None:
        """The cluster's keys changed (scopes/key_rotation): every host running an agent of
        this scope's takes them now (an agent takes only a newer ring), and with every
        `ensure_all` from now on (the agents' specs carry them: a restarted host makes its
        agents with them, one that missed this call catches up); agents placed from now on are
        made with them."""
        self.keys = keys
        hosts = {}
        for d in self.domains.values():
            for rec in d.agents.values():
                rec.spec["keys"] = keys.to_wire()
                hosts[rec.host._actor_id] = rec.host
        for host in hosts.values():
            host.rekey.remote(keys.to_wire())

    def set_upper(self, upper: dict | None) -> None:
        self.upper = dict(upper or {})
        for p, d in self.domains.items():
            d.upper = self.upper.get(p)

    async def update(self, members: dict[str, list[tuple[str, int]]], place, belongs,
                     hold: bool = False, options: dict | None = None) -> bool:
        """Bring every protocol's domain in line with its `members` ((name, region) in ring
        order); `place(protocol, name)` delegates an agent, `belongs(protocol, name)` says
        along which chain it should be now, `hold` that the list may be incomplete (see
        RecoveryDomain.update). True when an agent's address changed."""
        changed = False
        for protocol in sorted(set(members) | set(self.domains)):
            d = self.domains.get(protocol)
            if d is None:
                d = self.domains[protocol] = RecoveryDomain(self.path, protocol, self.top)
                d.upper = self.upper.get(protocol)
            names = members.get(protocol, [])
            faulty_hosts = d.hosts() if d.fault and not names else []
            changed |= await d.update(names, lambda name, p=protocol: place(p, name),
                                      lambda name, p=protocol: belongs(p, name), hold,
                                      options)
            if not names:
                del self.domains[protocol]
                for host in faulty_hosts:  # (a hung plug-in's thread would run on for good)
                    ray.kill(host, no_restart=True)
        return changed

    async def describe(self, timeout: float) -> dict:
        """Every domain with its agents' status (an agent not answering within `timeout` shows
        its error)."""
        # over a copy: while an agent's status is awaited, an update may add or drop a domain
        domains = list(self.domains.items())
        agents = await asyncio.gather(*(d.agent_status(timeout) for _, d in domains))
        return {p: {**d.describe(), "agents": a} for (p, d), a in zip(domains, agents,
                                                                      strict=True)}
