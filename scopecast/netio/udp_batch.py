"""Many datagrams per system call: UDP generic segmentation (GSO) to send, and generic receive
offload (GRO) to receive (Linux 4.18 and 5.0 on).

A sender hands the kernel one buffer of several datagrams cut at one segment size with a
`UDP_SEGMENT` control message; the kernel sends them as separate datagrams (each with its own
header and MAC, all of the segment size but the last, so shorter ones are padded: see `wire`). A
receiver that set `UDP_GRO` gets consecutive segments of one sender back in one `recvmsg`, with the
segment size in a control message. On a LAN of 1,500-byte frames that is a system call per 40-odd
datagrams instead of one each, where a datagram costs the kernel less than the call.

What the kernel and the interface allow is found out at start-up (`detect`: a real batch through a
socket on the member's interface); a send the interface still refuses turns GSO off for the
process, and the batch goes again one datagram at a time.
"""

from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass
from functools import lru_cache

from scopecast.netio.native import IMPLEMENTATION

log = logging.getLogger(__name__)

SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO = getattr(socket, "UDP_GRO", 104)
MAX_SEGMENTS = 64        # the kernel's UDP_MAX_SEGMENTS (64 before Linux 6.2, 128 from it)
MAX_BATCH = 65_000       # bytes of one batch: a UDP payload's limit, with room for headers
MIN_SEGMENTS = 2         # a datagram size that fits fewer than this in a batch is sent singly
GRO_SPACE = socket.CMSG_SPACE(4)
SEGMENT = struct.Struct("=H")
GRO_SIZE = struct.Struct("=i")


@dataclass(slots=True, frozen=True)
class Offloads:
    """Which batch calls a member uses."""

    gso: bool
    gro: bool


def offload_status(on: Offloads, datagram: int, stats, gso_error: str = "") -> dict:
    """A member's status of its batch calls: which are on, datagrams per call so far, which
    `native` parts run, GSO sends that failed (and the last one's error)."""
    sends, receives = stats["send_calls"], stats["recv_calls"]
    return {"gso": on.gso, "gro": on.gro, "native": IMPLEMENTATION, "datagram_bytes": datagram,
            "gso_failed": stats["gso_errors"] + stats["gso_refused"], "gso_error": gso_error or None,
            "datagrams_per_send": round(stats["datagrams_out"] / sends, 2) if sends else None,
            "datagrams_per_receive": round(stats["datagrams_in"] / receives, 2)
            if receives else None,
            # plain-run batches built, and received datagrams read, in C (_datagram_batch.c)
            "datagrams_sealed": stats["datagrams_sealed"],
            "datagrams_scanned": stats["datagrams_scanned"]}


@lru_cache(maxsize=16)
def detect(interface: str) -> Offloads:
    """What works on `interface` here: two datagrams sent as one GSO batch from one socket on it
    to another, which has GRO on; each capability whose socket option or send is refused is off."""
    gso = gro = False
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx.bind((interface, 0))
        rx.bind((interface, 0))
        rx.settimeout(1.0)
        gro = enable_gro(rx)
        try:
            tx.sendmsg([bytes(200)], [(SOL_UDP, UDP_SEGMENT, SEGMENT.pack(100))], 0,
                       rx.getsockname())
            got = 0
            while got < 200:
                data = rx.recv(1000)
                got += len(data)
            gso = True
        except OSError as exc:
            log.info("UDP GSO is not available on %s (%s): one datagram per send", interface, exc)
    except OSError as exc:
        log.info("batch calls not checked on %s (%s): one datagram per call", interface, exc)
        gro = False
    finally:
        tx.close()
        rx.close()
    return Offloads(gso, gro)


def enable_gro(sock: socket.socket) -> bool:
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return True
    except OSError:
        return False


def segment_size(data: bytes, ancillary: list) -> int:
    """The size of the datagrams in what one `recvmsg` returned on a GRO socket, each that
    size but the last (0: it was one datagram)."""
    for level, kind, value in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= GRO_SIZE.size:
            size = GRO_SIZE.unpack_from(value)[0]
            if 0 < size < len(data):
                return size
    return 0


def batch_limit(segment: int) -> int:
    """How many datagrams of `segment` bytes one batch holds."""
    return max(1, min(MAX_SEGMENTS, MAX_BATCH // segment))


def send_batch(sock: socket.socket, parts: list, segment: int, address) -> None:
    """Send the datagrams in `parts` (byte strings, each datagram `segment` bytes but the last)
    to `address` with one call; raises what sendmsg raises."""
    sock.sendmsg(parts, [(SOL_UDP, UDP_SEGMENT, SEGMENT.pack(segment))], 0, address)
