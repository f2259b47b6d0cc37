"""The cluster (root) scope manager: topic metadata, members, and the channels members use.

It never touches data (thesis 3.2.6): members ask it for their *view* — the members they may hear
from, the topic names, the multicast groups to join and their forwarding table — and it answers
only when the view changed since the version they hold. Members that are plain driver processes
cannot be called, so every member pulls (Ray actors will also be pushed to, later).

Its durable state (cluster key and settings, topics and sessions, members) lives in SQLite
(`scopes.state`), so Ray restarting the actor loses nothing: members it knew are taken back once they
check in again (until then they are left out of every view), and forgotten if they never do.

Foundation scope: one scope, topics disseminated over one IP multicast group each.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from scopecast.actors.errors import InvalidConfig, MemberExpired, TopicExists, TopicNotFound
from scopecast.netio.auth import new_cluster_key
from scopecast.scopes.state import ScopeStore
from scopecast.scopes.topics import TopicInfo, check_topic_name, is_pattern, topic_matcher

log = logging.getLogger(__name__)

KNOWN_POLICIES = ("tree", "chain", "star", "lan_multicast", "replicated")
KNOWN_RECOVERY = ("token_ring", "ack_tree", "none")
MEMBER_TIMEOUT = 10.0  # seconds without a heartbeat (a view poll, every 0.2 s) before removal


@dataclass(slots=True)
class MemberRecord:
    id: int
    name: str
    host: str
    port: int
    pid: int
    node: str
    role: str = "member"
    publishes: set[int] = field(default_factory=set)
    subscriptions: set[str] = field(default_factory=set)  # topic names and patterns
    client_subscriptions: set[str] = field(default_factory=set)  # the same, as a client
    subscribes: set[int] = field(default_factory=set)  # derived: topics covered either way
    waited_for: set[int] = field(default_factory=set)  # derived: those covered as a member
    last_seen: float = field(default_factory=time.monotonic)
    installed: int = 0      # the view version the member last said it has installed
    covered_at: dict[int, int] = field(default_factory=dict)  # topic -> version it was covered at
    confirmed: bool = True  # False for records reloaded after a restart, until the member calls

    @classmethod
    def reloaded(cls, body: dict) -> MemberRecord:
        return cls(body["id"], body["name"], body["host"], body["port"], body["pid"],
                   body["node"], body["role"], set(body["publishes"]),
                   set(body["subscriptions"]), set(body["client_subscriptions"]),
                   confirmed=False)  # until it checks in again

    def public(self) -> dict:
        return {"id": self.id, "name": self.name, "host": self.host, "port": self.port,
                "pid": self.pid, "node": self.node, "role": self.role,
                "publishes": sorted(self.publishes), "subscriptions": sorted(self.subscriptions),
                "client_subscriptions": sorted(self.client_subscriptions),
                "subscribes": sorted(self.subscribes),
                "confirmed": self.confirmed}


class ClusterScopeManager:
    """Root scope of a scopecast cluster (a Ray actor; see `scopecast.actors.declare`)."""

    def __init__(self, interface: str | None = None, mac: str = "gmac",
                 state: str | None = None, member_timeout: float = MEMBER_TIMEOUT) -> None:
        logging.basicConfig(level=logging.INFO)
        self._store = ScopeStore(Path(state) if state else None)
        cluster = self._store.get("cluster")
        if cluster is None:
            rng = random.SystemRandom()
            prefix = rng.getrandbits(10)
            cluster = {"id": rng.getrandbits(48), "key": new_cluster_key().hex(), "mac": mac,
                       "group_prefix": [239, 192 + (prefix >> 8), prefix & 0xFF],
                       "port": 40000 + rng.randrange(10000)}
            self._store.put("cluster", cluster)
        elif cluster["mac"] != mac:
            log.warning("state %s was created with mac=%s; keeping it (asked for %s)",
                        self._store.path, cluster["mac"], mac)
        self._cluster_id = cluster["id"]
        self._key = bytes.fromhex(cluster["key"])
        self._mac = cluster["mac"]
        self._group_prefix = tuple(cluster["group_prefix"])
        self._port = cluster["port"]
        self._interface = interface
        self._member_timeout = member_timeout
        # view versions only grow, also across restarts, so no member mistakes a new view for its own
        self._version = time.time_ns()
        self._topics = {t["name"]: TopicInfo(**t) for t in self._store.topics()}
        self._session_began: dict[int, int] = {}  # topic -> view version its session began at
        self._members = {m["id"]: MemberRecord.reloaded(m) for m in self._store.members()}
        for m in self._members.values():
            self._cover(m)
        self._started = time.time()
        log.info("cluster scope manager up: cluster %x, multicast %s.x:%d, state %s, %d topics, "
                 "%d members to confirm", self._cluster_id, ".".join(map(str, self._group_prefix)),
                 self._port, self._store.path, len(self._topics), len(self._members))

    # ------------------------------------------------------------------------------ cluster

    def hello(self) -> dict:
        """Cluster key and transport settings, for a process that connects."""
        return {"cluster_id": self._cluster_id, "key": self._key, "interface": self._interface,
                "mac": self._mac}

    # ------------------------------------------------------------------------------- topics

    def create_topic(self, name: str, policy: str = "tree", recovery: str = "token_ring",
                     root: str = "", exist_ok: bool = True, options: dict | None = None) -> TopicInfo:
        check_topic_name(name)
        _check_protocols(policy, recovery)
        existing = self._topics.get(name)
        if existing is not None:
            if not exist_ok or (existing.policy, existing.recovery) != (policy, recovery):
                raise TopicExists(f"topic {name!r} exists with policy={existing.policy!r}, "
                                  f"recovery={existing.recovery!r}")
            return existing
        tid = self._store.next_id("topic")
        group = "%d.%d.%d.%d" % (*self._group_prefix, 1 + (tid - 1) % 254)
        info = TopicInfo(name=name, id=tid, policy=policy, recovery=recovery, root=root,
                         session=1, group=group, port=self._port, options=dict(options or {}))
        self._topics[name] = info
        self._store.put_topic(name, tid, info.to_dict())
        for m in self._members.values():
            if any(is_pattern(n) for n in m.subscriptions | m.client_subscriptions):
                self._cover(m)
        self._bump()
        log.info("topic %s created (id %d, group %s:%d)", name, tid, group, self._port)
        return info

    def update_topic(self, name: str, policy: str | None = None,
                     recovery: str | None = None) -> TopicInfo:
        """Change a topic's policy or recovery protocol; this starts a new session (3.2.7):
        publishers move to it once every member subscriber knows it, ending the old one."""
        info = self.topic(name)
        policy = policy or info.policy
        recovery = recovery or info.recovery
        _check_protocols(policy, recovery)
        info = replace(info, policy=policy, recovery=recovery, session=info.session + 1)
        self._topics[name] = info
        self._store.put_topic(name, info.id, info.to_dict())
        self._session_began[info.id] = self._version + 1
        self._bump()
        log.info("topic %s: session %d (policy %s, recovery %s)", name, info.session, policy,
                 recovery)
        return info

    def topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicNotFound(name)
        return info

    def topics(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda t: t.id)

    def delete_topic(self, name: str) -> None:
        info = self.topic(name)
        del self._topics[name]
        self._store.delete_topic(name)
        for m in self._members.values():
            if info.id in m.publishes or info.id in m.subscribes:
                m.publishes.discard(info.id)
                m.subscriptions.discard(name)
                m.client_subscriptions.discard(name)
                self._changed(m)
        self._bump()

    # ------------------------------------------------------------------------------ members

    def register_member(self, name: str, host: str, port: int, pid: int, node: str,
                        role: str = "member") -> int:
        _check_role(role)
        mid = self._store.next_id("member")
        self._members[mid] = MemberRecord(mid, name, host, int(port), int(pid), node, role)
        self._changed(self._members[mid])
        log.debug("member %d (%s) registered at %s:%d", mid, name, host, port)
        return mid

    def unregister_member(self, member_id: int) -> None:
        if self._members.pop(member_id, None) is not None:
            self._store.delete_member(member_id)
            self._bump()
            log.debug("member %d left", member_id)

    def subscribe(self, member_id: int, names: list[str],
                  role: str = "member") -> list[TopicInfo]:
        """Subscribe to topics by name (which must exist) or by pattern (`flights/*`: existing and
        future topics); returns the topics covered now. As a "client" (3.2.2) the member is a
        transient subscriber: nobody waits for it."""
        _check_role(role)
        member = self._member(member_id)
        matched: dict[str, TopicInfo] = {}
        for n in names:
            if is_pattern(n):
                matcher = topic_matcher(n)
                matched.update((t.name, t) for t in self._topics.values() if matcher.match(t.name))
            else:
                matched[n] = self.topic(n)
        (member.subscriptions if role == "member" else member.client_subscriptions).update(names)
        self._changed(member)
        return sorted(matched.values(), key=lambda t: t.id)

    def unsubscribe(self, member_id: int, names: list[str], role: str = "member") -> None:
        member = self._members.get(member_id)
        if member is None:
            return
        (member.subscriptions if role == "member" else member.client_subscriptions
         ).difference_update(names)
        self._changed(member)

    def advertise(self, member_id: int, name: str) -> TopicInfo:
        info = self.topic(name)
        member = self._member(member_id)
        member.publishes.add(info.id)
        self._changed(member)
        return info

    def unadvertise(self, member_id: int, name: str) -> None:
        member = self._members.get(member_id)
        info = self._topics.get(name)
        if member is not None and info is not None:
            member.publishes.discard(info.id)
            self._changed(member)

    def view(self, member_id: int, have_version: int = 0) -> dict | None:
        """The member's view if it changed since `have_version`, else None (also a heartbeat)."""
        member = self._member(member_id)
        member.installed = have_version
        self._expire_members()
        if have_version == self._version:
            return None
        return {
            "version": self._version,
            "members": [(m.id, m.name, m.host, m.port) for m in self._members.values()
                        if m.confirmed],
            "topics": {t.id: t.name for t in self._topics.values()},
            "sessions": {t.id: t.session for t in self._topics.values()},
            **self._channels(member),
        }

    def _channels(self, member: MemberRecord) -> dict:
        """A member's channels: the groups it receives on, the routes it sends along (one
        multicast group per topic for now) and, per route destination, the receivers it waits for."""
        by_id = {t.id: t for t in self._topics.values()}
        routes = []
        receivers: dict[str, list[int]] = {}
        for tid in sorted(member.publishes):
            info = by_id.get(tid)
            if info is None:
                continue
            routes.append({"topic": tid, "src": [member.name], "dst": ["*"], "origin": member.name,
                           "group": info.group, "port": info.port})
            receivers[f"{info.group}:{info.port}"] = sorted(
                m.id for m in self._members.values()
                if tid in m.waited_for and m.role == "member" and m.id != member.id
                and m.confirmed)
        groups = sorted({(by_id[t].group, by_id[t].port) for t in member.subscribes if t in by_id})
        return {"groups": groups, "routes": routes, "receivers": receivers}

    def receivers_ready(self, name: str) -> bool:
        """True once every member subscriber of topic `name` has installed a view that shows it
        in its current session (so it has joined the topic's channel and accepts the session): a
        publisher waits for this before sending, or before moving to a new session."""
        info = self.topic(name)
        began = self._session_began.get(info.id, 0)
        return all(m.installed >= max(m.covered_at.get(info.id, 0), began)
                   for m in self._members.values()
                   if info.id in m.waited_for and m.role == "member" and m.confirmed)

    def status(self) -> dict:
        return {
            "cluster_id": f"{self._cluster_id:012x}",
            "uptime_s": round(time.time() - self._started, 1),
            "manager": {"pid": os.getpid(), "state": str(self._store.path), "mac": self._mac},
            "version": self._version,
            "topics": [t.to_dict() for t in self.topics()],
            "members": [{**m.public(), "channels": self._channels(m)}
                        for m in self._members.values()],
        }

    # ------------------------------------------------------------------------------ helpers

    def _member(self, member_id: int) -> MemberRecord:
        member = self._members.get(member_id)
        if member is None:
            raise MemberExpired(f"member {member_id} is not registered (expired after missing "
                                "heartbeats, or removed)")
        member.last_seen = time.monotonic()
        if not member.confirmed:
            member.confirmed = True
            self._bump()
        return member

    def _expire_members(self) -> None:
        now = time.monotonic()
        dead = [m for m in self._members.values() if now - m.last_seen > self._member_timeout]
        for m in dead:
            log.warning("member %d (%s) silent for %.0fs; removed", m.id, m.name,
                        self._member_timeout)
            del self._members[m.id]
            self._store.delete_member(m.id)
        if dead:
            self._bump()

    def _covered(self, names: set[str]) -> set[int]:
        patterns = [topic_matcher(n) for n in names if is_pattern(n)]
        return {t.id for t in self._topics.values()
                if t.name in names or any(p.match(t.name) for p in patterns)}

    def _changed(self, member: MemberRecord) -> None:
        self._cover(member)
        self._store.put_member(member.id, member.public())
        self._bump()

    def _cover(self, member: MemberRecord) -> None:
        """Recompute the topics a member's subscriptions cover (after its or the topics' change)."""
        member.waited_for = self._covered(member.subscriptions)
        member.subscribes = member.waited_for | self._covered(member.client_subscriptions)
        # the view that first shows a newly covered topic is the next one
        member.covered_at = {t: member.covered_at.get(t, self._version + 1)
                             for t in member.subscribes}

    def _bump(self) -> None:
        self._version += 1


def _check_protocols(policy: str, recovery: str) -> None:
    if policy not in KNOWN_POLICIES:
        raise InvalidConfig(f"unknown forwarding policy {policy!r}; built-ins are "
                            f"{', '.join(KNOWN_POLICIES)}")
    if recovery not in KNOWN_RECOVERY:
        raise InvalidConfig(f"unknown recovery protocol {recovery!r}; built-ins are "
                            f"{', '.join(KNOWN_RECOVERY)}")


def _check_role(role: str) -> None:
    if role not in ("member", "client"):
        raise InvalidConfig(f"role must be 'member' or 'client', not {role!r}")
