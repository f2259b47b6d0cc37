"""A scope manager (thesis 3.2.2-3.2.6, 3.2.10): one Ray actor per scope — host, LAN, a user's
scope such as `X/Q`, or the cluster (root, `cluster_manager`).

It knows its parent and its *members*: child scopes and member processes, never anything two levels
down. Upward, it reports what its subtree subscribes to and publishes (cascading subscription: the
first subscriber in a scope makes the scope subscribe in its parent, the last one leaving withdraws
it) and *offers* for each topic the endpoint at which traffic enters it. Downward, it receives from
its parent the topic table, sessions and the channels delegated to it, and pushes to each member its
own delegation — to a child scope through `install`, to a member process as the answer to the
member's standing `watch` call (a Ray actor cannot call into a user's process, so each member keeps
one call open and the scope answers it the moment the member's tables change).

Per topic, the policy container (`container`) runs the topic's forwarding policy in a policy actor
and keeps the channels it lays; `_relayout` superimposes them with the channels delegated from above
and hands each to the member it concerns. Everything is state-based and idempotent: reports double
as heartbeats, a child silent for `scope_timeout` (a member for `member_timeout`) is removed and the
channels are laid again around it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import warnings
import zlib
from dataclasses import dataclass, field

import ray

from scopecast.actors import declare
from scopecast.actors.errors import (
    InvalidConfig,
    MemberExpired,
    PluginRejected,
    ScopeRetired,
    actor_fault,
    typed_cause,
)
from scopecast.agents.builtin import NO_RECOVERY
from scopecast.netio.topic_names import Advertised, is_pattern, name_filter, topic_matcher
from scopecast.netio.transport import member_interface
from scopecast.policies.api import MULTICAST
from scopecast.policies.host import PolicyHost
from scopecast.policies.library import materialize, shipped
from scopecast.policies.registry import digest
from scopecast.scopes import multicast_probe
from scopecast.scopes.container import Channel, PolicyContainer
from scopecast.scopes.layout import Offer, multicast_path, sending_path
from scopecast.scopes.recovery_domain import GONE, AgentRecord, RecoveryDomains, agent_name
from scopecast.scopes.topic_table import TopicTable, position
from scopecast.scopes.topics import TopicInfo

log = logging.getLogger(__name__)

DEFAULT_SETTINGS = {"heartbeat_period": 0.5, "scope_timeout": 5.0, "member_timeout": 10.0,
                    "slow_lag_mb": 16.0, "slow_grace": 5.0,
                    "token_period": 0.01, "idle_token_period": 1.0, "empty_scope_timeout": 60.0}
POLICY_TIMEOUT = 10.0
POLICY_STARTUP = 120.0  # a policy actor's first start: a new worker process, on a loaded machine
POLICY_RETRY = 2.0      # a built-in policy actor that did not answer is asked again after this
STATUS_BUDGET = 30.0  # how long a status of the whole tree may take (each level below gets less)
AGENT_STATUS_TIMEOUT = 2.0
DEFAULT_POLICY = "tree"  # what a topic falls back to where its plug-in policy failed
BUILTIN_HOST = "builtin"  # the key of the node's policy actor that hosts the built-in policies
WATCH_TIMEOUT = 1.0
MULTICAST_KINDS = ("lan", "host", "user")


@dataclass(slots=True)
class Child:
    """A member of this scope: a member process or a child scope."""

    name: str
    kind: str                      # "member" or "scope"
    id: int = 0                    # member processes: cluster-wide member id
    host: str = ""
    port: int = 0
    pid: int = 0
    node: str = ""
    role: str = "member"
    subscriptions: set[str] = field(default_factory=set)         # names and patterns
    client_subscriptions: set[str] = field(default_factory=set)
    subs: dict[int, str] = field(default_factory=dict)           # topic -> "member" | "client"
    pubs: set[int] = field(default_factory=set)
    handle: object = None          # child scopes: their actor
    depth: int = 1
    regular: bool = True           # has forwarding duty (not only client subscriptions)
    # child scopes: per protocol whose domain there has members, the chain down to the member
    # that leads it (where the agent standing for the child in this scope's domain belongs)
    recovering: dict[str, tuple] = field(default_factory=dict)
    offers: dict[int, Offer] = field(default_factory=dict)
    joined: dict[str, list[int]] = field(default_factory=dict)
    incarnation: int = 0
    rev: int = 0                   # child scopes: revision of the state they reported
    last_seen: float = field(default_factory=time.monotonic)
    sent_version: int = 0          # version of the last delegation or view sent
    sent: object = None            # its content, to send only changes
    acked: int = 0                 # version the child says it has in place
    table: tuple | None = None     # topic table position it has (as far as this scope knows)
    counters: dict = field(default_factory=dict)  # member processes: data-plane counters
    lagging_since: float = 0.0
    demoted: str = ""              # why this member was demoted to client (a slow consumer)
    wake: asyncio.Event | None = None

    def offer(self, topic: int) -> Offer | None:
        """Where traffic of `topic` enters this member: the member process itself, or the entry
        the child scope offered (None until it has)."""
        if self.kind == "member":
            return Offer((), ("u", self.host, self.port, self.id),
                         (self.id,) if self.regular else ())
        return self.offers.get(topic)

    def record(self, topics: bool = True) -> dict:
        """For status; `topics`: with the ids of the topics it subscribes to and publishes."""
        ids = {"subscribes": sorted(self.subs), "publishes": sorted(self.pubs)} if topics else {}
        if self.kind == "member":
            return {"name": self.name, "id": self.id, "address": f"{self.host}:{self.port}",
                    "pid": self.pid, "node": self.node, "role": "member" if self.regular
                    else "client", "subscriptions": sorted(self.subscriptions),
                    "client_subscriptions": sorted(self.client_subscriptions), **ids,
                    "view": self.sent_version, "installed": self.acked, "counters": self.counters,
                    "demoted": self.demoted,
                    **_channels(self.sent, topics)}
        return {"name": self.name, "depth": self.depth, **ids, "delegated": self.sent_version,
                "installed": self.acked}


class ScopeManager:
    """A scope of the hierarchy; see the module docstring. Async Ray actor."""

    def __init__(self, path: str, kind: str, parent: str | None) -> None:
        logging.basicConfig(level=logging.INFO)
        self.path = path
        self.kind = kind
        self.name = path.rsplit("/", 1)[-1] if path else ""
        self._parent_name = parent
        self._parent = None
        self.incarnation = random.getrandbits(48)
        self.settings = dict(DEFAULT_SETTINGS)
        self.topics: dict[int, TopicInfo] = {}
        self._named: dict[str, TopicInfo] = {}
        self.table = TopicTable()        # the topics as they travel down (see topic_table)
        self._infos: dict[str, tuple[dict, TopicInfo]] = {}
        self.children: dict[str, Child] = {}
        self._by_id: dict[int, str] = {}
        self.multicast = kind in MULTICAST_KINDS
        self.container = PolicyContainer(path, self.multicast)
        self.delegation: dict = {"exits": [], "covered": {}}
        self._version = time.time_ns()   # grows across restarts too
        self.applied = 0                 # version of the parent's delegation in place
        self._pending_version = 0        # version of the parent's delegation last received
        self._reported = None            # the state last reported up (without its revision)
        self._report_rev = 0
        self._report_ref = None  # the last report's call: done once the parent has taken it in
        self._hosts: dict[str, object] = {}
        # (plug-in policy, topic) -> why the plug-in no longer lays that topic here
        self._failed: dict[tuple[str, int], str] = {}
        self._dirty = False
        self._domains: dict[str, list[tuple[str, int]]] | None = None  # see _domain_members
        self._task: asyncio.Task | None = None
        self._ticker: asyncio.Task | None = None
        self._recovering: asyncio.Task | None = None
        self._recovery_again = False
        self._started = time.time()
        self.recovery = RecoveryDomains(path, top=parent is None)
        self._hello: dict | None = None
        self._delegated: dict[str, dict] = {}   # the last layout's part for each child
        self._probe = multicast_probe.LanProbe(path, self._set_multicast)  # a LAN scope
        self._ears = multicast_probe.ProbeEars()  # a host scope
        self._empty_since: float | None = time.monotonic()  # a user's scope: see _retire_if_empty
        self._retiring: asyncio.Task | None = None
        self.retired = False
        # child scopes gone silent, kept in the recovery domains until they report again or Ray
        # says they are gone for good (see _expire); and when this scope itself was restarted
        self._silent: dict[str, Child] = {}
        self._watching: asyncio.Task | None = None
        self._rebuilt_at: float | None = time.monotonic() if _reconstructed() else None

    # ----------------------------------------------------------------------------- running

    async def start(self) -> bool:
        """Run (idempotent). Called when a member is about to join: an empty scope waits for it
        a whole `empty_scope_timeout` before it may retire."""
        self._empty_since = time.monotonic()
        self._ensure_ticking()
        return True

    def _ensure_ticking(self) -> None:
        if self.retired:
            return
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while not self.retired:
            try:
                await self._on_tick()
            except Exception:
                log.exception("scope %r: periodic work failed", self.path)
            period = self.settings["heartbeat_period"]
            before = time.monotonic()
            await asyncio.sleep(period)
            self._credit_own_stall(time.monotonic() - before - period)

    def _credit_own_stall(self, late: float) -> None:
        """A tick `late` seconds late means this scope's own loop was busy (a long re-layout)
        and heard no heartbeat meanwhile: children are not blamed for that time."""
        if late > self.settings["heartbeat_period"]:
            now = time.monotonic()
            for c in self.children.values():
                c.last_seen = min(now, c.last_seen + late)

    async def _on_tick(self) -> None:
        self._expire()
        self._end_rebuilding()
        self._watch_silent()
        self._report(force=True)
        self._start_recovery_tick()
        if self.kind == "lan":
            self._probe_tick()
        if self.kind == "user":
            self._retire_if_empty()

    # ------------------------------------------------------- retiring an empty user scope

    def _retire_if_empty(self) -> None:
        """A user's scope without members, child scopes and agents for `empty_scope_timeout`
        asks the cluster scope to retire it: scopes a job or a test named once would otherwise
        keep a process each, ticking, for the cluster's life. A member naming it again has it
        made again (`ensure_scope`)."""
        if self.children or self.recovery.domains:
            self._empty_since = None
            return
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        elif now - self._empty_since > self.settings["empty_scope_timeout"] and (
                self._retiring is None or self._retiring.done()):
            self._retiring = asyncio.get_running_loop().create_task(self._ask_to_retire())

    async def _ask_to_retire(self) -> None:
        try:
            await self._root_call("retire_scope", self.path, self.incarnation)
        except Exception as exc:  # asked again next tick
            log.warning("scope %r: retiring failed: %r", self.path, exc)

    async def retire(self, incarnation: int) -> bool:
        """Stop for good if still empty (the cluster scope then ends this actor): no more ticks
        or reports, the parent forgets this child, this scope's plug-in policy actors end.
        False if anything arrived meanwhile (a member, a child, a `start`)."""
        empty_for = time.monotonic() - (self._empty_since or time.monotonic())
        if (incarnation != self.incarnation or self.children or self.recovery.domains
                or empty_for < self.settings["empty_scope_timeout"]):
            return False
        self.retired = True
        for key, handle in self._hosts.items():
            if key != BUILTIN_HOST:
                ray.kill(handle, no_restart=True)
        try:
            await asyncio.wait_for(self._parent_handle().forget_scope.remote(
                self.name, self.incarnation), self.settings["scope_timeout"])
        except Exception as exc:  # the parent expires this child as silent instead
            log.warning("scope %r: parent not told of the retirement: %r", self.path, exc)
        log.info("scope %r retired (no members for %.0fs)", self.path, empty_for)
        return True

    async def forget_scope(self, name: str, incarnation: int) -> None:
        """A child scope retired."""
        child = self.children.get(name)
        if child is not None and child.kind == "scope" and child.incarnation == incarnation:
            self._remove(child, "retired")

    # ------------------------------------- what stability waits for: restarts and silence

    @property
    def rebuilding(self) -> bool:
        """Ray restarted this scope, and its children have not all had the time to report again
        (it rebuilds from them): its domains do not know all their members, so they hold
        stability back, and its parent keeps counting the domains it had."""
        return self._rebuilt_at is not None

    def _end_rebuilding(self) -> None:
        grace = max(self.settings["member_timeout"], self.settings["scope_timeout"])
        if self._rebuilt_at is not None and time.monotonic() - self._rebuilt_at > grace:
            self._rebuilt_at = None
            log.info("scope %r: rebuilt from %d children after its restart", self.path,
                     len(self.children))
            self._kick()  # (the report up says so)

    def _watch_silent(self) -> None:
        if self._silent and (self._watching is None or self._watching.done()):
            self._watching = asyncio.get_running_loop().create_task(self._ask_silent())

    async def _ask_silent(self) -> None:
        """A silent child scope leaves the recovery domains once Ray has given it up (a host
        scope whose node died: its members died with it); one that is restarting, or only
        slow, stays until it reports again."""
        silent = list(self._silent.values())
        answers = await self._ask(silent, lambda c: c.handle.incarnation_now.remote())
        for child, answer in zip(silent, answers, strict=True):
            if isinstance(answer, GONE) and self._silent.get(child.name) is child:
                del self._silent[child.name]
                log.warning("scope %r: child scope %s is gone for good: its recovery domains "
                            "no longer wait for it", self.path, child.name)
                self._kick()

    async def incarnation_now(self) -> int:
        """(What a parent asks of a silent child: an answer, late or not, means not gone.) It
        starts the ticks of a scope that Ray restarted where nothing else would: one whose
        members and hosts died with the node it ran on calls it no more, and until it ticks it
        never reports again, so the parent would keep waiting for it."""
        self._ensure_ticking()
        return self.incarnation

    # ------------------------------------------------------- multicast in a LAN (probe)

    def _probe_tick(self) -> None:
        """Probe whether IP multicast passes between this LAN's hosts (see multicast_probe)."""
        self._probe.tick({n: c.handle for n, c in self.children.items() if c.kind == "scope"},
                         self._group())

    def _set_multicast(self, on: bool) -> None:
        if on == self.multicast:
            return
        self.multicast = self.container.multicast = on
        self.container.topics.clear()  # every topic laid afresh, its policy told the change
        self._kick()

    async def probe_join(self, group: str, port: int, token: bytes) -> None:
        """(A host scope) join a LAN probe's group on this node's interface; returns once joined."""
        interface = member_interface((await self._cluster_hello()).get("interface"))
        self._ears.join(interface, group, port, token)

    async def probe_heard(self, token: bytes) -> int:
        """(A host scope) how many of the probe's datagrams this node heard since it joined."""
        return await self._ears.heard(token)

    async def probe_send(self, group: str, port: int, token: bytes) -> None:
        """(A host scope) send a LAN probe from this node's interface."""
        interface = member_interface((await self._cluster_hello()).get("interface"))
        await asyncio.to_thread(multicast_probe.send, interface, group, port, token)

    async def _cluster_hello(self) -> dict:
        """The cluster's key, authenticator and interface setting (asked of the root once)."""
        if self._hello is None:
            self._hello = await self._root_call("hello")
        return self._hello

    def _start_recovery_tick(self) -> None:
        """Agents are placed and watched beside the heartbeat, never in its way (a slow child
        scope or a burst of agents starting must not make this scope look dead); also right
        after a re-layout, so that a new subscriber holds stability back as soon as it can."""
        if self._recovering is not None and not self._recovering.done():
            self._recovery_again = True  # the running one may have missed this change
            return
        self._recovering = asyncio.get_running_loop().create_task(self._recovery_ticks())

    async def _recovery_ticks(self) -> None:
        self._recovery_again = True
        while self._recovery_again:
            self._recovery_again = False
            await self._recovery_tick()

    def _kick(self) -> None:
        """Lay channels again soon (coalesced: one re-layout runs at a time)."""
        self._ensure_ticking()
        self._dirty = True
        self._domains = None  # what changed may change them
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._relayout_loop())

    async def _relayout_loop(self) -> None:
        while self._dirty:
            self._dirty = False
            try:
                await self._relayout()
            except Exception:
                log.exception("scope %r: re-layout failed", self.path)
            self._start_recovery_tick()
            # re-layouts of thousands of topics run back to back: let members' heartbeats in
            await asyncio.sleep(0)

    async def _settle(self) -> None:
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    # ------------------------------------------------------------------- member processes

    async def register_member(self, name: str, host: str, port: int, pid: int, node: str,
                              role: str = "member", member_id: int = 0) -> int:
        _check_role(role)
        if self.retired:
            raise ScopeRetired(f"scope {self.path!r} retired as member {name} joined")
        old = self.children.get(name)
        if old is not None and (old.kind != "member" or old.id != member_id):
            raise InvalidConfig(f"member name {name!r} is taken in scope {self.path!r}")
        mid = await self._allocate(name, host, int(port), int(pid), node, member_id)
        self.children[name] = Child(name, "member", mid, host, int(port), int(pid), node, role,
                                    regular=role == "member", wake=asyncio.Event())
        self._by_id[mid] = name
        self._kick()
        log.info("scope %r: member %s (%d) joined at %s:%d", self.path, name, mid, host, port)
        return mid

    async def unregister_member(self, member_id: int) -> None:
        child = self.children.get(self._by_id.get(member_id, ""))
        if child is not None:
            self._remove(child, "left")

    async def subscribe(self, member_id: int, names: list[str],
                        role: str = "member") -> list[int]:
        """Subscribe a member to topics by name (which must exist) or pattern (existing and
        future topics); returns the ids of the topics covered now (all a member needs: a
        pattern over thousands of topics would cost it their whole entries, and Python keeps
        the memory they took)."""
        _check_role(role)
        member = self._member(member_id)
        matched: dict[str, TopicInfo] = {}
        for n in names:
            if is_pattern(n):
                matcher = topic_matcher(n)
                matched.update((t.name, t) for t in self.topics.values() if matcher.match(t.name))
            else:
                info = await self._topic(n)
                self._check_inside(info)
                matched[n] = info
        (member.subscriptions if role == "member" else member.client_subscriptions).update(names)
        self._resolve(member)
        self._kick()
        await self._settle()
        return sorted(t.id for t in matched.values())

    async def unsubscribe(self, member_id: int, names: list[str], role: str = "member") -> None:
        member = self._member(member_id, missing_ok=True)
        if member is not None:
            (member.subscriptions if role == "member" else member.client_subscriptions
             ).difference_update(names)
            self._resolve(member)
            self._kick()

    async def advertise(self, member_id: int, names: list[str]) -> list[Advertised]:
        """Make the member a publisher of `names` (one re-layout for all of them); what its
        publishers need of each."""
        infos = [await self._topic(n) for n in names]
        for info in infos:
            self._check_inside(info)
        member = self._member(member_id)
        member.pubs.update(info.id for info in infos)
        member.regular = True
        self._kick()
        await self._settle()
        return [Advertised(i.id, i.session, i.recovery != NO_RECOVERY) for i in infos]

    async def unadvertise(self, member_id: int, names: list[str]) -> None:
        member = self._member(member_id, missing_ok=True)
        ids = {info.id for info in map(self._topic_named, names) if info is not None}
        if member is not None and ids & member.pubs:
            member.pubs -= ids
            self._kick()

    async def watch(self, member_id: int, have_version: int = 0,
                    timeout: float = WATCH_TIMEOUT, counters: dict | None = None,
                    table: tuple | None = None) -> dict | None:
        """The member's tables once they differ from `have_version` (at most `timeout` later;
        None if they did not change), with the piece of the topic table past its position
        `table`. Also the member's heartbeat, its acknowledgement that `have_version` is in
        place, and its data-plane counters (for status)."""
        member = self._member(member_id)
        member.acked = have_version
        member.table = position(table)
        if isinstance(counters, dict):
            member.counters = counters
            self._check_lag(member)
        if have_version == member.sent_version and timeout > 0:
            member.wake.clear()
            try:
                await asyncio.wait_for(member.wake.wait(), min(timeout, WATCH_TIMEOUT * 5))
            except asyncio.TimeoutError:
                pass
            member = self._member(member_id, missing_ok=True)  # it may have left meanwhile
        if member is None or member.sent_version == have_version or member.sent is None:
            return None
        return {"version": member.sent_version, **member.sent,
                "topics": self.table.piece(member.table)}

    async def ready(self) -> bool:
        """True once the whole hierarchy has in place the channels laid for everything this
        scope knows now (a publisher waits for this before its first message)."""
        await self._settle()
        if self._parent_name is None:
            return await self.check()
        self._report(force=True)
        return await self._parent_handle().ready.remote()

    # ------------------------------------------------------------------------ child scopes

    async def report(self, name: str, body: dict, handle) -> bool:
        """A child scope's state (cascading subscription), also its heartbeat: a body without
        state names the revision this scope should have. False: it has not, send it."""
        self._ensure_ticking()
        child = self.children.get(name)
        if child is not None and child.kind != "scope":
            log.warning("scope %r: report from %r, which is a member process here", self.path, name)
            return True
        try:
            incarnation, acked, rev = int(body["incarnation"]), int(body["acked"]), int(body["rev"])
            table = position(body.get("table"))
            state = None if "subs" not in body else (
                int(body["depth"]), {int(k): str(v) for k, v in body["subs"].items()},
                {int(t) for t in body["pubs"]},
                {int(k): Offer.from_wire(v) for k, v in body["offers"].items()},
                dict(body["joined"]), bool(body["regular"]),
                {str(p): tuple(map(str, chain)) for p, chain in body["recovering"].items()})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("scope %r: malformed report from %r ignored: %s", self.path, name, exc)
            return True
        if state is None:
            if child is None or child.incarnation != incarnation or child.rev != rev:
                return False
        else:
            before = self._silent.pop(name, None) or child
            if child is None or child.incarnation != incarnation:
                if child is None:
                    log.info("scope %r: child scope %r joined", self.path, name)
                child = self.children[name] = Child(name, "scope", handle=handle,
                                                    incarnation=incarnation)
            if body.get("rebuilding") and before is not None:
                # (see `rebuilding`) the domains it had still count until it has rebuilt
                state = (*state[:-1], {**before.recovering, **state[-1]})
            child.rev = rev
            if state != (child.depth, child.subs, child.pubs, child.offers, child.joined,
                         child.regular, child.recovering):
                (child.depth, child.subs, child.pubs, child.offers, child.joined,
                 child.regular, child.recovering) = state
                self._kick()
        child.last_seen = time.monotonic()
        child.acked = acked
        if acked == child.sent_version and table != child.table:
            child.table = table  # it took in all sent, yet is elsewhere: a piece was lost
            self._kick()
        return True

    async def install(self, version: int, delegation: dict) -> None:
        """The parent's delegation: settings, topics, sessions, channels delegated here."""
        self._ensure_ticking()
        # the table first, even from an overtaken delegation: a newer one's piece may follow it
        if delegation["topics"] is not None:  # (None: nothing new, or no table yet above)
            piece = tuple(delegation["topics"])
            base = await self.table.base_ref(piece) if self.table.needs_base(piece) else None
            if self.table.take(piece, base):
                self._table_changed(self.table.changed)
        early = self.table.take_early(delegation["early"])
        if early:
            self._table_changed(early)
        if version < self._pending_version:
            return  # overtaken by a newer one
        self.settings.update(delegation["settings"])
        self.delegation = delegation
        self.recovery.set_upper(delegation.get("upper"))
        self._pending_version = version
        self._kick()

    async def check(self, version: int | None = None) -> bool:
        """Whether this subtree has in place what was last sent to it (`version`: the parent's),
        and this scope has heard back from every child what it makes of that: a child scope's
        report after applying it carries the subscriptions resolved against the topics sent
        (a pattern subscriber below learns of a new topic only so); nothing may have been sent
        down meanwhile, nor be about to be."""
        await self._settle()
        sent = self._version
        if (version is not None and self.applied != version) or not await self._reported_up():
            return False
        if any(c.acked != c.sent_version for c in self.children.values()):
            return False
        scopes = [c for c in self.children.values() if c.kind == "scope"]
        results = await self._ask(scopes, lambda c: c.handle.check.remote(c.sent_version))
        return all(r is True for r in results) and self._version == sent and not self._dirty \
            and (self._task is None or self._task.done())

    async def _reported_up(self) -> bool:
        """Whether the parent has taken in this scope's last report (so a layout it asks for is
        under way there, and the parent's own check sees it)."""
        if self._report_ref is None:
            return True
        try:
            known = await asyncio.wait_for(self._report_ref, self.settings["scope_timeout"])
            return known is not False  # (False: the state is on its way again)
        except Exception:  # the parent is gone or restarting: its check cannot pass either
            return False

    async def _ask(self, children: list[Child], call, timeout: float | None = None) -> list:
        """Call every child scope at once; a child that does not answer within `timeout` (the
        scope timeout by default: dead, or restarting) answers its exception."""
        timeout = timeout or self.settings["scope_timeout"]
        return await asyncio.gather(*(asyncio.wait_for(call(c), timeout) for c in children),
                                    return_exceptions=True)

    async def status(self, topics: bool = True, budget: float = STATUS_BUDGET) -> dict:
        """This subtree's state; `topics=False` leaves out what is per topic (layouts, topic
        ids of members): at thousands of topics that is megabytes, too much to poll. `budget`:
        the seconds this answer may take; each child scope is given less, so that a slow one
        shows here as not answering rather than this whole subtree not answering above."""
        scopes = [c for c in self.children.values() if c.kind == "scope"]
        below, recovery = await asyncio.gather(
            self._ask(scopes, lambda c: c.handle.status.remote(topics, budget * 0.6),
                      budget * 0.8),
            self.recovery.describe(min(AGENT_STATUS_TIMEOUT, budget * 0.5)))
        sub = {c.name: b if isinstance(b, dict)
               else {"path": "/".join(filter(None, (self.path, c.name))), "error": str(b)}
               for c, b in zip(scopes, below, strict=True)}
        return {"path": self.path or "/", "kind": self.kind, "pid": os.getpid(),
                "node": _node_id(), "incarnation": f"{self.incarnation:012x}",
                "delegation_version": self.applied, "depth": self._depth(),
                "multicast": self._group() if self.multicast else None,
                **({"multicast_probe": self._probe.state.record()} if self.kind == "lan" else {}),
                "members": [c.record(topics) for c in self.children.values()
                            if c.kind == "member"],
                **({"topics": self.container.describe(),
                    "delegated_here": self.delegation.get("exits", []),
                    "covered_here": self.delegation.get("covered", {})} if topics else {}),
                "policy_rejections": dict(self.container.rejected),
                "failed_policies": {f"{p} topic {t}": why for (p, t), why in self._failed.items()},
                "recovery": recovery, "rebuilding": self.rebuilding,
                "silent_scopes": sorted(self._silent),
                "scopes": [{**c.record(topics), **sub[c.name]} for c in scopes]}

    # ----------------------------------------------------------------------------- layout

    async def _relayout(self) -> None:
        version = self._pending_version
        wanted = self._wanted()
        for phase in ("choices", "events"):
            if phase == "events":
                wanted = self._wanted()  # entry members and exits chosen: sources and members
            await self._run_policies(self.container.requests(wanted, phase))
        length = self._length()
        self._delegated = self._delegate(length)
        self._send_down()
        self.applied = version
        self._report()

    def _table_changed(self, keys: set[str] | None) -> None:
        """Topics of `keys` (None: any) changed: the scope's TopicInfos and its members'
        subscriptions follow."""
        self._topics_changed(keys)
        for child in self.children.values():
            if child.kind == "member":
                self._resolve(child, keys)

    def _topics_changed(self, keys: set[str] | None = None) -> None:
        """Bring the TopicInfos in line with the table: those of `keys` (None: rebuild all,
        keeping those whose entries are the same objects as before). One change at a time,
        rebuilding all made creating 10,000 topics quadratic in every scope."""
        if keys is not None:
            for key in keys:
                old = self._infos.pop(key, None)
                if old is not None:
                    self.topics.pop(old[1].id, None)
                    if self._named.get(old[1].name) is old[1]:
                        del self._named[old[1].name]
                body = self.table.entries.get(key)
                if body is not None:
                    info = TopicInfo(**body)
                    self._infos[key] = (body, info)
                    self.topics[info.id] = self._named[info.name] = info
            return
        old = self._infos
        self._infos = {k: old[k] if k in old and old[k][0] is v else (v, TopicInfo(**v))
                       for k, v in self.table.entries.items()}
        self.topics = {int(k): info for k, (_v, info) in self._infos.items()}
        self._named = {info.name: info for info in self.topics.values()}

    def _relevant(self, info: TopicInfo) -> bool:
        root = info.root
        return root == "" or self.path == root or self.path.startswith(root + "/")

    def _interest(self) -> tuple[dict[int, set[str]], dict[int, set[str]], dict[int, set[str]]]:
        """Per topic: interested children (subscribers), publishing children, and children
        to which channels delegated from above were handed (exits)."""
        subs: dict[int, set[str]] = {}
        pubs: dict[int, set[str]] = {}
        for c in self.children.values():
            for t in c.subs:
                subs.setdefault(t, set()).add(c.name)
            for t in c.pubs:
                pubs.setdefault(t, set()).add(c.name)
        exits: dict[int, set[str]] = {}
        for x in self.delegation.get("exits", ()):
            exits.setdefault(x["topic"], set()).update(self._exit_members(x))
        return subs, pubs, exits

    def _exit_members(self, exit_: dict) -> list[str]:
        """The members a channel delegated from above goes to: the policy's choice, or the first
        forwarder where no policy runs for the topic here (a topic covered by a multicast group)."""
        layout = self.container.topics.get(exit_["topic"])
        chosen = layout.exits.get(exit_["replicas"]) if layout is not None else None
        return chosen or self._forwarders()[:1]

    def _forwarders(self) -> list[str]:
        names = sorted(c.name for c in self.children.values() if c.regular)
        return names or sorted(self.children)

    def _wanted(self) -> dict[int, dict]:
        subs, pubs, exits = self._interest()
        covered = {int(k) for k in self.delegation.get("covered", {})}
        forwarders = self._forwarders()
        replicas: dict[int, set[int]] = {}
        for x in self.delegation.get("exits", ()):
            replicas.setdefault(x["topic"], set()).add(x["replicas"])
        wanted = {}
        for tid in sorted(subs.keys() | pubs.keys() | exits.keys()):  # (no one's: nothing to lay)
            info = self.topics.get(tid)
            if info is None or tid in covered or not self._relevant(info):
                continue
            takers = {m for m in subs.get(tid, ()) if self.children[m].regular}
            members = takers | exits.get(tid, set())
            sources = set(pubs.get(tid, ()))
            up = self._parent_name is not None and self.path != info.root
            if up and (tid in subs or tid in exits):
                layout = self.container.topics.get(tid)
                if layout is not None and layout.entry in self.children:
                    sources.add(layout.entry)
                    members.add(layout.entry)
            if not members and not sources and tid not in subs:
                continue
            wanted[tid] = {"policy": self._policy_key(info),
                           "context": {"scope": self.path, "topic": info.name, "topic_id": tid,
                                       "multicast": self.multicast, "options": info.options},
                           "members": members, "sources": sources,
                           # the policy picks the entry and exits among the regular
                           # subscribers, which take the traffic anyway (a member that only
                           # publishes, made the entry, would get every other source's traffic
                           # just to pass it on); among any members where none subscribes
                           "candidates": sorted(takers) or forwarders,
                           "replicas": replicas.get(tid, {1})}
        return wanted

    def _policy_key(self, info: TopicInfo) -> str:
        """Which policy actor hosts the topic here: a built-in's name or a plug-in's digest; a
        plug-in that failed in this scope is replaced by the default policy (status says why)."""
        key = f"sha256:{info.plugin}" if info.plugin else info.policy
        return DEFAULT_POLICY if (key, info.id) in self._failed else key

    async def _run_policies(self, batches: dict[str, list[dict]]) -> None:
        async def one(policy: str, items: list[dict]) -> None:
            public = [{k: v for k, v in it.items() if not k.startswith("_")} for it in items]
            plugin = policy.startswith("sha256:")
            host, retry = None, False
            try:
                host = await self._policy_host(policy)
                results = await asyncio.wait_for(
                    host.apply.remote(self.path, "" if plugin else policy, public), POLICY_TIMEOUT)
            except Exception as exc:  # hung, died, or never came up (a plug-in's topics here
                # fall back to the default policy; a built-in is ours: slow, not wrong, asked again)
                why = ("did not answer in time" if isinstance(exc, asyncio.TimeoutError)
                       else actor_fault(exc))
                if host is None:
                    why = f"failed to start: {why}"
                log.warning("scope %r: policy actor %s failed: %s", self.path, policy, why)
                key = _host_key(policy)
                self._hosts.pop(key, None)
                if host is not None:  # its topics here get their whole state again next time
                    self.container.host_lost(lambda p: _host_key(p) == key)
                    if plugin:  # a fresh actor hosts the plug-in's other topics
                        ray.kill(host, no_restart=True)
                results = [{"topic": it["topic"], "ops": [], "error": f"policy actor {why}"}
                           for it in items]
                retry = not plugin
            for item, result in zip(items, results, strict=True):
                rejected = self.container.apply(item, result)
                if result.get("lost"):
                    self._dirty = True
                why = result.get("error") or (
                    f"returned malformed operations ({', '.join(rejected)})" if rejected else None)
                if why and policy != DEFAULT_POLICY and not retry:
                    self._failed[(policy, item["topic"])] = why[:500]
                    self._dirty = True  # lay the topic again with the default policy
            if retry:
                asyncio.get_running_loop().call_later(POLICY_RETRY, self._kick)

        await asyncio.gather(*(one(p, items) for p, items in batches.items() if items))

    async def _policy_host(self, policy: str):
        """The policy actor for a built-in policy (the node's, shared by its scopes) or for a
        plug-in (this scope's own: its module is fetched from the root's library, checked against
        its digest and shipped to the actor in its runtime_env). Made on first use."""
        key = _host_key(policy)
        handle = self._hosts.get(key)
        if handle is not None:
            return handle
        if key == BUILTIN_HOST:
            node = _node_id()
            handle = await _named_actor(PolicyHost, f"scopecast:policy:{node}",
                                        ray_options=pinned(node))
        else:
            module, cls, env = await self._plugin(policy)
            handle = await _named_actor(PolicyHost, f"scopecast:policy:{self.path}:{key[:23]}",
                                        module, cls, ray_options={"runtime_env": env})
        await asyncio.wait_for(handle.__ray_ready__.remote(), POLICY_STARTUP)
        self._hosts[key] = handle
        return handle

    async def _plugin(self, ref: str) -> tuple[str, str, dict]:
        """(module, class, runtime_env) of plug-in `ref` ("sha256:<hex>"): fetched from the
        root's library, checked against its digest, shipped in the runtime_env."""
        sha = ref[len("sha256:"):]
        module, cls, files = await self._root_call("plugin_files", sha)
        if digest(files) != sha:
            raise PluginRejected(f"plug-in {sha[:12]} does not match its digest")
        return module, cls, shipped(materialize(files, sha, module))

    def _length(self) -> int:
        """L: the length of the labels of channels laid in this scope."""
        return max((c.depth for c in self.children.values()), default=1)

    def _depth(self) -> int:
        return 1 + self._length()

    def _group(self) -> list:
        prefix = self.settings.get("group_prefix", (239, 192, 0))
        h = zlib.crc32(self.path.encode())
        return ["239.%d.%d.%d" % (prefix[1], (prefix[2] + (h >> 8)) & 0xFF, 1 + h % 254),
                self.settings.get("port", 40000)]

    def _delegate(self, length: int) -> dict[str, dict]:
        """Hand every channel to the member it concerns: own channels to their source member,
        channels delegated from above to the chosen exit members, multicast coverage to all."""
        out: dict[str, dict] = {}

        def give(name: str, key: str, item) -> None:
            body = out.setdefault(name, {"exits": [], "covered": {}})
            if key == "exits":
                body["exits"].append(item)
            else:
                body["covered"][str(item[0])] = item[1]

        subs, pubs, exits = self._interest()
        group = self._group()
        # coverage from above: every member interested in or publishing the topic joins / sends
        for tid, cov in self.delegation.get("covered", {}).items():
            tid = int(tid)
            for name in subs.get(tid, set()) | pubs.get(tid, set()) | exits.get(tid, set()):
                give(name, "covered", (tid, {**cov, "wraps": cov["wraps"] + [[name, length]]}))
        for tid, layout in self.container.topics.items():
            channels = list(layout.channels.values())
            clients = {m for m in subs.get(tid, ()) if not self.children[m].regular}
            channels += [Channel(o, c, o) for o in layout.sources for c in clients if c != o]
            if self.container.covered(tid):
                cov = {"topic": tid, "dst": multicast_path(length), "endpoint": ["g", *group],
                       "receivers": self._joined(group), "scope": self.path}
                for name in subs.get(tid, set()) | pubs.get(tid, set()) | exits.get(tid, set()):
                    give(name, "covered", (tid, {**cov, "origin": name,
                                                 "wraps": [[name, length]]}))
                channels = [c for c in channels if c.dst != MULTICAST]
            for ch in channels:
                ob = self._obligation(tid, ch, length)
                if ob is not None and ch.src in self.children:
                    give(ch.src, "exits", {**ob, "wraps": [[ch.src, length]]})
        for x in self.delegation.get("exits", ()):
            chosen = self._exit_members(x)
            n = len(chosen)
            for k, name in enumerate(chosen):
                give(name, "exits", {**x, "wraps": x["wraps"] + [[name, length]], "replicas": 1,
                                     "filter": ["modulo", n, k] if n > 1 else x["filter"]})
        return out

    def _obligation(self, tid: int, ch: Channel, length: int) -> dict | None:
        """The delegated form of one channel laid here: where it goes, and who waits for it."""
        dst = self.children.get(ch.dst)
        offer = dst.offer(tid) if dst is not None else None
        if offer is None:
            return None  # its entry is not known yet; laid when its report comes
        return {"topic": tid, "origin": ch.origin, "dst": offer.into(dst.name, length),
                "endpoint": list(offer.endpoint), "receivers": list(offer.receivers),
                "filter": list(ch.filter) if ch.filter else None, "replicas": ch.replicas,
                "scope": self.path}

    def _joined(self, group: list) -> list[int]:
        """Regular members of this subtree that join `group`."""
        key = "%s:%d" % tuple(group)
        ids: set[int] = set()
        for c in self.children.values():
            ids.update(c.joined.get(key, ()))
        return sorted(ids)

    # ----------------------------------------------------------------------- sending down

    def _send_down(self) -> None:
        """Send every child its part of the last layout (only what changed goes out)."""
        for child in list(self.children.values()):
            body = self._delegated.get(child.name, {"exits": [], "covered": {}})
            if child.kind == "member":
                self._send_view(child, body)
            else:
                self._send_install(child, body)

    def _send_install(self, child: Child, body: dict) -> None:
        content = {"settings": self.settings, "early": dict(self.table.early),
                   "exits": body["exits"], "covered": body["covered"],
                   "upper": self.recovery.addresses(child.name)}
        piece = self.table.piece(child.table)  # (what it lacks: sent along, not compared)
        if content == child.sent and piece is None:
            return
        self._version += 1
        child.sent, child.sent_version = content, self._version
        if piece is not None:
            child.table = self.table.position
        child.handle.install.remote(self._version, {**content, "topics": piece})

    def _send_view(self, child: Child, body: dict) -> None:
        view = self._member_view(child, body)
        if view == child.sent and child.table == self.table.position:
            return
        self._version += 1
        child.sent, child.sent_version = view, self._version
        # a member joins its groups for the senders once it can also hold their messages back:
        # with reliable topics, once its recovery agent is in place
        listed = child.regular and set(view["protocols"].values()) <= set(view["agents"])
        joined = {"%s:%d" % tuple(g): [child.id] for g in view["groups"]} if listed else {}
        if joined != child.joined:  # senders to those groups wait for it: lay again
            child.joined = joined
            self._dirty = True
        child.wake.set()

    def _member_view(self, member: Child, body: dict) -> dict:
        """A member process's tables: the channels it sends along, the groups it receives on
        (where a multicast group covers a topic it subscribes to or forwards), its siblings."""
        routes = [_route(ob) for ob in body["exits"]]
        forwards = {ob["topic"] for ob in body["exits"]}
        groups = set()
        for tid, cov in body["covered"].items():
            tid = int(tid)
            if tid in member.pubs:
                routes.append(_route(cov))
            if tid in member.subs or tid in forwards:
                groups.add(tuple(cov["endpoint"][1:]))
        receivers: dict[str, list[int]] = {}
        for r in routes:
            ep = r["endpoint"]
            key = "%s:%d" % (ep[1], ep[2])
            receivers[key] = sorted(set(receivers.get(key, [])) | set(r.pop("receivers")))
        reliable = self._reliable_topics(member)
        # one channel serves many topics: routes alike but for the topic travel as one entry
        # with their topics (a publisher of thousands of topics gets a few, not thousands)
        alike: dict[str, dict] = {}
        for r in routes:
            topic = r.pop("topic")
            alike.setdefault(repr(sorted(r.items())), {**r, "topics": []})["topics"].append(topic)
        return {"members": sorted([c.id, c.name, c.host, c.port] for c in self.children.values()
                                  if c.kind == "member"),
                "agents": self.recovery.addresses(member.name),
                "demoted": member.demoted,
                "protocols": reliable,
                "cached": sorted(t for t in reliable if self.topics[t].history == "cached"),
                "early": dict(self.table.early),
                "groups": sorted(list(g) for g in groups), "routes": list(alike.values()),
                "receivers": receivers}

    # ------------------------------------------------------------------------- sending up

    def _report(self, force: bool = False) -> None:
        """Send this scope's state up if it changed, else a heartbeat; `force`: a heartbeat. A state
        the parent has (same revision) goes as a heartbeat only: the state of thousands of
        topics, sent every period, kept both scopes busy parsing and comparing it."""
        if self._parent_name is None or self.retired:
            return
        if not force or self._reported is None:  # (what it depends on changes by re-layouts)
            state = self._report_body()
            if state != self._reported:
                self._reported = state
                self._report_rev += 1
                self._send_report({**state, "rev": self._report_rev})
                return
        self._send_report({"rev": self._report_rev})  # also says what it has in place now

    def _send_report(self, body: dict) -> None:
        body.update(incarnation=self.incarnation, acked=self.applied, table=self.table.position)
        try:
            ref = self._parent_handle().report.remote(
                self.name, body, ray.get_runtime_context().current_actor)
        except Exception as exc:
            log.warning("scope %r: cannot report to %r: %s", self.path, self._parent_name, exc)
            self._parent = None
            return
        self._report_ref = ref
        if "subs" not in body:
            asyncio.get_running_loop().create_task(self._resend_if_unknown(ref))

    async def _resend_if_unknown(self, ref) -> None:
        """A parent that answers a heartbeat with False lacks this scope's state (it restarted,
        or dropped a malformed report): it gets the whole state at once."""
        try:
            known = await ref
        except Exception:  # the parent is gone: the next heartbeat finds out
            return
        if known is False and ref is self._report_ref:
            self._send_report({**self._reported, "rev": self._report_rev})

    def _report_body(self) -> dict:
        subs: dict[int, str] = {}
        pubs: set[int] = set()
        for c in self.children.values():
            for t, role in c.subs.items():
                if subs.get(t) != "member":
                    subs[t] = role
            pubs |= c.pubs
        subs = {t: r for t, r in subs.items() if t in self.topics
                and self._relevant(self.topics[t]) and self.topics[t].root != self.path}
        pubs = {t for t in pubs if t in self.topics and self.topics[t].root != self.path}
        joined: dict[str, set[int]] = {}
        for c in self.children.values():
            for key, ids in c.joined.items():
                joined.setdefault(key, set()).update(ids)
        return {"depth": self._depth(), "subs": {str(t): r for t, r in subs.items()}, "pubs": sorted(pubs),
                "offers": {str(t): o.to_wire() for t, o in self._offers(subs).items()},
                "joined": {k: sorted(v) for k, v in joined.items()},
                "regular": any(c.regular for c in self.children.values()),
                "recovering": {p: list(self._lead_chain(p)) for p in self._domain_members()},
                "rebuilding": self.rebuilding}

    def _offers(self, subs: dict[int, str]) -> dict[int, Offer]:
        """For each topic this scope receives from its parent: where that traffic enters."""
        length = self._length()
        wanted = set(subs) | {x["topic"] for x in self.delegation.get("exits", ())}
        out = {}
        for tid in wanted:
            if str(tid) in self.delegation.get("covered", {}):
                continue
            if self.container.covered(tid):
                group = self._group()
                out[tid] = Offer(tuple(multicast_path(length)), ("g", *group),
                                 tuple(self._joined(group)))
                continue
            layout = self.container.topics.get(tid)
            entry = self.children.get(layout.entry) if layout and layout.entry else None
            below = entry.offer(tid) if entry is not None else None
            if below is not None:
                out[tid] = Offer(tuple(below.into(entry.name, length)), below.endpoint,
                                 below.receivers)
        return out

    def _parent_handle(self):
        if self._parent is None:
            self._parent = declare.find(self._parent_name)
        return self._parent

    def _check_lag(self, member: Child) -> None:
        """A member whose application stays behind by more than `slow_lag_mb` for `slow_grace`
        is demoted to client: nobody waits for it any more (paper 004: one slow consumer must
        not stall a publisher). It is told in its view; status shows it."""
        backlog = member.counters.get("backlog_bytes", 0)
        if not member.subscriptions or not isinstance(backlog, int) \
                or backlog <= self.settings["slow_lag_mb"] * (1 << 20):
            member.lagging_since = 0.0
            return
        now = time.monotonic()
        if not member.lagging_since:
            member.lagging_since = now
        elif now - member.lagging_since > self.settings["slow_grace"]:
            member.demoted = (f"application behind by {backlog >> 20} MiB for more than "
                              f"{self.settings['slow_grace']:g}s")
            log.warning("scope %r: member %s demoted to client: %s", self.path, member.name,
                        member.demoted)
            member.client_subscriptions |= member.subscriptions
            member.subscriptions = set()
            self._resolve(member)
            self._kick()

    # ---------------------------------------------------------------------- recovery domain

    def _reliable_topics(self, member: Child) -> dict[int, str]:
        """Topics a member process takes part in recovering (subscribed as a member, or
        published, with a recovery protocol), each with its protocol's domain key."""
        mine = {t for t, role in member.subs.items() if role == "member"} | member.pubs
        return {t: key for t in mine if t in self.topics
                and (key := self.topics[t].recovery_key) != NO_RECOVERY}

    def _domain_members(self) -> dict[str, list[tuple[str, int]]]:
        """Per protocol, the children in its domain with their regions, in ring order: children
        that subscribe to the same topics share a region (QSM), numbered in order of their
        first member, and the ring keeps a region's members together. Kept until the next
        change of children or topics (`_kick`): asked every tick, it costs a pass over every
        topic of every child."""
        if self._domains is None:
            self._domains = self._group_domains()
        return self._domains

    def _group_domains(self) -> dict[str, list[tuple[str, int]]]:
        grouped: dict[str, list[tuple[tuple, str]]] = {}
        for c in [*self.children.values(), *self._silent.values()]:
            keys = c.recovering if c.kind == "scope" else set(self._reliable_topics(c).values())
            interest = tuple(sorted(t for t, role in c.subs.items() if role == "member"))
            for key in keys:
                grouped.setdefault(key, []).append((interest, c.name))
        out: dict[str, list[tuple[str, int]]] = {}
        for key, entries in grouped.items():
            numbers: dict[tuple, int] = {}
            out[key] = [(name, numbers.setdefault(interest, len(numbers)))
                        for interest, name in sorted(entries)]
        return out

    def _lead_chain(self, protocol: str) -> tuple:
        """The chain from this scope down to the member leading its `protocol` domain."""
        members = self._domain_members().get(protocol)
        if not members:
            return ()
        leader = self.children.get(members[0][0]) or self._silent.get(members[0][0])
        if leader is None or leader.kind != "scope":
            return (members[0][0],)
        return (leader.name, *leader.recovering.get(protocol, ()))

    def _belongs(self, protocol: str, name: str) -> tuple | None:
        """Where the agent of child scope `name` belongs: its lead chain (None: a member, or a
        child whose domain has no leader yet)."""
        child = self.children.get(name)
        chain = child.recovering.get(protocol) if child and child.kind == "scope" else None
        return chain or None

    async def _recovery_tick(self) -> None:
        try:
            changed = await self.recovery.update(self._domain_members(), self._place_for,
                                                 self._belongs, hold=self.rebuilding)
        except Exception as exc:  # a child placing an agent timed out or died: next tick again
            log.warning("scope %r: recovery domain update failed: %r", self.path, exc)
            return
        if changed:
            self._send_down()  # the children's tables name their agents; no re-layout needed
            if self._dirty:  # a member's groups changed with it: senders wait for it
                self._kick()

    async def _place_for(self, protocol: str, name: str) -> AgentRecord:
        """Delegate the agent of member `name` of this scope's `protocol` domain (3.2.13)."""
        child = self.children.get(name)
        if child is None:  # silent: its agent stays where it was, holding stability back
            raise LookupError(f"child scope {name!r} is silent")
        hello = await self._cluster_hello()
        spec = {"name": agent_name(self.path, name, protocol),
                "domain": f"{self.path or '/'}|{name}",
                "level": 1 if child.kind == "member" else child.depth, "protocol": protocol,
                "options": {"active_period": self.settings["token_period"],
                            "idle_period": self.settings["idle_token_period"]},
                "key": hello["key"], "mac": hello["mac"], "interface": hello.get("interface")}
        if child.kind == "member":
            return AgentRecord(await self._agent_host(child.node, protocol), spec,
                               [self.path or "/", name])
        host, chain = await asyncio.wait_for(child.handle.place_agent.remote(spec),
                                             self.settings["scope_timeout"])
        return AgentRecord(host, spec, [self.path or "/", *chain])

    async def place_agent(self, spec: dict) -> list:
        """Place an agent of the parent's domain on the host of the leader of this scope's
        domain of the same protocol: delegated down to the child that leads, and run by the
        AgentHost of its member's node. Returns [agent host, chain]."""
        protocol = spec["protocol"]
        leader = self.children.get(self.recovery.leader(protocol) or "")
        if leader is not None and leader.kind == "scope":
            host, chain = await leader.handle.place_agent.remote(spec)
            return [host, [self.name, *chain]]
        node = leader.node if leader is not None else _node_id()
        return [await self._agent_host(node, protocol),
                [self.name, *([leader.name] if leader is not None else [])]]

    async def _agent_host(self, node: str, protocol: str):
        """The AgentHost of `node` for `protocol` (created on first use, pinned there): the
        built-ins share one per node; each plug-in protocol runs in one of its own."""
        from scopecast.agents.agent import AgentHost, host_name

        node = node or _node_id()
        opts = pinned(node)
        args: tuple = ()
        if protocol.startswith("sha256:"):
            module, cls, opts["runtime_env"] = await self._plugin(protocol)
            args = (module, cls)
        return await _named_actor(AgentHost, host_name(node, protocol), *args, ray_options=opts)

    # ---------------------------------------------------------------------------- helpers

    def _member(self, member_id: int, missing_ok: bool = False) -> Child | None:
        child = self.children.get(self._by_id.get(member_id, ""))
        if child is None:
            if missing_ok:
                return None
            raise MemberExpired(f"member {member_id} is not registered in scope {self.path!r} "
                                "(expired after missing heartbeats, or the scope restarted)")
        child.last_seen = time.monotonic()
        return child

    def _resolve(self, member: Child, keys: set[str] | None = None) -> None:
        """Topics a member's subscriptions cover (after its or the topics' change; `keys`: only
        those topics changed, None: any). What it publishes stays as it advertised it, even a
        topic missing from the table for now: a scope asks the root for a topic its parent's
        table does not carry yet, and a table from above that still lacks it (the parent not
        caught up, or a restarted scope's first one) must not make it forget a publisher; every
        use looks ids up in `topics`. (Matching every topic again for every member on every
        change of a table of 40,000 kept a scope busy past its parent's timeout.)"""
        client, mine = name_filter(member.client_subscriptions), name_filter(member.subscriptions)
        if keys is None:
            member.subs = {}
            infos = self.topics.values()
        else:
            for key in keys:
                member.subs.pop(int(key), None)
            infos = filter(None, map(self.topics.get, map(int, keys)))
        for info in infos:
            if mine(info.name):
                member.subs[info.id] = "member"
            elif client(info.name):
                member.subs[info.id] = "client"
        member.regular = bool(member.role == "member" and (member.subscriptions or member.pubs
                                                           or not member.client_subscriptions))

    def _expire(self) -> None:
        now = time.monotonic()
        for c in list(self.children.values()):
            limit = self.settings["member_timeout" if c.kind == "member" else "scope_timeout"]
            if now - c.last_seen > limit:
                if c.kind == "scope" and c.recovering:
                    # silent is not gone: a restarting scope's members live on, and stability
                    # passed without them would lose them what is unstable (nobody would keep
                    # it for them); see _ask_silent
                    self._silent[c.name] = c
                self._remove(c, f"silent for {limit:.0f}s")

    def _remove(self, child: Child, why: str) -> None:
        del self.children[child.name]
        if child.kind == "member":
            self._by_id.pop(child.id, None)
            self._release(child.id)
            if child.wake is not None:
                child.wake.set()
        log.log(logging.INFO if why in ("left", "retired") else logging.WARNING,
                "scope %r: %s %s removed (%s)", self.path, child.kind, child.name, why)
        self._kick()

    async def _topic(self, name: str) -> TopicInfo:
        info = self._topic_named(name)
        if info is None:
            info = await self._root_call("topic", name)
            self._table_changed(self.table.take_early({str(info.id): info.to_dict()}))
        return info

    def _topic_named(self, name: str) -> TopicInfo | None:
        return self._named.get(name)

    def _check_inside(self, info: TopicInfo) -> None:
        if not self._relevant(info):
            raise InvalidConfig(f"topic {info.name!r} is rooted at scope {info.root!r}; a member "
                                f"of scope {self.path!r} cannot use it")

    async def _allocate(self, name, host, port, pid, node, member_id) -> int:
        return await self._root_call("allocate_member", name, host, port, pid, node, self.path,
                                     member_id)

    def _release(self, member_id: int) -> None:
        asyncio.get_running_loop().create_task(self._root_call("release_member", member_id))

    async def _root_call(self, method: str, *args):
        root = declare.find(declare.CLUSTER_SCOPE_MANAGER)
        try:
            return await getattr(root, method).remote(*args)
        except ray.exceptions.RayTaskError as exc:
            cause = typed_cause(exc)
            if cause is not None:
                raise cause from None
            raise


def pinned(node: str) -> dict:
    """Ray options that place an actor on `node`. Hard affinity: Ray's soft one did not hold for
    actors that ask for no resources (on three nodes, most landed on another node); and an actor
    named for a node that is gone is not wanted elsewhere (its successor is named for its new
    node)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)} if node else {}


async def _named_actor(cls: type, name: str, *args, ray_options: dict):
    """`declare.get_or_create` off the event loop (a named-actor lookup is a blocking GCS call)."""
    return await asyncio.to_thread(declare.get_or_create, cls, name, *args,
                                   ray_options=ray_options)


def _host_key(policy: str) -> str:
    """Which policy actor runs `policy`: the node's built-ins' or the plug-in's own."""
    return policy if policy.startswith("sha256:") else BUILTIN_HOST


def _channels(view: dict | None, topics: bool = True) -> dict:
    """A member's channels as status shows them: labels "P:B-Q:C, T:P" with their endpoints
    (one per topic and channel: without `topics`, how many)."""
    if not view:
        return {"channels": [] if topics else 0, "groups": [], "receivers": {}}
    if not topics:
        return {"channels": sum(len(r["topics"]) for r in view["routes"]),
                "groups": view["groups"], "receivers": view["receivers"]}
    return {"channels": [{"label": f"{':'.join(r['src'])}-{':'.join(r['dst'])}, "
                                   f"{topic}:{r['origin']}",
                          "endpoint": r["endpoint"], "laid_in": r["scope"],
                          **({"filter": r["filter"]} if r["filter"] else {})}
                         for r in view["routes"] for topic in r["topics"]],
            "groups": view["groups"], "receivers": view["receivers"]}


def _route(ob: dict) -> dict:
    """A channel delegated down to a member process, as the member installs it."""
    return {"topic": ob["topic"], "src": sending_path(ob["wraps"]), "dst": ob["dst"],
            "origin": ob["origin"], "endpoint": ob["endpoint"], "filter": ob.get("filter"),
            "receivers": ob.get("receivers", []), "scope": ob.get("scope", "")}


def _check_role(role: str) -> None:
    if role not in ("member", "client"):
        raise InvalidConfig(f"role must be 'member' or 'client', not {role!r}")


def _reconstructed() -> bool:
    """Whether Ray restarted this actor (True where that cannot be told: holding stability
    back a while is safe, passing it too early is not)."""
    try:
        with warnings.catch_warnings():  # (Ray's own method reads a property it deprecated)
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return True


def _node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""

