"""The send path of the member runtime: take publishes from application threads, queue them per
destination in chunks of runs, and let each destination pull its next datagram when its window is
open (QSM's pull-based sending).

A part of `MemberRuntime` (see `member_parts`; it runs on the I/O thread only).

Feed items are runs (see `wire`) collected into chunks under one routing record; a datagram is its
header, a one-record routing table and the runs of one chunk."""

from __future__ import annotations

import errno
import logging
import selectors
import time
from collections import deque

from scopecast.netio import wire
from scopecast.netio.ack_gathering import GROUP_CHANNELS, group_channel, is_multicast, root
from scopecast.netio.channel import FilteredChannel, endpoints, resolve
from scopecast.netio.delay_window import DelayWindow
from scopecast.netio.delivery import Delivery
from scopecast.netio.feed import END, MESSAGE_COST, MIXED_EXTRA, Chunk, Feed, LoneBatch, MixedRun
from scopecast.netio.member_parts import MemberBasics, MemberTables, Receiving, Recovering
from scopecast.netio.message import Message
from scopecast.netio.own_stream import OwnStream
from scopecast.netio.routing import forward, matches, origin_record
from scopecast.netio.sealed_batches import SealedBatches
from scopecast.netio.udp_batch import batch_limit, send_batch

log = logging.getLogger("scopecast.netio.runtime")
EMPTY_TABLE = wire.encode_route_table([])
# a batch send failing with these lost its datagrams (netfilter dropped them, a route or a
# neighbour is missing for now), not for being a batch: the interface still takes batches
TRANSIENT_SEND_ERRORS = frozenset({errno.EPERM, errno.ENOBUFS, errno.ECONNREFUSED,
                                   errno.EHOSTUNREACH, errno.ENETUNREACH})
GSO_REFUSALS = 3  # GSO sends failing in a row (not transiently) that turn GSO off
# bytes one pass of the pump sends before the loop looks at its sockets again: a NAK waited
# behind a whole window (a few MiB, ~10 ms on loopback) before; ~1 ms of sending here, and many
# GSO batches of MTU-sized datagrams
PUMP_BYTES = 1 << 20


class SendPath:
    """Taking publishes, queueing them per destination, pulling datagrams (see module docstring)."""

    def __init__(self, basics: MemberBasics, tables: MemberTables, own: OwnStream,
                 publish_q: deque, sel: selectors.BaseSelector, gso: bool) -> None:
        self.member_id, self.name, self.config = basics.member_id, basics.name, basics.config
        self.stats, self.drops = basics.stats, basics.drops
        self._sock, self._auth, self._sel = basics.sock, basics.auth, sel
        self._trailer = basics.auth.trailer_size
        self._datagram = basics.datagram
        # what a datagram's routing table and runs may take: its size less the header and MAC
        self._capacity = basics.datagram - self._trailer - wire.HEADER.size
        self.tables = tables
        self._own = own  # reliable topics' messages are kept there until stable
        self.delivery: Delivery
        self.receiver: Receiving
        self.recovery: Recovering
        self._publish_q = publish_q  # (application threads append, this path takes)
        self.gso = gso
        # GSO calls' datagrams built and signed in C, where the extension is there; own
        # messages that fill a datagram alone queue as its LoneBatches while GSO is on (without
        # it, chunks serve as well, and lone batches already queued go as chunks)
        self._sealed = SealedBatches(basics.auth, self._datagram, self.stats) \
            if basics.auth.batch_sealer is not None else None
        self._batch_parts: list = []  # the batch being made: [datagram, MAC] pairs
        self._batch_n = 0
        self._batch_address: tuple[str, int] = ("", 0)
        self._batch_segment = 0
        self._batch_most = 0
        self.want_write = False
        self._origin = origin_record(basics.name)
        self._plans: dict[tuple, list] = {}
        self._own_plans: dict[int, tuple] = {}  # see _own_plan
        self._own_alike: dict[tuple, tuple] = {}  # see _own_plan
        self._route_tables: dict[tuple, tuple] = {}  # record -> (it, encoded); see _plan
        self._stamp = [0]  # the stamp of chunks started now, shared with every feed (see Feed)
        self._feeds: dict[tuple[str, int], Feed] = {}
        self._feeds_by_channel: dict[int, Feed] = {}
        self._stalled: tuple | None = None  # (address, [datagram, MAC, ...], GSO segment)
        self._batch_failures = 0  # GSO sends failed in a row (see _refused_batch)
        self.gso_error = ""       # the last one's error, for status
        self._active: deque[Feed] = deque()
        self.taken_bytes = 0    # taken off the hand-over queue
        self.feed_bytes = 0     # waiting in destination queues
        self.taken_sseq = 0
        self.handed = 0         # every own message with stream seq <= handed is on the wire

    def connect(self, delivery: Delivery, receiver: Receiving, recovery: Recovering) -> None:
        self.delivery, self.receiver, self.recovery = delivery, receiver, recovery

    def tables_changed(self) -> None:
        """Topics, routes, subscriptions or reliable topics changed: the per-topic plans are
        made again on first use."""
        self._own_plans.clear()
        self._own_alike.clear()

    def install_routes(self, receivers: dict[tuple[str, int], set[int]]) -> None:
        """The forwarding table changed (`tables.routes`); feeds of unchanged destinations keep
        their queues, each learns its receivers."""
        self.tables_changed()
        self._plans.clear()
        self._route_tables.clear()
        now = time.monotonic()
        # a receiver added once this member has sent anything joins mid-stream (light, see feed)
        streaming = any(f.dseq for f in self._feeds.values())
        for address in receivers:
            self._feed(address)
        for address, feed in self._feeds.items():
            waited = set(receivers.get(address, ())) - {self.member_id}
            if feed.channel >= GROUP_CHANNELS:  # its receivers' tree acknowledges through its
                top = root(self.member_id, waited)  # root (`ack_gathering`), which holds the
                feed.set_receivers(set() if top is None else {top}, now)  # window from now
            else:
                feed.set_receivers(waited, now, streaming)

    def expire_receivers(self, now: float) -> None:
        for feed in self._feeds.values():
            for member in feed.expire(now, self.config.ack_timeout):
                self.stats["receiver_timeouts"] += 1
                log.warning("receiver %s of %s:%d silent for %.1fs; no longer waiting for it",
                            member, *feed.address, self.config.ack_timeout)

    def busy(self) -> bool:
        """Datagrams still to go."""
        return self._stalled is not None or any(f.pending() for f in tuple(self._active))

    def status(self) -> dict:
        return {f"{h}:{p}": {"in_flight": f.in_flight(), "window": f.window.size,
                             "queued": f.queued_chunks(), "receivers": sorted(f.acks),
                             "light": sorted(f.light)}
                for (h, p), f in self._feeds.items()}

    def on_ack(self, sender: int, channel: int, dseq: int, held: float, light: int = 0) -> None:
        feed = self._feeds_by_channel.get(channel)
        if feed is None or dseq > feed.dseq:
            self.receiver.drop("bad_ack")
            return
        if not feed.acknowledge(sender, dseq, time.monotonic(), held, light):
            self.stats["acks_ignored"] += 1  # from a client, or a member no longer listed

    def take_publishes(self) -> None:
        q = self._publish_q
        self._stamp[0] = wire.stamp_now()  # (the datagrams' stamp: see wire)
        taken = 0
        queued = 0
        sseq = 0
        topic = None
        plan: list = []
        feed = record = table = run = own = None
        subs: tuple = ()
        own_plans = self._own_plans
        cache = self._own.cache
        keep = cache.append
        kept = len(cache)
        released = 0
        rel = False
        while q:
            item = q.popleft()  # as the cache keeps it: (sseq, topic, session, seq, ctype, payload)
            sseq, t, session, seq, ctype, payload = item
            n = len(payload) + MESSAGE_COST
            # two fast paths, inline (a call costs more than their checks): the next of this
            # topic extends this publisher's run, the next of another its mixed run
            if t == topic:
                if run is not None and seq == run.next_seq and sseq == run.next_sseq \
                        and session == run.session and ctype == run.ctype \
                        and (c := feed.open) is not None and c.last is run \
                        and (size := c.size + n) <= c.room:
                    run.payloads.append(payload)
                    run.next_seq += 1
                    run.next_sseq += 1
                    c.size = size
                    queued += n
                elif run.__class__ is LoneBatch and run.least < n <= run.most and ctype != END \
                        and feed.open is None and feed.chunks[-1] is run:  # (see put_lone)
                    run.items.append(item)
                    queued += n
                else:
                    run, size = self._queue_own(plan, feed, record, table, item, n)
                    queued += size
            else:
                topic = t
                plans = own_plans.get(t) or self._own_plan(t)
                if plans is not own:  # (topics alike share one: many topics, one publisher)
                    own = plans
                    plan, feed, record, table, subs, rel = own  # (feed: one queue, no filters)
                    run = None
                if run.__class__ is MixedRun and sseq == run.next_sseq \
                        and session == run.session and ctype == run.ctype \
                        and (c := feed.open) is not None and c.last is run \
                        and (size := c.size + n + MIXED_EXTRA) <= c.room:
                    run.messages.append(item)
                    run.next_sseq += 1
                    c.size = size
                    queued += n
                else:
                    run, size = self._queue_own(plan, feed, record, table, item, n)
                    queued += size
            taken += n
            if rel:  # kept until stable (see own_stream)
                keep(item)
            else:
                released += n
            if subs:  # subscribers in this process get it directly
                if ctype == END:
                    self.delivery.on_end_of_stream(self.member_id, topic, session, seq - 1)
                else:  # (a publisher may queue views, publish_dataframe does: a copy here)
                    if payload.__class__ is not bytes:
                        payload = bytes(payload)
                    name = self.tables.topic_names.get(topic, str(topic))
                    self.delivery.offer(subs, [Message(name, self.name, session, seq, payload,
                                                       ctype, self._origin)], n)
        stream = self._own
        if released:
            stream.sent_unreliable = True
        if len(cache) > kept:  # each stream's tail moves on (in C)
            for key in stream.tails.note(cache, kept):
                stream.published.add(*key)
        if sseq:
            self.taken_sseq = sseq
            self.recovery.progressed = True
        self.taken_bytes += taken
        stream.released_bytes += released
        self.feed_bytes += queued
        self.delivery.deliver()
        self._update_handed()

    def _queue_own(self, plan: list, feed: Feed | None, record: tuple, table: bytes, item: tuple,
                   n: int) -> tuple:
        """Queue one of this member's messages (a cache entry of `n` bytes) where no run it
        extends takes it: (the run it joined, or None for several destinations; bytes queued)."""
        sseq, topic, session, seq, ctype, payload = item
        me = self.member_id
        if feed is not None:
            if not feed.pending():
                self._active.append(feed)
            if self._sealed is not None and self.gso \
                    and (b := feed.put_lone(record, table, self._capacity, item, n, me)):
                return b, n
            return feed.put(record, table, self._capacity, True, topic, me, session, seq, me, sseq,
                            ctype, payload), n
        queued = 0
        for target, rec, tbl in plan:
            queued += self._push(target, rec, tbl, True, topic, me, session, seq, me, sseq, ctype,
                                 payload)
        return None, queued

    def _update_handed(self) -> None:
        low = self.taken_sseq
        for feed in self._active:
            first = feed.first_own()
            if first and first - 1 < low:
                low = first - 1
        self.handed = low

    def _own_plan(self, topic: int) -> tuple:
        """What `take_publishes` needs of a topic it publishes, in one lookup: (plan, its one
        feed when that is all of it, else None, that feed's record and table, the subscribers
        in this process, whether it is reliable)."""
        plan = self._plan(topic, self._origin)
        single = record = table = None
        if len(plan) == 1 and plan[0][0].__class__ is Feed:
            # one object per distinct record (`_plan` shares them): consecutive messages of topics
            # that carry equal records join one chunk (and one mixed run) on an identity check
            single, record, table = plan[0]
        own = (plan, single, record, table, self.tables.subs.get(topic, ()),
               topic in self.recovery.reliable)
        if single is not None:  # topics alike share one (thousands of topics, one publisher)
            own = self._own_alike.setdefault(own[1:], own)
        self._own_plans[topic] = own
        return own

    def _plan(self, topic: int, record: tuple) -> list:
        """For messages of `topic` carrying `record`: (feed or filtered channel, record after the
        hop, its encoded routing table); equal records and tables are one object each."""
        plan = []
        for route in self.tables.routes.get(topic, ()):
            if matches(record, route.label):
                after = forward(record, route.label)
                after, table = self._route_tables.get(after) or self._route_tables.setdefault(
                    after, (after, wire.encode_route_table([after])))
                if isinstance(route.channel, FilteredChannel):
                    plan.append((route.channel, after, table))
                else:
                    plan.append((self._feed(route.channel.address), after, table))
        return plan

    def _push(self, target, record: tuple, table: bytes, own: bool, topic: int, source: int,
              session: int, seq: int, stream: int, sseq: int, ctype: int, payload: bytes) -> int:
        """Queue one message for a feed, or for the endpoints a filtered channel picks for it;
        returns the bytes queued."""
        if target.__class__ is Feed:
            feeds = [target]
        else:  # an end marker goes to every endpoint: each receiver's stream ends
            feeds = [self._feed(e.address) for e in (
                endpoints(target) if ctype == END else _resolved(target, topic, source, seq, sseq))]
        for feed in feeds:
            if not feed.pending():
                self._active.append(feed)
            feed.put(record, table, self._capacity, own, topic, source, session, seq, stream, sseq,
                     ctype, payload)
        return (len(payload) + MESSAGE_COST) * len(feeds)

    def forward_run(self, topic, source, session, first, stream, first_sseq, ctype, record,
                    payloads: list, stamp: int = 0) -> None:
        plan = self._plans.get((topic, record))
        if plan is None:
            plan = self._plans[(topic, record)] = self._plan(topic, record)
        if not plan:
            return
        # the stamp of the datagram that brought them: latency is timed from the publisher on
        self._stamp[0] = stamp or wire.stamp_now()
        self.stats["forwarded"] += len(payloads)
        queued = 0
        for i, payload in enumerate(payloads):
            for target, after, table in plan:
                queued += self._push(target, after, table, False, topic, source, session, first + i,
                                     stream, first_sseq + i, ctype, payload)
        self.feed_bytes += queued

    def _feed(self, address: tuple[str, int]) -> Feed:
        feed = self._feeds.get(address)
        if feed is None:
            channel = len(self._feeds) + 1  # (below GROUP_CHANNELS)
            if self.config.gather_acks and is_multicast(address[0]) \
                    and (group := group_channel(*address)) not in self._feeds_by_channel:
                channel = group
            feed = self._feeds[address] = Feed(
                address, channel,
                DelayWindow(self.config.window_bytes, self.config.window_delay), self._stamp)
            self._feeds_by_channel[feed.channel] = feed
        return feed

    def pump(self) -> bool:
        """Let destinations pull datagrams while their windows are open and the socket takes
        them."""
        if self.want_write:
            return False
        now = time.monotonic()
        if self._stalled is not None:
            address, parts, segment = self._stalled
            self._stalled = None
            if not self._send(address, parts, segment):
                return False
        if self._batch_n and not self._flush_batch():
            return False
        active = self._active
        progressed = False
        budget = PUMP_BYTES
        sealed = self._sealed
        for _ in range(len(active)):
            feed = active.popleft()
            window = feed.window
            while budget > 0 and feed.pending() and (flight := feed.in_flight()) < window.size:
                # receivers acknowledge every ack_period, and at once (after the burst they are
                # taking) once the window is half full: few acks at ordinary rates, every
                # burst's at saturation
                flags = wire.FLAG_ACK_NOW if 2 * flight >= window.size else 0
                if sealed is not None and self.gso and (batch := sealed.take(
                        self.member_id, feed, flags, window.size - flight, now)) is not None:
                    data, segment, taken = batch
                    self.feed_bytes -= taken  # what take_publishes added
                    if self._batch_n:  # datagrams made before these go first
                        self._flush_batch()
                    self._send(feed.address, [data], segment)
                    budget -= len(data)
                    progressed = True
                    if self.want_write:
                        break
                    continue
                datagram = self._pull(feed, flags)
                budget -= len(datagram)
                if not self._transmit(feed, datagram, now):
                    break
                progressed = True
            if self._batch_n and not self.want_write:
                self._flush_batch()
            if feed.pending():
                active.append(feed)
                if feed.probe_due(now):
                    self._probe(feed)
            if self.want_write:
                break
        if progressed:
            self._update_handed()
        return progressed

    def _take_chunk(self, feed: Feed) -> Chunk:
        chunk = feed.take()
        self.feed_bytes -= chunk.queued()  # what take_publishes added
        return chunk

    def _pull(self, feed: Feed, flags: int = 0) -> bytes:
        """Build the next datagram for `feed`, just in time."""
        feed.dseq += 1
        if feed.frag is not None:
            return self._next_fragment(feed, flags)
        chunk = self._take_chunk(feed)
        if chunk.oversized:
            feed.fragment(chunk)
            return self._next_fragment(feed, flags)
        parts: list = []
        for run in chunk.runs:
            parts += run.parts()
        ptype = wire.PacketType.END_OF_STREAM if chunk.end_of_stream else wire.PacketType.DATA
        return wire.encode_data(ptype, self.member_id, feed.channel, feed.dseq, chunk.table,
                                len(chunk.runs), parts, flags=flags, stamp=chunk.stamp)

    def _next_fragment(self, feed: Feed, flags: int = 0) -> bytes:
        frags = feed.frag
        frag, piece = frags.take()
        if not frags.left():
            feed.frag = None
        r = frags.run
        parts = wire.run_parts(r.topic, r.source, r.session, r.first_seq, r.stream, r.first_sseq,
                               r.ctype, 0, [piece])
        return wire.encode_data(wire.PacketType.DATA, self.member_id, feed.channel, feed.dseq,
                                frags.table, 1, parts, frag, flags, frags.stamp)

    def _probe(self, feed: Feed, counter: str = "window_probes") -> None:
        """Re-announce the last datagram number to `feed`'s receivers in a DATA datagram without
        runs (see `feed`): each acknowledges it once it has taken everything sent before."""
        datagram = wire.encode_data(wire.PacketType.DATA, self.member_id, feed.channel, feed.dseq,
                                    EMPTY_TABLE, 0, [], flags=wire.FLAG_ACK_NOW)
        try:
            self._sock.sendmsg(self._auth.seal(datagram), (), 0, feed.address)
            self.stats[counter] += 1
        except OSError:
            self.drops["send_error"] += 1  # probed again after PROBE_AFTER

    def probe_tails(self, now: float) -> bool:
        """Probe each drained feed whose last datagrams are not acknowledged a moment after they
        went (see `feed`); whether any feed still has such a tail to probe later."""
        if self._stalled is not None or self._batch_n:
            return True  # datagrams still to go: a probe must not overtake them
        waiting = False
        for feed in self._feeds.values():
            if feed.tail_probe_due(now):
                self._probe(feed, "tail_probes")
            elif feed.unprobed_tail():
                waiting = True
        return waiting

    def _transmit(self, feed: Feed, datagram: bytes, now: float) -> bool:
        """Hand one datagram for `feed` to the socket, or add it to the batch being made for one
        call (`udp_batch`, GSO); False when the socket's send buffer is full (what did not go
        is sent first once it is writable)."""
        if self.gso:
            size = self._add_to_batch(feed.address, datagram)
            sent = True
        else:
            size = len(datagram) + self._trailer
            sent = self._send(feed.address, self._auth.seal(datagram), 0)
        feed.sent(size, now)
        self.stats["datagrams_out"] += 1
        return sent

    def _add_to_batch(self, address: tuple[str, int], datagram: bytes) -> int:
        """Add a datagram to the batch for `address` (sending the batch first when it goes
        elsewhere, is full, or was cut at a smaller size); returns the bytes it takes on the
        wire: the batch's segment size (shorter datagrams are padded to it, see `wire`)."""
        size = len(datagram) + self._trailer
        if self._batch_n and (address != self._batch_address or size > self._batch_segment
                              or self._batch_n >= self._batch_most):
            self._flush_batch()
        if not self._batch_n:
            self._batch_address, self._batch_segment = address, size
            self._batch_most = batch_limit(size)
        elif size < self._batch_segment:
            datagram = wire.padded(datagram, self._batch_segment - self._trailer)
        self._batch_parts += self._auth.seal(datagram)
        self._batch_n += 1
        return self._batch_segment

    def _flush_batch(self) -> bool:
        """Send the batch being made (False: the socket's buffer is full; it goes once
        writable)."""
        parts, n = self._batch_parts, self._batch_n
        self._batch_parts, self._batch_n = [], 0
        return self._send(self._batch_address, parts, self._batch_segment if n > 1 else 0)

    def _send(self, address: tuple[str, int], parts: list, segment: int) -> bool:
        """Send the datagrams in `parts` ([datagram, MAC] pairs, or one buffer of datagrams
        signed and cut at `segment` already): with one call when `segment` (their GSO segment
        size) is set, else one call each. False when the socket's send buffer
        is full: what did not go goes first once it is writable."""
        stats = self.stats
        try:
            if segment:
                try:
                    send_batch(self._sock, parts, segment, address)
                    stats["send_calls"] += 1
                    self._batch_failures = 0
                    return True
                except BlockingIOError:
                    raise
                except OSError as exc:
                    if exc.errno in TRANSIENT_SEND_ERRORS:  # (a firewall's drop, no route yet:
                        self.drops["send_error"] += 1      # lost, recovery repairs it; GSO
                        return True                       # itself works)
                    self._refused_batch(address, exc)  # this batch goes one datagram a call
                    if len(parts) == 1:  # a batch built in C (sealed_batches): cut up
                        data = parts[0]
                        parts = [x for i in range(0, len(data), segment)
                                 for x in (data[i:i + segment], b"")]
            while parts:
                try:
                    self._sock.sendmsg(parts[:2], (), 0, address)
                    stats["send_calls"] += 1
                except BlockingIOError:
                    raise
                except OSError as exc:  # (lost: recovery repairs it)
                    self.drops["send_error"] += 1
                    log.warning("send to %s:%d failed: %s", *address, exc)
                parts = parts[2:]
            return True
        except BlockingIOError:
            self._stalled = (address, parts, segment if self.gso else 0)
            self.want_write = True
            self._sel.modify(self._sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return False

    def _refused_batch(self, address: tuple[str, int], exc: OSError) -> None:
        """A GSO send failed, not for a transient reason: off after GSO_REFUSALS in a row (an
        interface that refuses batches refuses each; one failure may be the moment's)."""
        self._batch_failures += 1
        self.gso_error = f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc.strerror}"
        if self._batch_failures < GSO_REFUSALS:
            self.stats["gso_errors"] += 1
            log.info("UDP GSO send to %s:%d failed (%s); that batch one datagram per call",
                     *address, exc)
            return
        self.gso = False
        self.stats["gso_refused"] += 1
        log.warning("UDP GSO refused %d times in a row sending to %s:%d (%s); one datagram per "
                    "call from now on", GSO_REFUSALS, *address, exc)


def _resolved(channel, topic: int, source: int, seq: int, sseq: int) -> list:
    out: list = []
    resolve(channel, topic, source, seq, sseq, out)
    return out
