"""The member runtime: one I/O loop per member process owning every socket and all protocol state.

The loop runs on one thread at a time, the *leader*: the runtime's I/O thread, or an application
thread that would otherwise only wait in `Subscriber.receive()` for the I/O thread to hand it
messages. A thread hand-off costs a wake-up (here about 20 us of CPU, more than the protocol work
of a datagram), so a receiver that waits takes the sockets itself: one wake-up per datagram, not
three (the I/O thread's, the application's, and the GIL passing between them). The I/O thread
steps aside when such a thread asks for the lead, and takes it back once that thread has left
`receive()` (it looks every PARK seconds, or at once when there is work to send).

Other application threads never touch protocol state. They hand work over through lock-free deques
(`deque.append`/`popleft` are atomic) and wake the leader with one byte on a socketpair only when
it sleeps. The loop goes QSM-style: drain every readable socket fully (inbound first), take
queued publishes, then let each writable destination *pull* its next datagram, built just in time
from queued messages, as long as that destination's bytes-bounded window is open.

Flow control: receivers acknowledge the highest datagram number they took from each sender's
channel, and withhold acknowledgements while their application lags behind by more than
`max_backlog_bytes`, so a slow consumer slows the sender instead of overflowing a socket buffer.
Above that, a publisher holds at most `stable_window_bytes` of reliable messages not yet stable
(see `recovery_path`).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from scopecast.actors.errors import InvalidConfig, WindowFull
from scopecast.netio import wire
from scopecast.netio.auth import authenticator
from scopecast.netio.channel import Channel
from scopecast.netio.delivery import Subscription
from scopecast.netio.feed import MESSAGE_COST, Feed
from scopecast.netio.interrupts import GUARD
from scopecast.netio.key_table import KeyTable
from scopecast.netio.native import IMPLEMENTATION, BatchScanner, BatchSealer
from scopecast.netio.reassembly import Reassembler
from scopecast.netio.receive_path import ACK_NOW_GAP, ReceivePath
from scopecast.netio.recovery_path import IDLE_FROM, INF, RecoveryPath
from scopecast.netio.routing import RoutingLabel, origin_record
from scopecast.netio.send_path import SendPath
from scopecast.netio.transport import TransportConfig, multicast_socket, unicast_socket
from scopecast.netio.udp_batch import MIN_SEGMENTS, Offloads, batch_limit, detect, enable_gro
from scopecast.timing import TIMING

log = logging.getLogger(__name__)

PUBLISH_LINGER = TIMING.publish_linger
PARK = TIMING.park
HANDOVER_WAIT = TIMING.handover_wait
MANY_BYTES = 1 << 20  # publish_many checks the queue and the window once per this much
HOLE_DELAY = TIMING.hole_delay
MAX_MESSAGE, DEFAULT_MAX_MESSAGE = 0xFFFFFFFF, 16 << 20  # the wire's 32-bit lengths; the default
MAX_NAMES = 4096   # names of members remembered, current and gone
BEAT_EVERY = TIMING.beat_every
HEADER = wire.HEADER


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


@dataclass(slots=True, frozen=True)
class MemberInfo:
    """What a member needs to know of another member: its name and unicast address."""

    id: int
    name: str
    host: str
    port: int


@dataclass(slots=True, frozen=True)
class Route:
    """One forwarding-table entry: messages matching `label` go along `channel`."""

    label: RoutingLabel
    channel: Channel


class MemberRuntime(ReceivePath, SendPath, RecoveryPath):
    """The data plane of one member process (see module docstring); the receive and send paths
    live in `receive_path` and `send_path`, the state they share is set up here."""

    def __init__(self, member_id: int, name: str, key: bytes,
                 config: RuntimeConfig | None = None) -> None:
        if len(name.encode()) > wire.MAX_ROUTE_NAME:
            raise ValueError(f"member name longer than {wire.MAX_ROUTE_NAME} bytes")
        config = config or RuntimeConfig()
        if config.transport.interface is None:
            config = replace(config, transport=replace(config.transport, interface="127.0.0.1"))
        self.config = config
        self.member_id = member_id
        self.name = name
        self.drops: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self._auth = authenticator(self.config.mac, key)
        self._trailer = self._auth.trailer_size
        tcfg = self.config.transport
        self._datagram = tcfg.datagram_size()
        self._sock = unicast_socket(tcfg)
        self.address: tuple[str, int] = self._sock.getsockname()
        # batch calls (udp_batch): GSO where a batch holds several datagrams of this size
        found = detect(tcfg.interface)
        self.offloads = Offloads(gso=tcfg.gso and found.gso
                                 and batch_limit(self._datagram) >= MIN_SEGMENTS,
                                 gro=tcfg.gro and found.gro and enable_gro(self._sock))
        self._gso = self.offloads.gso
        self._gro = self.offloads.gro
        # a GRO call's consecutive plain runs read in C, a GSO call's built there (GMAC only: see
        # _datagram_batch.c; without the extension, see `native`, one by one in Python)
        gmac = self.config.mac == "gmac"
        self._scanner = BatchScanner(key) if BatchScanner and self._gro and gmac else None
        self._sealer = BatchSealer(key) if BatchSealer and self._gso and gmac else None
        self._plain_most = batch_limit(self._datagram)  # datagrams of one sealed batch
        self._batch_parts: list = []  # the batch being made: [datagram, MAC] pairs
        self._batch_n = 0
        self._batch_address: tuple[str, int] = ("", 0)
        self._batch_segment = 0
        self._batch_most = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._want_write = False
        self._groups: dict[tuple[str, int], socket.socket] = {}
        self._recv_size = 65_536
        self._capacity = self._datagram - self._trailer
        self._queue_limit = self.config.queue_bytes
        self._window_limit = self.config.stable_window_bytes
        self._delivery_cap = 2 * self.config.max_backlog_bytes  # see ReceivePath._deliver
        self._origin = origin_record(name)
        self._reassembler = Reassembler(self.config.max_message_bytes,
                                        self.config.reassembly_budget_bytes,
                                        self.config.reassembly_timeout)
        # protocol state, owned by the I/O thread
        self._members: dict[int, MemberInfo] = {}
        self._names: dict[int, str] = {}  # member -> name, kept a while after it left (its
                                          # messages still come as repairs: they keep its name)
        self._topic_names: dict[int, str] = {}
        self._sessions: dict[int, int] = {}      # topic -> latest session announced (I/O thread)
        self.publish_sessions: dict[int, int] = {}  # topic -> session publishers use (control)
        # (topic, session) -> seq of this member's last end marker: a later publisher of it in
        # this process numbers on from there (receivers drop a restart at 1 as duplicates)
        self.stream_ends: dict[tuple[int, int], int] = {}
        self._routes: dict[int, Sequence[Route]] = {}
        self._plans: dict[tuple, list] = {}
        # (topic, source, session) -> the routing record its runs came with, for forwarding the
        # runs a repair brings (see ReceivePath._accept)
        self._stream_paths: dict[tuple, tuple] = {}
        self._own_plans: dict[int, tuple] = {}  # see SendPath._own_plan
        self._own_alike: dict[tuple, tuple] = {}  # see SendPath._own_plan
        self._route_tables: dict[tuple, tuple] = {}  # record -> (it, encoded); SendPath._plan
        self._subs: dict[int, tuple[Subscription, ...]] = {}
        self._plain: dict[int, tuple] | None = None  # see ReceivePath._plain_topics
        self._subscriptions: list[Subscription] = []
        self._to_wake: list[Subscription] = []
        self._touched: list[Subscription] = []  # subscribers with messages in their inbox
        self._feeds: dict[tuple[str, int], Feed] = {}
        self._feeds_by_channel: dict[int, Feed] = {}
        self._stalled: tuple | None = None  # (address, [datagram, MAC, ...], GSO segment)
        self._active: deque[Feed] = deque()
        self._next_seq = KeyTable()  # (topic, source, session) -> next seq to deliver
        # (sender, channel) -> [dseq, dseq acked, when acked, when new data was last acked]
        self._recv_pos: dict[tuple[int, int], list] = {}
        self._held: deque[tuple[float, int, bytes]] = deque()
        self._held_bytes = 0
        self._early: dict[tuple, list] = {}  # (topic, source, session) -> EarlyRuns, in order
        self._early_bytes = 0
        self._releasing = False
        self._last_ack = 0.0
        self._ack_now = False  # a datagram asked for an acknowledgement without delay
        self._last_housekeeping = 0.0
        self._last_tail_probe = 0.0
        self._tails_open = False  # a feed's last datagrams may need a tail probe (see feed)
        # hand-over from application threads
        self._publish_q: deque[tuple] = deque()
        self._ops: deque = deque()
        self._sleeping = False
        self._wake_pending = False
        self._polled = False  # the loop has just polled: its next step need not
        # the I/O loop's leadership (see module docstring): held by the thread running the loop
        self._lead = threading.Lock()
        self._park = threading.Lock()  # the I/O thread waits on it while it does not lead
        self._park.acquire()
        self._io_leads = False
        self._handover = False          # a receiving application thread asks for the lead
        self._ordinal = itertools.count(1)  # stream sequence numbers; next() is atomic
        self.app_bytes = 0      # queued by publishers (application threads)
        self.taken_bytes = 0    # taken off the hand-over queue (I/O thread)
        self.feed_bytes = 0     # waiting in destination queues (I/O thread)
        self._taken_sseq = 0
        self.handed = 0         # every own message with stream seq <= handed is on the wire
        self._space = threading.Event()
        # what the application threads blocked in _wait_until wait for: the I/O thread wakes them
        # once one of these holds, not after every step (a saturating publisher would be woken,
        # and take the GIL, thousands of times a second to find its queue still full)
        self._waiting_for: list = []
        self.unknown_sender = threading.Event()  # set for the control thread: refresh members
        self._stop = False
        self._init_recovery()
        if self.config.freeze_gc:
            gc.freeze()
        self._thread = threading.Thread(target=self._run, name=f"scopecast-io-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- application side (any thread)

    def call(self, fn, *args) -> None:
        """Run `fn(*args)` on the I/O thread (table installs, subscriptions, ...)."""
        self._ops.append((fn, args))
        self._wake()

    def call_wait(self, fn, *args, timeout: float = 10.0, beat=None):
        """Run `fn(*args)` on the I/O thread and return its result (or raise its exception);
        `beat()`, if given, is called every BEAT_EVERY seconds while the I/O thread is busy."""
        done = threading.Event()
        box: list = []

        def run() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box.append((False, exc))
            done.set()

        self.call(run)
        end = time.monotonic() + timeout
        while not done.wait(timeout if beat is None else
                            min(BEAT_EVERY, max(0.0, end - time.monotonic()))):
            if beat is None or time.monotonic() >= end:
                raise TimeoutError(f"I/O thread did not run {fn.__name__} within {timeout}s")
            beat()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def publish(self, topic: int, session: int, seq: int, ctype: int, payload: bytes) -> int:
        """Queue one message; returns its stream sequence number (for `wait_sent`)."""
        if self.app_bytes - self.taken_bytes + self.feed_bytes > self._queue_limit:
            self._wait_for_space()
        if self.app_bytes - self.released_bytes > self._window_limit:
            self._wait_for_window()
        sseq = next(self._ordinal)
        self.app_bytes += MESSAGE_COST + len(payload)
        self._publish_q.append((sseq, topic, session, seq, ctype, payload))  # a cache entry
        if self._sleeping and not self._wake_pending:
            self._wake_pending = True
            self._wake()
        return sseq

    def publish_many(self, topic: int, session: int, first_seq: int, ctype: int,
                     payloads: list) -> tuple[int, int]:
        """Queue `payloads` as messages `first_seq`, `first_seq` + 1, ... of one topic, in
        chunks of up to MANY_BYTES with the queue and window checked once per chunk (the
        per-message work in C). Returns how many were queued — all, unless the window fills and
        the runtime does not block (then the chunks before; WindowFull if not even the first)
        — and the stream sequence number of the last one."""
        q, ordinal, total = self._publish_q, self._ordinal, len(payloads)
        sseq = start = 0
        # costs[i]: the queue bytes of the first i payloads, summed in C (not a loop per message)
        costs = list(itertools.accumulate(map(MESSAGE_COST.__add__, map(len, payloads)), initial=0))
        while start < total:
            if self.app_bytes - self.taken_bytes + self.feed_bytes > self._queue_limit:
                self._wait_for_space()
            if self.app_bytes - self.released_bytes > self._window_limit:
                if start and not self.config.block_when_full:
                    break
                self._wait_for_window()
            end = min(bisect.bisect_left(costs, costs[start] + MANY_BYTES, start + 1), total)
            size = costs[end] - costs[start]
            sseqs = list(itertools.islice(ordinal, end - start))
            self.app_bytes += size
            q.extend(zip(sseqs, itertools.repeat(topic), itertools.repeat(session),
                         range(first_seq + start, first_seq + end), itertools.repeat(ctype),
                         payloads[start:end]))
            sseq, start = sseqs[-1], end
            if self._sleeping and not self._wake_pending:
                self._wake_pending = True
                self._wake()
        return start, sseq

    def end_stream(self, topic: int, session: int, last_seq: int) -> int:
        """Queue an end-of-stream marker behind the messages already published on `topic`: the
        stream's last message (seq `last_seq` + 1), so it is ordered, forwarded, repaired and
        made stable like the rest. Returns its stream sequence number."""
        sseq = self.publish(topic, session, last_seq + 1, wire.ContentType.END, b"")
        self.stream_ends[(topic, session)] = last_seq + 1
        return sseq

    def _queued(self) -> int:
        return self.app_bytes - self.taken_bytes + self.feed_bytes

    def _wait_for_space(self) -> None:
        # wait for the queue to drain to half the limit, so that a saturating publisher blocks and
        # wakes once per half-queue rather than once per message
        limit = self._queue_limit // 2
        self._wait_until(lambda: self._queued() <= limit)

    def _wait_for_window(self) -> None:
        """Own messages of reliable topics fill the window until they are stable."""
        if not self.config.block_when_full:
            raise WindowFull(f"{self.app_bytes - self.released_bytes} bytes published and not yet "
                             f"stable exceed stable_window_bytes={self._window_limit}; slow "
                             "down, flush(), or configure block_when_full=True")
        began = time.monotonic()
        self._wait_until(lambda: self.app_bytes - self.released_bytes <= self._window_limit)
        # (app thread: only it writes these two counters)
        self.stats["window_full_waits"] += 1
        self.stats["window_full_ms"] += round((time.monotonic() - began) * 1000)

    def wait_stable(self, sseq: int, timeout: float) -> bool:
        """Wait until every own message up to stream sequence `sseq` is stable."""
        return self._wait_until(lambda: self.stable_sseq >= sseq, timeout)

    def wait_sent(self, sseq: int, timeout: float) -> bool:
        """Wait until every message up to stream sequence `sseq` was handed to the socket."""
        return self._wait_until(lambda: self.handed >= sseq, timeout, poke=True)

    def _wait_until(self, done, timeout: float | None = None, poke: bool = False) -> bool:
        """Block an application thread until `done()` (the I/O thread signals progress), the
        timeout, or close; `poke` wakes the I/O thread each time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting_for.append(done)
        try:
            while not done():
                remaining = 0.05 if deadline is None else min(deadline - time.monotonic(), 0.05)
                if remaining <= 0 or self._stop:
                    return done()
                if poke:
                    self._wake()
                self._space.wait(remaining)
                self._space.clear()
            return True
        finally:
            self._waiting_for.remove(done)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")  # (the leader's poll watches it)
        except (BlockingIOError, OSError):
            pass  # already a wake-up pending (or closing)
        if not self._lead.locked():  # nobody leads: the I/O thread takes the lead at once
            self._unpark()

    def _unpark(self) -> None:
        try:
            self._park.release()
        except RuntimeError:
            pass  # already released: the I/O thread is about to look

    def close(self, timeout: float = 5.0) -> None:
        if self._stop:
            return
        self._stop = True
        self._wake()
        self._unpark()
        self._thread.join(timeout)
        # a receiving thread that leads leaves the loop at once (woken, it sees the stop)
        led = self._lead.acquire(timeout=timeout)
        for s in list(self._groups.values()) + [self._sock, self._wake_r, self._wake_w]:
            try:
                s.close()
            except OSError:
                pass
        self._sel.close()
        if led:
            self._lead.release()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------- control installs (I/O thread)

    def install_members(self, members: list[MemberInfo]) -> None:
        if self._members.keys() - {m.id for m in members}:
            # what a member that left held for this one to forward is gone: evidence of loss
            self.loss_seen_at = time.monotonic()
            self.stats["loss_member_left"] += 1
        self._members = {m.id: m for m in members}
        names = self._names
        for m in members:
            names.pop(m.id, None)
            names[m.id] = m.name
        if len(names) > MAX_NAMES:  # forget the longest gone (never a current member)
            for gone in [k for k in names if k not in self._members][:len(names) - MAX_NAMES]:
                del names[gone]
        for key in [k for k in self._recv_pos if k[0] not in self._members]:
            del self._recv_pos[key]
        self._release_held()

    def held_senders(self) -> set[int]:
        """Members to look up: senders of datagrams held because no view named them yet, and
        senders this member must ask for repairs."""
        held = {sender for _t, sender, _data in self._held}
        return held | (self._unknown_sources - set(self._members))

    def install_topics(self, names: dict[int, str], sessions: dict[int, int] | None = None) -> None:
        """Topic names, and the current session of each: a run of a later session is refused
        until the scope announces it (publishers wait for every member to know it). The dicts
        are the runtime's from now on (not copied: thousands of topics, one member)."""
        self._topic_names = names
        if sessions is not None:
            self._sessions = sessions
        self._tables_changed()
        for sub in self._subscriptions:
            self._match_patterns(sub)

    def _tables_changed(self) -> None:
        """Topics, routes, subscriptions or reliable topics changed: the per-topic lookups of the
        receive and send paths (`_plain`, `_own_plans`) are made again on first use."""
        self._plain = None
        self._own_plans.clear()
        self._own_alike.clear()

    def _match_patterns(self, sub: Subscription) -> None:
        """A pattern subscription takes in the known topics it matches."""
        if sub.patterns:
            new = [t for t, n in self._topic_names.items()
                   if t not in sub.topics and any(p.match(n) for p in sub.patterns)]
            if new:
                sub.topics.update(new)
                self._index(sub, new)

    def install_routes(self, routes: dict[int, Sequence[Route]],
                       receivers: dict[tuple[str, int], set[int]] | None = None) -> None:
        """Replace the forwarding table (`routes` is the runtime's from now on); feeds of
        unchanged destinations keep their queues."""
        self._routes = routes
        self._tables_changed()
        self._plans.clear()
        self._route_tables.clear()
        now = time.monotonic()
        receivers = receivers or {}
        for address in receivers:
            self._feed(address)
        for address, feed in self._feeds.items():
            feed.set_receivers(set(receivers.get(address, ())) - {self.member_id}, now)
        self._note_receivers(set().union(*receivers.values()) - {self.member_id})

    def install_groups(self, wanted: set[tuple[str, int]]) -> None:
        """Join exactly the multicast groups in `wanted`."""
        for group, port in list(self._groups):
            if (group, port) not in wanted:
                self.leave_group(group, port)
        for group, port in sorted(wanted):
            self.join_group(group, port)

    def join_group(self, group: str, port: int) -> None:
        if (group, port) in self._groups:
            return
        sock = multicast_socket(self.config.transport, group, port)
        if self._gro:
            enable_gro(sock)
        self._groups[(group, port)] = sock
        self._sel.register(sock, selectors.EVENT_READ)

    def leave_group(self, group: str, port: int) -> None:
        sock = self._groups.pop((group, port), None)
        if sock is not None:
            self._sel.unregister(sock)
            sock.close()

    def add_subscription(self, sub: Subscription) -> None:
        self._subscriptions.append(sub)
        self._index(sub, sub.topics)
        self._match_patterns(sub)

    def _index(self, sub: Subscription, topics) -> None:
        self._tables_changed()
        grown: dict[tuple, tuple] = {}  # topics alike share one tuple of subscriptions
        subs = self._subs
        for t in topics:
            old = subs.get(t, ())
            new = grown.get(old)
            if new is None:
                new = grown[old] = old + (sub,)
            subs[t] = new

    def remove_subscription(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        for t in sub.topics:
            rest = tuple(s for s in self._subs.get(t, ()) if s is not sub)
            if rest:
                self._subs[t] = rest
            else:
                self._subs.pop(t, None)
        self._tables_changed()
        self.forget_keys(sub.topics - self._subs.keys())
        sub.event.set()  # a receive() waiting on it returns

    def snapshot(self) -> dict:
        """Counters and table sizes for status (runs on the I/O thread)."""
        return {
            "member": self.member_id, "name": self.name, "address": list(self.address),
            "drops": dict(self.drops), "stats": dict(self.stats),
            "groups": [f"{g}:{p}" for g, p in self._groups],
            "offloads": self._offload_status(),
            "feeds": {f"{h}:{p}": {"in_flight": f.in_flight(), "window": f.window.size,
                                   "queued": f.queued_chunks(),
                                   "receivers": sorted(f.acks)}
                      for (h, p), f in self._feeds.items()},
            "topics": sorted(self._subs),
            "backlog_bytes": max((s.backlog() for s in self._subscriptions), default=0),
            "recovery": {"agents": {p: "%s:%d" % a for p, a in self._agents.items()},
                         "reliable_topics": len(self._reliable),  # a count: sent each second
                         "window_bytes": self.app_bytes - self.released_bytes,
                         "window_limit": self._window_limit, "stable_sseq": self.stable_sseq,
                         "cacher": self._cacher, "token_period": self._period,
                         "light": self.light(),
                         "senders_known": sorted(self._records),
                         "gaps": len(self._nak_at), "held_early_bytes": self._early_bytes,
                         "cached_runs": self._peer_cache.count(),
                         "repair_ms": percentiles(self.repair_ms)},
        }

    def _offload_status(self) -> dict:
        """Which batch calls are on, datagrams per call so far, which `native` parts run."""
        st = self.stats
        return {"gso": self._gso, "gro": self._gro, "native": IMPLEMENTATION,
                "datagram_bytes": self._datagram,
                "datagrams_per_send": round(st["datagrams_out"] / st["send_calls"], 2)
                if st["send_calls"] else None,
                "datagrams_per_receive": round(st["datagrams_in"] / st["recv_calls"], 2)
                if st["recv_calls"] else None,
                # plain-run batches built, and received datagrams read, in C (_datagram_batch.c)
                "datagrams_sealed": st["datagrams_sealed"],
                "datagrams_scanned": st["datagrams_scanned"]}

    # -------------------------------------------------------------------------- the I/O loop

    def _run(self) -> None:
        """The I/O thread: lead the loop unless an application thread does (see module
        docstring); while one does, look every PARK whether it still does."""
        while not self._stop:
            if self._lead.acquire(blocking=False):
                self._io_leads = True
                try:
                    self._loop(self._handing_over, INF)
                finally:
                    self._io_leads = False
                    self._handover = False
                    self._release_lead()
            if not self._stop:
                self._park.acquire(timeout=PARK)

    def _handing_over(self) -> bool:
        return self._handover

    def lead(self, done, timeout: float) -> bool:
        """Run the I/O loop on this (application) thread until `done()` or `timeout` seconds:
        a thread that would wait for the I/O thread to hand it messages takes the sockets
        itself (see module docstring). False, having done nothing, when another application
        thread leads (or the I/O thread does not step aside in time): wait as before."""
        deadline = time.monotonic() + timeout
        lead = self._lead
        if not lead.acquire(blocking=False):
            if not self._io_leads:
                return False  # another receiving thread leads
            self._handover = True
            self._wake()
            got = lead.acquire(timeout=max(0.0, min(HANDOVER_WAIT, timeout)))
            self._handover = False
            if not got:
                return False
            self.stats["handovers"] += 1
        stats = self.stats
        stats["receive_leads"] += 1
        taken = stats["datagrams_in"]
        held = GUARD.hold(self._wake)  # (Ctrl-C in the main thread: once the loop is left)
        try:
            self._loop((lambda: GUARD.interrupted or done()) if held else done, deadline)
        finally:
            stats["datagrams_in_receiving"] += stats["datagrams_in"] - taken
            self._release_lead()
            if self._publish_q or self._ops or self._stalled is not None \
                    or self._wake_pending or any(f.pending() for f in tuple(self._active)):
                self._unpark()  # work to finish: the I/O thread takes it over now
            if held:
                GUARD.release()
        return True

    def _release_lead(self) -> None:
        self._sleeping = True  # (a publish then wakes the I/O thread)
        self._lead.release()

    def _loop(self, done, deadline: float) -> None:
        """The I/O loop, on the leading thread, until `done()`, `deadline` or close."""
        sel = self._sel
        while not self._stop and not done():
            try:
                if not self._step(sel):
                    if done() or not self._idle(sel, deadline):
                        break
            except Exception:  # never let one bad event kill the member's data plane
                log.exception("scopecast I/O loop error (continuing)")
                self.drops["internal_error"] += 1
                self._sleeping = False

    def _idle(self, sel, deadline: float = INF) -> bool:
        """Wait for something to do (at most until `deadline`); False once it has passed."""
        self._sleeping = True
        left = INF
        if not self._publish_q and not self._ops:
            if deadline < INF:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._sleeping = False
                    return False
            if self._wake_pending:
                # woken by a publisher a moment ago: linger, so that a burst of publishes
                # costs one wake-up per linger period instead of one per message
                self._poll(sel, min(PUBLISH_LINGER, left))
                self._wake_pending = False
            else:
                self._poll(sel, min(self._idle_timeout(), left))
            self._polled = True
        self._sleeping = False
        return True

    def _step(self, sel) -> bool:
        if self._polled:  # (the loop's wait has just polled)
            self._polled = False
        else:
            self._poll(sel, 0)
        while self._ops:
            fn, args = self._ops.popleft()
            fn(*args)
        if self._publish_q:
            self._take_publishes()
        sent = self._pump()
        now = time.monotonic()
        if now - self._last_ack >= (ACK_NOW_GAP if self._ack_now else self.config.ack_period):
            self._send_acks(now)
        if sent:
            self._tails_open = True
        elif self._tails_open and now - self._last_tail_probe >= self.config.ack_period:
            self._last_tail_probe = now
            self._tails_open = self._probe_tails(now)
        if now - self._last_housekeeping >= 0.1:
            self._housekeeping(now)
        # at once when a hole opens, when one NAKed is due to be asked for again, and when the
        # stream moves again while the period is idle (else a sender stalled on its window would
        # wait a whole idle period to say so); soon again while idle and unstable (`_settling`)
        if now - self._last_summary >= self._period or (
                (self.hole_opened or now >= self.retry_at or now >= self.settle_at
                 or self.progressed and self._period > IDLE_FROM)
                and now - self._last_summary >= HOLE_DELAY):
            self._recovery_tick(now)
        if self._waiting_for and any(done() for done in tuple(self._waiting_for)):
            self._space.set()
        if self._to_wake:
            self._wake_subscribers()
        return sent or bool(self._publish_q)

    def _idle_timeout(self) -> float:
        if self.hole_opened or self.progressed and self._period > IDLE_FROM:
            return HOLE_DELAY
        if self._ack_now:
            timeout = ACK_NOW_GAP
        elif self._tails_open or any(pos[0] != pos[1] for pos in self._recv_pos.values()):
            timeout = self.config.ack_period
        else:
            timeout = min(0.1, self._period) if self._reliable or self._early else 0.1
        due = min(self.retry_at, self.settle_at)  # (a NAKed hole to ask for again, a report)
        if due < INF:
            timeout = min(timeout, max(HOLE_DELAY, due - time.monotonic()))
        return timeout

    def _poll(self, sel, timeout: float) -> None:
        events = sel.select(timeout)
        if len(events) > 1:
            # the member's own socket first: NAKs, repairs and acknowledgements come there, and
            # must not wait behind a backlog of new data on a multicast socket (QSM gives
            # recovery priority, thesis 4611-4616)
            events.sort(key=lambda event: event[0].fileobj is not self._sock)
        for key, mask in events:
            sock = key.fileobj
            if mask & selectors.EVENT_READ:
                if sock is self._wake_r:
                    try:
                        while sock.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                else:
                    self._drain(sock)
            if mask & selectors.EVENT_WRITE and self._want_write:
                self._want_write = False
                sel.modify(self._sock, selectors.EVENT_READ)
        if self._to_wake:
            self._wake_subscribers()

    def _housekeeping(self, now: float) -> None:
        self._last_housekeeping = now
        expired = self._reassembler.expire()
        if expired:
            self.drops["reassembly_timeout"] += expired
        if self._held and now - self._held[0][0] > self.config.unknown_sender_grace:
            self._release_held()
        if self._early:
            self._expire_early(now)
        for feed in self._feeds.values():
            for member in feed.expire(now, self.config.ack_timeout):
                self.stats["receiver_timeouts"] += 1
                log.warning("receiver %s of %s:%d silent for %.1fs; no longer waiting for it",
                            member, *feed.address, self.config.ack_timeout)


def percentiles(values) -> dict:
    """p50/p99/p99.9/max (nearest rank) of repair times in ms, with their count."""
    v = sorted(values)
    if not v:
        return {"count": 0}
    n = len(v)
    return {"count": n, "p50": round(v[n // 2], 1),
            "p99": round(v[min(n - 1, n * 99 // 100)], 1),
            "p99.9": round(v[min(n - 1, n * 999 // 1000)], 1), "max": round(v[-1], 1)}
