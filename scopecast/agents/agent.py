"""RecoveryAgent: the Ray actor that stands for one sub-domain in its peer group (thesis 3.2.11-3.2.13).

The actor is the protocol's environment: one UDP socket (datagrams authenticated with the cluster
key, like the data plane's) and one thread that feeds the protocol what arrives — the bottom's
summaries, peers' tokens, the answers of the agent above — and sends what it returns. Ray calls only
set it up: the owning scope starts it through the delegation chain, installs peer-group views and
reads its status; no Ray call is on the path of a token or a summary.

Packets (all `PacketType.TOKEN`, msgpack bodies): ``["sum", summary]`` from a bottom (answered
``["ins", instructions]`` to the address it came from), ``["tok", version, index, body]`` between
peers, and ``["sum", aggregate]`` / ``["ins", ...]`` between a group's leader and the agent above.
"""

from __future__ import annotations

import logging
import os
import random
import selectors
import threading
import time
from collections import Counter, deque

import ray

from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol
from scopecast.agents.token_ring import TokenRing
from scopecast.netio import wire
from scopecast.netio.auth import authenticator
from scopecast.netio.transport import TransportConfig, unicast_socket

log = logging.getLogger(__name__)

TICK = 0.005
BUILTIN: dict[str, type[RecoveryProtocol]] = {"token_ring": TokenRing}


class RecoveryAgent:
    """One agent: a protocol instance, its socket and its thread (see the module docstring)."""

    def __init__(self, domain: str, level: int, protocol: str, options: dict, key: bytes,
                 mac: str, interface: str) -> None:
        logging.basicConfig(level=logging.INFO)
        self.domain = domain
        self.protocol = BUILTIN[protocol](DomainContext(domain, level, dict(options)))
        self.incarnation = random.getrandbits(48)
        self._auth = authenticator(mac, key)
        interface = interface or ray.util.get_node_ip_address()
        self._sock = unicast_socket(TransportConfig(interface=interface, rcvbuf_bytes=4 << 20))
        self.address = self._sock.getsockname()
        self._peers: list[tuple[str, int]] = []
        self._upper: tuple[str, int] | None = None
        self._view: PeerView | None = None
        self._ops: deque = deque()
        self.drops: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self._last_bottom = 0.0
        self._last_up = 0.0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="scopecast-agent", daemon=True)
        self._thread.start()
        log.info("recovery agent %s (%s) at %s:%d", domain, protocol, *self.address)

    # ----------------------------------------------------------------------- Ray methods

    def start(self) -> list:
        """Where this agent listens, and which incarnation it is (a restart changes both)."""
        return [self.address[0], self.address[1], self.incarnation, os.getpid()]

    def view(self, version: int, peers: list[list], index: int, upper: list | None,
             top: bool) -> None:
        """A new view of the peer group: `peers` are [name, host, port] in ring order; `upper`
        the agent above (None at the top, or while it is being placed)."""
        self._ops.append((version, peers, index, upper, top))

    def status(self) -> dict:
        v = self._view
        return {"domain": self.domain, "protocol": self.protocol.name, "pid": os.getpid(),
                "address": "%s:%d" % self.address, "view": v.version if v else 0,
                "peers": list(v.peers) if v else [], "index": v.index if v else -1,
                "leader": bool(v and v.index == 0), "upper": "%s:%d" % self._upper if self._upper
                else None, "period": getattr(self.protocol, "period", None),
                "bottom_age": round(time.monotonic() - self._last_bottom, 3),
                "protocol_stats": dict(getattr(self.protocol, "stats", {})),
                "drops": dict(self.drops), "stats": dict(self.stats)}

    def stop(self) -> None:
        self._stop = True

    # ---------------------------------------------------------------------------- thread

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ)
        while not self._stop:
            try:
                while self._ops:
                    self._install(*self._ops.popleft())
                if sel.select(TICK):
                    self._drain()
                now = time.monotonic()
                self._send_peers(self.protocol.on_tick(now))
                up = self.protocol.upward()
                if up is not None and self._upper is not None:
                    self._send(["sum", up], self._upper)
            except Exception:  # one bad event must not stop the agent
                log.exception("recovery agent %s: loop error (continuing)", self.domain)
                self.drops["internal_error"] += 1

    def _install(self, version: int, peers: list[list], index: int, upper: list | None,
                 top: bool) -> None:
        self._peers = [(h, int(p)) for _n, h, p in peers]
        self._upper = (upper[0], int(upper[1])) if upper else None
        self._view = PeerView(version, tuple(n for n, _h, _p in peers), index, not top)
        self.protocol.on_view(self._view)

    def _drain(self) -> None:
        while True:
            try:
                data, addr = self._sock.recvfrom(65_536)
            except BlockingIOError:
                return
            except OSError:
                self.drops["socket_error"] += 1
                return
            self._on_datagram(data, addr)

    def _on_datagram(self, data: bytes, addr) -> None:
        n = len(data) - self._auth.trailer_size
        if n < wire.HEADER.size or not self._auth.check(data, n):
            self.drops["bad_mac"] += 1
            return
        try:
            header, body = wire.decode_control(memoryview(data)[:n])
            if header.ptype != wire.PacketType.TOKEN:
                raise wire.DecodeError("bad_type", "not a token packet")
            kind = body[0]
            now = time.monotonic()
            if kind == "sum" and isinstance(body[1], dict):
                self._last_bottom = now
                self.stats["summaries"] += 1
                self._send(["ins", self.protocol.on_summary(body[1], now)], addr)
            elif kind == "tok" and self._view is not None and body[1] == self._view.version:
                self.stats["tokens"] += 1
                self._send_peers(self.protocol.on_peer(int(body[2]), body[3], now))
            elif kind == "ins" and isinstance(body[1], dict):
                self.protocol.on_down(body[1])
            else:
                self.drops["stale_or_unknown"] += 1
        except (wire.DecodeError, IndexError, KeyError, TypeError, ValueError, AttributeError):
            self.drops["bad_packet"] += 1

    def _send_peers(self, out: list[tuple[int, object]]) -> None:
        v = self._view
        for index, body in out:
            if v is not None and 0 <= index < len(self._peers):
                self._send(["tok", v.version, v.index, body], self._peers[index])

    def _send(self, body, address: tuple[str, int]) -> None:
        try:
            data = wire.encode_control(wire.PacketType.TOKEN, 0, body)
        except ValueError:
            self.drops["oversized"] += 1
            return
        try:
            self._sock.sendmsg([data, self._auth.sign(data)], (), 0, address)
        except OSError:
            self.drops["send_error"] += 1
