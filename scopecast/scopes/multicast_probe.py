"""Does IP multicast pass between the hosts of a LAN scope?

Most clouds and container networks drop IP multicast. A LAN scope with several hosts therefore
lays unicast channels (its policies see `multicast=False`) until a probe shows that multicast
passes: every other host scope manager joins the LAN's group (on the port beside the data port)
on its own interface, then one host scope manager sends a few datagrams carrying a random token
to it and the listeners count what came; then a second one sends to the first. Multicast is on
only if every host heard the token. The listeners have joined before anything is sent, so a host
slow to answer (a loaded machine) delays the probe instead of failing it. A LAN is probed again
when its hosts change, and every RETRY seconds while it is unicast-only. Datagrams without the
token are ignored, and logged with their count: the probe port is as open as any other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scopecast.netio.transport import TransportConfig, multicast_socket, unicast_socket
from scopecast.timing import TIMING

PROBES = 10          # datagrams one probe sends ...
SPACING = TIMING.probe_spacing
LISTEN = TIMING.probe_listen
RETRY = TIMING.probe_retry
STALE = TIMING.probe_stale
_BUFFER = 1 << 16

log = logging.getLogger(__name__)


@dataclass
class ProbeState:
    """What a LAN scope knows of multicast among its hosts (shown in its status)."""

    verified: frozenset = frozenset()   # the hosts multicast was seen to pass between
    probed: frozenset = frozenset()     # the hosts of the last probe
    state: str = "single host"          # "single host", "probing", "passes", "unicast-only"
    heard: dict = field(default_factory=dict)  # host -> probes heard, at the last probe
    at: float = 0.0                     # when the last probe ended (time.time())

    def record(self) -> dict:
        return {"state": self.state, "heard": dict(self.heard), "at": self.at}


def new_token() -> bytes:
    return b"scopecast-probe:" + os.urandom(16).hex().encode()


def _config(interface: str) -> TransportConfig:
    return TransportConfig(interface=interface, rcvbuf_bytes=_BUFFER, sndbuf_bytes=_BUFFER)


class Listener:
    """One host's ear for one probe: joined to the group when made, so that what is sent after
    every listener was made is in its socket buffer however late it is read."""

    def __init__(self, interface: str, group: str, port: int, token: bytes):
        self.group, self.port, self.token = group, port, token
        self.born = time.monotonic()
        self._sock = multicast_socket(_config(interface), group, port)

    def heard(self, seconds: float = LISTEN) -> int:
        """How many datagrams carrying the token came (stops at the first, or after `seconds`
        with none); closes the socket."""
        heard = strays = 0
        try:
            self._sock.setblocking(True)
            deadline = time.monotonic() + seconds
            while not heard and (left := deadline - time.monotonic()) > 0:
                self._sock.settimeout(left)
                try:
                    data = self._sock.recv(len(self.token) + 1)
                except TimeoutError:
                    break
                if data == self.token:
                    heard += 1
                else:
                    strays += 1
        finally:
            self.close()
        if strays:
            log.warning("multicast probe on %s:%d: ignored %d datagram(s) without its token",
                        self.group, self.port, strays)
        return heard

    def close(self) -> None:
        self._sock.close()


def send(interface: str, group: str, port: int, token: bytes, count: int = PROBES) -> None:
    """Send `token` to `group` from `interface`, `count` times (the listeners have joined)."""
    sock = unicast_socket(_config(interface))
    try:
        for _ in range(count):
            try:
                sock.sendto(token, (group, port))
            except OSError:
                pass  # a network that refuses multicast outright: heard by nobody
            time.sleep(SPACING)
    finally:
        sock.close()


def decide(heard: dict[str, int]) -> bool:
    """Multicast passes when every listening host heard the sender."""
    return bool(heard) and all(n > 0 for n in heard.values())


def probe_port(port: int) -> int:
    return port + 1 if port < 0xFFFF else port - 1



class LanProbe:
    """A LAN scope's side of the probe: when to probe (its hosts changed, or it is unicast-only
    and RETRY passed), running one probe through the host scopes' actors, and the verdict,
    which goes to `set_multicast` (False while a probe runs: nothing goes by multicast until it
    is seen to pass)."""

    def __init__(self, path: str, set_multicast: Callable[[bool], None]) -> None:
        self.path = path
        self.state = ProbeState()
        self._set_multicast = set_multicast
        self._running: asyncio.Task | None = None

    def tick(self, hosts: dict[str, object], group: tuple[str, int]) -> None:
        """`hosts`: the LAN's host scopes by name (their actor handles); `group`: the LAN's
        multicast group and data port. Runs on the scope's event loop."""
        if self._running is not None and not self._running.done():
            return
        names = frozenset(hosts)
        p = self.state
        if len(names) <= 1:
            p.state = "single host"
            self._set_multicast(True)
        elif not names <= p.verified and (names != p.probed or p.state != "unicast-only"
                                          or time.time() - p.at > RETRY):
            self._set_multicast(False)
            p.state = "probing"
            self._running = asyncio.get_running_loop().create_task(self._run(dict(hosts), group))

    async def _run(self, hosts: dict[str, object], group: tuple[str, int]) -> None:
        address, port = group[0], probe_port(group[1])
        token = new_token()
        first, second, *rest = sorted(hosts)

        async def probe(sender: str, listeners: list[str]) -> dict[str, int]:
            ears = [hosts[n] for n in listeners]
            await asyncio.gather(*(h.probe_join.remote(address, port, token) for h in ears))
            await hosts[sender].probe_send.remote(address, port, token)
            heard = await asyncio.gather(*(h.probe_heard.remote(token) for h in ears))
            return dict(zip(listeners, heard, strict=True))

        p = self.state
        try:  # every host hears one other: the first all the others, then the second the first
            heard = await asyncio.wait_for(probe(first, [second, *rest]), 10.0)
            heard.update(await asyncio.wait_for(probe(second, [first]), 10.0))
        except Exception as exc:  # a host scope gone meanwhile: probed again next tick
            log.warning("scope %r: multicast probe failed (again next tick): %r", self.path, exc)
            p.state = "retry"
            return
        passes = decide(heard)
        p.heard, p.at, p.probed = heard, time.time(), frozenset(hosts)
        p.verified = frozenset(hosts) if passes else frozenset()
        p.state = "passes" if passes else "unicast-only"
        log.info("scope %r: IP multicast %s between its %d hosts (%s)", self.path,
                 "passes" if passes else "does NOT pass: unicast channels only", len(hosts), heard)
        self._set_multicast(passes)


class ProbeEars:
    """A host scope's side: the listeners of the probes under way, by token."""

    def __init__(self) -> None:
        self._listening: dict[bytes, Listener] = {}

    def join(self, interface: str, group: str, port: int, token: bytes) -> None:
        for old in [t for t, ear in self._listening.items()
                    if time.monotonic() - ear.born > STALE]:
            self._listening.pop(old).close()
        self._listening[token] = Listener(interface, group, port, token)

    async def heard(self, token: bytes) -> int:
        ear = self._listening.pop(token, None)
        return 0 if ear is None else await asyncio.to_thread(ear.heard)
