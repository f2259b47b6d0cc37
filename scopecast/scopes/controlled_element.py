"""The controlled element (thesis 3.2.6): the thin control layer inside a member process.

It registers the process with its scope manager, passes subscribe/advertise requests up, and keeps
the member runtime's tables (members, topics, groups, forwarding table) in step with the scope's
view. All Ray calls happen here, on the caller's thread or the element's control thread — never on
the runtime's I/O thread, so the data plane never waits for the control plane.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import replace

import ray

from scopecast.actors.errors import MemberExpired, ScopecastError
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig
from scopecast.scopes.channel import MulticastGroup
from scopecast.scopes.routing import RoutingLabel

log = logging.getLogger(__name__)

VIEW_PERIOD = 0.2
READY_TIMEOUT = 5.0


def call(method, *args, timeout: float = 60.0, **kwargs):
    """Call a scope-manager method and re-raise our typed errors as themselves."""
    try:
        return ray.get(method.remote(*args, **kwargs), timeout=timeout)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ScopecastError):
            raise cause from None
        raise


class ControlledElement:
    """One per member process and cluster: owns the `MemberRuntime` and its control thread."""

    def __init__(self, manager, hello: dict, config: RuntimeConfig | None = None,
                 role: str = "member") -> None:
        self.manager = manager
        config = replace(config or RuntimeConfig(), mac=hello["mac"])
        if config.transport.interface is None:
            interface = hello.get("interface") or _node_ip()
            config = replace(config, transport=replace(config.transport, interface=interface))
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._version = 0
        self._lock = threading.Lock()  # serialises view installs (control thread vs callers)
        self._stop = threading.Event()
        self._published: dict[str, int] = {}   # topic -> open Publisher handles
        self._session_moves: dict[int, int] = {}  # topic -> session publishers should move to
        self._topic_names: dict[int, str] = {}
        self._subscribed: dict[tuple, int] = {}  # (topic, role) -> open Subscriber handles
        self._role = role
        # the runtime's socket is the member's address, so it exists before the registration
        self.runtime = MemberRuntime(0, self.name, hello["key"], config)
        self._register()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="scopecast-control", daemon=True)
        self._thread.start()

    def _register(self) -> None:
        rt = self.runtime
        self.member_id = call(self.manager.register_member, self.name, rt.address[0],
                              rt.address[1], os.getpid(), _node_id(), self._role)
        rt.member_id = self.member_id

    def _rejoin(self) -> None:
        """The scope forgot this member (it was silent too long): register again, with the same
        socket, and take back its subscriptions and publications."""
        with self._lock:
            old = self.member_id
            self._register()
            for role in ("member", "client"):
                names = [n for (n, r) in self._subscribed if r == role]
                if names:
                    call(self.manager.subscribe, self.member_id, names, role)
            for name in self._published:
                call(self.manager.advertise, self.member_id, name)
            self._version = 0
        log.warning("member %d had been dropped by its scope; rejoined as member %d", old,
                    self.member_id)
        self.refresh()

    # ------------------------------------------------------------------ requests from the API

    def subscribe(self, names: list[str], role: str = "member"):
        """Subscribe this member to `names` (topics or patterns) as a member or a client; returns
        the TopicInfos covered now, once their groups are joined."""
        infos = call(self.manager.subscribe, self.member_id, names, role)
        for name in names:
            self._subscribed[(name, role)] = self._subscribed.get((name, role), 0) + 1
        self.refresh()
        return infos

    def advertise(self, name: str):
        """Make this member a publisher of `name`; returns its TopicInfo once routes are laid and
        every member subscribed to the topic has joined its channel (a topic created a moment ago
        reaches pattern subscribers with their next view)."""
        info = call(self.manager.advertise, self.member_id, name)
        self._published[name] = self._published.get(name, 0) + 1
        self.refresh()
        deadline = time.monotonic() + READY_TIMEOUT
        while not call(self.manager.receivers_ready, name):
            if time.monotonic() > deadline:
                log.warning("subscribers of %s did not take their view within %.0fs; publishing "
                            "anyway (they may miss the first messages)", name, READY_TIMEOUT)
                break
            time.sleep(0.02)
        return info

    def release(self, publisher_of: str | None = None,
                subscriber_of: list[str] | None = None, role: str = "member") -> None:
        """A publisher or subscriber closed: leave topics no other handle in this process uses."""
        if publisher_of is not None and _decrement(self._published, publisher_of):
            call(self.manager.unadvertise, self.member_id, publisher_of)
        gone = [n for n in subscriber_of or () if _decrement(self._subscribed, (n, role))]
        if gone:
            call(self.manager.unsubscribe, self.member_id, gone, role)
        self.refresh()

    # ------------------------------------------------------------------------- view installs

    def refresh(self) -> None:
        """Fetch the view if it changed and install it in the runtime (waits for the install)."""
        with self._lock:
            view = call(self.manager.view, self.member_id, self._version)
            if view is None:
                return
            self.runtime.call_wait(self._install, view)
            self._version = view["version"]
            # tell the scope at once that this view is in place (publishers may be waiting on it)
            call(self.manager.view, self.member_id, self._version)

    def _install(self, view: dict) -> None:
        """Runs on the I/O thread: swap in the new tables."""
        rt = self.runtime
        rt.install_members([MemberInfo(*m) for m in view["members"]])
        sessions = {int(k): v for k, v in view["sessions"].items()}
        self._topic_names = {int(k): v for k, v in view["topics"].items()}
        rt.install_topics(self._topic_names, sessions)
        for tid, session in sessions.items():  # topics this process publishes move on later
            if rt.publish_sessions.get(tid, session) < session:
                self._session_moves[tid] = session
        rt.install_groups({(g, p) for g, p in view["groups"]})
        routes: dict[int, list[Route]] = {}
        for r in view["routes"]:
            label = RoutingLabel(tuple(r["src"]), tuple(r["dst"]), r["topic"], r["origin"])
            routes.setdefault(r["topic"], []).append(
                Route(label, MulticastGroup(r["group"], r["port"])))
        receivers = {_address(k): set(v) for k, v in view["receivers"].items()}
        rt.install_routes(routes, receivers)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.runtime.unknown_sender.wait(VIEW_PERIOD)
            self.runtime.unknown_sender.clear()
            if self._stop.is_set():
                break
            try:
                try:
                    self.refresh()
                    self._move_sessions()
                except MemberExpired:
                    self._rejoin()
            except Exception as exc:  # the control plane may be restarting; keep the data plane
                log.warning("view refresh failed: %s", exc)
                self._stop.wait(1.0)

    def _move_sessions(self) -> None:
        """Let this process's publishers move to a topic's new session once every member that
        subscribes to it has taken the view announcing it (thesis 3.2.7)."""
        names = self._topic_names
        for tid, session in list(self._session_moves.items()):
            if call(self.manager.receivers_ready, names.get(tid, "")):
                self.runtime.publish_sessions[tid] = session
                del self._session_moves[tid]
                log.info("publishers of %s move to session %d", names.get(tid), session)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self.runtime.unknown_sender.set()
        self._thread.join(5.0)
        try:
            call(self.manager.unregister_member, self.member_id, timeout=10.0)
        except Exception as exc:
            log.debug("unregister failed: %s", exc)
        self.runtime.close()


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


def _node_ip() -> str:
    return ray.util.get_node_ip_address()


def _node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return ""
