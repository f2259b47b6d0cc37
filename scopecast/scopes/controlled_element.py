"""The controlled element (thesis 3.2.6): the thin control layer inside a member process.

It registers the process with its scope manager, passes subscribe/advertise requests up, and keeps
the member runtime's tables (members, topics, groups, forwarding table) in step with the scope's
view. All Ray calls happen here, on the caller's thread or the element's control thread — never on
the runtime's I/O thread, so the data plane never waits for the control plane.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import replace

import ray

from scopecast.actors.errors import (
    ControlTimeout,
    InvalidConfig,
    MemberExpired,
    ScopeRetired,
    typed_cause,
)
from scopecast.netio import wire
from scopecast.netio.auth import ClusterKeys
from scopecast.netio.channel import FilteredChannel, MulticastGroup, UnicastEndpoint
from scopecast.netio.filters import build
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import (
    DEFAULT_MAX_MESSAGE,
    MemberInfo,
    MemberRuntime,
    Route,
    RuntimeConfig,
)
from scopecast.netio.transport import member_interface
from scopecast.scopes.paths import scope_actor
from scopecast.scopes.topic_table import MemberTopicTable
from scopecast.scopes.views import MalformedView, MemberView, ViewRoute
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

WATCH_PERIOD = TIMING.watch_period
POLL = TIMING.control_poll
READY_TIMEOUT = TIMING.ready_timeout
CALL_TIMEOUT = TIMING.call_timeout
PER_NAME = TIMING.call_per_name
COUNTERS_WAIT = TIMING.counters_wait
# a member without publishers or subscribers stays this long (repairing what it sent, its counters
# readable), then leaves its scope: a process would otherwise stay a member, with an I/O thread,
# of every scope it ever used (and keep each of them from retiring)
IDLE_MEMBER_LINGER = TIMING.idle_member_linger
# the member's scope manager ended for good (an empty user scope retires; see ScopeManager.retire)
SCOPE_GONE = (ScopeRetired, ray.exceptions.ActorDiedError)


def call(method, *args, timeout: float = CALL_TIMEOUT, **kwargs):
    """Call a scope-manager method and re-raise our typed errors as themselves."""
    return call_ref(method.remote(*args, **kwargs), timeout,
                    getattr(method, "_method_name", "a call"))


def call_ref(ref, timeout: float | None = None, what: str = "a call"):
    """`ray.get` of a scope-manager call, with our typed errors re-raised as themselves, and
    ControlTimeout for an answer that did not come within `timeout`."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise ControlTimeout(
            f"the scope manager did not answer {what} within {timeout:g} s: it is busy (laying "
            "out thousands of topics at once?) or restarting; `scopecast status` shows it. The "
            "call may still take effect; retrying is safe") from None
    except ray.exceptions.RayTaskError as exc:
        cause = typed_cause(exc)
        if cause is not None:
            raise cause from None
        raise


def _names_timeout(names) -> float:
    return CALL_TIMEOUT + PER_NAME * len(names)


def cluster_config(config: RuntimeConfig | None, hello: dict) -> RuntimeConfig:
    """`config` with the limits every member of the cluster applies (`hello`: the root's): the
    largest message, so that no publisher sends what its subscribers would refuse. A process
    that asks for another limit gets InvalidConfig."""
    config = config or RuntimeConfig()
    limit = hello.get("max_message_bytes") or DEFAULT_MAX_MESSAGE
    if config.max_message_bytes != limit:
        if config.max_message_bytes != DEFAULT_MAX_MESSAGE:
            raise InvalidConfig(
                f"max_message_bytes is a cluster setting: this cluster's is {limit:,} bytes "
                f"and this process asked for {config.max_message_bytes:,}; set it when the "
                "cluster is deployed (connect(max_message_bytes=...), scopecast up "
                "--max-message-bytes)")
        config = replace(config, max_message_bytes=limit)
    return config


class ControlledElement:
    """One per member process, cluster and scope: owns the `MemberRuntime` and its control
    thread, which keeps one `watch` call open at the member's scope manager (the scope answers it
    when the member's tables change) and resolves peers the member has not heard of."""

    def __init__(self, root, manager, scope: str, hello: dict,
                 config: RuntimeConfig | None = None, role: str = "member",
                 name: str | None = None, on_unused=None, credential: str | None = None) -> None:
        self.root = root
        self.manager = manager
        self.scope = scope
        config = replace(cluster_config(config, hello), mac=hello["mac"])
        if config.transport.interface is None:
            interface = member_interface(hello.get("interface"))
            config = replace(config, transport=replace(config.transport, interface=interface))
        if config.transport.datagram_bytes is None and hello.get("datagram_bytes"):
            config = replace(config, transport=replace(config.transport,
                                                       datagram_bytes=hello["datagram_bytes"]))
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.member_id = 0
        self._version = 0
        self._lock = threading.Lock()  # serialises view installs (control thread vs callers)
        self._stop = threading.Event()
        self._published: dict[str, int] = {}   # topic -> open Publisher handles
        self._session_moves: dict[int, int] = {}  # topic -> session publishers should move to
        self._table = MemberTopicTable()
        self._handed: dict | None = None  # the table's names dict last handed to the runtime
        self._installed: MemberView | None = None  # the view installed last
        self._subscribed: dict[tuple, int] = {}  # (topic, role) -> open Subscriber handles
        self._latest: dict | None = None  # the data plane's counters taken last (see _counters)
        self._siblings: list[MemberInfo] = []
        self._peers: dict[int, MemberInfo] = {}  # members of other scopes, from the directory
        self._role = role
        self._credential = credential  # (a token: scopes/credentials)
        self.demoted = ""   # why the scope demoted this member to client, if it did
        self._rejoining = False  # the scope forgot it, and it has not rejoined whole yet
        self._on_unused = on_unused  # called from the control thread once it lingered out
        self.unused_since: float | None = time.monotonic()  # no publisher nor subscriber since
        # the runtime's socket is the member's address, so it exists before the registration
        self.runtime = MemberRuntime(0, self.name, hello["key"], config)
        # the cluster's keys (a ring while a rotation is under way: scopes/key_rotation)
        self._keys = ClusterKeys.first(hello["key"])
        if hello.get("keys"):
            self._take_keys(ClusterKeys.from_wire(hello["keys"]))
        self.publish = self.runtime.publish  # one bound method for all of its publishers
        try:
            self._register()  # (PermissionDenied for a credential not this cluster's, ...)
            self._fetch()
        except BaseException:
            self.runtime.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="scopecast-control", daemon=True)
        self._thread.start()

    def _register(self) -> None:
        rt = self.runtime
        me = (self.name, rt.address[0], rt.address[1], os.getpid(), _node_id(), self._role)
        args = (*me, self.member_id, wire.VERSION, self._credential)
        try:
            self.member_id = call(self.manager.register_member, *args)
        except SCOPE_GONE:
            self._find_scope()
            self.member_id = call(self.manager.register_member, *args)
        rt.member_id = self.member_id

    def _find_scope(self) -> None:
        """The scope manager ended (it retired while this member was away, or as it joined):
        have the scope made again and talk to the new one."""
        call(self.root.ensure_scope, self.scope)
        self.manager = scope_actor(self.scope)

    def _rejoin(self) -> None:
        """The scope forgot this member (silent too long, or the scope restarted): register
        again, with the same socket and id, and take back its subscriptions and publications.
        A step that fails (a restarting scope, a loaded node) has the control loop run it all
        again: registered without them, the member would look well to its scope and get
        nothing, or publish with no recovery agent, for good."""
        with self._lock:
            old = self.member_id
            self._register()
            for role in ("member", "client"):
                names = [n for (n, r) in self._subscribed if r == role]
                if names:
                    call(self.manager.subscribe, self.member_id, names, role,
                         timeout=_names_timeout(names))
            if self._published:
                call(self.manager.advertise, self.member_id, list(self._published),
                     timeout=_names_timeout(self._published))
            self._version, self._installed = 0, None  # (every table installed again)
        self._rejoining = False
        log.warning("member %d had been dropped by scope %r; rejoined as member %d", old,
                    self.scope, self.member_id)

    # ------------------------------------------------------------------ requests from the API

    def subscribe(self, names: list[str], role: str = "member"):
        """Subscribe this member to `names` (topics or patterns) as a member or a client; returns
        the ids of the topics covered now."""
        rt = self.runtime  # light before a channel can bring anything (netio/promotion)
        rt.call_wait(rt.recovery.promotion.join, time.monotonic())
        with self._in_use():
            ids = call(self.manager.subscribe, self.member_id, names, role,
                       timeout=_names_timeout(names))
            for name in names:
                self._subscribed[(name, role)] = self._subscribed.get((name, role), 0) + 1
        self._fetch()
        rt.call_wait(lambda: rt.recovery.promotion.subscribed(
            not rt.recovery.reliable.isdisjoint(ids)))
        return ids

    def advertise(self, names: list[str]) -> list:
        """Make this member a publisher of `names`; returns what its publishers need of each
        (`Advertised`) once every scope has in place the channels laid for them (so subscribers
        known now miss nothing)."""
        with self._in_use():
            grants = call(self.manager.advertise, self.member_id, names,
                          timeout=_names_timeout(names))
            for name in names:
                self._published[name] = self._published.get(name, 0) + 1
        self.wait_ready(names[0] if len(names) == 1 else f"{len(names)} topics")
        return grants

    def wait_ready(self, name: str) -> bool:
        self._fetch()
        deadline = time.monotonic() + READY_TIMEOUT
        while not call(self.manager.ready):
            if time.monotonic() > deadline:
                log.warning("the scopes did not settle within %.0fs for %s; publishing anyway "
                            "(subscribers may miss the first messages)", READY_TIMEOUT, name)
                return False
            time.sleep(0.02)
        return True

    @contextlib.contextmanager
    def _in_use(self):
        """A subscribe or advertise under way: the member is not unused meanwhile (over thousands
        of topics on a loaded machine one can take longer than IDLE_MEMBER_LINGER, and the member
        must not leave its scope in the middle of it); unused again after it only if it failed and
        nothing else is open."""
        self.unused_since = None
        try:
            yield
        finally:
            if not self._published and not self._subscribed:
                self.unused_since = time.monotonic()

    def release(self, publisher_of: list[str] = (),
                subscriber_of: list[str] | None = None, role: str = "member") -> None:
        """Publishers or a subscriber closed: leave topics no other handle in this process uses.
        Publishers leave in one call, without waiting: the scope re-lays once for a burst of them
        (closing thousands of publishers would otherwise wait for one re-layout each); calls from
        this process reach the scope in order, so a later advertise of a topic comes after it."""
        unpublished = [n for n in publisher_of if _decrement(self._published, n)]
        if unpublished:
            self.manager.unadvertise.remote(self.member_id, unpublished)
        gone = [n for n in subscriber_of or () if _decrement(self._subscribed, (n, role))]
        if gone:
            call(self.manager.unsubscribe, self.member_id, gone, role)
        if not self._published and not self._subscribed:
            self.unused_since = time.monotonic()

    def touch(self) -> None:
        """About to be used again: an unused member lingers a whole IDLE_MEMBER_LINGER more."""
        if self.unused_since is not None:
            self.unused_since = time.monotonic()

    def lingered_out(self) -> bool:
        """Unused for IDLE_MEMBER_LINGER, and everything it sent is stable (nobody needs a repair from it)."""
        since, latest = self.unused_since, self._latest or {}
        return (since is not None and time.monotonic() - since > IDLE_MEMBER_LINGER
                and latest.get("recovery", {}).get("window_bytes") == 0)

    # ------------------------------------------------------------------------- view installs

    def _fetch(self) -> None:
        """Take the member's current tables now, if they changed."""
        self._take(call(self.manager.watch, self.member_id, self._version, 0,
                        table=self._table.position))

    def _take(self, answer: dict | None) -> None:
        if answer is None:
            return
        try:
            version, view, piece = MemberView.from_wire(answer)
        except MalformedView as exc:  # (a scope of another version: fetched again next time)
            log.warning("member %d: view from scope %r dropped: %s", self.member_id, self.scope,
                        exc)
            return
        with self._lock:
            if version <= self._version:
                return
            if piece is not None:  # the scope's topic table (fetched here: no Ray call on the
                piece = tuple(piece)   # I/O thread)
                base = ray.get(self._table.base_ref(piece)) if self._table.needs_base(piece) \
                    else None
                self._table.take(piece, base)
            self._table.take_early(view.early)
            self.runtime.call_wait(self._install, view, beat=self._beat)
            self._version = version

    def _install(self, view: MemberView) -> None:
        """Runs on the I/O thread: swap in the new tables. A table the view leaves as it was is
        not made again: a member of 10,000 topics gets a view for each change anywhere in its
        scope, and tables of 10,000 entries made and dropped each time cost it CPU and left its
        heap fragmented (resident memory a topic it never gave back)."""
        rt, last = self.runtime, self._installed
        self._siblings = [MemberInfo(*m) for m in view.members]
        rt.install_members(self._siblings + list(self._peers.values()))
        table = self._table  # (a change makes its dicts anew, never changing one handed over:
        if table.names is not self._handed:  # MemberTopicTable; so a new dict is a change)
            rt.install_topics(table.names, table.sessions)
            self._handed = table.names
        for tid, session in table.sessions.items():  # topics this process publishes move on
            if rt.publish_sessions.get(tid, session) < session:   # later
                self._session_moves[tid] = session
        rt.install_groups(set(view.groups), {_address(k): v for k, v in view.joined.items()})
        kept = {}  # the parts installed before that this view has alike (kept, not its own)
        if last is not None and (last.routes, last.receivers) == (view.routes, view.receivers):
            kept.update(routes=last.routes, receivers=last.receivers)
        else:
            self._install_routes(view)
        if view.demoted and not self.demoted:
            self.demoted = view.demoted
            log.warning("member %d demoted to client by scope %r: %s; its publishers no longer "
                        "wait for it and it may miss messages", self.member_id, self.scope,
                        self.demoted)
        if last is not None and (last.agents, last.protocols, last.cached) == \
                (view.agents, view.protocols, view.cached):
            kept.update(agents=last.agents, protocols=last.protocols, cached=last.cached)
        else:  # (the runtime keeps `protocols`)
            rt.install_recovery(dict(view.agents), view.protocols, set(view.cached))
        self._take_keys(view.keys)
        self._installed = replace(view, **kept)

    def _install_routes(self, view: MemberView) -> None:
        """The forwarding table of `view` (on the I/O thread)."""
        routes: dict[int, tuple[Route, ...]] = {}
        alike: dict[tuple[int, ...], tuple[Route, ...]] = {}  # by the routes' ids
        for r in view.routes:  # one entry per channel, with the topics it serves
            route = Route(RoutingLabel(r.src, r.dst, r.origin), _channel(r))
            for topic in r.topics:  # topics of the same channels share one tuple
                both = routes.get(topic, ()) + (route,)  # (mostly one)
                routes[topic] = alike.setdefault(tuple(map(id, both)), both)
        receivers = {_address(k): set(v) for k, v in view.receivers.items()}
        self.runtime.install_routes(routes, receivers)

    def _take_keys(self, keys: ClusterKeys) -> None:
        """Seal and accept as `keys` say (auth.ClusterKeys), if they are newer than this
        member's (on the I/O thread, or before it handles a datagram)."""
        if keys.supersedes(self._keys):
            self._keys = keys
            self.runtime.install_keys(keys.raw(), keys.generation)

    def _resolve_peers(self) -> None:
        """Look up in the directory the members whose datagrams the runtime is holding."""
        # (beating while the I/O thread is busy: a member whose data plane lags on a loaded
        # machine must not look dead to its scope, which would then drop it)
        unknown = self.runtime.call_wait(self.runtime.held_senders, beat=self._beat)
        unknown -= set(self._peers)
        if not unknown:
            return
        found = call(self.root.lookup_members, sorted(unknown))
        with self._lock:
            self._peers.update((m[0], MemberInfo(*m[:4], None if m[4] is None else tuple(m[4])))
                               for m in found)
            members = self._siblings + list(self._peers.values())
            self.runtime.call_wait(self.runtime.install_members, members, beat=self._beat)

    def _loop(self) -> None:
        pending = done = None
        while not self._stop.is_set():
            try:
                if self._rejoining:  # (its failure, even half-way, is retried whole)
                    self._rejoin()
                try:
                    if pending is None:
                        pending = self.manager.watch.remote(
                            self.member_id, self._version, WATCH_PERIOD, self._counters(),
                            table=self._table.position)
                        done = pending.future()
                    # (a future, not ray.wait: Ray's wait from a second thread of an actor that
                    # is running a task races with that task's bookkeeping)
                    concurrent.futures.wait([done], timeout=POLL)
                    if self.runtime.unknown_sender.is_set():
                        self.runtime.unknown_sender.clear()
                        self._resolve_peers()
                    if done.done():
                        ref, pending = pending, None
                        self._take(call_ref(ref))
                        self._move_sessions()
                        if self._on_unused is not None and self.lingered_out():
                            self._on_unused(self)
                except (MemberExpired, *SCOPE_GONE):
                    pending = None
                    self._rejoining = True
            except Exception as exc:  # the control plane may be restarting; keep the data plane
                pending = None
                log.warning("%s failed (again in 1 s): %s",
                            "rejoining" if self._rejoining else "view refresh", exc)
                self._stop.wait(1.0)

    def _counters(self) -> dict | None:
        """What status shows of this member's data plane (drops by reason, recovery counters,
        window use, token period, role) for the next heartbeat. Taken on the I/O thread; when
        that is busy (a burst to catch up with, a loaded machine) the heartbeat goes with the
        counters taken last: a member whose data plane lags is the slow-consumer check's to
        judge, by its lag, and must not look dead to its scope."""
        try:
            self.runtime.call_wait(self._snapshot, timeout=COUNTERS_WAIT)
        except TimeoutError:
            pass  # (the snapshot still runs once the I/O thread gets to it)
        return self._latest

    def _snapshot(self) -> None:
        """Runs on the I/O thread."""
        snap = self.runtime.snapshot()
        role = "client" if self._role != "member" or self.demoted else \
            "light" if snap["recovery"]["light"] else "regular"
        self._latest = {"role": role,
                        "backlog_bytes": snap["backlog_bytes"], "drops": snap["drops"],
                        "stats": snap["stats"], "recovery": snap["recovery"]}

    def _beat(self) -> None:
        """A heartbeat while the control thread waits for a busy I/O thread (a watch that
        returns at once; its answer is not needed)."""
        self.manager.watch.remote(self.member_id, self._version, 0, self._latest,
                                  table=self._table.position)

    def _move_sessions(self) -> None:
        """Let this process's publishers move to a topic's new session once every member knows
        it (thesis 3.2.7)."""
        if self._session_moves and call(self.manager.ready):
            for tid, session in list(self._session_moves.items()):
                self.runtime.publish_sessions[tid] = session
                del self._session_moves[tid]
                log.info("publishers of %s move to session %d", self._table.names.get(tid),
                         session)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.runtime.unknown_sender.set()
        if threading.current_thread() is not self._thread:  # (it may close itself: IDLE_MEMBER_LINGER)
            self._thread.join(5.0)
        try:
            call(self.manager.unregister_member, self.member_id, timeout=10.0)
        except Exception as exc:
            log.debug("unregister failed: %s", exc)
        self.runtime.close()


def _channel(route: ViewRoute):
    ep = route.endpoint
    channel = UnicastEndpoint(ep[1], ep[2], ep[3]) if ep[0] == "u" else MulticastGroup(ep[1], ep[2])
    if route.filter:
        return FilteredChannel(((build(route.filter), channel),))
    return channel


def _decrement(counts: dict, name) -> bool:
    """Drop one use of `name`; True when it was the last."""
    left = counts.get(name, 0) - 1
    if left > 0:
        counts[name] = left
        return False
    counts.pop(name, None)
    return True


def _address(key: str) -> tuple[str, int]:
    host, port = key.rsplit(":", 1)
    return (host, int(port))


def _node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""

