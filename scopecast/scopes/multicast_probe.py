"""Does IP multicast pass between the hosts of a LAN scope? (issue 8 item 5)

Most clouds and container networks drop IP multicast. A LAN scope with several hosts therefore
lays unicast channels (its policies see `multicast=False`) until a probe shows that multicast
passes: one host scope manager sends a few datagrams carrying a random token to the LAN's group
(on the port beside the data port) while every other host scope manager listens for them on its
own interface, then a second one sends to the first; multicast is on only if every host heard the
token. A LAN is probed again when its
hosts change, and every RETRY seconds while it is unicast-only. Datagrams without the token are
ignored, and logged with their count: the probe port is as open as any other.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from scopecast.netio.transport import TransportConfig, multicast_socket, unicast_socket

PROBES = 10          # datagrams one probe sends ...
SPACING = 0.05       # ... this far apart, after
LEAD = 0.3           # this long for the listeners to join; they listen for
LISTEN = 1.5         # this long (or until they heard one)
RETRY = 60.0         # seconds between probes of a LAN found unicast-only
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


def listen(interface: str, group: str, port: int, token: bytes, seconds: float = LISTEN) -> int:
    """Join `group` on `interface` and count the datagrams carrying `token` (stops at the first,
    or after `seconds`)."""
    sock = multicast_socket(_config(interface), group, port)
    heard = strays = 0
    try:
        sock.setblocking(True)
        deadline = time.monotonic() + seconds
        while not heard and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data = sock.recv(len(token) + 1)
            except TimeoutError:
                break
            if data == token:
                heard += 1
            else:
                strays += 1
    finally:
        sock.close()
    if strays:
        log.warning("multicast probe on %s:%d: ignored %d datagram(s) without its token", group,
                    port, strays)
    return heard


def send(interface: str, group: str, port: int, token: bytes, count: int = PROBES) -> None:
    """Send `token` to `group` from `interface`, `count` times, starting after LEAD."""
    sock = unicast_socket(_config(interface))
    try:
        time.sleep(LEAD)
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

