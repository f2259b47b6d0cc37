"""The data-plane settings of one member process (`RuntimeConfig`), and how its repair times are
reported."""

from __future__ import annotations

from dataclasses import dataclass, field

from scopecast.actors.errors import InvalidConfig
from scopecast.netio.transport import TransportConfig

MAX_MESSAGE, DEFAULT_MAX_MESSAGE = 0xFFFFFFFF, 16 << 20  # the wire's 32-bit lengths; the default


@dataclass(slots=True, frozen=True)
class RuntimeConfig:
    """Data-plane settings of one member process; the defaults work on one machine."""

    transport: TransportConfig = field(default_factory=TransportConfig)
    window_bytes: int = 4 << 20          # unacknowledged bytes in flight per destination, at most
    window_delay: float = 0.005          # ... fewer while acks come back later than this beyond
                                         # the least round trip (see delay_window)
    stable_window_bytes: int = 64 << 20  # own messages of reliable topics not yet stable
    block_when_full: bool = True         # publish() waits for stability; False: raise WindowFull
    queue_bytes: int = 8 << 20           # published but not yet sent; publish() blocks beyond
    max_backlog_bytes: int = 32 << 20    # delivered but not consumed; acks withheld beyond
    max_message_bytes: int = DEFAULT_MAX_MESSAGE  # a cluster setting (see controlled_element)
    reassembly_budget_bytes: int = 64 << 20
    reassembly_timeout: float = 10.0
    ack_period: float = 0.01           # receivers acknowledge this often (and at once when a
                                       # sender's window is half full: wire.FLAG_ACK_NOW)
    ack_timeout: float = 5.0             # a receiver silent this long stops holding the window
    gather_acks: bool = True             # receivers of this member's multicast channels
                                         # acknowledge up a tree (netio/ack_gathering); False:
                                         # each to this member directly
    unknown_sender_grace: float = 2.0    # how long datagrams of a not-yet-known member are held
    held_bytes: int = 8 << 20            # ... and how many bytes of them (not a count: on a
                                         # 1500-byte MTU a count holds a fraction of a second)
    reorder_bytes: int = 32 << 20        # runs that arrived ahead of a gap, held until it fills
    reorder_timeout: float = 0.2         # ... or until this long, then delivered with the gap
    join_timeout: float = 2.0            # reliable topics: how long a first run waits to learn
                                         # where the sender's unstable messages start
    mac: str = "gmac"                    # packet authenticator, see `auth` (set by the cluster)
    # Move every object alive when the member starts (Ray's and the application's start-up heap)
    # out of the cyclic garbage collector's reach (gc.freeze): otherwise each full collection walks
    # that whole heap, which here cost more than a third of a member's throughput. Turn it off if
    # the application drops cyclic garbage created before it joined.
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        for name in ("window_bytes", "stable_window_bytes", "queue_bytes", "max_backlog_bytes",
                     "max_message_bytes", "reassembly_budget_bytes", "held_bytes", "reorder_bytes"):
            if getattr(self, name) <= 0:
                raise InvalidConfig(f"RuntimeConfig.{name} must be positive")
        if self.max_message_bytes > MAX_MESSAGE:
            raise InvalidConfig(f"RuntimeConfig.max_message_bytes is at most {MAX_MESSAGE} (the "
                                "wire format's 32-bit lengths)")
        if min(self.ack_period, self.ack_timeout, self.reassembly_timeout, self.window_delay,
               self.reorder_timeout, self.join_timeout) <= 0:
            raise InvalidConfig("RuntimeConfig periods and timeouts must be positive")


def percentiles(values, digits: int = 1) -> dict:
    """p50/p99/p99.9/max (nearest rank) of times in ms, with their count."""
    v = sorted(values)
    if not v:
        return {"count": 0}
    n = len(v)
    return {"count": n, "p50": round(v[n // 2], digits),
            "p99": round(v[min(n - 1, n * 99 // 100)], digits),
            "p99.9": round(v[min(n - 1, n * 999 // 1000)], digits), "max": round(v[-1], digits)}
