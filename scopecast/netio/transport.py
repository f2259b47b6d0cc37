"""UDP unicast and IP multicast sockets with explicit interface, TTL, loopback and buffer sizes."""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from dataclasses import dataclass

from scopecast.actors.errors import InvalidConfig

log = logging.getLogger(__name__)

MAX_DATAGRAM = 65_000  # below UDP's 65,507-byte payload limit

# Linux constants not exported by every Python build
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)


@dataclass(slots=True, frozen=True)
class TransportConfig:
    """Socket settings; defaults work on one machine (loopback multicast)."""

    interface: str | None = None  # None: the cluster's choice (loopback for an embedded cluster)
    ttl: int = 1
    loopback: bool = True
    rcvbuf_bytes: int = 32 << 20
    sndbuf_bytes: int = 4 << 20
    datagram_bytes: int | None = None  # None: from the interface MTU (64 KB on loopback)
    gso: bool = True   # send a batch of datagrams per call where the kernel allows (udp_batch)
    gro: bool = True   # receive a batch of datagrams per call where the kernel allows

    def __post_init__(self) -> None:
        if self.datagram_bytes is not None and not 1200 <= self.datagram_bytes <= MAX_DATAGRAM:
            raise InvalidConfig(f"TransportConfig.datagram_bytes must be within 1200..{MAX_DATAGRAM}")
        if not 0 <= self.ttl <= 255:
            raise InvalidConfig("TransportConfig.ttl must be within 0..255")
        if self.rcvbuf_bytes <= 0 or self.sndbuf_bytes <= 0:
            raise InvalidConfig("TransportConfig buffer sizes must be positive")

    def datagram_size(self) -> int:
        if self.datagram_bytes is not None:
            return self.datagram_bytes
        return max(1200, min(MAX_DATAGRAM, interface_mtu(self.interface) - 28))


def interface_mtu(address: str | None) -> int:
    """MTU of the interface that holds `address` (1500 if it cannot be read)."""
    if address is None or address.startswith("127."):
        name = "lo"
    else:
        name = _interface_name(address)
    try:
        with open(f"/sys/class/net/{name}/mtu") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 1500


def _interface_name(address: str) -> str:
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == address for a in addrs):
                return name
    except Exception:  # psutil missing or unreadable: fall back to the default MTU
        pass
    return ""


def _set_buffer(sock: socket.socket, opt: int, force_opt: int, size: int, what: str,
                sysctl: str) -> int:
    if os.geteuid() == 0:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force_opt, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
    else:
        sock.setsockopt(socket.SOL_SOCKET, opt, size)
    got = sock.getsockopt(socket.SOL_SOCKET, opt)
    # Linux stores (and reports) twice the value asked for, to cover bookkeeping overhead
    if got < (2 * size if sys.platform.startswith("linux") else size):
        log.warning("%s: asked for %d bytes, kernel gave %d; raise %s (sysctl -w %s=%d) or run as "
                    "root", what, size, got, sysctl, sysctl, size)
    return got


def configure_buffers(sock: socket.socket, config: TransportConfig) -> tuple[int, int]:
    rcv = _set_buffer(sock, socket.SO_RCVBUF, SO_RCVBUFFORCE, config.rcvbuf_bytes, "SO_RCVBUF",
                      "net.core.rmem_max")
    snd = _set_buffer(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, config.sndbuf_bytes, "SO_SNDBUF",
                      "net.core.wmem_max")
    return rcv, snd


def member_interface(configured: str | None) -> str:
    """The address the members of this node use: the cluster's setting, else the node's IP."""
    if configured:
        return configured
    import ray

    return ray.util.get_node_ip_address()


def unicast_socket(config: TransportConfig, port: int = 0) -> socket.socket:
    """The member's own socket: receives unicast traffic and sends unicast and multicast."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((config.interface, port))
    configure_buffers(sock, config)
    iface = socket.inet_aton(config.interface)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, iface)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, config.ttl)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1 if config.loopback else 0)
    sock.setblocking(False)
    return sock


def multicast_socket(config: TransportConfig, group: str, port: int) -> socket.socket:
    """A socket that receives one IP multicast group on the configured interface only."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((group, port))  # binding to the group filters out other groups on this port
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_MULTICAST_ALL, 0)
    except OSError:
        pass
    configure_buffers(sock, config)
    mreq = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton(config.interface))
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    sock.setblocking(False)
    return sock
