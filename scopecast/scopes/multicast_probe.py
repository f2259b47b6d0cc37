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

import logging
import os
import time
from dataclasses import dataclass, field

from scopecast.netio.transport import TransportConfig, multicast_socket, unicast_socket

PROBES = 10          # datagrams one probe sends ...
SPACING = 0.05       # ... this far apart; the listeners then wait at most
LISTEN = 1.0         # this long for one more to come
RETRY = 60.0         # seconds between probes of a LAN found unicast-only
STALE = 60.0         # a listener never asked what it heard (its LAN scope died) is closed after
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

