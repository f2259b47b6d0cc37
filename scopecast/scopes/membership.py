"""Who is in a scope (thesis 3.2.2): its member processes and child scopes, and the failure
detector that removes those gone silent.

A member process registers, then keeps one `watch` call open (its heartbeat); a child scope
reports its state up every heartbeat period. One silent for `member_timeout` (a child scope for
`scope_timeout`) is removed, and the scope lays its channels again around it. A child scope that
takes part in recovery is not forgotten with it: it stays in `silent` (and so in the recovery
domains, holding stability back) until it reports again or Ray says it is gone for good, because a
restarting scope's members live on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from scopecast.actors.errors import InvalidConfig, MemberExpired
from scopecast.netio.topic_names import name_filter
from scopecast.scopes.credentials import Credential
from scopecast.scopes.layout import Offer
from scopecast.scopes.reports import ScopeReport
from scopecast.scopes.topics import TopicInfo
from scopecast.scopes.views import MemberView

log = logging.getLogger(__name__)

ROLES = ("member", "client")


@dataclass(slots=True)
class Child:
    """What a scope keeps of one of its children (the thesis' members of a scope): a member
    process (`MemberProcess`) or a child scope (`ChildScope`)."""

    kind: ClassVar[str]
    name: str
    subs: dict[int, str] = field(default_factory=dict)           # topic -> "member" | "client"
    pubs: set[int] = field(default_factory=set)
    depth: int = 1                 # levels below this scope down to member processes
    regular: bool = True           # has forwarding duty (not only client subscriptions)
    joined: dict[str, list[int]] = field(default_factory=dict)   # group -> members that joined
    last_seen: float = field(default_factory=time.monotonic)
    sent_version: int = 0          # version of the last delegation or view sent
    sent_at: float = 0.0           # when it was sent (monotonic)
    sent: object = None            # its content (a MemberView or a Delegation), to send only
                                   # changes
    acked: int = 0                 # version the child says it has in place
    table: tuple | None = None     # topic table position it has (as far as this scope knows)


@dataclass(slots=True)
class MemberProcess(Child):
    """A member process of this scope."""

    kind: ClassVar[str] = "member"
    id: int = 0                    # cluster-wide member id
    host: str = ""
    port: int = 0
    pid: int = 0
    node: str = ""
    role: str = "member"
    subscriptions: set[str] = field(default_factory=set)         # names and patterns
    client_subscriptions: set[str] = field(default_factory=set)
    counters: dict = field(default_factory=dict)  # data-plane counters (for status)
    lagging_since: float = 0.0
    demoted: str = ""              # why this member was demoted to client (a slow consumer)
    wake: asyncio.Event | None = None
    credential: Credential | None = None  # what it may publish and read (None: anything)

    def may_read(self, topic: str) -> bool:
        return self.credential is None or self.credential.may_read(topic)

    @property
    def publish_limit(self) -> tuple[str, ...] | None:
        """The topics it may publish to, for its peers (None: any)."""
        return None if self.credential is None else self.credential.publish

    def offers_of(self, topic: int) -> tuple[Offer, ...]:
        """Where traffic of `topic` enters this member: the member process itself."""
        return (Offer((), ("u", self.host, self.port, self.id),
                      (self.id,) if self.regular else ()),)

    def record(self, topics: bool = True) -> dict:
        """For status; `topics`: with the ids of the topics it subscribes to and publishes."""
        ids = {"subscribes": sorted(self.subs), "publishes": sorted(self.pubs)} if topics else {}
        return {"name": self.name, "id": self.id, "address": f"{self.host}:{self.port}",
                "pid": self.pid, "node": self.node,
                "role": "member" if self.regular else "client",
                "subscriptions": sorted(self.subscriptions),
                "client_subscriptions": sorted(self.client_subscriptions), **ids,
                "view": self.sent_version, "installed": self.acked, "counters": self.counters,
                "demoted": self.demoted, **_channels(self.sent, topics),
                **({"credential": self.credential.describe()} if self.credential else {})}


@dataclass(slots=True)
class ChildScope(Child):
    """A child scope of this scope."""

    kind: ClassVar[str] = "scope"
    handle: object = None          # its actor
    # per domain key whose domain there has members, the chain down to the member that leads it
    # (where the agent standing for the child in this scope's domain belongs)
    recovering: dict[str, tuple] = field(default_factory=dict)
    offers: dict[int, tuple[Offer, ...]] = field(default_factory=dict)
    incarnation: int = 0
    rev: int = 0                   # revision of the state it reported

    def offers_of(self, topic: int) -> tuple[Offer, ...]:
        """Where traffic of `topic` enters the child scope: the entry it offered, or an offer
        per sub-channel where it splits the traffic (none until it has offered)."""
        return self.offers.get(topic, ())

    def record(self, topics: bool = True) -> dict:
        ids = {"subscribes": sorted(self.subs), "publishes": sorted(self.pubs)} if topics else {}
        return {"name": self.name, "depth": self.depth, **ids, "delegated": self.sent_version,
                "installed": self.acked}


class Membership:
    """The children of one scope and their heartbeats. `on_change` is called whenever the
    channels must be laid again (a child joined, left, or changed what it reports); `release`
    with the id of a member process that left (the root frees it in its directory)."""

    def __init__(self, path: str, settings: dict, on_change: Callable[[], None],
                 release: Callable[[int], None]) -> None:
        self.path = path
        self.settings = settings
        self.children: dict[str, Child] = {}
        self.silent: dict[str, Child] = {}  # child scopes gone silent (see the module docstring)
        self.expired: Counter[str] = Counter()  # children removed as silent, by kind (status)
        self.not_waited: dict[str, int] = {}  # member -> view version not waited for (logged)
        self._by_id: dict[int, str] = {}
        self._on_change = on_change
        self._release = release

    def scopes(self) -> list[ChildScope]:
        return [c for c in self.children.values() if c.kind == "scope"]

    def processes(self) -> list[MemberProcess]:
        return [c for c in self.children.values() if c.kind == "member"]

    def unsettled(self, grace: float) -> list[Child]:
        """The children a publisher waits for (see ScopeManager.check): those that have not
        said they have in place what was sent to them last. Not a member process silent since
        its view was sent, `grace` seconds ago or more: it died without leaving, or its process
        is stalled (the failure detector removes it at member_timeout; a stalled one that comes
        back catches up by recovery), and a new publisher would otherwise wait for it to go."""
        now = time.monotonic()
        out = []
        for c in self.children.values():
            if c.acked == c.sent_version:
                continue
            if c.kind == "member" and c.last_seen < c.sent_at and now - c.last_seen >= grace:
                if c.sent_version != self.not_waited.get(c.name):
                    self.not_waited[c.name] = c.sent_version
                    log.info("scope %r: a publisher does not wait for member %r (silent for "
                             "%.1f s, since before its view was sent)", self.path, c.name,
                             now - c.last_seen)
                continue
            out.append(c)
        return out

    # ------------------------------------------------------------------- member processes

    def check_name(self, name: str, member_id: int) -> None:
        old = self.children.get(name)
        if old is not None and (old.kind != "member" or old.id != member_id):
            raise InvalidConfig(f"member name {name!r} is taken in scope {self.path!r}")

    def add_member(self, name: str, member_id: int, host: str, port: int, pid: int, node: str,
                   role: str, credential: Credential | None = None) -> MemberProcess:
        check_role(role)
        child = self.children[name] = MemberProcess(
            name, id=member_id, host=host, port=port, pid=pid, node=node, role=role,
            regular=role == "member", wake=asyncio.Event(), credential=credential)
        self._by_id[member_id] = name
        self._on_change()
        return child

    def member(self, member_id: int, missing_ok: bool = False) -> MemberProcess | None:
        """A member process by id; its call counts as a heartbeat."""
        child = self.known(member_id)
        if child is None:
            if missing_ok:
                return None
            raise MemberExpired(f"member {member_id} is not registered in scope {self.path!r} "
                                "(expired after missing heartbeats, or the scope restarted)")
        child.last_seen = time.monotonic()
        return child

    def known(self, member_id: int) -> MemberProcess | None:
        """A member process by id, if it is still registered (not a heartbeat: a watch call
        woken for a member that died goes on without it)."""
        return self.children.get(self._by_id.get(member_id, ""))

    def check_lag(self, member: MemberProcess, topics: dict[int, TopicInfo]) -> None:
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
            resolve(member, topics)
            self._on_change()

    # ------------------------------------------------------------------------ child scopes

    def take_report(self, name: str, report: ScopeReport, handle) -> bool:
        """A child scope's report (its state, or a heartbeat naming the revision of the state
        this scope should have). False: this scope lacks that state; the child sends it."""
        child = self.children.get(name)
        if child is not None and child.kind != "scope":
            log.warning("scope %r: report from %r, which is a member process here", self.path, name)
            return True
        state = report.state
        if state is None:
            if child is None or child.incarnation != report.incarnation or child.rev != report.rev:
                return False
        else:
            before = self.silent.pop(name, None) or child
            if child is None or child.incarnation != report.incarnation:
                if child is None:
                    log.info("scope %r: child scope %r joined", self.path, name)
                child = self.children[name] = ChildScope(name, handle=handle,
                                                         incarnation=report.incarnation)
            recovering = dict(state.recovering)
            if state.rebuilding and before is not None:
                # (a scope Ray restarted) the domains it had still count until it has rebuilt
                recovering = {**before.recovering, **recovering}
            child.rev = report.rev
            new = (state.depth, state.subs, set(state.pubs), state.offers, state.joined,
                   state.regular, recovering)
            if new != (child.depth, child.subs, child.pubs, child.offers, child.joined,
                       child.regular, child.recovering):
                (child.depth, child.subs, child.pubs, child.offers, child.joined,
                 child.regular, child.recovering) = new
                self._on_change()
        child.last_seen = time.monotonic()
        child.acked = report.acked
        if report.acked == child.sent_version and report.table != child.table:
            child.table = report.table  # it took in all sent, yet is elsewhere: a piece was lost
            self._on_change()
        return True

    def forget_scope(self, name: str, incarnation: int) -> None:
        """A child scope retired."""
        child = self.children.get(name)
        if child is not None and child.kind == "scope" and child.incarnation == incarnation:
            self.remove(child, "retired")

    # ---------------------------------------------------------------------- failure detector

    def credit_stall(self, late: float) -> None:
        """A tick `late` seconds late means the scope's own loop was busy (a long re-layout)
        and heard no heartbeat meanwhile: children are not blamed for that time."""
        if late > self.settings["heartbeat_period"]:
            now = time.monotonic()
            for c in self.children.values():
                c.last_seen = min(now, c.last_seen + late)

    def alive(self, name: str, incarnation: int) -> bool:
        """A child scope says it lives, from outside its event loop (see `Reporter`): it is not
        silent, whatever its loop is busy with. False: no such child (of that incarnation)."""
        child = self.children.get(name)
        if child is None or child.kind != "scope" or child.incarnation != incarnation:
            return False
        child.last_seen = time.monotonic()
        return True

    def expire(self) -> None:
        now = time.monotonic()
        for c in list(self.children.values()):
            limit = self.settings["member_timeout" if c.kind == "member" else "scope_timeout"]
            if now - c.last_seen > limit:
                self.expired[c.kind] += 1
                if c.kind == "scope" and c.recovering:
                    # silent is not gone: a restarting scope's members live on, and stability
                    # passed without them would lose them what is unstable (nobody would keep
                    # it for them); see Rebuild.ask_silent
                    self.silent[c.name] = c
                self.remove(c, f"silent for {limit:.0f}s")

    def remove(self, child: Child, why: str) -> None:
        del self.children[child.name]
        self.not_waited.pop(child.name, None)
        if child.kind == "member":
            self._by_id.pop(child.id, None)
            self._release(child.id)
            if child.wake is not None:
                child.wake.set()
        log.log(logging.INFO if why in ("left", "retired") else logging.WARNING,
                "scope %r: %s %s removed (%s)", self.path, child.kind, child.name, why)
        self._on_change()


def resolve(member: MemberProcess, topics: dict[int, TopicInfo], keys: set[str] | None = None) -> None:
    """The topics a member's subscriptions cover (after its or the topics' change; `keys`: only
    those topics changed, None: any). What it publishes stays as it advertised it, even a topic
    missing from the table for now: a scope asks the root for a topic its parent's table does not
    carry yet, and a table from above that still lacks it (the parent not caught up, or a
    restarted scope's first one) must not make it forget a publisher; every use looks ids up in
    the topics. (Matching every topic again for every member on every change of a table of
    40,000 kept a scope busy past its parent's timeout.)"""
    client, mine = name_filter(member.client_subscriptions), name_filter(member.subscriptions)
    if keys is None:
        member.subs = {}
        infos = topics.values()
    else:
        for key in keys:
            member.subs.pop(int(key), None)
        infos = filter(None, map(topics.get, map(int, keys)))
    may_read = member.may_read
    for info in infos:
        if mine(info.name) and may_read(info.name):
            member.subs[info.id] = "member"
        elif client(info.name) and may_read(info.name):
            member.subs[info.id] = "client"
    member.regular = bool(member.role == "member" and (member.subscriptions or member.pubs
                                                       or not member.client_subscriptions))


def check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidConfig(f"role must be 'member' or 'client', not {role!r}")


def _channels(view: MemberView | None, topics: bool = True) -> dict:
    """A member's channels as status shows them: labels "P:B-Q:C, T:P" with their endpoints
    (one per topic and channel: without `topics`, how many)."""
    if not view:
        return {"channels": [] if topics else 0, "groups": [], "receivers": {}}
    groups = [list(g) for g in view.groups]
    receivers = {k: list(v) for k, v in view.receivers.items()}
    if not topics:
        return {"channels": sum(len(r.topics) for r in view.routes), "groups": groups,
                "receivers": receivers}
    return {"channels": [{"label": f"{r.label}, {topic}:{r.origin}", "endpoint": list(r.endpoint),
                          "laid_in": r.scope, **({"filter": list(r.filter)} if r.filter else {})}
                         for r in view.routes for topic in r.topics],
            "groups": groups, "receivers": receivers}


async def ask_all(children: list[Child], call, timeout: float) -> list:
    """Call every child scope at once; a child that does not answer within `timeout` (dead, or
    restarting) answers its exception."""
    return await asyncio.gather(*(asyncio.wait_for(call(c), timeout) for c in children),
                                return_exceptions=True)
