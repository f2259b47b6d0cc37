"""The recovery-protocol interface (thesis 3.2.11-3.2.12), shared registry and `API_VERSION` with
forwarding policies.

A recovery protocol is pure logic hosted by a recovery agent (`agents.agent`), one agent per
(sub-domain, peer group). The agent is its environment: it owns the UDP socket and the clock and
tells the protocol what happened; the protocol answers with what to send.

- **View**: the peer group (agents in ring order, this agent's place), whether an agent above
  exists (the peer group's aggregate goes up through the leader), and how many members of the
  domain are not in the group yet (their agents are being placed): a protocol must not count a
  message as held by the group while any are missing. Peers with identical subscription sets
  share a *region* (QSM): they receive the same streams, so they can repair each other; the ring
  order keeps each region's peers together, and a protocol may partition along regions.
- **Bottom interface**: the member (or, for a higher domain, the co-located leader agent of the peer
  group below) pushes a `Summary` each token period; the reply is an `Instructions`.
- **Peer messages**: tokens, requests; opaque msgpack-able values between agents of one group.
- **Upper interface**: the leader's `upward()` summary of the whole group, and the `down` state the
  agent above answers with (stability decided at the top, senders' records).

Summary (all keys optional)::

    {"acks": {stream: max_contiguous}, "seen": {stream: highest delivered}, "naks": [[stream,
     topic, session, lo, hi, lo_sseq, hi_sseq, member_id, host, port]], "recs": {stream: record},
     "light": true}

`light` (thesis 3.2.14): the bottom is a member that joined and has not caught up yet (or, from a
group's leader, a group whose members all are). Stability should leave its acks out: it is
promoted, and says so by leaving `light` out, once it has caught up (`netio.promotion`). An agent
made for a member joining a running domain gets ``{"light": true}`` as its first summary, so that a
member stopped before it ever reported holds nobody back.

A *stream* is a sender's sequence space (the wire format's stream id, here the sending member's id);
`max_contiguous` is the stream position up to which the bottom holds everything it is owed. A
*record* is what a sender says of its unstable messages: ``[max_sseq, named, heartbeat, horizon,
key_count, key_digest]``, `named` being (topic, session, first_seq, first_sseq, last_seq, last_sseq)
per topic, packed as `netio.recovery_records.RECORD_ENTRY`s (or a list of such lists); the heartbeat
moves with every summary, the runs name at most a few hundred topics (the oldest unstable; every
unstable message up to `horizon` is of one of them), and the keys digest every (topic, session) the
sender sent on (`netio.stream_position`: a receiver that took them all is owed every stream seq). A
protocol passes records on as they are. A NAK's `hi` of 2**32-1 asks for everything of the topic in
the sseq range (a survivor catching up with another after the sender is gone); topic 0 asks for
every message in the sseq range, whatever its topic (a dense stream's hole).

Instructions::

    {"down": {stream: [stable_sseq, record]}, "hi": {stream: highest any member delivered},
     "push": [nak, ...], "period": seconds, "cacher": bool}

`push` asks the bottom to repair the named ranges from its cache to the requester.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scopecast.policies.api import API_VERSION

__all__ = ["API_VERSION", "DomainContext", "PeerView", "RecoveryProtocol"]


@dataclass(slots=True, frozen=True)
class DomainContext:
    """What a recovery protocol may inspect: its domain and options."""

    domain: str                 # "<scope path>|<sub-domain name>" this agent stands for
    level: int                  # 1 for a member domain, higher up the hierarchy
    options: dict = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class PeerView:
    """One version of a peer group as its owning scope laid it out (an agent gets a version
    once: the same version always means the same view, so messages of other peers that carry it
    belong to this view)."""

    version: int
    peers: tuple[str, ...]      # sub-domain names, in the order the protocol should use
    index: int                  # this agent's place in `peers`
    has_upper: bool             # an agent above takes this group's aggregate (else: the top)
    missing: int = 0            # members of the domain whose agents are not reachable yet: until
                                # they are, nothing counts as held by the whole group
    regions: tuple[int, ...] = ()  # per peer, its region (contiguous in `peers`); () = one region


class RecoveryProtocol:
    """Base class of recovery protocols; the defaults acknowledge nothing and repair nothing."""

    api_version = API_VERSION
    name = "base"

    def __init__(self, context: DomainContext) -> None:
        self.context = context

    def on_view(self, view: PeerView) -> None:
        """A new view of the peer group."""

    def on_summary(self, summary: dict, now: float) -> dict:
        """The bottom's summary; returns its instructions."""
        return {}

    def on_peer(self, sender: int, body, now: float) -> list[tuple[int, object]]:
        """A message from peer `sender` (index in the view); returns (peer index, body) to send."""
        return []

    def on_tick(self, now: float) -> list[tuple[int, object]]:
        """Called every few milliseconds; returns (peer index, body) to send."""
        return []

    def upward(self) -> dict | None:
        """The summary of the whole peer group for the agent above (the leader only; None if
        there is nothing new)."""
        return None

    def on_down(self, instructions: dict) -> None:
        """The agent above answered `upward()` (its instructions for this group)."""

    def describe(self) -> dict:
        """What the agent's status shows of this instance's state (small, JSON-able): enough to
        tell a group whose rounds go on from one that is stuck."""
        return {}
