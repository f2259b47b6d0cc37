"""The member runtime: one I/O loop per member process owning every socket, and the protocol
state in parts that own theirs (see `member_parts`).

The loop runs on one thread at a time, the *leader*: the I/O thread, or an application thread
that would otherwise only wait in `Subscriber.receive()` for the I/O thread to hand it messages.
A hand-off costs a wake-up (about 20 us of CPU here, more than a datagram's protocol work), so a
receiver that waits takes the sockets itself: one wake-up per datagram, not three. The I/O thread
steps aside when such a thread asks for the lead and takes it back once that thread has left
`receive()` (it looks PARK to PARK_MOST seconds later, or at once when there is work to send).

Other application threads never touch protocol state: they hand work over through lock-free
deques and wake the leader with one byte on a socketpair only when it sleeps. The loop goes
QSM-style: drain every readable socket (inbound first), take queued publishes, then let each
writable destination *pull* its next datagram, built just in time from queued messages, while
that destination's bytes-bounded window is open.

Flow control: receivers acknowledge the highest datagram number they took from each sender's
channel and withhold acknowledgements while their application lags by more than
`max_backlog_bytes` (`channel_acks`), so a slow consumer slows the sender instead of overflowing a
socket buffer; a publisher holds at most `stable_window_bytes` of reliable messages not yet
stable (`own_stream`).
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
from contextlib import suppress
from dataclasses import replace

from scopecast.actors.errors import WindowFull
from scopecast.netio import wire
from scopecast.netio.auth import KeyRing
from scopecast.netio.channel_acks import ChannelAcks
from scopecast.netio.delivery import Delivery, Subscription
from scopecast.netio.feed import MESSAGE_COST
from scopecast.netio.interrupts import GUARD
from scopecast.netio.joins import Joins
from scopecast.netio.member_parts import MemberBasics, MemberInfo, MemberTables, Route
from scopecast.netio.own_stream import OwnStream
from scopecast.netio.receive_path import ReceivePath
from scopecast.netio.recovery_path import INF, RecoveryPath
from scopecast.netio.reorder_buffer import ReorderBuffer
from scopecast.netio.repair_server import MemberRepairs
from scopecast.netio.runtime_config import DEFAULT_MAX_MESSAGE, RuntimeConfig, percentiles
from scopecast.netio.send_path import SendPath
from scopecast.netio.thread_stack import innermost
from scopecast.netio.transport import multicast_socket, unicast_socket
from scopecast.netio.udp_batch import MIN_SEGMENTS, Offloads, batch_limit, detect, enable_gro, offload_status
from scopecast.timing import TIMING

log = logging.getLogger(__name__)
PUBLISH_LINGER, HANDOVER_WAIT = TIMING.publish_linger, TIMING.handover_wait
PARK, PARK_MOST = TIMING.park, TIMING.park_most
MANY_BYTES = 1 << 20  # publish_many checks the queue and the window once per this much
ROOM_AHEAD = 1 << 18  # publish() looks at the queue and the window at least once per this much
BEAT_EVERY = TIMING.beat_every


class MemberRuntime:
    """The data plane of one member process (see module docstring): the I/O loop, the
    application side, and the control installs; the protocol work is its parts' (`sender`,
    `receiver`, `reorder`, `acks`, `delivery`, `own`, `joins`, `recovery`: see `member_parts`),
    wired here."""

    def __init__(self, member_id: int, name: str, key: bytes,
                 config: RuntimeConfig | None = None) -> None:
        if len(name.encode()) > wire.MAX_ROUTE_NAME:
            raise ValueError(f"member name longer than {wire.MAX_ROUTE_NAME} bytes")
        config = config or RuntimeConfig()
        if config.transport.interface is None:
            config = replace(config, transport=replace(config.transport, interface="127.0.0.1"))
        self.config = config
        self._member_id, self.name = member_id, name
        self.drops: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        tcfg = config.transport
        datagram = tcfg.datagram_size()
        self._sock = unicast_socket(tcfg)
        self.address: tuple[str, int] = self._sock.getsockname()
        # batch calls (udp_batch): GSO where a batch holds several datagrams of this size
        found = detect(tcfg.interface)
        self.offloads = Offloads(gso=tcfg.gso and found.gso
                                 and batch_limit(datagram) >= MIN_SEGMENTS,
                                 gro=tcfg.gro and found.gro and enable_gro(self._sock))
        self._datagram = datagram
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._groups: dict[tuple[str, int], socket.socket] = {}
        self._queue_limit, self._window_limit = config.queue_bytes, config.stable_window_bytes
        self.publish_sessions: dict[int, int] = {}  # topic -> session publishers use (control)
        # (topic, session) -> seq of this member's last end marker: a later publisher of it in
        # this process numbers on from there (receivers drop a restart at 1 as duplicates)
        self.stream_ends: dict[tuple[int, int], int] = {}
        self._last_housekeeping = self._last_tail_probe = 0.0
        self._tails_open = False  # a feed's last datagrams may need a tail probe (see feed)
        self._publish_q: deque[tuple] = deque()  # hand-overs from application threads
        self._ops: deque = deque()  # calls for the I/O thread (call, call_wait)
        self._sleeping = self._wake_pending = self._polled = False  # (_polled: see _step)
        # the I/O loop's leadership (see module docstring): held by the thread running the loop
        self._lead = threading.Lock()
        self._park = threading.Lock()  # the I/O thread waits on it while it does not lead
        self._park.acquire()
        self.park_for = PARK  # how long it waits there at a time (see _run)
        self._io_leads, self._handover = False, False  # (_handover: a receiving thread asks)
        self._ordinal = itertools.count(1)  # stream sequence numbers; next() is atomic
        self.app_bytes = 0      # queued by publishers (application threads)
        self._room_until = 0    # app_bytes up to which publish() need not look (_make_room)
        self._space = threading.Event()
        # what the application threads blocked in _wait_until wait for: the I/O thread wakes them
        # once one of these holds, not after every step (a saturating publisher would be woken,
        # and take the GIL, thousands of times a second to find its queue still full)
        self._waiting_for: list = []
        self.unknown_sender = threading.Event()  # set for the control thread: refresh members
        self.stopped = False  # closed (set once)
        # the parts (protocol state, owned by the I/O thread)
        self.tables = MemberTables()
        # (the C batch sealer and scanner only serve GSO and GRO calls; key rotation: install_keys)
        self.keys = KeyRing(config.mac, [key], batches=self.offloads.gso or self.offloads.gro)
        basics = MemberBasics(member_id, name, config, self._sock, self.keys,
                              datagram, self.stats, self.drops, self.unknown_sender, self.address)
        self.receiver = ReceivePath(basics, self.tables, self.offloads.gro)
        self.own = OwnStream(self.stats, self._space)
        self.sender = SendPath(basics, self.tables, self.own, self._publish_q, self._sel,
                               self.offloads.gso)
        self.joins = Joins(self.stats, self.tables, self.own)
        self.recovery = RecoveryPath(basics, self.tables, self.own, self.joins)
        self.delivery = Delivery(member_id, name, self.tables, self.stats, config.max_backlog_bytes)
        self.acks = ChannelAcks(basics, self.tables, self.receiver.send_control, self.recovery)
        self.reorder = ReorderBuffer(config, self.stats, self.drops, self.receiver.next_seq,
                                     self.receiver.take_run, self.recovery, self.joins, self.delivery)
        self.joins.connect(self.receiver, self.reorder, self.delivery, self.recovery.look_up)
        self.repairs = MemberRepairs(basics, self.tables, self.own, self.recovery.peer_cache,
                                     self.receiver.drop)
        self.receiver.connect(self.delivery, self.acks, self.joins, self.reorder, self.repairs,
                              self.sender, self.recovery)
        self.sender.connect(self.delivery, self.receiver, self.recovery)
        self.recovery.connect(self.delivery, self.reorder, self.repairs, self.receiver, self.sender)
        if config.freeze_gc:
            gc.freeze()
        self._thread = threading.Thread(target=self._run, name=f"scopecast-io-{name}", daemon=True)
        self._thread.start()

    @property
    def member_id(self) -> int:
        return self._member_id

    @member_id.setter
    def member_id(self, member_id: int) -> None:
        """The id its scope registered this member under (after its socket, its address, exists)."""
        self._member_id = member_id
        for part in (self.receiver, self.sender, self.recovery, self.delivery, self.repairs, self.acks):
            part.member_id = member_id

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
                raise TimeoutError(f"I/O thread did not run {fn.__name__} within {timeout}s; it "
                                   f"{'leads' if self._io_leads else 'does not lead'} the loop, "
                                   f"in: {innermost(self._thread)}")
            beat()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def publish(self, topic: int, session: int, seq: int, ctype: int, payload: bytes) -> int:
        """Queue one message; returns its stream sequence number (for `wait_sent`)."""
        if self.app_bytes > self._room_until:
            self._make_room()
        sseq = next(self._ordinal)
        self.app_bytes += MESSAGE_COST + len(payload)
        self._publish_q.append((sseq, topic, session, seq, ctype, payload))  # a cache entry
        if self._sleeping and not self._wake_pending:
            self._wake_pending = True
            self._wake()
        return sseq

    def publish_many(self, topic: int, session: int, first_seq: int, ctype: int,
                     payloads: list) -> tuple[int, int]:
        """Queue `payloads` as messages `first_seq`, `first_seq` + 1, ... of one topic, in chunks
        of up to MANY_BYTES, the queue and window checked once a chunk. Returns how many were
        queued (all, unless the window fills and the runtime does not block: then the chunks
        before, WindowFull if none) and the stream sequence number of the last one."""
        q, ordinal, total = self._publish_q, self._ordinal, len(payloads)
        sseq = start = 0
        # costs[i]: the queue bytes of the first i payloads, summed in C (not a loop per message)
        costs = list(itertools.accumulate(map(MESSAGE_COST.__add__, map(len, payloads)), initial=0))
        while start < total:
            if self._queued() > self._queue_limit:
                self._wait_for_space()
            if self.app_bytes - self.own.released_bytes > self._window_limit:
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
        """Queue an end-of-stream marker behind `topic`'s messages: the stream's last message (seq
        `last_seq` + 1), ordered, forwarded, repaired and made stable like the rest; its sseq."""
        sseq = self.publish(topic, session, last_seq + 1, wire.ContentType.END, b"")
        self.stream_ends[(topic, session)] = last_seq + 1
        return sseq

    def _make_room(self) -> None:
        """Wait for room in the queue and the window, and note up to where it surely lasts (it
        only grows; forwarded bytes also fill the queue: seen ROOM_AHEAD on, at the latest)."""
        if self._queued() > self._queue_limit:
            self._wait_for_space()
        if self.app_bytes - self.own.released_bytes > self._window_limit:
            self._wait_for_window()
        sender = self.sender
        self._room_until = min(sender.taken_bytes - sender.feed_bytes + self._queue_limit,
                               self.own.released_bytes + self._window_limit,
                               self.app_bytes + ROOM_AHEAD)

    def _queued(self) -> int:
        return self.app_bytes - self.sender.taken_bytes + self.sender.feed_bytes

    def _wait_for_space(self) -> None:
        # wait for the queue to drain to half the limit, so that a saturating publisher blocks and
        # wakes once per half-queue rather than once per message
        limit = self._queue_limit // 2
        self._wait_until(lambda: self._queued() <= limit)

    def _wait_for_window(self) -> None:
        """Own messages of reliable topics fill the window until they are stable."""
        if not self.config.block_when_full:
            raise WindowFull(f"{self.app_bytes - self.own.released_bytes} bytes published and not "
                             f"yet stable exceed stable_window_bytes={self._window_limit}; slow "
                             "down, flush(), or configure block_when_full=True")
        began = time.monotonic()
        self._wait_until(lambda: self.app_bytes - self.own.released_bytes <= self._window_limit)
        self.stats["window_full_waits"] += 1  # (app thread: only it writes these two)
        self.stats["window_full_ms"] += round((time.monotonic() - began) * 1000)

    def wait_stable(self, sseq: int, timeout: float) -> bool:
        """Wait until every own message up to stream sequence `sseq` is stable."""
        return self._wait_until(lambda: self.own.stable_sseq >= sseq, timeout)

    def wait_sent(self, sseq: int, timeout: float) -> bool:
        """Wait until every message up to stream sequence `sseq` was handed to the socket."""
        return self._wait_until(lambda: self.sender.handed >= sseq, timeout, poke=True)

    def _wait_until(self, done, timeout: float | None = None, poke: bool = False) -> bool:
        """Block an application thread until `done()` (the I/O thread signals progress), the
        timeout, or close; `poke` wakes the I/O thread each time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting_for.append(done)
        try:
            while not done():
                remaining = 0.05 if deadline is None else min(deadline - time.monotonic(), 0.05)
                if remaining <= 0 or self.stopped:
                    return done()
                if poke:
                    self._wake()
                self._space.wait(remaining)
                self._space.clear()
            return True
        finally:
            self._waiting_for.remove(done)

    def _wake(self) -> None:
        with suppress(OSError):  # (a wake-up already pending, or closing)
            self._wake_w.send(b"\0")  # (the leader's poll watches it)
        if not self._lead.locked():  # nobody leads: the I/O thread takes the lead at once
            self._unpark()

    def _unpark(self) -> None:
        with suppress(RuntimeError):  # (already released: the I/O thread is about to look)
            self._park.release()

    def close(self, timeout: float = 5.0) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._wake()
        self._unpark()
        self._thread.join(timeout)
        # a receiving thread that leads leaves the loop at once (woken, it sees the stop)
        led = self._lead.acquire(timeout=timeout)
        for s in list(self._groups.values()) + [self._sock, self._wake_r, self._wake_w]:
            with suppress(OSError):
                s.close()
        self._sel.close()
        if led:
            self._lead.release()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------- control installs (I/O thread)

    def install_members(self, members: list[MemberInfo]) -> None:
        if self.tables.set_members(members):
            # what a member that left held for this one to forward is gone: evidence of loss
            self.recovery.loss_seen_at = time.monotonic()
            self.stats["loss_member_left"] += 1
        self.acks.members_changed()
        self.receiver.members_changed()

    def install_keys(self, keys: Sequence[bytes], generation: int) -> None:
        """Seal with keys[0] and accept any of `keys` from now on (a key rotation's step)."""
        self.keys.set(keys, generation)

    def held_senders(self) -> set[int]:
        """Members to look up: senders of held datagrams, senders to NAK, channel tree parents."""
        return self.receiver.held_senders() | self.recovery.to_look_up() | self.acks.to_look_up()

    def install_topics(self, names: dict[int, str], sessions: dict[int, int] | None = None) -> None:
        """Topic names, and the current session of each: a run of a later session is refused
        until the scope announces it (publishers wait for every member to know it). The dicts
        are the runtime's from now on (not copied: thousands of topics, one member)."""
        self.tables.topic_names = names
        if sessions is not None:
            self.tables.sessions = sessions
        for sub in self.tables.subscriptions:
            self.tables.match_patterns(sub)
        self._tables_changed()

    def _tables_changed(self) -> None:
        """Topics, routes, subscriptions or reliable topics changed: per-topic lookups anew."""
        self.receiver.tables_changed()
        self.sender.tables_changed()

    def install_recovery(self, agents: dict[str, tuple[str, int]], protocols: dict[int, str],
                         cached: set[int] = frozenset()) -> None:
        """This member's agents (per protocol) and its reliable topics' protocols."""
        self.recovery.install(agents, protocols, cached)
        self._tables_changed()

    def install_routes(self, routes: dict[int, Sequence[Route]],
                       receivers: dict[tuple[str, int], set[int]] | None = None) -> None:
        """Replace the forwarding table (`routes` is the runtime's from now on); feeds of
        unchanged destinations keep their queues."""
        self.tables.routes = routes
        self.receiver.tables_changed()
        receivers = receivers or {}
        self.sender.install_routes(receivers)
        self.joins.note_receivers(set().union(*receivers.values()) - {self.member_id})

    def install_groups(self, wanted: set[tuple[str, int]],
                       receivers: dict[tuple[str, int], tuple[int, ...]] | None = None) -> None:
        """Join exactly the multicast groups in `wanted` (`receivers`: each one's receivers)."""
        for group, port in list(self._groups):
            if (group, port) not in wanted:
                self.leave_group(group, port)
        for group, port in sorted(wanted):
            self.join_group(group, port)
        self.acks.groups_changed(receivers or {})

    def join_group(self, group: str, port: int) -> None:
        if (group, port) in self._groups:
            return
        sock = multicast_socket(self.config.transport, group, port)
        if self.offloads.gro:
            enable_gro(sock)
        self._groups[(group, port)] = sock
        self._sel.register(sock, selectors.EVENT_READ)

    def leave_group(self, group: str, port: int) -> None:
        sock = self._groups.pop((group, port), None)
        if sock is not None:
            self._sel.unregister(sock)
            sock.close()

    def add_subscription(self, sub: Subscription) -> None:
        self.tables.subscribe(sub)
        self._tables_changed()

    def remove_subscription(self, sub: Subscription) -> None:
        gone = self.tables.unsubscribe(sub)
        self._tables_changed()
        self.recovery.forget_keys(gone)
        sub.event.set()  # a receive() waiting on it returns

    def snapshot(self) -> dict:
        """Counters and table sizes for status (runs on the I/O thread)."""
        return {
            "member": self.member_id, "name": self.name, "address": list(self.address),
            "drops": dict(self.drops), "stats": dict(self.stats),
            "groups": [f"{g}:{p}" for g, p in self._groups],
            "offloads": self._offload_status(),
            "feeds": self.sender.status(), "key_generation": self.keys.generation,
            "topics": sorted(self.tables.subs),
            "backlog_bytes": max((s.backlog() for s in self.tables.subscriptions), default=0),
            "latency_ms": percentiles(self.receiver.latency_ms, 2),
            "recovery": {**self.recovery.status(),
                         "window_bytes": self.app_bytes - self.own.released_bytes,
                         "window_limit": self._window_limit,
                         "held_early_bytes": self.reorder.bytes,
                         "repair_ms": percentiles(self.recovery.repair_ms)},
        }

    def _offload_status(self) -> dict:
        return offload_status(Offloads(self.sender.gso, self.offloads.gro), self._datagram,
                              self.stats, self.sender.gso_error)

    # -------------------------------------------------------------------------- the I/O loop

    def _run(self) -> None:
        """The I/O thread: lead unless an application thread does (module docstring); while one
        does, look PARK later whether it still does, each time twice as late, up to PARK_MOST (a
        look every PARK cost 1 KB 1 -> 4 12%). A member that forwards looks every PARK: a pause
        over hole_delay in what it forwards is a hole to members taking the rest another way."""
        while not self.stopped:
            if self._lead.acquire(blocking=False):
                self._io_leads, self.park_for = True, PARK
                try:
                    self._loop(lambda: self._handover, INF)  # (until a receiving thread asks)
                finally:
                    self._io_leads = False
                    self._handover = False
                    self._release_lead()
            else:
                self.stats["park_looks"] += 1
                if not self.tables.routes:
                    self.park_for = min(2 * self.park_for, PARK_MOST)
            if not self.stopped:
                self._park.acquire(timeout=self.park_for)

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
            if self._publish_q or self._ops or self._wake_pending or self.sender.busy():
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
        while not self.stopped and not done():
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
            else:  # until the next acknowledgement, tail probe or recovery tick may be due
                self._poll(sel, min(self.recovery.idle_timeout(self.acks.timeout(self._tails_open)),
                                    left))
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
            self.sender.take_publishes()
        sent = self.sender.pump()
        now = time.monotonic()
        if now >= self.acks.due_at:
            self.acks.send_if_due(now)
        if sent:
            self._tails_open = True
        elif self._tails_open and now - self._last_tail_probe >= self.config.ack_period:
            self._last_tail_probe = now
            self._tails_open = self.sender.probe_tails(now)
        if now - self._last_housekeeping >= 0.1:
            self._housekeeping(now)
        recovery = self.recovery
        if now >= recovery.tick_at or recovery.hole_opened or recovery.progressed and recovery.idle:
            recovery.tick_if_due(now)
        if self._waiting_for and any(done() for done in tuple(self._waiting_for)):
            self._space.set()
        if self.delivery.to_wake:
            self.delivery.wake_subscribers()
        return sent or bool(self._publish_q)

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
                    self.receiver.drain(sock)
            if mask & selectors.EVENT_WRITE and self.sender.want_write:
                self.sender.want_write = False
                sel.modify(self._sock, selectors.EVENT_READ)
        if self.delivery.to_wake:
            self.delivery.wake_subscribers()

    def _housekeeping(self, now: float) -> None:
        self._last_housekeeping = now
        self.receiver.housekeeping(now)
        self.sender.expire_receivers(now)
        self.acks.expire_children(now)


__all__ = ["DEFAULT_MAX_MESSAGE", "MemberInfo", "MemberRuntime", "Route", "RuntimeConfig", "percentiles"]
