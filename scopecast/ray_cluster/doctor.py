"""`scopecast doctor`: a preflight of this host for scopecast's data path. Each check says what it
found and, where it falls short, what to change: the interface and its MTU (the datagram size),
IP multicast on the interface, the ephemeral UDP ports, firewall rules that drop UDP, the socket
buffer limits, the kernel's batch calls (GSO/GRO), the compiled parts of the data path and Java
for Spark.

A check is `ok`, `warn` (works, but slower or with a caveat) or `fail` (scopecast cannot work as
configured). Multicast is tried on this host only: whether the LAN passes it between hosts is what
a LAN scope's own probe finds out (see docs/operations.md).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass

from scopecast.netio.transport import TransportConfig, interface_mtu
from scopecast.netio.udp_batch import detect

PROBE_GROUP = "239.255.77.77"
UDP_HEADERS = 28           # IPv4 and UDP headers: a datagram's payload is the MTU less these
PORTS_WARN_SHARE = 0.8     # of the ephemeral range in use by UDP sockets


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str            # "ok", "warn" or "fail"
    found: str
    fix: str = ""


def default_interface() -> str:
    """The address this host would send from toward other hosts (the default route's source; no
    datagram is sent), or loopback on a host without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _interface(address: str) -> Check:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
    except OSError as exc:
        return Check("interface", "fail", f"{address}: cannot bind a UDP socket ({exc.strerror})",
                     "pass an address of this host (--interface)")
    mtu = interface_mtu(address)
    size = min(65000, mtu - UDP_HEADERS)
    found = f"{address}, MTU {mtu}: datagrams of {size:,} bytes"
    if mtu < 1280:
        return Check("interface", "warn", found, "an MTU below 1,280 carries few messages a datagram")
    return Check("interface", "ok", found)


def _multicast(address: str) -> Check:
    """One datagram to a group on `address`, looped back to a socket that joined it there."""
    token = os.urandom(8)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.bind((PROBE_GROUP, 0))
        port = rx.getsockname()[1]
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton(PROBE_GROUP) + socket.inet_aton(address))
        rx.settimeout(0.2)
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(address))
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            tx.sendto(token, (PROBE_GROUP, port))
            try:
                if rx.recv(64) == token:
                    return Check("multicast", "ok", f"a datagram to {PROBE_GROUP} on {address} "
                                 "came back (whether the LAN passes it between hosts, each LAN "
                                 "scope probes)")
            except TimeoutError:
                continue
        found = f"nothing sent to {PROBE_GROUP} on {address} came back within 1 s"
    except OSError as exc:
        found = f"IP multicast on {address} refused: {exc.strerror}"
    finally:
        rx.close()
        tx.close()
    return Check("multicast", "warn", found,
                 "LAN scopes fall back to unicast channels (more copies per receiver); allow "
                 "multicast on the interface (a route for 224.0.0.0/4, IGMP on the switch) if you "
                 "can")


def _ports() -> Check:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = map(int, f.read().split())
        with open("/proc/net/udp") as f:
            used = sum(1 for _ in f) - 1
    except (OSError, ValueError):
        return Check("ports", "warn", "cannot read the ephemeral port range or the UDP sockets")
    share = used / max(1, hi - lo + 1)
    found = f"ephemeral range {lo}-{hi}, UDP sockets open: {used:,} ({share:.0%})"
    if share >= PORTS_WARN_SHARE:
        return Check("ports", "warn", found, "widen net.ipv4.ip_local_port_range")
    return Check("ports", "ok", found + "; allow UDP to this range and to the cluster's group "
                 "port and the one beside it between nodes")


def _firewall() -> Check:
    iptables = shutil.which("iptables")
    if iptables is None:
        return Check("firewall", "ok", "no iptables here to inspect")
    try:
        out = subprocess.run([iptables, "-S"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("firewall", "warn", f"iptables -S failed: {exc}")
    if out.returncode != 0:
        return Check("firewall", "warn", "cannot read the firewall rules (iptables -S needs root)")
    drops = [line for line in out.stdout.splitlines()
             if line.startswith("-A ") and ("-j DROP" in line or "-j REJECT" in line)
             and ("-p udp" in line or " -p " not in line)]
    policies = [line for line in out.stdout.splitlines()
                if line.startswith(("-P INPUT DROP", "-P OUTPUT DROP"))]
    if drops or policies:
        return Check("firewall", "warn", f"{len(drops) + len(policies)} rules may drop UDP: "
                     + "; ".join(policies + drops[:5]) + (" ..." if len(drops) > 5 else ""),
                     "make sure they spare the ports above between the cluster's nodes (lost "
                     "datagrams show as NAKs and repairs in `scopecast status`)")
    return Check("firewall", "ok", "no iptables rule drops UDP")


def _buffers() -> Check:
    want = TransportConfig()
    try:
        limits = {}
        for key in ("rmem_max", "wmem_max"):
            with open(f"/proc/sys/net/core/{key}") as f:
                limits[key] = int(f.read())
    except (OSError, ValueError):
        return Check("buffers", "warn", "cannot read net.core.rmem_max / wmem_max")
    found = (f"rmem_max {limits['rmem_max']:,}, wmem_max {limits['wmem_max']:,} (members ask for "
             f"{want.rcvbuf_bytes:,} / {want.sndbuf_bytes:,})")
    short = [f"sysctl -w net.core.{key}={size}" for key, size
             in (("rmem_max", want.rcvbuf_bytes), ("wmem_max", want.sndbuf_bytes))
             if limits[key] < size]
    if short and os.geteuid() != 0:
        return Check("buffers", "warn", found, "small buffers drop bursts: " + "; ".join(short))
    return Check("buffers", "ok", found + ("" if not short else "; root overrides the limits"))


def _batches(address: str) -> Check:
    offloads = detect(address)
    found = f"GSO {'on' if offloads.gso else 'off'}, GRO {'on' if offloads.gro else 'off'}"
    if offloads.gso and offloads.gro:
        return Check("batch calls", "ok", found + ": many datagrams per system call")
    return Check("batch calls", "warn", found, "a kernel from Linux 5.0 on sends and takes "
                 "MTU-sized datagrams many per call; without, each costs a system call")


def _compiled() -> Check:
    from scopecast.netio import native

    if native.FORCED:
        return Check("compiled parts", "warn", f"pure Python ({native.FORCE_PURE} is set)",
                     f"unset {native.FORCE_PURE} unless you are ruling out the C extensions")
    if native.missing:
        return Check("compiled parts", "warn", "missing: " + "; ".join(native.missing),
                     "install gcc, the Python headers (python3-dev) and libssl-dev, then "
                     "reinstall scopecast: without them the data path runs slower")
    return Check("compiled parts", "ok", "the C tables and datagram batches are built")


def _java() -> Check:
    from scopecast.actors.errors import SparkUnavailable
    from scopecast.ray_cluster.spark import check_java

    try:
        version = check_java()
    except SparkUnavailable as exc:
        return Check("java", "warn", str(exc), "only the DataFrame API and the demo need it")
    return Check("java", "ok", f"Java {version} for Spark")


def run(interface: str | None = None) -> list[Check]:
    address = interface or default_interface()
    first = _interface(address)
    if first.status == "fail":
        return [first]
    return [first, _multicast(address), _ports(), _firewall(), _buffers(), _batches(address),
            _compiled(), _java()]


def as_dicts(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():<5} {c.name:<{width}}  {c.found}")
        if c.fix and c.status != "ok":
            lines.append(f"{'':<5} {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)

