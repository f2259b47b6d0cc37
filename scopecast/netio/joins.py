"""Joins (thesis 3.2.14), a part of the member runtime (see `member_parts`).

A sender notes, for each receiver its scope adds, where each of its topics stood: the receiver's
*join point*. A member that meets a sender's stream without its start asks the sender for it
(`WhereAsk`, answered with `JoinPoints`; the asks of a recovery period go out together, many
topics a datagram). With `history="from_join"` it starts there; with
"cached" it first replays everything not yet stable. It is *light* until it holds everything
from its start up to the join point, then *regular*."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from scopecast.netio.control_messages import MAX_JOINS, MAX_WHERE, JoinPoints, WhereAsk
from scopecast.netio.delivery import Delivery
from scopecast.netio.member_parts import MemberTables, Receiving
from scopecast.netio.own_stream import OwnStream

if TYPE_CHECKING:  # (it takes runs as joins say where streams start)
    from scopecast.netio.reorder_buffer import ReorderBuffer

JOIN_TRIES = 20  # asks for a join point before starting at the first cached


class Joins:
    """Join points given (as a sender) and asked for (as a receiver)."""

    def __init__(self, stats: Counter, tables: MemberTables, own: OwnStream) -> None:
        self._stats, self._tables, self._own = stats, tables, own
        self._look_up: Callable[[int], None]  # a member to talk to that this one does not know
        self._receiver: Receiving
        self._reorder: ReorderBuffer
        self._delivery: Delivery
        self._cached_history: frozenset[int] = frozenset()  # topics whose joiners replay first
        self._join_points: dict[int, dict] = {}  # receiver -> {(topic, session): first owed seq}
        self._starts: dict[tuple, int] = {}      # key -> join point, until caught up with it
        self._asks: dict[tuple, list] = {}       # key -> [asks sent, last sent]
        self._due: dict[tuple[int, int], list[int]] = {}  # (sender, session) -> topics to ask

    def connect(self, receiver: Receiving, reorder: ReorderBuffer, delivery: Delivery,
                look_up: Callable[[int], None]) -> None:
        self._receiver, self._reorder, self._delivery = receiver, reorder, delivery
        self._look_up = look_up

    def install(self, cached: set[int]) -> None:
        """The reliable topics whose joiners replay what is cached first."""
        self._cached_history = frozenset(cached)

    def asked(self, key: tuple) -> bool:
        return key in self._asks

    def note_receivers(self, receivers: set[int]) -> None:
        """Record where this member's streams stood when each receiver its scope lists now
        first appeared: its join points (topics not started yet begin at 1 for it). A receiver
        keeps its join point while it is a member (a view may leave it out for a moment)."""
        new = receivers - self._join_points.keys()
        if new:
            points = {k: (t[2] if t.__class__ is list else t) + 1
                      for k, t in self._own.tails.items()}
            for member in new:
                self._join_points[member] = points  # shared: never changed after
        members = self._tables.members
        for member in [m for m in self._join_points if m not in receivers and m not in members]:
            del self._join_points[member]

    def on_where(self, receiver: int, session: int, topics: tuple[int, ...]) -> None:
        """A receiver asks where its streams of `topics` start: for each, its join point and
        the first message this member still holds (what is cached). A receiver this member was
        not told of (it receives through a forwarding member) joined no later than that first
        message: stability waited for it since it entered its recovery domain."""
        member = self._tables.members.get(receiver)
        if member is None:  # answered when it asks again, once looked up
            self._stats["where_unanswered"] += 1
            self._look_up(receiver)
            return
        tails, points = self._own.tails, self._join_points.get(receiver)
        flat: list[int] = []
        for topic in topics:
            tail = tails.get((topic, session), 0)
            cached = tail[0] if tail.__class__ is list else tail + 1
            flat += (topic, points.get((topic, session), 1) if points is not None else cached,
                     cached)
        for i in range(0, len(flat), 3 * MAX_JOINS):
            self._receiver.send_control(JoinPoints(session, tuple(flat[i:i + 3 * MAX_JOINS])),
                                        (member.host, member.port))

    def on_join_points(self, sender: int, answer: JoinPoints) -> None:
        """The sender's answer: where this member joined its streams, and what it still holds."""
        if any([self._joined(sender, topic, answer.session, start, cached)
                for topic, start, cached in answer.triples()]):
            self._delivery.deliver()

    def _joined(self, sender: int, topic: int, session: int, start: int, cached: int) -> bool:
        """This member joined `sender`'s stream of `topic` at `start`; the sender still holds
        everything from `cached` on. True if the stream starts now."""
        key = (topic, sender, session)
        if self._asks.pop(key, None) is None or min(start, cached) < 1 or key in self._starts:
            return False  # not asked, or answered already
        self._starts[key] = start
        if key not in self._receiver.next_seq:
            # what became stable before it is held by nobody any more: from the cache on
            start = cached if topic in self._cached_history else max(start, cached)
            held = self._reorder.held.get(key)
            if held and held[0].first < start:  # it listened before its sender noticed it
                start = held[0].first
            self._receiver.next_seq[key] = start
            self._stats["joined_at"] = start
            if key in self._reorder.held:
                self._reorder.release(key)
            return True
        return False

    def asking(self, key: tuple, now: float, period: float) -> bool:
        """Ask `key`'s sender where this member joined its stream (again each period, a few
        times; `send_asks` sends the asks due). True while the key must wait for the answer: a
        stream this member has not started yet."""
        ask = self._asks.get(key)
        if ask is None:
            if key in self._starts:
                return False
            ask = self._asks[key] = [0, 0.0]
        if ask[0] >= JOIN_TRIES:
            return False
        if now - ask[1] >= min(period, 0.25):
            self._due.setdefault((key[1], key[2]), []).append(key[0])
            ask[0] += 1
            ask[1] = now
            if ask[0] == JOIN_TRIES:
                self._stats["join_point_unknown"] += 1
        return key not in self._receiver.next_seq

    def send_asks(self) -> None:
        """The asks due (`asking`), MAX_WHERE topics a datagram per sender and session."""
        due, self._due = self._due, {}
        for (source, session), topics in due.items():
            member = self._tables.members.get(source)
            if member is None:
                self._look_up(source)
                continue
            for i in range(0, len(topics), MAX_WHERE):
                self._receiver.send_control(WhereAsk(session, tuple(topics[i:i + MAX_WHERE])),
                                            (member.host, member.port))

    def pending(self, key: tuple) -> bool:
        ask = self._asks.get(key)
        return ask is not None and ask[0] < JOIN_TRIES

    def light(self) -> bool:
        """Still catching up with a stream it joined (thesis 3.2.14's light member)."""
        return any(self.pending(k) for k in self._asks) \
            or any(self._receiver.next_seq.get(k, 0) < start for k, start in self._starts.items())

    def caught_up(self) -> None:
        next_seq = self._receiver.next_seq
        for key in [k for k, a in self._asks.items() if a[0] >= JOIN_TRIES and k in next_seq]:
            del self._asks[key]  # never answered (its sender is gone): started without
        for key in [k for k, start in self._starts.items() if next_seq.get(k, 0) >= start]:
            del self._starts[key]
            self._stats["joins_caught_up"] += 1
