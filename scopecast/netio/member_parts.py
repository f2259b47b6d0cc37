"""What the parts of a member's data plane share, and what each offers the others.

`MemberRuntime` (runtime.py) runs one I/O loop and composes parts that own their state: the send
path (`send_path`), the receive path (`receive_path`) with its reorder buffer (`reorder_buffer`)
and acknowledgements (`channel_acks`), delivery to the applications (`delivery`), the member's
own unstable messages (`own_stream`), joins (`joins`), the recovery path (`recovery_path`) and
repair serving (`repair_server`). They run on the I/O thread only. Each gets

- `MemberBasics`: who the member is and what it sends and counts with (never replaced);
- `MemberTables`: what the control plane installed (members, topics, routes, subscriptions),
  which the runtime replaces whole on each install and every part reads;
- the other parts it works with. Of the send, receive and recovery paths a part uses only what
  their interfaces below declare (`Sending`, `Receiving`, `Recovering`); `tests/test_layers.py`
  walks the source and fails on any other use, and on a `_private` attribute of another module.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from scopecast.netio.channel import Channel
from scopecast.netio.delivery import Subscription
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.topic_names import name_filter

MAX_NAMES = 4096   # names of members remembered, current and gone

if TYPE_CHECKING:
    from scopecast.netio.key_table import KeyTable
    from scopecast.netio.peer_cache import PeerCache
    from scopecast.netio.promotion import Promotion
    from scopecast.netio.stream_position import StreamPositions
    from scopecast.netio.tail_evidence import TailEvidence


@dataclass(slots=True, frozen=True)
class MemberInfo:
    """What a member needs to know of another member: its name and unicast address, and the
    topics (names and patterns) its credential lets it publish to (None: any)."""

    id: int
    name: str
    host: str
    port: int
    publish: tuple[str, ...] | None = None


@dataclass(slots=True, frozen=True)
class Route:
    """One forwarding-table entry: messages matching `label` go along `channel`."""

    label: RoutingLabel
    channel: Channel


@dataclass(slots=True, frozen=True)
class MemberBasics:
    """Who the member is and what it sends and counts with (the same objects for every part)."""

    member_id: int             # as made: the runtime gives its parts the id it is registered
                               # under later (`MemberRuntime.member_id`)
    name: str
    config: object             # RuntimeConfig
    sock: socket.socket        # the member's unicast socket: data to peers, control, repairs
    auth: object               # signs and checks datagrams (`auth`)
    datagram: int              # bytes of a datagram on the wire, MAC included
    stats: Counter
    drops: Counter
    unknown_sender: threading.Event  # set for the control thread: look members up
    address: tuple[str, int]   # the socket's

@dataclass(slots=True)
class MemberTables:
    """What the control plane installed; the runtime replaces a table whole (the parts look it
    up here each time, never keep one)."""

    members: dict[int, MemberInfo] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)  # member -> name, kept a while after it
                                   # left (its messages still come as repairs: they keep its name)
    topic_names: dict[int, str] = field(default_factory=dict)
    sessions: dict[int, int] = field(default_factory=dict)  # topic -> latest session announced
    routes: dict[int, Sequence[Route]] = field(default_factory=dict)
    subs: dict[int, tuple[Subscription, ...]] = field(default_factory=dict)  # topic -> takers
    subscriptions: list[Subscription] = field(default_factory=list)
    # member -> a test of the topic names it may publish to, for members with a credential
    # (scopes/credentials); empty in a cluster without credentials
    limits: dict[int, Callable[[str], bool]] = field(default_factory=dict)

    def set_members(self, members: list[MemberInfo]) -> bool:
        """The members this one knows now; whether any it knew left. Names of members gone are
        kept, the MAX_NAMES latest (their messages still come as repairs)."""
        left = bool(self.members.keys() - {m.id for m in members})
        self.members = current = {m.id: m for m in members}
        self.limits = {m.id: name_filter(m.publish) for m in members if m.publish is not None}
        names = self.names
        for m in members:
            names.pop(m.id, None)
            names[m.id] = m.name
        if len(names) > MAX_NAMES:  # forget the longest gone (never a current member)
            for gone in [k for k in names if k not in current][:len(names) - MAX_NAMES]:
                del names[gone]
        return left

    def subscribe(self, sub: Subscription) -> None:
        self.subscriptions.append(sub)
        self._index(sub, sub.topics)
        self.match_patterns(sub)

    def unsubscribe(self, sub: Subscription) -> set[int]:
        """Take `sub` out; the topics of it nobody here takes any more."""
        if sub in self.subscriptions:
            self.subscriptions.remove(sub)
        subs = self.subs
        for t in sub.topics:
            rest = tuple(s for s in subs.get(t, ()) if s is not sub)
            if rest:
                subs[t] = rest
            else:
                subs.pop(t, None)
        return sub.topics - subs.keys()

    def match_patterns(self, sub: Subscription) -> None:
        """A pattern subscription takes in the known topics it matches."""
        if sub.patterns:
            new = [t for t, n in self.topic_names.items()
                   if t not in sub.topics and any(p.match(n) for p in sub.patterns)]
            if new:
                sub.topics.update(new)
                self._index(sub, new)

    def _index(self, sub: Subscription, topics) -> None:
        grown: dict[tuple, tuple] = {}  # topics alike share one tuple of subscriptions
        subs = self.subs
        for t in topics:
            old = subs.get(t, ())
            new = grown.get(old)
            if new is None:
                new = grown[old] = old + (sub,)
            subs[t] = new


class Receiving(Protocol):
    """What the send and recovery paths use of the receive path."""

    next_seq: KeyTable          # (topic, source, session) -> next seq to deliver

    def drop(self, reason: str) -> None: ...
    def send_control(self, message, address: tuple[str, int]) -> None: ...


class Sending(Protocol):
    """What the receive and recovery paths use of the send path."""

    handed: int        # every own message with stream seq <= handed is on the wire
    taken_sseq: int    # the last own message taken off the publish queue

    def forward_run(self, topic: int, source: int, session: int, first: int, stream: int,
                    first_sseq: int, ctype: int, record: tuple, payloads: list,
                    stamp: int = 0) -> None: ...
    def on_ack(self, sender: int, channel: int, dseq: int, held: float,
               light: int = 0) -> None: ...


class Recovering(Protocol):
    """What the receive and send paths use of the recovery path."""

    reliable: Set[int]
    cacher: bool
    evidence: TailEvidence
    positions: StreamPositions
    peer_cache: PeerCache
    last_sseq: KeyTable
    max_seen: dict[int, int]
    gap_at: dict[tuple, list]
    hole_opened: bool
    progressed: bool
    loss_seen_at: float
    data_seen_at: float
    promotion: Promotion

    def note_filled(self, key: tuple, given_up: bool) -> None: ...
    def on_instructions(self, body: dict, key: str) -> None: ...


__all__ = ["MemberBasics", "MemberInfo", "MemberTables", "Receiving", "Recovering", "Route",
           "Sending"]
