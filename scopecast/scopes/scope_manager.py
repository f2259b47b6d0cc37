"""A scope manager (thesis 3.2.2-3.2.6, 3.2.10): one Ray actor per scope — host, LAN, a configured
level above the LANs (kind "level", e.g. a datacenter), a user's scope such as `X/Q`, or the
cluster (root, `cluster_manager`).

It knows its parent and its *members*: child scopes and member processes, never anything two levels
down. Upward, it reports what its subtree subscribes to and publishes (cascading subscription: the
first subscriber in a scope makes the scope subscribe in its parent, the last one leaving withdraws
it) and *offers* for each topic the endpoint at which traffic enters it. Downward, it receives from
its parent the topic table, sessions and the channels delegated to it, and pushes to each member its
own delegation — to a child scope through `install`, to a member process as the answer to the
member's standing `watch` call (a Ray actor cannot call into a user's process, so each member keeps
one call open and the scope answers it the moment the member's tables change).

Everything is state-based and idempotent: reports double as heartbeats, a child silent for
`scope_timeout` (a member for `member_timeout`) is removed and the channels are laid again around it.

The actor wires parts that each own their state:

| part | module | what it does |
|---|---|---|
| `members` | `membership` | children, heartbeats, failure detection |
| `topics` | `topic_view` | the topic table and its entries |
| `planner` | `planner` | what is laid, delegated, reported (pure) |
| `policies` | `policy_runner` | runs the policies in policy actors |
| `choices` | `scope_admin` | the administrators' settings: each topic's policy and recovery chain |
| `downlink` | `downlink` | sends children their part |
| `reporter` | `reporting` | reports up, heartbeats |
| `recovery`, `agents` | `recovery_domain`, `agent_placement` | recovery domains and their agents |
| `retirement`, `rebuild` | `retirement` | an empty scope's end; rebuilding after a restart |
| `probe`, `ears` | `multicast_probe` | does multicast pass in a LAN |
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter

import ray

from scopecast.actors import declare, logs
from scopecast.actors.errors import (
    IncompatibleVersion,
    InvalidConfig,
    PermissionDenied,
    ScopeRetired,
    typed_cause,
)
from scopecast.agents.builtin import NO_RECOVERY
from scopecast.netio import wire
from scopecast.netio.topic_names import (
    Advertised,
    check_subscription,
    is_pattern,
    topic_matcher,
)
from scopecast.netio.transport import member_interface
from scopecast.policies.builtin import alike_topics
from scopecast.scopes import credentials, multicast_probe
from scopecast.scopes.agent_placement import AgentPlacement
from scopecast.scopes.collector import collector_off
from scopecast.scopes.container import PolicyContainer
from scopecast.scopes.delegation import Delegation, MalformedDelegation
from scopecast.scopes.downlink import Downlink
from scopecast.scopes.membership import Membership, ask_all, check_role, resolve
from scopecast.scopes.paths import scope_name
from scopecast.scopes.placement import node_id
from scopecast.scopes.planner import Planner
from scopecast.scopes.policy_runner import PolicyRunner
from scopecast.scopes.recovery_domain import RecoveryDomains
from scopecast.scopes.relayouts import Relayouts
from scopecast.scopes.reporting import Reporter
from scopecast.scopes.reports import MalformedReport, ScopeReport
from scopecast.scopes.retirement import Rebuild, Retirement
from scopecast.scopes.scope_admin import ScopeChoices
from scopecast.scopes.topic_table import position
from scopecast.scopes.topic_view import ScopeTopics, within
from scopecast.scopes.topics import TopicInfo
from scopecast.timing import TIMING, cluster_defaults

log = logging.getLogger(__name__)

# the cluster settings: the timing ones (see scopecast.timing) and how far behind, in MiB, a
# member's application may fall before it is demoted to client (slow_grace)
DEFAULT_SETTINGS = {**cluster_defaults(), "slow_lag_mb": 16.0}
STATUS_BUDGET = TIMING.status_budget
AGENT_STATUS_TIMEOUT = TIMING.agent_status_timeout
WATCH_TIMEOUT = TIMING.watch_period
MULTICAST_KINDS = ("lan", "host", "user")


class ScopeManager:
    """A scope of the hierarchy; see the module docstring. Async Ray actor."""

    def __init__(self, path: str, kind: str, parent: str | None) -> None:
        logs.configure()
        self.path = path
        self.kind = kind
        self.name = scope_name(path)
        self.incarnation = random.getrandbits(48)
        self.settings = dict(DEFAULT_SETTINGS)
        self._parent_name = parent
        self._started = time.time()
        self.applied = 0                 # version of the parent's delegation in place
        self._pending_version = 0        # version of the parent's delegation last received
        self._dirty, self.relayouts = False, Relayouts()
        self._laying: asyncio.Task | None = None
        self._ticker: asyncio.Task | None = None
        self._ticked = time.monotonic()  # when the loop last ticked (see Reporter.start_beating)
        self._install_delay = 0.0  # fault injection: see inject_delay
        self.delays_injected = 0
        self._hello: dict | None = None
        self.dropped: Counter[str] = Counter()  # what this scope dropped, by why (for status)
        self.topics = ScopeTopics()
        self.members = Membership(path, self.settings, self._kick, self._release)
        self.container = PolicyContainer(path, kind in MULTICAST_KINDS, alike_topics)
        self.choices = ScopeChoices(path)  # the administrators' settings (from the root, down)
        self.planner = Planner(path, parent is None, self.members, self.topics, self.container,
                               self.settings, self.choices)
        self.policies = PolicyRunner(path, self.container, self._root_call, self._kick,
                                     self.choices)
        self.recovery = RecoveryDomains(path, top=parent is None)
        self.downlink = Downlink(self.members, self.planner, self.topics, self.recovery,
                                 self.settings, self.choices)
        self.retirement = Retirement(path, self.settings, self.incarnation, self._root_call)
        self.rebuild = Rebuild(path, self.settings, self.members, self._kick)
        self.reporter = Reporter(path, parent, self.settings, self.incarnation,
                                 lambda: self.planner.report_state(self.rebuild.rebuilding),
                                 lambda: (self.applied, self.topics.table.position))
        self.agents = AgentPlacement(path, self.members, self.planner, self.recovery,
                                     self.settings, self._cluster_hello, self._root_call,
                                     lambda: self.rebuild.rebuilding, self._agents_changed)
        self.probe = multicast_probe.LanProbe(path, self._set_multicast)  # a LAN scope
        self.ears = multicast_probe.ProbeEars()  # a host scope

    # ----------------------------------------------------------------------------- running

    async def start(self) -> bool:
        """Run (idempotent): a member is about to join, and may take `empty_scope_timeout`."""
        self.retirement.touch()
        self._ensure_ticking()
        return True

    def _ensure_ticking(self) -> None:
        if self.retirement.retired:
            return
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
            self.reporter.start_beating(lambda: self._ticked)

    async def _tick(self) -> None:
        while not self.retirement.retired:
            self._ticked = time.monotonic()
            try:
                await self._on_tick()
            except Exception:
                log.exception("scope %r: periodic work failed", self.path)
            period = self.settings["heartbeat_period"]
            before = self._ticked = time.monotonic()
            await asyncio.sleep(period)
            self.members.credit_stall(time.monotonic() - before - period)

    async def _on_tick(self) -> None:
        self.members.expire()
        self.rebuild.tick()
        self.reporter.report(force=True)
        self.agents.start()
        if self.kind == "lan":
            self.probe.tick({c.name: c.handle for c in self.members.scopes()},
                            self.planner.group())
        if self.kind == "user":
            self.retirement.tick(self._empty())

    def _empty(self) -> bool:
        return not self.members.children and not self.recovery.domains

    def _kick(self) -> int:
        """Lay channels again soon (one re-layout at a time); the change's number (`relayouts`)."""
        self._ensure_ticking()
        self._dirty = True
        self.planner.forget_domains()  # what changed may change them
        if self._laying is None or self._laying.done():
            self._laying = asyncio.get_running_loop().create_task(self._relayout_loop())
        return self.relayouts.kick()

    async def _relayout_loop(self) -> None:
        while self._dirty:
            self._dirty = False
            covered = self.relayouts.begin()
            try:
                await self._relayout()
            except Exception:
                log.exception("scope %r: re-layout failed", self.path)
            finally:
                self.relayouts.done(covered)
            self.agents.start()
            # re-layouts of thousands of topics run back to back: let members' heartbeats in
            await asyncio.sleep(0)

    async def _relayout(self) -> None:
        with collector_off():  # (100,000 topics: see scopes/collector)
            version = self._pending_version
            if await self.policies.lay(lambda: self.planner.wanted(self.policies.policy_key)):
                self._dirty = True
            self.downlink.delegated = self.planner.delegate()
            self._dirty |= self.downlink.send()
            self.applied = version
            self.reporter.report()

    async def _settle(self) -> None:
        while self._laying is not None and not self._laying.done():
            await asyncio.shield(self._laying)

    def _agents_changed(self) -> None:
        """The children's tables name their agents: sent again, no re-layout needed (unless a
        member's groups changed with them: senders wait for it)."""
        if self.downlink.send():
            self._kick()

    # ------------------------------------------------------------------- member processes

    async def register_member(self, name: str, host: str, port: int, pid: int, node: str,
                              role: str = "member", member_id: int = 0,
                              wire_version: int | None = None,
                              credential: str | None = None) -> int:
        """A member joins; with a `credential` token (`scopes/credentials`) it may publish and
        read only what that allows (PermissionDenied for a token this cluster did not issue)."""
        check_role(role)
        wire.check_version(wire_version, f"member {name}")  # (one of an older scopecast: None)
        if self.retirement.retired:
            raise ScopeRetired(f"scope {self.path!r} retired as member {name} joined")
        self.members.check_name(name, member_id)
        cred = None
        if credential is not None:
            cred = credentials.verify((await self._cluster_hello())["credential_key"], credential)
        mid = await self._root_call("allocate_member", name, host, int(port), int(pid), node,
                                    self.path, member_id,
                                    None if cred is None else list(cred.publish))
        self.members.add_member(name, mid, host, int(port), int(pid), node, role, cred)
        log.info("scope %r: member %s (%d) joined at %s:%d%s", self.path, name, mid, host, port,
                 f" with credential {cred.name!r}" if cred else "")
        return mid

    async def unregister_member(self, member_id: int) -> None:
        child = self.members.member(member_id, missing_ok=True)
        if child is not None:
            self.members.remove(child, "left")

    async def subscribe(self, member_id: int, names: list[str],
                        role: str = "member") -> list[int]:
        """Subscribe a member to topics by name (which must exist) or pattern (existing and
        future topics); returns the ids of the topics covered now (all a member needs: a
        pattern over thousands of topics would cost it their whole entries, and Python keeps
        the memory they took)."""
        check_role(role)
        member = self.members.member(member_id)
        for n in names:
            check_subscription(n)
            if member.credential is not None and not member.credential.may_subscribe(n):
                raise PermissionDenied(
                    f"member {member.name}'s credential {member.credential.name!r} does not let "
                    f"it subscribe to {n!r} (it may subscribe to "
                    f"{list(member.credential.subscribe)})")
        matched: dict[str, TopicInfo] = {}
        for n in names:
            if is_pattern(n):
                matcher = topic_matcher(n)
                matched.update((t.name, t) for t in self.topics.by_id.values()
                               if matcher.match(t.name))
            else:
                info = await self._topic(n)
                self._check_inside(info)
                matched[n] = info
        (member.subscriptions if role == "member" else member.client_subscriptions).update(names)
        resolve(member, self.topics.by_id)
        await self.relayouts.laid_since(self._kick())  # (not the loop idle: see relayouts)
        return sorted(t.id for t in matched.values())

    async def unsubscribe(self, member_id: int, names: list[str], role: str = "member") -> None:
        member = self.members.member(member_id, missing_ok=True)
        if member is not None:
            (member.subscriptions if role == "member" else member.client_subscriptions
             ).difference_update(names)
            resolve(member, self.topics.by_id)
            self._kick()

    async def advertise(self, member_id: int, names: list[str]) -> list[Advertised]:
        """Make the member a publisher of `names` (one re-layout for all of them); what its
        publishers need of each."""
        infos = [await self._topic(n) for n in names]
        for info in infos:
            self._check_inside(info)
        member = self.members.member(member_id)
        cred = member.credential
        for info in infos:
            if cred is not None and not cred.may_publish(info.name):
                raise PermissionDenied(
                    f"member {member.name}'s credential {cred.name!r} does not let it publish "
                    f"to {info.name!r} (it may publish to {list(cred.publish)})")
        member.pubs.update(info.id for info in infos)
        member.regular = True
        await self.relayouts.laid_since(self._kick())
        return [Advertised(i.id, i.session, i.recovery != NO_RECOVERY) for i in infos]

    async def unadvertise(self, member_id: int, names: list[str]) -> None:
        member = self.members.member(member_id, missing_ok=True)
        ids = {info.id for info in map(self.topics.by_name.get, names) if info is not None}
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
        member = self.members.member(member_id)
        member.acked = have_version
        member.table = position(table)
        if isinstance(counters, dict):
            member.counters = counters
            self.members.check_lag(member, self.topics.by_id)
        if have_version == member.sent_version and timeout > 0:
            member.wake.clear()
            try:
                # (held at most half a member timeout: the member is silent meanwhile)
                await asyncio.wait_for(member.wake.wait(),
                                       min(timeout, self.settings["member_timeout"] / 2))
            except asyncio.TimeoutError:
                pass
            member = self.members.known(member_id)  # it may have left
        if member is None or member.sent_version == have_version or member.sent is None:
            return None
        return member.sent.to_wire(member.sent_version, self.topics.table.piece(member.table))

    async def ready(self) -> bool:
        """True once the whole hierarchy has in place the channels laid for everything this
        scope knows now (a publisher waits for this before its first message)."""
        await self._settle()
        if self._parent_name is None:
            return await self.check()
        self.reporter.report(force=True)
        return await self.reporter.parent().ready.remote()

    # ------------------------------------------------------------------------ child scopes

    async def report(self, name: str, body: dict, handle) -> bool:
        """A child scope's state (cascading subscription), also its heartbeat: a body without
        state names the revision this scope should have. False: it has not, send it."""
        self._ensure_ticking()
        try:
            report = ScopeReport.from_wire(body)
        except MalformedReport as exc:
            self.dropped["malformed_report"] += 1
            log.warning("scope %r: report from %r dropped: %s", self.path, name, exc)
            return True
        try:
            wire.check_version(report.wire_version, f"scope {name!r}")
        except IncompatibleVersion as exc:  # its members' datagrams would be dropped here
            self.dropped["wire_version"] += 1
            if self.dropped["wire_version"] == 1:
                log.error("scope %r: child scope refused: %s", self.path, exc)
            raise
        return self.members.take_report(name, report, handle)

    async def install(self, body: dict) -> None:
        """The parent's delegation: settings, topics, sessions, channels delegated here."""
        self._ensure_ticking()
        if self._install_delay:
            self._hold_loop()
        try:
            version, delegation, piece = Delegation.from_wire(body)
        except MalformedDelegation as exc:  # (a parent of another version: it sends again)
            self.dropped["malformed_delegation"] += 1
            log.warning("scope %r: delegation dropped: %s", self.path, exc)
            return
        table = self.topics.table
        # the table first, even from an overtaken delegation: a newer one's piece may follow it
        if piece is not None:  # (None: nothing new, or no table yet above)
            piece = tuple(piece)
            base = await table.base_ref(piece) if table.needs_base(piece) else None
            if table.take(piece, base):
                self._table_changed(table.changed)
        early = table.take_early(delegation.early)
        if early:
            self._table_changed(early)
        if version < self._pending_version:
            return  # overtaken by a newer one
        self.settings.update(delegation.settings)
        self.downlink.take_keys(delegation.keys)  # (a newer ring only)
        if self.choices.set(delegation.admins) | self.choices.set_failed(delegation.failed):
            log.info("scope %r: administration now %s", self.path, self.choices.describe())
        self.planner.delegation = delegation
        self.recovery.set_upper(delegation.upper)
        self._pending_version = version
        self._kick()

    async def check(self, version: int | None = None) -> bool:
        """Whether this subtree has in place what was last sent to it (`version`: the parent's),
        and this scope has heard back from every child what it makes of that: a child scope's
        report after applying it carries the subscriptions resolved against the topics sent
        (a pattern subscriber below learns of a new topic only so); nothing may have been sent
        down meanwhile, nor be about to be."""
        await self._settle()
        sent = self.downlink.version
        if (version is not None and self.applied != version) \
                or not await self.reporter.taken_in():
            return False
        if self.members.unsettled(self.settings["ready_grace"]):
            return False
        results = await ask_all(self.members.scopes(),
                                lambda c: c.handle.check.remote(c.sent_version),
                                self.settings["scope_timeout"])
        return all(r is True for r in results) and self.downlink.version == sent \
            and not self._dirty and (self._laying is None or self._laying.done())

    async def used_topics(self) -> list[int]:
        """The topics this subtree takes part in: what a change of this scope's administration
        concerns (the root starts their new sessions)."""
        subs, pubs, exits = self.planner.interest()
        return sorted(subs.keys() | pubs.keys() | exits.keys() | self.container.topics.keys())

    async def alive(self, name: str, incarnation: int) -> bool:
        """A child scope whose event loop is held says it lives (see Reporter.start_beating)."""
        return self.members.alive(name, incarnation)

    async def inject_delay(self, seconds: float) -> None:
        """Fault injection (tests, `make chaos`): the next install holds this scope's event loop
        for `seconds` of CPU, as installing a very large delegation does."""
        self._install_delay = float(seconds)

    def _hold_loop(self) -> None:
        seconds, self._install_delay = self._install_delay, 0.0
        log.warning("scope %r: holding its event loop for %.1f s (injected)", self.path, seconds)
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # CPU, not a sleep: the GIL is held as real work holds it
            pass
        self.delays_injected += 1

    async def forget_scope(self, name: str, incarnation: int) -> None:
        """A child scope retired."""
        self.members.forget_scope(name, incarnation)

    async def place_agent(self, spec: dict) -> list:
        """(The parent's agent placement) see `AgentPlacement.place_agent`."""
        return await self.agents.place_agent(spec)

    async def incarnation_now(self) -> int:
        """(What a parent asks of a silent child: an answer, late or not, means not gone.) It
        starts the ticks of a scope that Ray restarted where nothing else would: one whose
        members and hosts died with the node it ran on calls it no more, and until it ticks it
        never reports again, so the parent would keep waiting for it."""
        self._ensure_ticking()
        return self.incarnation

    @property
    def rebuilding(self) -> bool:
        return self.rebuild.rebuilding

    async def status(self, topics: bool = True, budget: float = STATUS_BUDGET) -> dict:
        """This subtree's state; `topics=False` leaves out what is per topic (layouts, topic
        ids of members): at thousands of topics that is megabytes, too much to poll. `budget`:
        the seconds this answer may take; each child scope is given less, so that a slow one
        shows here as not answering rather than this whole subtree not answering above."""
        scopes = self.members.scopes()
        below, recovery = await asyncio.gather(
            ask_all(scopes, lambda c: c.handle.status.remote(topics, budget * 0.6), budget * 0.8),
            self.recovery.describe(min(AGENT_STATUS_TIMEOUT, budget * 0.5)))
        sub = {c.name: b if isinstance(b, dict)
               else {"path": "/".join(filter(None, (self.path, c.name))), "error": str(b)}
               for c, b in zip(scopes, below, strict=True)}
        delegation = self.planner.delegation
        return {"path": self.path or "/", "kind": self.kind, "pid": os.getpid(),
                "node": node_id(), "incarnation": f"{self.incarnation:012x}",
                "delegation_version": self.applied, "depth": self.planner.depth(),
                "multicast": self.planner.group() if self.container.multicast else None,
                "regions": self.planner.last_regions.describe(),
                **({"multicast_probe": self.probe.state.record()} if self.kind == "lan" else {}),
                "members": [c.record(topics) for c in self.members.processes()],
                "administration": self.choices.describe(),
                **({"topics": self._topics_status(),
                    "delegated_here": [o.describe() for o in delegation.part.exits],
                    "covered_here": delegation.part.describe_covered()}
                 if topics else {}),
                "policy_rejections": dict(self.container.rejected),
                "dropped": dict(self.dropped),
                "failed_policies": self.policies.describe(),
                "recovery": recovery, "rebuilding": self.rebuild.rebuilding,
                "silent_scopes": sorted(self.members.silent),
                "expired": dict(self.members.expired),
                "liveness": {"beats_outside_loop": self.reporter.beats_outside_loop,
                             "delays_injected": self.delays_injected},
                **({"refused_by_parent": self.reporter.refused} if self.reporter.refused else {}),
                "scopes": [{**c.record(topics), **sub[c.name]} for c in scopes]}

    def _topics_status(self) -> dict:
        """Each topic laid here: its layout, and its policy and recovery chain here."""
        out = self.container.describe()
        for tid, entry in out.items():
            info = self.topics.by_id.get(int(tid))
            if info is not None:
                entry["recovery"] = self.choices.recovery_key(info)
        return out

    # ------------------------------------------------------------------------- retirement

    async def retire(self, incarnation: int) -> bool:
        """Stop for good if still empty (the cluster scope then ends this actor): no more ticks
        or reports, the parent forgets this child, this scope's plug-in policy actors end.
        False if anything arrived meanwhile (a member, a child, a `start`)."""
        empty_for = self.retirement.retire(incarnation, self._empty())
        if empty_for is None:
            return False
        self.reporter.stopped = True
        self.policies.end_plugins()
        try:
            await asyncio.wait_for(self.reporter.parent().forget_scope.remote(
                self.name, self.incarnation), self.settings["scope_timeout"])
        except Exception as exc:  # the parent expires this child as silent instead
            log.warning("scope %r: parent not told of the retirement: %r", self.path, exc)
        log.info("scope %r retired (no members for %.0fs)", self.path, empty_for)
        return True

    @property
    def retired(self) -> bool:
        return self.retirement.retired

    # ------------------------------------------------------- multicast in a LAN (probe)

    def _set_multicast(self, on: bool) -> None:
        if on == self.container.multicast:
            return
        self.container.multicast = on
        self.container.topics.clear()  # every topic laid afresh, its policy told the change
        self._kick()

    async def probe_join(self, group: str, port: int, token: bytes) -> None:
        """(A host scope) join a LAN probe's group on this node's interface; returns once joined."""
        interface = member_interface((await self._cluster_hello()).get("interface"))
        self.ears.join(interface, group, port, token)

    async def probe_heard(self, token: bytes) -> int:
        """(A host scope) how many of the probe's datagrams this node heard since it joined."""
        return await self.ears.heard(token)

    async def probe_send(self, group: str, port: int, token: bytes) -> None:
        """(A host scope) send a LAN probe from this node's interface."""
        interface = member_interface((await self._cluster_hello()).get("interface"))
        await asyncio.to_thread(multicast_probe.send, interface, group, port, token)

    # ----------------------------------------------------------------------------- topics

    def _table_changed(self, keys: set[str] | None) -> None:
        """Topics of `keys` (None: any) changed: TopicInfos and members' subscriptions follow."""
        self.topics.follow(keys)
        for child in self.members.processes():
            resolve(child, self.topics.by_id, keys)

    async def _topic(self, name: str) -> TopicInfo:
        """A topic by name; one the table from above does not carry yet is asked of the root."""
        info = self.topics.by_name.get(name)
        if info is None:
            info = await self._root_call("topic", name)
            self._table_changed(self.topics.table.take_early({str(info.id): info.to_dict()}))
        return info

    def _check_inside(self, info: TopicInfo) -> None:
        if not within(info, self.path):
            raise InvalidConfig(f"topic {info.name!r} is rooted at scope {info.root!r}; a member "
                                f"of scope {self.path!r} cannot use it")

    # ---------------------------------------------------------------------------- the root

    async def _cluster_hello(self) -> dict:
        """The cluster's key, authenticator and interface setting (asked of the root once)."""
        if self._hello is None:
            self._hello = await self._root_call("hello")
        return self._hello

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
