"""The receive path of the member runtime: drain sockets, authenticate, take runs in order per
stream, forward them, reassemble fragments, and hand control messages to the part they are for.

A part of `MemberRuntime` (see `member_parts`; it runs on the I/O thread only). What it takes
goes to `Delivery`; runs ahead of a gap to the `ReorderBuffer`; each channel's datagram numbers
to `ChannelAcks`."""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from itertools import repeat

from scopecast.netio import control_messages, wire
from scopecast.netio.channel_acks import ChannelAcks
from scopecast.netio.control_messages import Ack, GroupAck, InstructionsEnvelope, JoinPoints, NakAsk, WhereAsk
from scopecast.netio.delivery import Delivery
from scopecast.netio.feed import END, MESSAGE_COST
from scopecast.netio.joins import Joins
from scopecast.netio.key_table import KeyTable
from scopecast.netio.member_parts import MemberBasics, MemberTables, Recovering, Sending
from scopecast.netio.message import Message
from scopecast.netio.native import NameTable, SeqTable, take_mixed
from scopecast.netio.reassembly import Reassembler, ReassemblyError
from scopecast.netio.reorder_buffer import ReorderBuffer
from scopecast.netio.repair_server import REPAIR_RECORD, CachedRun, MemberRepairs
from scopecast.netio.replay_guard import ControlNumbers, ReplayGuard
from scopecast.netio.udp_batch import GRO_SPACE, segment_size
from scopecast.netio.wire import WireRun

log = logging.getLogger("scopecast.netio.runtime")
HEADER, MIXED = wire.HEADER, wire.MIXED
STAMP, STAMP_AT = wire.STAMP, wire.STAMP_AT
DRAIN_BUDGET = 512  # receive calls per socket per pass: control calls and timers run between passes
AWAITING_BUDGET = 8  # on a group's socket while a hole waits: its repair comes on the own socket


class ReceivePath:
    """Draining sockets, taking runs in order, forwarding them, reassembly, datagrams of members
    not known yet, control messages to their parts (see module docstring)."""

    def __init__(self, basics: MemberBasics, tables: MemberTables, gro: bool) -> None:
        config = basics.config
        self.member_id, self.name, self.config = basics.member_id, basics.name, config
        self.stats, self.drops = basics.stats, basics.drops
        self.unknown_sender = basics.unknown_sender
        self._sock, self._auth = basics.sock, basics.auth
        self._trailer = basics.auth.trailer_size
        self.tables = tables
        self.delivery: Delivery
        self._acks: ChannelAcks
        self._joins: Joins
        self._reorder: ReorderBuffer
        self._repairs: MemberRepairs
        self.sender: Sending
        self.recovery: Recovering
        self._gro = gro
        self._recv_size = 65_536
        self._numbers = ControlNumbers()  # this member's control datagrams (replay_guard)
        self._replays = ReplayGuard()
        self._reassembler = Reassembler(config.max_message_bytes, config.reassembly_budget_bytes,
                                        config.reassembly_timeout)
        self._stream_paths: dict[tuple, tuple] = {}  # stream -> its runs' record (see _accept)
        self._plain: dict[int, tuple] | None = None  # see _plain_topics
        self.next_seq = KeyTable()  # (topic, source, session) -> next seq to deliver
        self._held: deque[tuple[float, int, bytes]] = deque()  # datagrams of members not known
        self._held_bytes = 0
        # the stamp of the data datagram being taken (see wire.stamp_now): what runs forwarded
        # from it carry on, and what one receive call's delivery is timed by
        self.stamp_in = 0
        self.latency_ms: deque[float] = deque(maxlen=4096)  # stamp -> delivered, latest calls

    def connect(self, delivery: Delivery, acks: ChannelAcks, joins: Joins, reorder: ReorderBuffer,
                repairs: MemberRepairs, sender: Sending, recovery: Recovering) -> None:
        self.delivery, self._acks, self._joins, self._reorder = delivery, acks, joins, reorder
        self._repairs, self.sender, self.recovery = repairs, sender, recovery

    def tables_changed(self) -> None:
        self._plain = None  # made again on first use (see _plain_topics)

    def members_changed(self) -> None:
        """Take what was held for members not known before."""
        self._release_held()

    def held_senders(self) -> set[int]:
        """Senders of datagrams held because no view named them yet."""
        return {sender for _t, sender, _data in self._held}

    def housekeeping(self, now: float) -> None:
        self._replays.expire(now)
        expired = self._reassembler.expire()
        if expired:
            self.drops["reassembly_timeout"] += expired
        if self._held and now - self._held[0][0] > self.config.unknown_sender_grace:
            self._release_held()
        if self._reorder.held:
            self._reorder.expire(now)

    def drain(self, sock: socket.socket) -> None:
        # recvfrom (a fresh bytes object) rather than recv_into a shared buffer: payloads are then
        # cheap slices of it, and a held datagram needs no copy; with GRO, recvmsg (a batch of
        # datagrams of one sender, and their size: see udp_batch)
        recv = sock.recvmsg if self._gro else sock.recvfrom
        size = self._recv_size
        space = GRO_SPACE if self._gro else 0
        stats, delivery, recovery = self.stats, self.delivery, self.recovery
        opened = recovery.hole_opened
        budget = AWAITING_BUDGET if recovery.gap_at and sock is not self._sock else DRAIN_BUDGET
        for _ in range(budget):
            self.stamp_in = 0
            try:
                data, *ancillary = recv(size, space) if space else recv(size)
            except BlockingIOError:
                self._acks.drained()
                return
            except OSError as exc:
                self.drops["socket_error"] += 1
                log.debug("recv failed: %s", exc)
                return
            stats["recv_calls"] += 1
            if space and ancillary[0] and (segment := segment_size(data, ancillary[0])):
                stats["datagrams_in"] += -(-len(data) // segment)
                self._take_segments(data, segment)
            else:
                stats["datagrams_in"] += 1
                self._on_datagram(data)
            if delivery.touched:  # what the call brought, to the applications as one batch each
                delivery.deliver()
                if self.stamp_in:
                    self._time_delivery()
            if recovery.hole_opened and not opened:
                # NAKed now, not once the rest of the backlog is taken: a full budget of large
                # datagrams takes tens of ms, and that wait was most of the slowest repairs
                return

    def _time_delivery(self) -> None:
        """Delivery latency of one receive call: its (last) data datagram's stamp -> delivered."""
        ms = wire.stamp_age_ms(self.stamp_in, wire.stamp_now())
        if ms is None:
            self.stats["latency_unclocked"] += 1  # the sender's clock disagrees with ours
        else:
            self.latency_ms.append(ms)
            self.stats["latency_timed"] += 1  # (how many of latency_ms are new: metrics)

    def _take_segments(self, data: bytes, size: int) -> None:
        """The datagrams of one GRO receive call (segments of `size` bytes, the last may be
        shorter): consecutive plain runs of one stream as one run, read in C; the rest singly."""
        scanner = self._auth.batch_scanner  # (of the key it seals with: auth.KeyRing)
        scan = scanner.scan if scanner is not None else None
        pos, end = 0, len(data)
        stamp_of = STAMP.unpack_from
        while pos < end:
            got = scan(data, size, pos) if scan is not None else None
            if got is not None and self._take_scanned(got, stamp_of(data, pos + STAMP_AT)[0]):
                pos = got[0]
                continue
            stop = got[0] if got is not None else pos + size
            while pos < stop:  # (what the fast path leaves: the slow path counts or handles)
                self._on_datagram(data[pos:pos + size])
                pos += size

    def _take_scanned(self, got: tuple, stamp: int) -> bool:
        """Take consecutive plain runs of one stream, or the fragments of one message, from
        authentic datagrams, as `_on_data` takes one run (see _datagram_batch.c); False if they
        need the slow path (a sender or source not known yet, this member's own, a routing
        table that does not decode, a message over the largest)."""
        (_, segments, sender, channel, first_dseq, last_dseq, flags, table, topic, source,
         session, first, stream, first_sseq, ctype, lengths, payloads) = got
        if sender == self.member_id or sender not in self.tables.members \
                or (source not in self.tables.names and source != self.member_id):
            return False
        # one message of several segments: a message's fragments, reassembled in C
        whole = segments > len(lengths)
        if whole and lengths[0] > self.config.max_message_bytes:
            return False  # (the slow path counts the drop)
        try:
            routes = wire.decode_table(table)
        except wire.DecodeError:
            return False
        if not routes:
            return False
        # (one call a batch: _on_data's inline in-order check saves a call per run, not here)
        self.stamp_in = stamp
        self.take_run(payloads, routes, topic, source, session, first, stream, first_sseq, ctype,
                      0, lengths, 0)
        self._acks.note(sender, channel, first_dseq, last_dseq, 1, flags)
        self.stats["datagrams_scanned"] += segments
        if whole:
            self.stats["reassembled"] += 1
        return True

    def _on_datagram(self, data: bytes) -> None:
        n = len(data) - self._trailer
        if n < HEADER.size:
            self.drop("truncated")
            return
        data = self._auth.open(data, n)
        if data is None:
            self.drop("bad_mac")
            return
        try:
            header = wire.unpack_header(data)
            if header.pad:  # (a segment of a batch sent at once: see udp_batch)
                n = len(wire.unpadded(memoryview(data)[:n], header))
        except wire.DecodeError as exc:
            self.drop(exc.reason)
            return
        sender = header.sender
        if header.ptype not in wire.DATA_TYPES:  # (data: a replay is a duplicate)
            refused = self._replays.admit(sender, header.dseq, header.stamp, wire.stamp_now(),
                                          time.monotonic())
            if refused is not None:
                self.drop(refused)
                return
        if header.ptype == wire.PacketType.TOKEN:  # from this member's recovery agent
            self._dispatch(header, data, n)
            return
        if sender == self.member_id:
            self.stats["own_datagrams"] += 1
            return
        if sender not in self.tables.members:
            self._hold(sender, data)
            return
        self._dispatch(header, data, n)

    def _dispatch(self, header: wire.Header, data: bytes, n: int) -> None:
        """Handle an authenticated datagram of a known sender; `n` is its length without MAC."""
        body = memoryview(data)[:n]
        try:
            if header.ptype in wire.DATA_TYPES:
                self._on_data(header, body, data)
            else:
                self._on_control(header, body)
        except wire.DecodeError as exc:
            self.drop(exc.reason)

    def drop(self, reason: str) -> None:
        self.drops[reason] += 1
        if self.drops[reason] in (1, 10, 100, 1000) or self.drops[reason] % 10000 == 0:
            log.warning("dropped datagram: %s (%d so far)", reason, self.drops[reason])

    def _hold(self, sender: int, data: bytes) -> None:
        """Keep a datagram of a member the control plane has not told us about yet (bounded)."""
        if self._held_bytes + len(data) > self.config.held_bytes:
            self.drop("unknown_sender")
            return
        self._held.append((time.monotonic(), sender, data))
        self._held_bytes += len(data)
        self.unknown_sender.set()

    def _release_held(self) -> None:
        held, self._held = self._held, deque()
        self._held_bytes = 0
        now = time.monotonic()
        for t, sender, data in held:
            if sender in self.tables.members:
                header = wire.unpack_header(data)
                self._dispatch(header, data, len(data) - self._trailer - header.pad)
                self.delivery.deliver()
            elif now - t < self.config.unknown_sender_grace:
                self._held.append((t, sender, data))
                self._held_bytes += len(data)
            else:
                self.drop("unknown_sender")

    def _on_data(self, header: wire.Header, body: memoryview, data: bytes) -> None:
        """Take a data datagram's runs into the inboxes (the caller delivers them: once per
        receive call, not per datagram of a batch)."""
        routes, off = wire.decode_routes(body, HEADER.size)
        self.stamp_in = header.stamp  # (0 on a repair: the runs it brings are timed by repair_ms)
        if header.flags & wire.FLAG_FRAGMENT:
            source = self._on_fragment(header, body, routes, off)
        else:
            # runs are validated as they are read: the runs before a malformed one in an
            # authenticated datagram are kept
            names, me = self.tables.names, self.member_id
            by_source, sessions = self.next_seq.by_source, self.tables.sessions
            reorder = self._reorder
            in_order = not reorder.held  # else every run goes by take_run (held runs)
            for run in wire.iter_runs(body, off, header.count, len(routes)):
                topic, source, session, first, stream, sseq, ctype, ridx, lengths, at = run
                if source not in names and source != me:
                    # a source never known yet (forwarded from another scope): held until
                    # it is, so that its messages name it from the first (runs taken already
                    # come again as duplicates, and are dropped as such)
                    self._hold(source, data)
                    if header.ptype != wire.PacketType.REPAIR:
                        # (held, not lost: no gap after it)
                        self._acks.note(header.sender, header.channel, header.dseq, header.dseq,
                                        header.count, header.flags)
                    return
                if topic == MIXED:
                    self._take_mixed(data, routes, run)
                    in_order = not reorder.held
                    continue
                topics = by_source.get((source, session))
                if in_order and topics is not None and topics.get(topic) == first \
                        and session <= sessions.get(topic, session):
                    # the common case, checked here rather than in a call per run: next in
                    # order, of an announced session
                    topics[topic] = first + len(lengths)
                    self._accept(data, routes, (topic, source, session), first, stream, sseq,
                                 ctype, ridx, lengths, at)
                else:
                    self.take_run(data, routes, *run)
        if header.flags & wire.FLAG_MORE and header.count:  # a repair its budget cut short
            self.recovery.evidence.cut_short(source)
        if header.ptype == wire.PacketType.REPAIR:
            self.stats["repair_datagrams_in"] += 1
        else:
            self._acks.note(header.sender, header.channel, header.dseq, header.dseq, header.count,
                            header.flags)

    def take_run(self, data: bytes, routes: list, topic: int, source: int, session: int,
                 first: int, stream: int, first_sseq: int, ctype: int, ridx: int,
                 lengths: tuple, off: int) -> None:
        """Deliver and forward one run: FIFO per (topic, source, session), duplicates dropped;
        order is checked once per run, not per message."""
        announced = self.tables.sessions.get(topic)
        if announced is not None and session > announced:
            self.stats["unannounced_session"] += len(lengths)
            return
        key = (topic, source, session)
        expected = self.next_seq.get(key)
        if first != expected:  # not the next in order (or the first seen of its key)
            # a run ahead of its predecessors (or the first seen of a source, not starting at 1)
            # waits a little for them: replicated channels and re-layouts reorder
            if first > (1 if expected is None else expected):
                run = WireRun(topic, source, session, first, stream, first_sseq, ctype, ridx,
                              lengths, off)
                if self._reorder.hold(key, data, routes, run):
                    return
                expected = self.next_seq.get(key)  # the held runs went ahead of this one
            if expected is not None and first != expected:
                if first < expected:
                    skip = min(expected - first, len(lengths))
                    self.stats["duplicates"] += skip
                    if skip == len(lengths):
                        return
                    off += sum(lengths[:skip])
                    lengths = lengths[skip:]
                    first += skip
                    first_sseq += skip
                else:
                    self.stats["gaps"] += 1
        self.next_seq[key] = first + len(lengths)
        self._accept(data, routes, key, first, stream, first_sseq, ctype, ridx, lengths, off)
        reorder = self._reorder
        if reorder.held and key in reorder.held and not reorder.releasing:
            reorder.release(key)

    def _forbidden(self, topic: int, source: int) -> bool:
        """A run published by a member whose credential does not let it publish to the topic
        (scopes/credentials): dropped, counted, neither delivered nor forwarded."""
        allowed = self.tables.limits.get(source)
        if allowed is None or allowed(self.tables.topic_names.get(topic, "")):
            return False
        self.drop("forbidden")
        return True

    def _plain_topics(self) -> dict[int, tuple]:
        """topic -> (subscriptions, reliable, latest announced session, names) of the topics this
        member takes and does not forward, rebuilt on table installs: what `_take_mixed` needs of
        a message in one lookup. Topics alike share the value (`names`, a NameTable of them, is
        all the memory per topic): a run's messages are alike when each has a name there."""
        plain: dict[int, tuple] = {}
        names: dict[tuple, dict[int, str]] = {}
        sessions, forwards = self.tables.sessions, self.tables.routes
        reliable = self.recovery.reliable
        topic_names = self.tables.topic_names
        for topic, subs in self.tables.subs.items():
            if topic not in forwards:
                info = (subs, topic in reliable, sessions.get(topic, 1 << 62))
                plain[topic] = info
                group = names.setdefault(info, {})
                if (name := topic_names.get(topic)) is not None:
                    group[topic] = name
        same = {info: (*info, NameTable(group)) for info, group in names.items()}
        self._plain = plain = {topic: same[info] for topic, info in plain.items()}
        return plain

    def _take_mixed(self, data: bytes, routes: list, run: tuple) -> None:
        """A mixed run (see `wire`): each message the next of its own topic. Those next in order
        on topics this member takes and does not forward are delivered here in one pass (what
        `_accept` does, per message); any other goes by `take_run` as a run of its own."""
        plain = self._plain
        if plain is None:
            plain = self._plain_topics()
        if self.tables.limits and run[1] in self.tables.limits:
            plain = {}  # a source with a credential: each message by take_run, checked there
        if self._take_mixed_at_once(data, routes, run, plain):
            return
        _, source, session, _, stream, sseq, ctype, ridx, count, off = run
        # this run's source session, by topic (none yet: `take_run` makes it for what it
        # accepts; a run of a session never announced leaves no table behind)
        next_seq = self.next_seq.by_source.get((source, session), {})
        last_sseq = None
        topic_names = self.tables.topic_names
        route = routes[ridx]
        source_name = self.tables.names.get(source) or str(source)
        self.stats["mixed_runs"] += 1
        in_order = not self._reorder.held and ctype != END
        cacher, peer_cache = self.recovery.cacher, self.recovery.peer_cache
        top = low = 0  # the stretch of stream seqs taken in this pass, from `low` to `top`
        group: tuple = ()  # the subscribers of the messages in `batch`
        batch: list = []
        nbytes = 0
        for topic, seq, n in wire.mixed_entries(data, off, count):
            p = plain.get(topic)
            if p is not None and in_order and next_seq.get(topic) == seq and session <= p[2]:
                next_seq[topic] = seq + 1
                payload = data[off:off + n]
                if p[0] is not group:
                    if batch:
                        self.delivery.offer(group, batch, nbytes)
                    group, batch, nbytes = p[0], [], 0
                batch.append(Message(topic_names.get(topic) or str(topic), source_name, session,
                                     seq, payload, ctype, route))
                nbytes += n + MESSAGE_COST
                if p[1]:  # reliable
                    if not low:
                        low = sseq
                    if last_sseq is None:
                        last_sseq = self.recovery.last_sseq.topics(source, session)
                    last_sseq[topic] = top = sseq
                    if cacher:  # kept until stable, to repair peers (see peer_cache)
                        peer_cache.keep(source, CachedRun(sseq, sseq, data, topic, session, seq,
                                                          ctype, (n,), off))
            else:
                if batch:  # delivered in order: what came before goes first
                    self.delivery.offer(group, batch, nbytes)
                    group, batch, nbytes = (), [], 0
                if low:
                    self._stream_taken(source, low, top)
                    low = 0
                self.take_run(data, routes, topic, source, session, seq, stream, sseq, ctype, ridx,
                              (n,), off)
                in_order = not self._reorder.held and ctype != END
            off += n
            sseq += 1
        if batch:
            self.delivery.offer(group, batch, nbytes)
        if low:
            self._stream_taken(source, low, top)

    def _take_mixed_at_once(self, data: bytes, routes: list, run: tuple, plain: dict) -> bool:
        """The common mixed run, taken with the per-message work in C (`take_mixed`): every
        message the next in order of its own topic, all of topics this member takes and does not
        forward, reliable, for the same subscribers. False, having done nothing, for any other
        run."""
        _, source, session, _, _, sseq, ctype, ridx, count, off = run
        if self._reorder.held or ctype == END:
            return False
        info = plain.get(wire.mixed_topic(data, off, count))  # the first's: every message alike
        if info is None or not info[1] or session > info[2]:
            return False
        key = (source, session)
        next_seq = self.next_seq.by_source.get(key)  # topic -> next seq
        if next_seq is None:
            return False
        last = self.recovery.last_sseq.by_source.get(key)
        made = last is None  # (a new table is kept only if the run is taken)
        if made:
            last = SeqTable()
        taken = take_mixed(next_seq, last, info[3], data, off, count, sseq)
        if taken is None:
            return False
        if made:
            self.recovery.last_sseq.by_source[key] = last
        names, seqs, payloads, nbytes = taken
        top = sseq + count - 1
        self.stats["mixed_runs"] += 1
        source_name = self.tables.names.get(source) or str(source)
        self.delivery.offer(info[0],
                            list(map(Message, names, repeat(source_name), repeat(session), seqs,
                                     payloads, repeat(ctype), repeat(routes[ridx]))),
                            nbytes + MESSAGE_COST * count)
        recovery = self.recovery
        if recovery.cacher:  # kept until stable, to repair peers (see peer_cache)
            recovery.peer_cache.keep(source, CachedRun(sseq, top, data, MIXED, session, 0, ctype,
                                                       count, off))
        self._stream_taken(source, sseq, top)
        return True

    def _stream_taken(self, source: int, lo: int, hi: int) -> None:
        """Stream seqs `lo`..`hi` of `source` were taken: its stream position moves, and the
        highest seen (which the summaries report)."""
        self.recovery.positions.mark(source, lo, hi)
        if hi > self.recovery.max_seen.get(source, 0):
            self.recovery.max_seen[source] = hi
            self.recovery.progressed = True

    def _accept(self, data: bytes, routes: list, key: tuple, first: int, stream: int,
                first_sseq: int, ctype: int, ridx: int, lengths: tuple, off: int) -> None:
        """Deliver, forward and (reliable topics) account for a run that is next in order."""
        topic, source, session = key
        subs = self.tables.subs.get(topic)
        forwards = topic in self.tables.routes
        if not (subs or forwards):  # (a group carrying topics it does not take: see regions)
            self.stats["not_taken"] += len(lengths)
            return
        count = len(lengths)
        if self.tables.limits and self._forbidden(topic, source):
            if topic in self.recovery.reliable:  # (its stream moves on: never asked for again)
                self._stream_taken(source, first_sseq, first_sseq + count - 1)
            return
        stop = off
        payloads = [data[stop:(stop := stop + n)] for n in lengths]
        route = routes[ridx]
        if subs and ctype == END:
            self.delivery.on_end_of_stream(source, topic, session, first + count - 2)
        elif subs:
            topic_name = self.tables.topic_names.get(topic) or str(topic)
            source_name = self.tables.names.get(source) or str(source)
            self.delivery.offer(subs, [Message(topic_name, source_name, session, seq, payload,
                                               ctype, route)
                                       for seq, payload in enumerate(payloads, first)],
                                sum(lengths) + MESSAGE_COST * count)
        if forwards:
            if route == REPAIR_RECORD:
                # a run this member lost, repaired: on along the stream's own path, where the
                # members downstream miss it too. Else they would see no gap when it was a
                # burst's last, and could tell their stall from a pause only by a timer
                route = self._stream_paths.get(key)
            else:
                self._stream_paths[key] = route
            if route is not None:
                self.sender.forward_run(topic, source, session, first, stream, first_sseq, ctype,
                                        route, payloads, self.stamp_in)
        recovery = self.recovery
        if topic in recovery.reliable:
            top = recovery.last_sseq[key] = first_sseq + count - 1
            self._stream_taken(source, first_sseq, top)
            if recovery.cacher:  # kept until stable, to repair peers (see peer_cache)
                recovery.peer_cache.keep(source, CachedRun(first_sseq, top, data, topic, session,
                                                           first, ctype, lengths, off))

    def _on_fragment(self, header: wire.Header, body: memoryview, routes: list, off: int) -> int:
        """Take a fragment to its message; returns the message's source."""
        if header.count != 1 or off + wire.FRAGMENT.size > len(body):
            raise wire.DecodeError("bad_fragment")
        total, index, count, chunk = wire.FRAGMENT.unpack_from(body, off)
        runs = list(wire.iter_runs(body, off + wire.FRAGMENT.size, 1, len(routes)))
        topic, source, session, seq, stream, sseq, ctype, ridx, lengths, start = runs[0]
        if topic == MIXED or len(lengths) != 1:
            raise wire.DecodeError("bad_fragment", "fragment run of several messages")
        if seq < self.next_seq.get((topic, source, session), 0):
            self.stats["duplicates"] += 1  # a piece of a message delivered already (a repair's)
            return source
        piece = wire.WireMessage(topic, source, session, seq, stream, sseq, ctype, routes[ridx],
                                 bytes(body[start:start + lengths[0]]))
        try:
            whole = self._reassembler.add(header.sender,
                                          wire.Fragment(piece, total, index, count, chunk))
        except ReassemblyError as exc:
            self.drop(exc.reason)
            return source
        if (m := whole) is not None:
            self.stats["reassembled"] += 1
            self.take_run(m.payload, [m.route], m.topic_id, m.source, m.session, m.seq,
                          m.stream, m.stream_seq, m.content_type, 0, (len(m.payload),), 0)
        return source

    def _on_control(self, header: wire.Header, body: memoryview) -> None:
        header, body = wire.decode_control(body)
        msg = control_messages.decode(header.ptype, body)  # (DecodeError: counted by the caller)
        self.stats["control_in"] += 1
        kind = msg.__class__
        if kind is Ack:
            self.sender.on_ack(header.sender, msg.channel, msg.dseq, msg.held_us / 1e6, msg.light)
        elif kind is GroupAck:
            self._acks.on_group_ack(header.sender, msg)
        elif kind is NakAsk:
            self._repairs.on_nak(header.sender, msg)
        elif kind is InstructionsEnvelope:
            try:
                self.recovery.on_instructions(msg.body, msg.protocol)
            except (TypeError, ValueError, IndexError, AttributeError):
                self.drop("bad_instructions")
        elif kind is WhereAsk:
            self._joins.on_where(header.sender, msg.session, msg.topics)
        elif kind is JoinPoints:
            self._joins.on_join_points(header.sender, msg)
        else:  # a summary or a peer token: for agents, not members
            self.drop("bad_control")

    def send_control(self, message, address) -> None:
        ptype, body = control_messages.encode(message)
        data = wire.encode_control(ptype, self.member_id, body, 0, self._numbers.next(),
                                   wire.stamp_now())
        try:
            self._sock.sendmsg(self._auth.seal(data), (), 0, address)
            self.stats["control_out"] += 1
            self.stats["control_bytes_out"] += len(data) + self._trailer
        except OSError as exc:
            self.drops["send_error"] += 1
            log.debug("control send to %s failed: %s", address, exc)

