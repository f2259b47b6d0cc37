"""Recovery agents (thesis 3.2.11-3.2.13) and the per-node Ray actor that runs them.

A `RecoveryAgent` stands for one sub-domain in its peer group. It is the protocol's environment: one
UDP socket (datagrams authenticated with the cluster key, like the data plane's) through which the
protocol hears its bottom's summaries, its peers' tokens and the answers of the agent above, and
sends what the protocol returns.

Agents are delegated to a node (the chain ends at the host of the member they are placed beside);
there they live in that node's `AgentHost`, one Ray actor per node that runs every agent of the
built-in protocols placed on the node on one thread (and one per plug-in protocol, so that a faulty
plug-in stalls only its own agents). One actor per agent would mean one Python process per agent —
about a second of CPU to start and tens of MB each, for a job that wakes every few milliseconds for
microseconds — and on a small machine dozens of those starved the scope managers' heartbeats. Ray
calls only set agents up: the owning scope ensures its agent exists (the reply carries address and
incarnation, so a host that Ray restarted recreates its agents on the next ping), installs
peer-group views and reads status; no Ray call is on the path of a token or a summary.

Packets (all `PacketType.TOKEN`, typed in `netio.control_messages`): a `Summary` from a bottom
(answered with an `InstructionsEnvelope` to the address it came from, naming the protocol: a member
has one agent per protocol among its topics), `PeerToken`s between peers, and a `Summary` of the
aggregate / an `InstructionsEnvelope` between a group's leader and the agent above.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import selectors
import threading
import time
from collections import Counter, deque

import ray

from scopecast.actors import logs
from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol
from scopecast.agents.builtin import BUILTIN_PROTOCOLS
from scopecast.netio import control_messages, wire
from scopecast.netio.auth import ClusterKeys, KeyRing
from scopecast.netio.control_messages import InstructionsEnvelope, PeerToken, Summary
from scopecast.netio.replay_guard import ControlNumbers, ReplayGuard
from scopecast.netio.transport import TransportConfig, unicast_socket
from scopecast.policies.host import PLUGIN_MEMORY, confine
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

TICK = TIMING.agent_tick
IDLE_WAIT = TIMING.agent_idle_wait
HANG = TIMING.agent_hang
MAX_STATE_CHARS = 8192  # of a protocol's describe() in status


class RecoveryAgent:
    """One agent: a protocol instance and its socket, driven by its host's thread."""

    def __init__(self, spec: dict, interface: str, protocol: type[RecoveryProtocol]) -> None:
        self.name = spec["name"]
        self.fault = ""  # what its protocol did wrong first (a raise): the scope replaces it
        self.domain = spec["domain"]
        # tags its instructions: the member's agent for that domain (`scopes.scope_admin`)
        self.key = spec.get("domain_key") or spec["protocol"]
        self.options = dict(spec.get("options") or {})
        self.protocol = protocol(DomainContext(self.domain, int(spec["level"]), dict(self.options)))
        self.plugin = protocol not in BUILTIN_PROTOCOLS.values()
        self.incarnation = random.getrandbits(48)
        # its control datagrams' sender id (above members' ids, which count from 1), numbers and
        # stamps, and the guard against replayed ones (netio/replay_guard)
        self.sender = 1 << 31 | random.getrandbits(31)
        self._numbers = ControlNumbers()
        self._replays = ReplayGuard()
        keys = ClusterKeys.from_wire(spec.get("keys") or ClusterKeys().to_wire())
        self.keys = keys if keys.generation else ClusterKeys.first(spec["key"])
        self._auth = KeyRing(spec["mac"], self.keys.raw(), self.keys.generation)
        self.sock = unicast_socket(TransportConfig(interface=spec.get("interface") or interface,
                                                   rcvbuf_bytes=4 << 20))
        self.address = self.sock.getsockname()
        self._peers: list[tuple[str, int]] = []
        self._upper: tuple[str, int] | None = None
        self._view: PeerView | None = None
        # a member joining a running domain (thesis 3.2.14) is light until it reports, so that
        # one stopped before its first report holds nobody back (the summary is its words)
        self.bottom_light = bool(spec.get("light"))
        if self.bottom_light:
            _guarded(self, self.protocol.on_summary, {"light": True}, time.monotonic())
        self.drops: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self._last_bottom = 0.0

    def install(self, version: int, peers: list[list], index: int, upper: list | None,
                top: bool, missing: int) -> None:
        """A new view of the peer group: `peers` are [name, host, port, region] in ring order;
        `upper` the agent above (None at the top, or while it is being placed); `missing`
        members have no agent in the group yet."""
        self._peers = [(h, int(p)) for _n, h, p, _r in peers]
        self._upper = (upper[0], int(upper[1])) if upper else None
        self._view = PeerView(version, tuple(n for n, *_ in peers), index, not top, missing,
                              tuple(int(r) for *_, r in peers))
        self.protocol.on_view(self._view)

    def rekey(self, keys: ClusterKeys) -> None:
        """Seal and accept as `keys` say (auth.ClusterKeys), if it is a newer ring (see
        scopes/key_rotation)."""
        if keys.supersedes(self.keys):
            self.keys = keys
            self._auth.set(keys.raw(), keys.generation)

    def status(self) -> dict:
        v = self._view
        return {"domain": self.domain, "protocol": self.protocol.name, "options": self.options,
                "pid": os.getpid(), **({"fault": self.fault} if self.fault else {}),
                "address": "%s:%d" % self.address, "view": v.version if v else 0,
                "peers": list(v.peers) if v else [], "index": v.index if v else -1,
                "missing": v.missing if v else 0,
                "leader": bool(v and v.index == 0), "upper": "%s:%d" % self._upper if self._upper
                else None, "period": getattr(self.protocol, "period", None),
                "bottom_age": round(time.monotonic() - self._last_bottom, 3),
                "bottom_light": self.bottom_light,
                "protocol_stats": dict(getattr(self.protocol, "stats", {})),
                "state": _protocol_state(self.protocol),
                "drops": dict(self.drops), "stats": dict(self.stats),
                "key_generation": self.keys.generation}

    def tick(self, now: float) -> None:
        self._replays.expire(now)
        self._send_peers(self.protocol.on_tick(now))
        up = self.protocol.upward()
        if up is not None and self._upper is not None:
            self._send(Summary(up), self._upper)

    def drain(self) -> None:
        while True:
            try:
                data, addr = self.sock.recvfrom(65_536)
            except BlockingIOError:
                return
            except OSError:
                self.drops["socket_error"] += 1
                return
            self._on_datagram(data, addr)

    def _on_datagram(self, data: bytes, addr) -> None:
        n = len(data) - self._auth.trailer_size
        if n < wire.HEADER.size or (data := self._auth.open(data, n)) is None:
            self.drops["bad_mac"] += 1
            return
        try:
            header, body = wire.decode_control(memoryview(data)[:n])
            if header.ptype != wire.PacketType.TOKEN:
                raise wire.DecodeError("bad_type", "not a token packet")
            msg = control_messages.decode(header.ptype, body)
        except (wire.DecodeError, IndexError, KeyError, TypeError, ValueError, AttributeError):
            self.drops["bad_packet"] += 1
            return
        now = time.monotonic()
        refused = self._replays.admit(header.sender, header.dseq, header.stamp, wire.stamp_now(),
                                      now)
        if refused is not None:
            self.drops[refused] += 1
            return
        try:
            if msg.__class__ is Summary:
                self._last_bottom = now
                self.bottom_light = msg.body.get("light") is True
                self.stats["summaries"] += 1
                self._send(InstructionsEnvelope(self.protocol.on_summary(msg.body, now),
                                                self.key), addr)
            elif msg.__class__ is PeerToken and self._view is not None \
                    and msg.version == self._view.version:
                self.stats["tokens"] += 1
                self._send_peers(self.protocol.on_peer(msg.index, msg.body, now))
            elif msg.__class__ is InstructionsEnvelope:
                self.protocol.on_down(msg.body)
            else:
                self.drops["stale_or_unknown"] += 1
        except (IndexError, KeyError, TypeError, ValueError, AttributeError):
            # a built-in protocol reading a peer's malformed body; a plug-in's error is its
            # fault (`_guarded`: the scope replaces it)
            if self.plugin:
                raise
            self.drops["bad_packet"] += 1

    def _send_peers(self, out: list[tuple[int, object]]) -> None:
        v = self._view
        for index, body in out:
            if v is not None and 0 <= index < len(self._peers):
                self._send(PeerToken(v.version, v.index, body), self._peers[index])

    def _send(self, message, address: tuple[str, int]) -> None:
        try:
            ptype, body = control_messages.encode(message)
            data = wire.encode_control(ptype, self.sender, body, 0, self._numbers.next(),
                                       wire.stamp_now())
        except (ValueError, TypeError):  # too large, or not msgpack-able (a faulty plug-in)
            self.drops["unsendable"] += 1
            return
        try:
            self.sock.sendmsg(self._auth.seal(data), (), 0, address)
            self.stats["datagrams_out"] += 1
            self.stats["bytes_out"] += len(data) + self._auth.trailer_size
        except OSError:
            self.drops["send_error"] += 1


class AgentHost:
    """The Ray actor (one per node, and per plug-in protocol) whose thread runs the agents
    delegated to that node.

    Ray methods run on the actor's own thread and only queue work for the agents' thread, which
    alone touches agents after they are created (no locks). A plug-in's host gets the plug-in's
    `module` and `cls` (its package came with the actor's runtime_env) and bounded memory."""

    def __init__(self, module: str | None = None, cls: str | None = None) -> None:
        logs.configure()
        self._plugin: type[RecoveryProtocol] | None = None
        if module is not None:
            confine(PLUGIN_MEMORY)
            self._plugin = getattr(importlib.import_module(module), cls)
        self._interface = ray.util.get_node_ip_address()
        self._agents: dict[str, RecoveryAgent] = {}   # the Ray side's view
        self._versions: dict[str, int] = {}           # agent -> the latest view version sent
        self._ops: deque = deque()
        self._looped = time.monotonic()  # the agents' thread's last pass (a hung plug-in's stops)
        self._thread = threading.Thread(target=self._run, name="scopecast-agents", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------- Ray methods

    def ensure_all(self, specs: list[dict]) -> list[list]:
        """`_ensure` each of `specs`: a scope asks for all its agents here in one call, since
        one call per agent each tick (dozens a second) queued up behind each other on a loaded
        node."""
        return [self._ensure(spec) for spec in specs]

    def _ensure(self, spec: dict) -> list:
        """Create agent `spec["name"]` unless it runs here; where it listens, which incarnation
        it is (a host restarted by Ray recreates its agents with new ones), the latest view
        version it was sent (a scope restarted by Ray goes on from there), and its fault ("" if
        none: its protocol raised, or a plug-in's thread hangs)."""
        agent = self._agents.get(spec["name"])
        if agent is None:
            protocol = self._plugin or BUILTIN_PROTOCOLS[spec["protocol"]]
            agent = self._agents[spec["name"]] = RecoveryAgent(spec, self._interface, protocol)
            self._ops.append(("add", agent))
            log.info("recovery agent %s (%s) at %s:%d", agent.domain, agent.protocol.name,
                     *agent.address)
        elif spec.get("keys"):  # (a rotation's step this host's `rekey` call missed)
            ring = ClusterKeys.from_wire(spec["keys"])
            if ring.supersedes(agent.keys):
                self._ops.append(("rekey", agent, (ring,)))
        stalled = time.monotonic() - self._looped
        fault = agent.fault or (f"its agents' thread made no progress for {stalled:.0f} s"
                                if self._plugin is not None and stalled > HANG else "")
        return [agent.address[0], agent.address[1], agent.incarnation, os.getpid(),
                self._versions.get(spec["name"], 0), fault]

    def view(self, name: str, version: int, peers: list[list], index: int, upper: list | None,
             top: bool, missing: int) -> None:
        if name in self._agents:
            self._versions[name] = version
            self._ops.append(("view", self._agents[name],
                              (version, peers, index, upper, top, missing)))

    def rekey(self, keys: list) -> None:
        """The cluster's keys (`ClusterKeys` wire form) for every agent here (see
        scopes/key_rotation); each takes them only if newer than its own."""
        ring = ClusterKeys.from_wire(keys)
        for agent in self._agents.values():
            self._ops.append(("rekey", agent, (ring,)))

    def statuses(self, names: list[str]) -> list[dict]:
        """The status of each named agent (one call for a scope's agents here)."""
        return [a.status() if (a := self._agents.get(n)) is not None
                else {"error": "no such agent here"} for n in names]

    def drop(self, name: str) -> None:
        agent = self._agents.pop(name, None)
        self._versions.pop(name, None)
        if agent is not None:
            self._ops.append(("drop", agent))

    # ---------------------------------------------------------------------------- thread

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        next_tick = 0.0
        while True:
            self._looped = time.monotonic()
            try:
                while self._ops:
                    self._apply(sel, *self._ops.popleft())
                if not sel.get_map():
                    time.sleep(IDLE_WAIT)
                    continue
                for key, _ in sel.select(max(0.0, next_tick - time.monotonic())):
                    _guarded(key.data, key.data.drain)
                # every agent's tick once per TICK, not after every datagram: with dozens of
                # agents on a node, hundreds of summaries a second each woke all of them
                now = time.monotonic()
                if now < next_tick:
                    continue
                next_tick = now + TICK
                for key in list(sel.get_map().values()):
                    _guarded(key.data, key.data.tick, now)
            except Exception:  # a bad view or op must not stop the node's agents
                log.exception("recovery agents: loop error (continuing)")

    @staticmethod
    def _apply(sel: selectors.BaseSelector, op: str, agent: RecoveryAgent, args=()) -> None:
        if op == "add":
            sel.register(agent.sock, selectors.EVENT_READ, agent)
        elif op == "view":
            agent.install(*args)
        elif op == "rekey":
            agent.rekey(*args)
        else:
            sel.unregister(agent.sock)
            agent.sock.close()


def _guarded(agent: RecoveryAgent, step, *args) -> None:
    """Run one agent's step; an error is counted (logged the first time) and the others go on."""
    try:
        step(*args)
    except (Exception, SystemExit) as exc:  # (MemoryError too: a plug-in over its memory bound)
        agent.drops["internal_error"] += 1
        if agent.drops["internal_error"] == 1:
            agent.fault = f"{agent.protocol.name}: {exc!r}"[:300]
            log.exception("recovery agent %s: error (counted from now on)", agent.domain)


def _protocol_state(protocol: RecoveryProtocol) -> dict:
    """The protocol's `describe()`, read from a Ray thread while the agents' thread runs it: a
    table changing size meanwhile, or a faulty plug-in (no dict, or a large one), gives an
    error instead."""
    try:
        state = protocol.describe()
        if not isinstance(state, dict) or len(repr(state)) > MAX_STATE_CHARS:
            return {"error": f"describe() gave no dict of at most {MAX_STATE_CHARS} characters"}
        return state
    except Exception as exc:
        return {"error": repr(exc)[:200]}


def host_name(node_id: str, protocol: str) -> str:
    """The named AgentHost of a node for `protocol` (the built-ins share one)."""
    if protocol.startswith("sha256:"):
        return f"scopecast:agents:{node_id}:{protocol[7:23]}"
    return f"scopecast:agents:{node_id}"
