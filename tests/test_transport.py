"""UDP transport settings (scopecast/netio/transport.py): datagram size from the interface MTU, socket
buffers (forced as root) and the warning that says which sysctl to raise when the kernel caps them."""

from __future__ import annotations

import logging
import os
import random
import socket

import pytest

from scopecast.netio import transport
from scopecast.netio.transport import (
    TransportConfig,
    configure_buffers,
    interface_mtu,
    multicast_socket,
    unicast_socket,
)

LOGGER = "scopecast.netio.transport"


def read_sysctl(name: str) -> int:
    with open(f"/proc/sys/{name.replace('.', '/')}") as f:
        return int(f.read())


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root: SO_RCVBUFFORCE/SO_SNDBUFFORCE "
                                "bypass net.core.rmem_max/wmem_max only with CAP_NET_ADMIN")


# -------------------------------------------------------------------------------- datagram size


@pytest.mark.parametrize("interface", ["127.0.0.1", None, "127.0.0.2"])
def test_loopback_datagram_size_is_capped_at_65000(interface):
    assert interface_mtu(interface) == int(open("/sys/class/net/lo/mtu").read())
    assert interface_mtu(interface) > 65_028  # loopback MTU is 64 KB on Linux
    assert TransportConfig(interface=interface).datagram_size() == 65_000


def test_explicit_datagram_size_wins():
    assert TransportConfig(interface="127.0.0.1", datagram_bytes=9000).datagram_size() == 9000


def test_datagram_size_from_a_real_interface_mtu():
    psutil = pytest.importorskip("psutil")
    for name, addrs in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addrs if a.family == socket.AF_INET]
        if name != "lo" and ipv4 and os.path.exists(f"/sys/class/net/{name}/mtu"):
            break
    else:
        pytest.skip("no non-loopback IPv4 interface")
    mtu = int(open(f"/sys/class/net/{name}/mtu").read())
    assert interface_mtu(ipv4[0]) == mtu
    assert TransportConfig(interface=ipv4[0]).datagram_size() == max(1200, min(65_000, mtu - 28))


def test_unknown_address_falls_back_to_ethernet_mtu():
    assert interface_mtu("203.0.113.77") == 1500
    assert TransportConfig(interface="203.0.113.77").datagram_size() == 1472


def test_datagram_size_floor(monkeypatch):
    monkeypatch.setattr(transport, "interface_mtu", lambda address: 576)
    assert TransportConfig(interface="198.51.100.1").datagram_size() == 1200


# ---------------------------------------------------------------------------------- socket buffers


@needs_root
def test_unicast_socket_buffers_at_least_requested_as_root():
    rmem_max = read_sysctl("net.core.rmem_max")
    wmem_max = read_sysctl("net.core.wmem_max")
    # above the sysctl caps: only the FORCE options can grant them
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=4 * rmem_max,
                             sndbuf_bytes=4 * wmem_max)
    sock = unicast_socket(config)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= config.rcvbuf_bytes
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= config.sndbuf_bytes
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
        assert sock.getblocking() is False
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == config.ttl
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP) == 1
    finally:
        sock.close()


@needs_root
def test_configure_buffers_reports_what_the_kernel_gave_as_root(caplog):
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=3 << 20, sndbuf_bytes=1 << 20)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, caplog.at_level(logging.WARNING,
                                                                                     LOGGER):
        rcv, snd = configure_buffers(sock, config)
        assert rcv == sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= 3 << 20
        assert snd == sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= 1 << 20
    assert not [r for r in caplog.records if r.name == LOGGER]


@needs_root
def test_multicast_socket_buffers_and_membership():
    rmem_max = read_sysctl("net.core.rmem_max")
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=2 * rmem_max)
    group = f"239.255.{random.randint(1, 254)}.{random.randint(1, 254)}"
    rx = multicast_socket(config, group, 0)
    tx = unicast_socket(config)
    try:
        assert rx.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= config.rcvbuf_bytes
        port = rx.getsockname()[1]
        tx.sendto(b"hello", (group, port))
        rx.settimeout(10.0)  # liveness bound only
        assert rx.recv(100) == b"hello"
    finally:
        rx.close()
        tx.close()


def _rcvbuf_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and "net.core.rmem_max" in r.getMessage()]


def test_capped_receive_buffer_warns_naming_rmem_max(monkeypatch, caplog):
    monkeypatch.setattr(transport.os, "geteuid", lambda: 1000)
    rmem_max = read_sysctl("net.core.rmem_max")
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=4 * rmem_max, sndbuf_bytes=64 << 10)
    with caplog.at_level(logging.WARNING, LOGGER):
        sock = unicast_socket(config)
        sock.close()
    messages = _rcvbuf_warnings(caplog)
    assert len(messages) == 1, caplog.text
    assert "SO_RCVBUF" in messages[0] and f"net.core.rmem_max={4 * rmem_max}" in messages[0]
    assert not any("wmem_max" in r.getMessage() for r in caplog.records)


def test_no_warning_when_the_request_fits(monkeypatch, caplog):
    monkeypatch.setattr(transport.os, "geteuid", lambda: 1000)
    rmem_max = read_sysctl("net.core.rmem_max")
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=rmem_max // 4, sndbuf_bytes=64 << 10)
    with caplog.at_level(logging.WARNING, LOGGER):
        unicast_socket(config).close()
    assert _rcvbuf_warnings(caplog) == []


def test_warns_for_a_request_just_above_rmem_max(monkeypatch, caplog):
    monkeypatch.setattr(transport.os, "geteuid", lambda: 1000)
    rmem_max = read_sysctl("net.core.rmem_max")
    request = rmem_max + rmem_max // 2
    config = TransportConfig(interface="127.0.0.1", rcvbuf_bytes=request, sndbuf_bytes=64 << 10)
    with caplog.at_level(logging.WARNING, LOGGER):
        sock = unicast_socket(config)
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        sock.close()
    assert got == 2 * rmem_max  # the kernel stored rmem_max (and reports it doubled)
    assert len(_rcvbuf_warnings(caplog)) == 1


@pytest.mark.parametrize("kwargs", [{"datagram_bytes": 100}, {"datagram_bytes": 70_000},
                                    {"ttl": 300}, {"rcvbuf_bytes": 0}])
def test_transport_config_out_of_range_is_a_typed_error(kwargs):
    import scopecast

    with pytest.raises(scopecast.InvalidConfig):
        TransportConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [{"window_bytes": 0}, {"max_message_bytes": 2**32},
                                    {"ack_period": 0}, {"held_bytes": -1}])
def test_runtime_config_out_of_range_is_a_typed_error(kwargs):
    import scopecast
    from scopecast.netio.runtime import RuntimeConfig

    with pytest.raises(scopecast.InvalidConfig):
        RuntimeConfig(**kwargs)


def test_a_cluster_datagram_size_out_of_range_is_refused_before_anything_starts():
    import scopecast

    with pytest.raises(scopecast.InvalidConfig, match="datagram_bytes"):
        scopecast.connect(datagram_bytes=100)
