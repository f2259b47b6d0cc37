"""The receive path of the member runtime: drain sockets, authenticate, deliver runs to
subscribers in order, forward, reassemble fragments, acknowledge.

A part of `MemberRuntime` (runs on its I/O thread only); the state it uses is set up there."""

from __future__ import annotations

import bisect
import logging
import socket
import time
from collections import deque
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from scopecast.netio import control_messages, wire
from scopecast.netio.control_messages import Ack, InstructionsEnvelope, JoinPoint, NakAsk, WhereAsk
from scopecast.netio.delivery import Subscription
from scopecast.netio.feed import END, MESSAGE_COST
from scopecast.netio.message import Message
from scopecast.netio.native import NameTable, SeqTable, take_mixed
from scopecast.netio.reassembly import ReassemblyError
from scopecast.netio.repair_server import REPAIR_RECORD, CachedRun
from scopecast.netio.udp_batch import GRO_SPACE, segment_size
from scopecast.netio.wire import WireRun
from scopecast.timing import TIMING

log = logging.getLogger("scopecast.netio.runtime")
HEADER = wire.HEADER
MIXED = wire.MIXED
ACK_REPEAT, ACK_REPEAT_IDLE = 0.02, 0.5  # seconds between repeats of an unchanged ack
ACK_NOW_GAP = TIMING.ack_now_gap
_first = itemgetter(0)  # (an EarlyRun's first seq: its bisect key)
DRAIN_BUDGET = 512  # datagrams per socket per pass: control calls and timers run between passes


class EarlyRun(NamedTuple):
    """A run held because it came ahead of its predecessors (see `_hold_early`)."""
    first: int      # its first seq (the list of a key's held runs is ordered by it)
    at: float       # when it came (time.monotonic())
    data: bytes     # the datagram it is in
    routes: list    # the datagram's routing table
    run: WireRun


class ReceivePath:

    def _drain(self, sock: socket.socket) -> None:
        # recvfrom (a fresh bytes object) rather than recv_into a shared buffer: payloads are then
        # cheap slices of it, and a held datagram needs no copy; with GRO, recvmsg (a batch of
        # datagrams of one sender, and their size: see udp_batch)
        recv = sock.recvmsg if self._gro else sock.recvfrom
        size = self._recv_size
        space = GRO_SPACE if self._gro else 0
        stats = self.stats
        opened = self.hole_opened
        for _ in range(DRAIN_BUDGET):
            try:
                data, *ancillary = recv(size, space) if space else recv(size)
            except BlockingIOError:
                # drained: a sender whose window is filling asked for an acknowledgement without
                # delay (FLAG_ACK_NOW); it resumes as soon as this burst is taken
                if self._ack_now and (now := time.monotonic()) - self._last_ack >= ACK_NOW_GAP:
                    self._send_acks(now)
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
            if self._touched:  # what the call brought, to the applications as one batch each
                self._deliver()
            if self.hole_opened and not opened:
                # NAKed now, not once the rest of the backlog is taken: a full budget of large
                # datagrams takes tens of ms, and that wait was most of the slowest repairs
                return

    def _take_segments(self, data: bytes, size: int) -> None:
        """The datagrams of one GRO receive call (segments of `size` bytes, the last may be
        shorter): consecutive plain runs of one stream as one run, read in C; the rest one by
        one."""
        scan = self._scanner.scan if self._scanner is not None else None
        pos, end = 0, len(data)
        while pos < end:
            got = scan(data, size, pos) if scan is not None else None
            if got is not None and self._take_scanned(got):
                pos = got[0]
                continue
            stop = got[0] if got is not None else pos + size
            while pos < stop:  # (what the fast path leaves: the slow path counts or handles)
                self._on_datagram(data[pos:pos + size])
                pos += size

    def _take_scanned(self, got: tuple) -> bool:
        """Take consecutive plain runs of one stream from authentic datagrams, as `_on_data`
        takes one run (see _datagram_batch.c); False if they need the slow path (a sender or source
        not known yet, this member's own, a routing table that does not decode)."""
        (_, _, sender, channel, first_dseq, last_dseq, flags, table, topic, source, session,
         first, stream, first_sseq, ctype, lengths, payloads) = got
        if sender == self.member_id or sender not in self._members \
                or (source not in self._names and source != self.member_id):
            return False
        try:
            routes = wire.decode_table(table)
        except wire.DecodeError:
            return False
        if not routes:
            return False
        # (one call a batch: _on_data's inline in-order check saves a call per run, not here)
        self._take_run(payloads, routes, topic, source, session, first, stream, first_sseq, ctype,
                       0, lengths, 0)
        self._note_channel(sender, channel, first_dseq, last_dseq, 1, flags)
        self.stats["datagrams_scanned"] += got[1]
        return True

    def _on_datagram(self, data: bytes) -> None:
        n = len(data) - self._trailer
        if n < HEADER.size:
            self._drop("truncated")
            return
        if not self._auth.check(data, n):
            self._drop("bad_mac")
            return
        try:
            header = wire.unpack_header(data)
            if header.pad:  # (a segment of a batch sent at once: see udp_batch)
                n = len(wire.unpadded(memoryview(data)[:n], header))
        except wire.DecodeError as exc:
            self._drop(exc.reason)
            return
        sender = header.sender
        if header.ptype == wire.PacketType.TOKEN:  # from this member's recovery agent
            self._dispatch(header, data, n)
            return
        if sender == self.member_id:
            self.stats["own_datagrams"] += 1
            return
        if sender not in self._members:
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
            self._drop(exc.reason)

    def _drop(self, reason: str) -> None:
        self.drops[reason] += 1
        if self.drops[reason] in (1, 10, 100, 1000) or self.drops[reason] % 10000 == 0:
            log.warning("dropped datagram: %s (%d so far)", reason, self.drops[reason])

    def _hold(self, sender: int, data: bytes) -> None:
        """Keep a datagram of a member the control plane has not told us about yet (bounded)."""
        if self._held_bytes + len(data) > self.config.held_bytes:
            self._drop("unknown_sender")
            return
        self._held.append((time.monotonic(), sender, data))
        self._held_bytes += len(data)
        self.unknown_sender.set()

    def _release_held(self) -> None:
        held, self._held = self._held, deque()
        self._held_bytes = 0
        now = time.monotonic()
        for t, sender, data in held:
            if sender in self._members:
                header = wire.unpack_header(data)
                self._dispatch(header, data, len(data) - self._trailer - header.pad)
                self._deliver()
            elif now - t < self.config.unknown_sender_grace:
                self._held.append((t, sender, data))
                self._held_bytes += len(data)
            else:
                self._drop("unknown_sender")

    def _on_data(self, header: wire.Header, body: memoryview, data: bytes) -> None:
        """Take a data datagram's runs into the inboxes (the caller delivers them: once per
        receive call, not per datagram of a batch)."""
        routes, off = wire.decode_routes(body, HEADER.size)
        if header.flags & wire.FLAG_FRAGMENT:
            source = self._on_fragment(header, body, routes, off)
        else:
            # runs are validated as they are read: the runs before a malformed one in an
            # authenticated datagram are kept
            names, me = self._names, self.member_id
            by_source, sessions = self._next_seq.by_source, self._sessions
            in_order = not self._early  # else every run goes by _take_run (held runs)
            for run in wire.iter_runs(body, off, header.count, len(routes)):
                topic, source, session, first, stream, sseq, ctype, ridx, lengths, at = run
                if source not in names and source != me:
                    # a source never known yet (forwarded from another scope): held until
                    # it is, so that its messages name it from the first (runs taken already
                    # come again as duplicates, and are dropped as such)
                    self._hold(source, data)
                    if header.ptype != wire.PacketType.REPAIR:
                        self._note_received(header)  # (held, not lost: no gap after it)
                    return
                if topic == MIXED:
                    self._take_mixed(data, routes, run)
                    in_order = not self._early
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
                    self._take_run(data, routes, *run)
        if header.flags & wire.FLAG_MORE and header.count:  # a repair its budget cut short
            self._evidence.cut_short(source)
        if header.ptype == wire.PacketType.REPAIR:
            self.stats["repair_datagrams_in"] += 1
        else:
            self._note_received(header)

    def _note_received(self, header: wire.Header) -> None:
        self._note_channel(header.sender, header.channel, header.dseq, header.dseq, header.count,
                           header.flags)

    def _note_channel(self, sender: int, channel: int, first: int, last: int, count: int,
                      flags: int) -> None:
        """Datagrams `first`..`last` of a sender's channel came (`count`: runs in each; 0 for a
        probe)."""
        if flags & wire.FLAG_ACK_NOW:
            self._ack_now = True
        key = (sender, channel)
        pos = self._recv_pos.get(key)
        if pos is None:
            self._recv_pos[key] = [last, 0, 0.0, 0.0, time.monotonic()]
        elif last > pos[0]:
            now = time.monotonic()
            # datagrams of this channel that never came (a probe, a datagram of no runs,
            # re-announces the last one sent: that one too): the evidence of loss that lets
            # this member ask for a stream's tail (see RecoveryPath._tail_wanted)
            missing = first - pos[0] - (count != 0)
            if missing > 0:
                self.stats["channel_gaps"] += missing
                self.loss_seen_at = now
            pos[0] = last
            pos[4] = self.data_seen_at = now  # (acks say how long after it went)
        elif not count:
            # a full window's probe: its sender holds more for this channel (what a forwarding
            # member queued will come: see RecoveryPath._tail_wanted)
            self.data_seen_at = time.monotonic()

    def _take_run(self, data: bytes, routes: list, topic: int, source: int, session: int,
                  first: int, stream: int, first_sseq: int, ctype: int, ridx: int,
                  lengths: tuple, off: int) -> None:
        """Deliver and forward one run: FIFO per (topic, source, session), duplicates dropped;
        order is checked once per run, not per message."""
        announced = self._sessions.get(topic)
        if announced is not None and session > announced:
            self.stats["unannounced_session"] += len(lengths)
            return
        key = (topic, source, session)
        expected = self._next_seq.get(key)
        if first != expected:  # not the next in order (or the first seen of its key)
            # a run ahead of its predecessors (or the first seen of a source, not starting at 1)
            # waits a little for them: replicated channels and re-layouts reorder
            if first > (1 if expected is None else expected):
                run = WireRun(topic, source, session, first, stream, first_sseq, ctype, ridx,
                              lengths, off)
                if self._hold_early(key, data, routes, run):
                    return
                expected = self._next_seq.get(key)  # the held runs went ahead of this one
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
        self._next_seq[key] = first + len(lengths)
        self._accept(data, routes, key, first, stream, first_sseq, ctype, ridx, lengths, off)
        if self._early and key in self._early and not self._releasing:
            self._release_early(key)

    def _plain_topics(self) -> dict[int, tuple]:
        """topic -> (subscriptions, reliable, latest announced session, names) of the topics this
        member takes and does not forward, rebuilt on table installs: what `_take_mixed` needs of
        a message in one lookup. Topics alike share the value (`names`, a NameTable of them, is
        all the memory per topic): a run's messages are alike when each has a name there."""
        plain: dict[int, tuple] = {}
        names: dict[tuple, dict[int, str]] = {}
        sessions, reliable, forwards = self._sessions, self._reliable, self._routes
        topic_names = self._topic_names
        for topic, subs in self._subs.items():
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
        `_accept` does, per message); any other goes by `_take_run` as a run of its own."""
        plain = self._plain
        if plain is None:
            plain = self._plain_topics()
        if self._take_mixed_at_once(data, routes, run, plain):
            return
        _, source, session, _, stream, sseq, ctype, ridx, count, off = run
        # this run's source session, by topic (none yet: `_take_run` makes it for what it
        # accepts; a run of a session never announced leaves no table behind)
        next_seq = self._next_seq.by_source.get((source, session), {})
        last_sseq = None
        topic_names = self._topic_names
        route = routes[ridx]
        source_name = self._names.get(source) or str(source)
        self.stats["mixed_runs"] += 1
        in_order = not self._early and ctype != END
        cacher = self._cacher
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
                        self._offer(group, batch, nbytes)
                    group, batch, nbytes = p[0], [], 0
                batch.append(Message(topic_names.get(topic) or str(topic), source_name, session,
                                     seq, payload, ctype, route))
                nbytes += n + MESSAGE_COST
                if p[1]:  # reliable
                    if not low:
                        low = sseq
                    if last_sseq is None:
                        last_sseq = self._last_sseq.topics(source, session)
                    last_sseq[topic] = top = sseq
                    if cacher:  # kept until stable, to repair peers (see peer_cache)
                        self._peer_cache.keep(source, CachedRun(sseq, sseq, data, topic, session,
                                                                seq, ctype, (n,), off))
            else:
                if batch:  # delivered in order: what came before goes first
                    self._offer(group, batch, nbytes)
                    group, batch, nbytes = (), [], 0
                if low:
                    self._stream_taken(source, low, top)
                    low = 0
                self._take_run(data, routes, topic, source, session, seq, stream, sseq, ctype, ridx,
                               (n,), off)
                in_order = not self._early and ctype != END
            off += n
            sseq += 1
        if batch:
            self._offer(group, batch, nbytes)
        if low:
            self._stream_taken(source, low, top)

    def _take_mixed_at_once(self, data: bytes, routes: list, run: tuple, plain: dict) -> bool:
        """The common mixed run, taken with the per-message work in C (`take_mixed`): every
        message the next in order of its own topic, all of topics this member takes and does not
        forward, reliable, for the same subscribers. False, having done nothing, for any other
        run."""
        _, source, session, _, _, sseq, ctype, ridx, count, off = run
        if self._early or ctype == END:
            return False
        info = plain.get(wire.mixed_topic(data, off, count))  # the first's: every message alike
        if info is None or not info[1] or session > info[2]:
            return False
        key = (source, session)
        next_seq = self._next_seq.by_source.get(key)  # topic -> next seq
        if next_seq is None:
            return False
        last = self._last_sseq.by_source.get(key)
        made = last is None  # (a new table is kept only if the run is taken)
        if made:
            last = SeqTable()
        taken = take_mixed(next_seq, last, info[3], data, off, count, sseq)
        if taken is None:
            return False
        if made:
            self._last_sseq.by_source[key] = last
        names, seqs, payloads, nbytes = taken
        top = sseq + count - 1
        self.stats["mixed_runs"] += 1
        self._offer(info[0],
                    list(map(Message, names, repeat(self._names.get(source) or str(source)),
                             repeat(session), seqs, payloads, repeat(ctype), repeat(routes[ridx]))),
                    nbytes + MESSAGE_COST * count)
        if self._cacher:  # kept until stable, to repair peers (see peer_cache)
            self._peer_cache.keep(source, CachedRun(sseq, top, data, MIXED, session, 0, ctype,
                                                    count, off))
        self._stream_taken(source, sseq, top)
        return True

    def _stream_taken(self, source: int, lo: int, hi: int) -> None:
        """Stream seqs `lo`..`hi` of `source` were taken: its stream position moves, and the
        highest seen (which the summaries report)."""
        self._positions.mark(source, lo, hi)
        if hi > self._max_seen.get(source, 0):
            self._max_seen[source] = hi
            self.progressed = True

    def _accept(self, data: bytes, routes: list, key: tuple, first: int, stream: int,
                first_sseq: int, ctype: int, ridx: int, lengths: tuple, off: int) -> None:
        """Deliver, forward and (reliable topics) account for a run that is next in order."""
        topic, source, session = key
        subs = self._subs.get(topic)
        forwards = topic in self._routes
        if not (subs or forwards):
            return
        count = len(lengths)
        stop = off
        payloads = [data[stop:(stop := stop + n)] for n in lengths]
        route = routes[ridx]
        if subs and ctype == END:
            self._on_end_of_stream(source, topic, session, first + count - 2)
        elif subs:
            topic_name = self._topic_names.get(topic) or str(topic)
            source_name = self._names.get(source) or str(source)
            self._offer(subs, [Message(topic_name, source_name, session, seq, payload, ctype,
                                       route) for seq, payload in enumerate(payloads, first)],
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
                self._forward_run(topic, source, session, first, stream, first_sseq, ctype,
                                  route, payloads)
        if topic in self._reliable:
            top = self._last_sseq[key] = first_sseq + count - 1
            self._stream_taken(source, first_sseq, top)
            if self._cacher:  # kept until stable, to repair peers (see peer_cache)
                self._peer_cache.keep(source, CachedRun(first_sseq, top, data, topic, session,
                                                        first, ctype, lengths, off))

    # ------------------------------------------------------------ runs that arrive early

    def _hold_early(self, key: tuple, data: bytes, routes: list, run: WireRun) -> bool:
        """Keep a run that arrived ahead of its predecessors (channels replicated modulo n, or a
        path changed by a re-layout) until they come, within a byte budget; False when full."""
        size, first = sum(run.lengths), run.first
        if self._early_bytes + size > self.config.reorder_bytes:
            if key[0] in self._reliable:
                self.drops["reorder_full"] += len(run.lengths)  # not acknowledged: NAKed later
                self.loss_seen_at = time.monotonic()  # (a tail dropped here shows no other gap)
                return True
            if key in self._early:  # out of room: what is held goes first, with its gaps
                self._release_early(key, give_up=True)
            return False
        held = self._early.setdefault(key, [])
        # (runs mostly come in order: found from the end, so thousands held stay cheap)
        at = len(held) if not held or held[-1].first < first \
            else bisect.bisect(held, first, key=_first)
        if key[0] in self._reliable:  # a new hole ends just before this run: when did it open
            before = held[at - 1] if at else None
            if before is None or before.first + len(before.run.lengths) != first:
                self._gap_at.setdefault(key, []).append((first - 1, time.monotonic()))
                self.hole_opened = True
        held.insert(at, EarlyRun(first, time.monotonic(), data, routes, run))
        if key[0] in self._reliable:  # taken, for the stream position (held till delivered)
            self._positions.mark(key[1], run.first_sseq, run.first_sseq + len(run.lengths) - 1)
        self._early_bytes += size
        self.stats["held_early"] += 1
        return True

    def _release_early(self, key: tuple, give_up: bool = False) -> None:
        """Take the held runs of `key` that are now next in order (all of them if `give_up`:
        the runs missing before them are not coming, which is counted as a gap)."""
        held = self._early.get(key)
        if not held:
            return
        taken = 0
        self._releasing = True
        try:
            for early in held:
                expected = self._next_seq.get(key)
                if expected is None or early.first > expected:
                    if not give_up:
                        break
                    if expected is not None:  # else it is where this member joined the stream
                        self.stats["gaps"] += 1
                    self._next_seq[key] = early.first
                taken += 1
                self._early_bytes -= sum(early.run.lengths)
                self._take_run(early.data, early.routes, *early.run)
                if key in self._gap_at:
                    self._note_filled(key, give_up)
        finally:
            self._releasing = False
            del held[:taken]  # (at once: one pop per run made long releases quadratic)
            if not held:
                del self._early[key]

    def _expire_early(self, now: float) -> None:
        """Give up waiting for what is missing before held runs — on reliable topics only where
        the member joins the stream and neither a record nor its sender said where it starts
        (`join_timeout`): it starts at the first run it holds, and NAKs the holes after it."""
        for key in [k for k, held in self._early.items() if self._given_up(k, held, now)]:
            if key[0] in self._reliable:
                self._next_seq[key] = self._early[key][0].first
                self.stats["started_unasked"] += 1
                self._release_early(key)
            else:
                self._release_early(key, give_up=True)
        self._deliver()

    def _given_up(self, key: tuple, held: list, now: float) -> bool:
        age = now - min(h.at for h in held)
        if key[0] not in self._reliable:
            return age > self.config.reorder_timeout
        return key not in self._next_seq and not self._pending(key) \
            and age > self.config.join_timeout

    def _offer(self, subs: tuple[Subscription, ...], msgs: list[Message], nbytes: int) -> None:
        """Put messages in the inboxes of `subs`; `_deliver` hands the inboxes over."""
        for sub in subs:
            if not sub.inbox:
                self._touched.append(sub)
            sub.inbox.extend(msgs)
            sub.inbox_bytes += nbytes

    def _deliver(self) -> None:
        """Hand every filled inbox to its application as one batch."""
        if not self._touched:
            return
        touched, self._touched = self._touched, []
        cap = self._delivery_cap
        for sub in touched:
            batch, nbytes = sub.inbox, sub.inbox_bytes
            sub.inbox = []
            sub.inbox_bytes = 0
            if sub.backlog() > cap:
                # memory stays bounded whatever the application does: a member that lags this far
                # already holds its senders back (acknowledgements withheld), so only a client,
                # whom nobody waits for, gets here; it misses these messages (a gap in its seqs)
                self.stats["delivery_overflow"] += len(batch)
                continue
            sub.delivered_bytes += nbytes
            self.stats["delivered"] += len(batch)
            sub.queue.append((batch, nbytes))
            self._wake_later(sub)

    def _wake_later(self, sub: Subscription) -> None:
        if sub.waiting and not sub.wake:
            sub.wake = True
            self._to_wake.append(sub)

    def _wake_subscribers(self) -> None:
        """Wake waiting applications once per drained burst, not once per datagram (or per end
        marker: the markers of thousands of topics closed together come in a few datagrams)."""
        for sub in self._to_wake:
            sub.wake = False
            sub.event.set()
        self._to_wake.clear()

    def _on_fragment(self, header: wire.Header, body: memoryview, routes: list, off: int) -> int:
        """Take a fragment to its message; returns the message's source."""
        if header.count != 1 or off + wire.FRAGMENT.size > len(body):
            raise wire.DecodeError("bad_fragment")
        total, index, count, chunk = wire.FRAGMENT.unpack_from(body, off)
        runs = list(wire.iter_runs(body, off + wire.FRAGMENT.size, 1, len(routes)))
        topic, source, session, seq, stream, sseq, ctype, ridx, lengths, start = runs[0]
        if topic == MIXED or len(lengths) != 1:
            raise wire.DecodeError("bad_fragment", "fragment run of several messages")
        if seq < self._next_seq.get((topic, source, session), 0):
            self.stats["duplicates"] += 1  # a piece of a message delivered already (a repair's)
            return source
        piece = wire.WireMessage(topic, source, session, seq, stream, sseq, ctype, routes[ridx],
                                 bytes(body[start:start + lengths[0]]))
        try:
            whole = self._reassembler.add(header.sender,
                                          wire.Fragment(piece, total, index, count, chunk))
        except ReassemblyError as exc:
            self._drop(exc.reason)
            return source
        if (m := whole) is not None:
            self.stats["reassembled"] += 1
            self._take_run(m.payload, [m.route], m.topic_id, m.source, m.session, m.seq,
                           m.stream, m.stream_seq, m.content_type, 0, (len(m.payload),), 0)
        return source

    def _on_control(self, header: wire.Header, body: memoryview) -> None:
        header, body = wire.decode_control(body)
        msg = control_messages.decode(header.ptype, body)  # (DecodeError: counted by the caller)
        kind = msg.__class__
        if kind is Ack:
            self._on_ack(header.sender, msg.channel, msg.dseq, msg.held_us / 1e6)
        elif kind is NakAsk:
            self._on_nak(header.sender, msg)
        elif kind is InstructionsEnvelope:
            try:
                self._on_instructions(msg.body, msg.protocol)
            except (TypeError, ValueError, IndexError, AttributeError):
                self._drop("bad_instructions")
        elif kind is WhereAsk:
            self._on_where(header.sender, msg.topic, msg.session)
        elif kind is JoinPoint:
            self._on_join_point(header.sender, *msg)
        else:  # a summary or a peer token: for agents, not members
            self._drop("bad_control")

    def _on_end_of_stream(self, source: int, topic: int, session: int, last_seq: int) -> None:
        """`source`'s stream of `topic` ended after `last_seq`: what came before goes to the
        applications first, so one that finds its queue empty and the marker there has it all."""
        self._deliver()
        name = self.name if source == self.member_id else self._names.get(source) or str(source)
        for sub in self._subs.get(topic, ()):
            sub.end((self._topic_names.get(topic, str(topic)), name, session), last_seq)
            self._wake_later(sub)

    def _on_ack(self, sender: int, channel: int, dseq: int, held: float) -> None:
        feed = self._feeds_by_channel.get(channel)
        if feed is None or dseq > feed.dseq:
            self._drop("bad_ack")
            return
        if not feed.acknowledge(sender, dseq, time.monotonic(), held):
            self.stats["acks_ignored"] += 1  # from a client, or a member no longer listed

    def _send_acks(self, now: float) -> None:
        self._last_ack = now
        self._ack_now = False
        for sub in self._subscriptions:  # (not per topic: a pattern's one is under thousands)
            if sub.backlog() > self.config.max_backlog_bytes:
                self.stats["acks_withheld"] += 1
                return
        for (sender, channel), pos in self._recv_pos.items():
            if pos[0] == pos[1]:
                # repeated: a lost ack must not leave a sender's full window stalled (often for
                # a second after the last new data, then rarely)
                if now - pos[2] < (ACK_REPEAT if now - pos[3] < 1.0 else ACK_REPEAT_IDLE):
                    continue
            else:
                pos[3] = now
            member = self._members.get(sender)
            if member is None:
                continue
            pos[1] = pos[0]
            pos[2] = now
            # how long the acknowledged datagram waited for this ack (acks go every ack_period):
            # the sender's round-trip sample leaves it out (see delay_window)
            held = max(0, round((now - pos[4]) * 1e6))
            self._send_control(Ack(channel, pos[0], held), (member.host, member.port))

    def _send_control(self, message, address) -> None:
        ptype, body = control_messages.encode(message)
        data = wire.encode_control(ptype, self.member_id, body)
        try:
            self._sock.sendmsg([data, self._auth.sign(data)], (), 0, address)
            self.stats["control_out"] += 1
            self.stats["control_bytes_out"] += len(data) + self._trailer
        except OSError as exc:
            self.drops["send_error"] += 1
            log.debug("control send to %s failed: %s", address, exc)

