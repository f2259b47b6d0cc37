"""The member runtime: one I/O thread per member process owning every socket and all protocol state.

Application threads never touch protocol state. They hand work over through lock-free deques
(`deque.append`/`popleft` are atomic) and wake the I/O thread with one byte on a socketpair only when
it sleeps. The I/O thread loops QSM-style: drain every readable socket fully (inbound first), take
queued publishes, then let each writable destination *pull* its next datagram, built just in time
from queued messages, as long as that destination's bytes-bounded window is open.

Flow control (until the Reliability issue ties the window to stability): receivers acknowledge the
highest datagram number they took from each sender's channel, and withhold acknowledgements while
their application lags behind by more than `max_backlog_bytes`, so a slow consumer slows the sender
instead of overflowing a socket buffer.
"""

from __future__ import annotations

import gc
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from scopecast.actors.errors import InvalidConfig
from scopecast.netio import wire
from scopecast.netio.auth import authenticator
from scopecast.netio.delivery import Subscription
from scopecast.netio.feed import MESSAGE_COST, RUN_COST, Feed
from scopecast.netio.message import Message
from scopecast.netio.reassembly import Reassembler, ReassemblyError
from scopecast.netio.transport import TransportConfig, multicast_socket, unicast_socket
from scopecast.scopes.channel import Channel, FilteredChannel, endpoints, resolve
from scopecast.scopes.routing import RoutingLabel, forward, matches, origin_record

log = logging.getLogger(__name__)

LINGER = 0.0005  # seconds the I/O thread waits for more publishes after a wake-up
MAX_MESSAGE = 0xFFFFFFFF
HEADER = wire.HEADER


@dataclass(slots=True, frozen=True)
class RuntimeConfig:
    """Data-plane settings of one member process; the defaults work on one machine."""

    transport: TransportConfig = field(default_factory=TransportConfig)
    window_bytes: int = 4 << 20          # unacknowledged bytes in flight per destination
    queue_bytes: int = 8 << 20           # published but not yet sent; publish() blocks beyond
    max_backlog_bytes: int = 32 << 20    # delivered but not consumed; acks withheld beyond
    max_message_bytes: int = 16 << 20
    reassembly_budget_bytes: int = 64 << 20
    reassembly_timeout: float = 10.0
    ack_period: float = 0.002
    ack_timeout: float = 5.0             # a receiver silent this long stops holding the window
    unknown_sender_grace: float = 2.0    # how long datagrams of a not-yet-known member are held
    held_datagrams: int = 512
    mac: str = "gmac"                    # packet authenticator, see `auth` (set by the cluster)
    # Move every object alive when the member starts (Ray's and the application's start-up heap)
    # out of the cyclic garbage collector's reach (gc.freeze): otherwise each full collection walks
    # that whole heap, which here cost more than a third of a member's throughput. Turn it off if
    # the application drops cyclic garbage created before it joined.
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        for name in ("window_bytes", "queue_bytes", "max_backlog_bytes", "max_message_bytes",
                     "reassembly_budget_bytes", "held_datagrams"):
            if getattr(self, name) <= 0:
                raise InvalidConfig(f"RuntimeConfig.{name} must be positive")
        if self.max_message_bytes > MAX_MESSAGE:
            raise InvalidConfig(f"RuntimeConfig.max_message_bytes is at most {MAX_MESSAGE} (the "
                                "wire format's 32-bit lengths)")
        if min(self.ack_period, self.ack_timeout, self.reassembly_timeout) <= 0:
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


class MemberRuntime:
    """The data plane of one member process (see module docstring)."""

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
        self._origin = origin_record(name)
        self._reassembler = Reassembler(self.config.max_message_bytes,
                                        self.config.reassembly_budget_bytes,
                                        self.config.reassembly_timeout)
        # protocol state, owned by the I/O thread
        self._members: dict[int, MemberInfo] = {}
        self._topic_names: dict[int, str] = {}
        self._routes: dict[int, list[Route]] = {}
        self._plans: dict[tuple, list] = {}
        self._own_plans: dict[int, list] = {}
        self._subs: dict[int, tuple[Subscription, ...]] = {}
        self._subscriptions: list[Subscription] = []
        self._to_wake: list[Subscription] = []
        self._touched: list[Subscription] = []  # subscribers with messages in their inbox
        self._feeds: dict[tuple[str, int], Feed] = {}
        self._feeds_by_channel: dict[int, Feed] = {}
        self._stalled: tuple[Feed, bytes] | None = None
        self._active: deque[Feed] = deque()
        self._next_seq: dict[tuple[int, int, int], int] = {}
        self._recv_pos: dict[tuple[int, int], list] = {}  # (sender, channel) -> [dseq, acked, t]
        self._held: deque[tuple[float, int, bytes]] = deque()
        self._last_ack = 0.0
        self._last_housekeeping = 0.0
        # hand-over from application threads
        self._publish_q: deque[tuple] = deque()
        self._ops: deque = deque()
        self._sleeping = False
        self._wake_pending = False
        self._ordinal = itertools.count(1)  # stream sequence numbers; next() is atomic
        self.app_bytes = 0      # queued by publishers (application threads)
        self.taken_bytes = 0    # taken off the hand-over queue (I/O thread)
        self.feed_bytes = 0     # waiting in destination queues (I/O thread)
        self._taken_sseq = 0
        self.handed = 0         # every own message with stream seq <= handed is on the wire
        self._space = threading.Event()
        self._space_waiting = False
        self.unknown_sender = threading.Event()  # set for the control thread: refresh members
        self._stop = False
        if self.config.freeze_gc:
            gc.freeze()
        self._thread = threading.Thread(target=self._run, name=f"scopecast-io-{name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- application side (any thread)

    def call(self, fn, *args) -> None:
        """Run `fn(*args)` on the I/O thread (table installs, subscriptions, ...)."""
        self._ops.append((fn, args))
        self._wake()

    def call_wait(self, fn, *args, timeout: float = 10.0):
        done = threading.Event()
        box: list = []

        def run() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box.append((False, exc))
            done.set()

        self.call(run)
        if not done.wait(timeout):
            raise TimeoutError(f"I/O thread did not run {fn.__name__} within {timeout}s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def publish(self, topic: int, session: int, seq: int, ctype: int, payload: bytes) -> int:
        """Queue one message; returns its stream sequence number (for `wait_sent`)."""
        if self.app_bytes - self.taken_bytes + self.feed_bytes > self._queue_limit:
            self._wait_for_space()
        sseq = next(self._ordinal)
        self.app_bytes += MESSAGE_COST + len(payload)
        self._publish_q.append((topic, seq, sseq, payload, session, ctype))
        if self._sleeping and not self._wake_pending:
            self._wake_pending = True
            self._wake()
        return sseq

    def end_stream(self, topic: int, session: int, last_seq: int) -> None:
        """Queue an end-of-stream marker behind the messages already published on `topic`."""
        self._publish_q.append((topic, last_seq, 0, b"", session, 0))
        self._wake()

    def _queued(self) -> int:
        return self.app_bytes - self.taken_bytes + self.feed_bytes

    def _wait_for_space(self) -> None:
        # wait for the queue to drain to half the limit, so that a saturating publisher blocks and
        # wakes once per half-queue rather than once per message
        limit = self._queue_limit // 2
        while self._queued() > limit and not self._stop:
            self._space_waiting = True
            self._space.wait(0.05)
            self._space.clear()
        self._space_waiting = False

    def wait_sent(self, sseq: int, timeout: float) -> bool:
        """Wait until every message up to stream sequence `sseq` was handed to the socket."""
        deadline = time.monotonic() + timeout
        while self.handed < sseq:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stop:
                return self.handed >= sseq
            self._space_waiting = True
            self._wake()
            self._space.wait(min(remaining, 0.05))
            self._space.clear()
        return True

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already a wake-up pending (or closing)

    def close(self, timeout: float = 5.0) -> None:
        if self._stop:
            return
        self._stop = True
        self._wake()
        self._thread.join(timeout)
        for s in list(self._groups.values()) + [self._sock, self._wake_r, self._wake_w]:
            try:
                s.close()
            except OSError:
                pass
        self._sel.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------- control installs (I/O thread)

    def install_members(self, members: list[MemberInfo]) -> None:
        self._members = {m.id: m for m in members}
        for key in [k for k in self._recv_pos if k[0] not in self._members]:
            del self._recv_pos[key]
        self._release_held()

    def install_topics(self, names: dict[int, str]) -> None:
        self._topic_names = dict(names)
        for sub in self._subscriptions:
            self._match_patterns(sub)

    def _match_patterns(self, sub: Subscription) -> None:
        """A pattern subscription takes in the known topics it matches."""
        if sub.patterns:
            new = [t for t, n in self._topic_names.items()
                   if t not in sub.topics and any(p.match(n) for p in sub.patterns)]
            if new:
                sub.topics.update(new)
                self._index(sub, new)

    def install_routes(self, routes: dict[int, list[Route]],
                       receivers: dict[tuple[str, int], set[int]] | None = None) -> None:
        """Replace the forwarding table; feeds of unchanged destinations keep their queues."""
        self._routes = {t: list(rs) for t, rs in routes.items()}
        self._plans.clear()
        self._own_plans.clear()
        now = time.monotonic()
        receivers = receivers or {}
        for address in receivers:
            self._feed(address)
        for address, feed in self._feeds.items():
            feed.set_receivers(set(receivers.get(address, ())) - {self.member_id}, now)

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
        for t in topics:
            self._subs[t] = self._subs.get(t, ()) + (sub,)

    def remove_subscription(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        for t in sub.topics:
            rest = tuple(s for s in self._subs.get(t, ()) if s is not sub)
            if rest:
                self._subs[t] = rest
            else:
                self._subs.pop(t, None)
        sub.closed = True
        sub.event.set()

    def snapshot(self) -> dict:
        """Counters and table sizes for status (runs on the I/O thread)."""
        return {
            "member": self.member_id, "name": self.name, "address": list(self.address),
            "drops": dict(self.drops), "stats": dict(self.stats),
            "groups": [f"{g}:{p}" for g, p in self._groups],
            "feeds": {f"{h}:{p}": {"in_flight": f.in_flight(), "queued": f.queued_chunks(),
                                   "receivers": sorted(f.acks)}
                      for (h, p), f in self._feeds.items()},
            "topics": sorted(self._subs),
        }

    # -------------------------------------------------------------------------- the I/O loop

    def _run(self) -> None:
        sel = self._sel
        while not self._stop:
            try:
                if not self._step(sel):
                    self._idle(sel)
            except Exception:  # never let one bad event kill the member's data plane
                log.exception("scopecast I/O loop error (continuing)")
                self.drops["internal_error"] += 1
                self._sleeping = False

    def _idle(self, sel) -> None:
        self._sleeping = True
        if not self._publish_q and not self._ops:
            if self._wake_pending:
                # woken by a publisher a moment ago: linger, so that a burst of publishes
                # costs one wake-up per linger period instead of one per message
                self._poll(sel, LINGER)
                self._wake_pending = False
            else:
                self._poll(sel, self._idle_timeout())
        self._sleeping = False

    def _step(self, sel) -> bool:
        self._poll(sel, 0)
        while self._ops:
            fn, args = self._ops.popleft()
            fn(*args)
        if self._publish_q:
            self._take_publishes()
        sent = self._pump()
        now = time.monotonic()
        if now - self._last_ack >= self.config.ack_period:
            self._send_acks(now)
        if now - self._last_housekeeping >= 0.1:
            self._housekeeping(now)
        if self._space_waiting:
            self._space.set()
        if self._to_wake:
            self._wake_subscribers()
        return sent or bool(self._publish_q)

    def _idle_timeout(self) -> float:
        if any(pos[0] != pos[1] for pos in self._recv_pos.values()):
            return self.config.ack_period
        return 0.1

    def _poll(self, sel, timeout: float) -> None:
        for key, mask in sel.select(timeout):
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

    # ----------------------------------------------------------------------------- receive path

    def _drain(self, sock: socket.socket) -> None:
        # recvfrom (a fresh bytes object) rather than recv_into a shared buffer: payloads are then
        # cheap slices of it, and a held datagram needs no copy
        recv = sock.recvfrom
        size = self._recv_size
        while True:
            try:
                data, _addr = recv(size)
            except BlockingIOError:
                # drained: acknowledge now rather than at the next ack tick, so that a sender
                # waiting on its window resumes as soon as this burst is taken
                now = time.monotonic()
                if now - self._last_ack >= self.config.ack_period / 4:
                    self._send_acks(now)
                return
            except OSError as exc:
                self.drops["socket_error"] += 1
                log.debug("recv failed: %s", exc)
                return
            self.stats["datagrams_in"] += 1
            self._on_datagram(data)

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
        except wire.DecodeError as exc:
            self._drop(exc.reason)
            return
        sender = header.sender
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
        if len(self._held) >= self.config.held_datagrams:
            self._drop("unknown_sender")
            return
        self._held.append((time.monotonic(), sender, data))
        self.unknown_sender.set()

    def _release_held(self) -> None:
        held, self._held = self._held, deque()
        now = time.monotonic()
        for t, sender, data in held:
            if sender in self._members:
                self._dispatch(wire.unpack_header(data), data, len(data) - self._trailer)
            elif now - t < self.config.unknown_sender_grace:
                self._held.append((t, sender, data))
            else:
                self._drop("unknown_sender")

    def _on_data(self, header: wire.Header, body: memoryview, data: bytes) -> None:
        routes, off = wire.decode_routes(body, HEADER.size)
        try:
            if header.flags & wire.FLAG_FRAGMENT:
                self._on_fragment(header, body, routes, off)
            else:
                # runs are validated as they are read: the runs before a malformed one in an
                # authenticated datagram are kept
                for run in wire.iter_runs(body, off, header.count, len(routes)):
                    self._take_run(data, routes, *run)
        finally:
            if self._touched:
                self._deliver(self._touched)
                self._touched = []
        self._note_received(header, len(body))

    def _note_received(self, header: wire.Header, nbytes: int) -> None:
        key = (header.sender, header.channel)
        pos = self._recv_pos.get(key)
        if pos is None:
            self._recv_pos[key] = [header.dseq, 0, 0.0]
        elif header.dseq > pos[0]:
            pos[0] = header.dseq

    def _take_run(self, data: bytes, routes: list, topic: int, source: int, session: int,
                  first: int, stream: int, first_sseq: int, ctype: int, ridx: int,
                  lengths: tuple, off: int) -> None:
        """Deliver and forward one run: FIFO per (topic, source, session), duplicates dropped;
        order is checked once per run, not per message."""
        count = len(lengths)
        key = (topic, source, session)
        expected = self._next_seq.get(key)
        if expected is not None and first != expected:
            if first < expected:
                skip = min(expected - first, count)
                self.stats["duplicates"] += skip
                if skip == count:
                    return
                off += sum(lengths[:skip])
                lengths = lengths[skip:]
                first += skip
                first_sseq += skip
            else:
                self.stats["gaps"] += 1
        self._next_seq[key] = first + len(lengths)
        subs = self._subs.get(topic)
        forwards = topic in self._routes
        if not subs and not forwards:
            return
        payloads = []
        append = payloads.append
        for n in lengths:
            stop = off + n
            append(data[off:stop])
            off = stop
        route = routes[ridx]
        if subs:
            member = self._members.get(source)
            topic_name = self._topic_names.get(topic) or str(topic)
            source_name = member.name if member is not None else str(source)
            out = [Message(topic_name, source_name, session, seq, payload, ctype, route)
                   for seq, payload in enumerate(payloads, first)]
            nbytes = sum(lengths) + MESSAGE_COST * len(lengths)
            for sub in subs:
                if not sub.inbox:
                    self._touched.append(sub)
                sub.inbox.extend(out)
                sub.inbox_bytes += nbytes
        if forwards:
            self._forward_run(topic, source, session, first, stream, first_sseq, ctype, route,
                              payloads)

    def _deliver(self, touched: list[Subscription]) -> None:
        for sub in touched:
            batch, nbytes = sub.inbox, sub.inbox_bytes
            sub.inbox = []
            sub.inbox_bytes = 0
            sub.delivered_bytes += nbytes
            self.stats["delivered"] += len(batch)
            sub.queue.append((batch, nbytes))
            if sub.waiting and not sub.wake:
                sub.wake = True
                self._to_wake.append(sub)

    def _wake_subscribers(self) -> None:
        """Wake waiting applications once per drained burst, not once per datagram."""
        for sub in self._to_wake:
            sub.wake = False
            sub.event.set()
        self._to_wake.clear()

    def _on_fragment(self, header: wire.Header, body: memoryview, routes: list, off: int) -> None:
        if header.count != 1 or off + wire.FRAGMENT.size > len(body):
            raise wire.DecodeError("bad_fragment")
        total, index, count, chunk = wire.FRAGMENT.unpack_from(body, off)
        runs = list(wire.iter_runs(body, off + wire.FRAGMENT.size, 1, len(routes)))
        topic, source, session, seq, stream, sseq, ctype, ridx, lengths, start = runs[0]
        if len(lengths) != 1:
            raise wire.DecodeError("bad_fragment", "fragment run of several messages")
        piece = wire.WireMessage(topic, source, session, seq, stream, sseq, ctype, routes[ridx],
                                 bytes(body[start:start + lengths[0]]))
        try:
            whole = self._reassembler.add(header.sender,
                                          wire.Fragment(piece, total, index, count, chunk))
        except ReassemblyError as exc:
            self._drop(exc.reason)
            return
        if whole is not None:
            self.stats["reassembled"] += 1
            m = whole
            self._take_run(m.payload, [m.route], m.topic_id, m.source, m.session, m.seq,
                           m.stream, m.stream_seq, m.content_type, 0, (len(m.payload),), 0)

    def _on_control(self, header: wire.Header, body: memoryview) -> None:
        header, msg = wire.decode_control(body)
        if header.ptype == wire.PacketType.CONTROL:
            if (isinstance(msg, list) and len(msg) == 3 and msg[0] == "ack"
                    and isinstance(msg[1], int) and isinstance(msg[2], int)):
                self._on_ack(header.sender, msg[1], msg[2])
            else:
                self._drop("bad_control")
        elif header.ptype == wire.PacketType.END_OF_STREAM:
            self._note_received(header, len(body))
            if (isinstance(msg, list) and len(msg) == 3 and all(isinstance(v, int) for v in msg)):
                self._on_end_of_stream(header.sender, *msg)
            else:
                self._drop("bad_control")
        else:
            self.stats[f"ignored_{wire.PacketType(header.ptype).name.lower()}"] += 1

    def _on_end_of_stream(self, sender: int, topic: int, session: int, last_seq: int) -> None:
        subs = self._subs.get(topic, ())
        member = self._members.get(sender)
        for sub in subs:
            sub.ends[(self._topic_names.get(topic, str(topic)),
                      member.name if member else str(sender), session)] = last_seq
            if sub.waiting:
                sub.event.set()

    def _on_ack(self, sender: int, channel: int, dseq: int) -> None:
        feed = self._feeds_by_channel.get(channel)
        if feed is None or dseq > feed.dseq:
            self._drop("bad_ack")
            return
        if not feed.acknowledge(sender, dseq, time.monotonic()):
            self.stats["acks_ignored"] += 1  # from a client, or a member no longer listed

    def _send_acks(self, now: float) -> None:
        self._last_ack = now
        for sub_list in self._subs.values():
            for sub in sub_list:
                if sub.backlog() > self.config.max_backlog_bytes:
                    self.stats["acks_withheld"] += 1
                    return
        for (sender, channel), pos in self._recv_pos.items():
            if pos[0] == pos[1] and now - pos[2] < 0.5:
                continue
            member = self._members.get(sender)
            if member is None:
                continue
            pos[1] = pos[0]
            pos[2] = now
            self._send_control(wire.PacketType.CONTROL, ["ack", channel, pos[0]],
                               (member.host, member.port))

    def _send_control(self, ptype: int, body, address, channel: int = 0, dseq: int = 0) -> None:
        data = wire.encode_control(ptype, self.member_id, body, channel, dseq)
        try:
            self._sock.sendmsg([data, self._auth.sign(data)], (), 0, address)
            self.stats["control_out"] += 1
        except OSError as exc:
            self.drops["send_error"] += 1
            log.debug("control send to %s failed: %s", address, exc)

    def _housekeeping(self, now: float) -> None:
        self._last_housekeeping = now
        expired = self._reassembler.expire()
        if expired:
            self.drops["reassembly_timeout"] += expired
        if self._held and now - self._held[0][0] > self.config.unknown_sender_grace:
            self._release_held()
        for feed in self._feeds.values():
            for member in feed.expire(now, self.config.ack_timeout):
                self.stats["receiver_timeouts"] += 1
                log.warning("receiver %s of %s:%d silent for %.1fs; no longer waiting for it",
                            member, *feed.address, self.config.ack_timeout)

    # ---------------------------------------------------------------------------- send path
    #
    # Entries are encoded once (by the publishing thread for own messages, here for forwarded ones)
    # with routing-table index 0, and queued in chunks per destination: a datagram is then its
    # header, a one-record routing table and the joined entries of one chunk.

    def _take_publishes(self) -> None:
        q = self._publish_q
        capacity = self._capacity
        me = self.member_id
        taken = 0
        queued = 0
        sseq = 0
        touched: list[Subscription] = []
        topic = None
        plan: list = []
        feed = record = table = run = None
        subs: tuple = ()
        while q:
            item = q.popleft()
            if item[0] != topic or not item[2]:
                topic = item[0]
                plan = self._own_plans.get(topic) or self._own_plan(topic)
                # the common case: one destination queue, no filters
                feed, record, table = plan[0] if (
                    len(plan) == 1 and plan[0][0].__class__ is Feed) else (None, None, None)
                run = None
                subs = self._subs.get(topic, ())
                if not item[2]:  # end-of-stream marker: (topic, last_seq, 0, b"", session, 0)
                    self._queue_end_of_stream(plan, topic, item[4], item[1])
                    topic = None
                    continue
            _, seq, sseq, payload, session, ctype = item
            n = len(payload) + MESSAGE_COST
            taken += n
            if run is not None and seq == run.next_seq and sseq == run.next_sseq \
                    and ctype == run.ctype and (c := feed.open) is not None and c.last is run \
                    and c.size + n <= c.room:
                run.payloads.append(payload)  # fast path: extend this publisher's run
                run.next_seq += 1
                run.next_sseq += 1
                c.size += n
                queued += n
            elif feed is not None:
                if not feed.pending():
                    self._active.append(feed)
                run = feed.put(record, table, capacity, True, topic, me, session, seq, me, sseq,
                               ctype, payload)
                queued += n
            else:
                for target, rec, tbl in plan:
                    queued += self._push(target, rec, tbl, True, topic, me, session, seq, me,
                                         sseq, ctype, payload)
            if subs:
                msg = Message(self._topic_names.get(topic, str(topic)), self.name, session, seq,
                              payload, ctype, self._origin)
                for sub in subs:
                    if not sub.inbox:
                        touched.append(sub)
                    sub.inbox.append(msg)
                    sub.inbox_bytes += n
        if sseq:
            self._taken_sseq = sseq
        self.taken_bytes += taken
        self.feed_bytes += queued
        if touched:
            self._deliver(touched)
        self._update_handed()

    def _update_handed(self) -> None:
        low = self._taken_sseq
        for feed in self._active:
            first = feed.first_own()
            if first and first - 1 < low:
                low = first - 1
        self.handed = low

    def _own_plan(self, topic: int) -> list:
        plan = self._plan(topic, self._origin)
        self._own_plans[topic] = plan
        return plan

    def _plan(self, topic: int, record: tuple) -> list:
        """For messages of `topic` carrying `record`: (feed or filtered channel, record after the
        hop, its encoded routing table)."""
        plan = []
        for route in self._routes.get(topic, ()):
            if matches(record, route.label):
                after = forward(record, route.label)
                table = wire.encode_route_table([after])
                if isinstance(route.channel, FilteredChannel):
                    plan.append((route.channel, after, table))
                else:
                    plan.append((self._feed(route.channel.address), after, table))
        self._plans[(topic, record)] = plan
        return plan

    def _push(self, target, record: tuple, table: bytes, own: bool, topic: int, source: int,
              session: int, seq: int, stream: int, sseq: int, ctype: int, payload: bytes) -> int:
        """Queue one message for a feed, or for the endpoints a filtered channel picks for it;
        returns the bytes queued."""
        feeds = [target] if target.__class__ is Feed else [
            self._feed(e.address) for e in _resolved(target, topic, source, seq, sseq)]
        for feed in feeds:
            if not feed.pending():
                self._active.append(feed)
            feed.put(record, table, self._capacity, own, topic, source, session, seq, stream, sseq,
                     ctype, payload)
        return (len(payload) + MESSAGE_COST) * len(feeds)

    def _forward_run(self, topic, source, session, first, stream, first_sseq, ctype, record,
                     payloads: list) -> None:
        plan = self._plans.get((topic, record))
        if plan is None:
            plan = self._plan(topic, record)
        if not plan:
            return
        self.stats["forwarded"] += len(payloads)
        queued = 0
        for i, payload in enumerate(payloads):
            for target, after, table in plan:
                queued += self._push(target, after, table, False, topic, source, session, first + i,
                                     stream, first_sseq + i, ctype, payload)
        self.feed_bytes += queued

    def _queue_end_of_stream(self, plan: list, topic: int, session: int, last_seq: int) -> None:
        for target, _after, _table in plan:
            feeds = [target] if target.__class__ is Feed else [
                self._feed(e.address) for e in endpoints(target)]
            for feed in feeds:
                if not feed.pending():
                    self._active.append(feed)
                feed.put_end_of_stream((topic, session, last_seq))

    def _feed(self, address: tuple[str, int]) -> Feed:
        feed = self._feeds.get(address)
        if feed is None:
            feed = self._feeds[address] = Feed(address, len(self._feeds) + 1)
            self._feeds_by_channel[feed.channel] = feed
        return feed

    def _pump(self) -> bool:
        """Let destinations pull datagrams while their windows are open and the socket takes them."""
        if self._want_write:
            return False
        if self._stalled is not None:
            feed, data = self._stalled
            self._stalled = None
            if not self._transmit(feed, data):
                return False
        active = self._active
        window = self.config.window_bytes
        progressed = False
        for _ in range(len(active)):
            feed = active.popleft()
            while feed.pending() and feed.in_flight() < window:
                if not self._transmit(feed, self._pull(feed)):
                    break
                progressed = True
            if feed.pending():
                active.append(feed)
            if self._want_write:
                break
        if progressed:
            self._update_handed()
        return progressed

    def _pull(self, feed: Feed) -> bytes:
        """Build the next datagram for `feed`, just in time."""
        feed.dseq += 1
        if feed.frag is not None:
            return self._next_fragment(feed)
        chunk = feed.take()
        self.feed_bytes -= chunk.size - RUN_COST * len(chunk.runs)  # what _take_publishes added
        if chunk.end_of_stream is not None:
            return wire.encode_control(wire.PacketType.END_OF_STREAM, self.member_id,
                                       list(chunk.end_of_stream), feed.channel, feed.dseq)
        if chunk.oversized:
            room = chunk.room - wire.FRAGMENT.size - wire.run_size(1, 0)
            feed.frag = (chunk.first_own, _pieces(chunk.runs[0], room, chunk.table))
            return self._next_fragment(feed)
        parts: list = []
        for run in chunk.runs:
            parts += run.parts()
        return wire.encode_data(wire.PacketType.DATA, self.member_id, feed.channel, feed.dseq,
                                chunk.table, len(chunk.runs), parts)

    def _next_fragment(self, feed: Feed) -> bytes:
        first_own, pieces = feed.frag
        table, frag, parts = next(pieces)
        if frag[1] == frag[2] - 1:
            feed.frag = None
        return wire.encode_data(wire.PacketType.DATA, self.member_id, feed.channel, feed.dseq, table,
                                1, parts, frag)

    def _transmit(self, feed: Feed, datagram: bytes) -> bool:
        try:
            self._sock.sendmsg([datagram, self._auth.sign(datagram)], (), 0, feed.address)
        except BlockingIOError:
            # the kernel's send buffer is full: keep this datagram and resend it when writable
            self._stalled = (feed, datagram)
            self._want_write = True
            self._sel.modify(self._sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return False
        except OSError as exc:
            self.drops["send_error"] += 1
            log.warning("send to %s:%d failed: %s", *feed.address, exc)
        feed.sent_bytes += len(datagram) + self._trailer
        feed.history.append((feed.dseq, feed.sent_bytes))
        if not feed.acks:
            feed.base_bytes = feed.sent_bytes
        self.stats["datagrams_out"] += 1
        return True


def _pieces(run, chunk: int, table: bytes):
    """(routing table, fragment struct, run parts) for each fragment of a one-message run."""
    for frag, piece in wire.fragments(run.payloads[0], chunk):
        yield table, frag, wire.run_parts(run.topic, run.source, run.session, run.first_seq,
                                          run.stream, run.first_sseq, run.ctype, 0, [piece])


def _resolved(channel, topic: int, source: int, seq: int, sseq: int) -> list:
    out: list = []
    resolve(channel, topic, source, seq, sseq, out)
    return out
