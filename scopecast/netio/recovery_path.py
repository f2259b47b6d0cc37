"""The member's side of recovery (thesis 3.2.12's bottom interface; QSM's member state).

A part of `MemberRuntime` (runs on its I/O thread only). The member keeps its own state — its
unstable messages, what it received and what it misses — and every token period pushes a summary to
its recovery agent: per sender stream the MaxContiguous position it holds everything it is owed up
to, its NAKs, and (as a sender) its record. The agent's reply carries stability decided at the top
(cleanup), the senders' records (which reveal tail losses), and repairs to push to peers.

- **Several protocols**: a member has one agent per recovery protocol among its topics (each
  protocol is a domain of its own). Every agent gets the same acknowledgements (MaxContiguous is
  per stream, whatever the topics) but only the NAKs of its protocol's topics; a message is stable
  when every agent says so, and a peer's cached copy goes when every agent that knows the stream
  says so.
- **Sender**: every message of a reliable topic stays in `_cache` until stable; the window is the
  bytes held there (`RuntimeConfig.stable_window_bytes`), and `publish()` blocks or raises
  `WindowFull` beyond it. `stable_sseq` is what `flush()` waits for.
- **Receiver**: a run after a gap waits in the reorder buffer (with no timeout on reliable topics)
  while the member NAKs the range: to its agent (a neighbour that caches it pushes the repair) and,
  from the next period on, straight to the sender, which still holds everything not yet stable.
- **Caching members** (the agent says which) keep what they receive until stable, to serve NAKs.
- **Joins** (thesis 3.2.14): a sender notes, for each receiver its scope adds, where each of its
  topics stood (the receiver's *join point*); a member that meets a sender's stream without its
  start asks the sender for it. With `history="from_join"` it starts there; with "cached" it first
  replays everything not yet stable. It is *light* until it holds everything from its start up to
  the join point, then *regular*.

Repairs travel as REPAIR datagrams under a routing record no channel matches: a repair goes only
where it was asked for. A forwarding member that was repaired forwards the runs it got along the
stream's own path (the record its other runs came with), as it would have forwarded them: the
members below it missed them too, and a lost tail would otherwise show them no gap at all.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Set

from scopecast.netio.control_messages import (
    Instructions,
    JoinPoint,
    Nak,
    SenderRecordWire,
    Summary,
    WhereAsk,
)
from scopecast.netio.feed import MESSAGE_COST
from scopecast.netio.key_table import KeyTable
from scopecast.netio.native import TailTable
from scopecast.netio.peer_cache import PeerCache
from scopecast.netio.recovery_records import MAX_RECORD_TOPICS, AgentReply, SenderRecord, named_topics
from scopecast.netio.repair_server import ANY_TOPIC, RepairServer, entry_sseq
from scopecast.netio.stream_position import KeyDigest, StreamPositions
from scopecast.netio.tail_evidence import TailEvidence
from scopecast.timing import TIMING

MAX_NAKS = 64
RECORD_SCAN = 4096                   # own unstable messages looked at for the record's horizon
MAX_STREAM_NAKS = 8                  # holes of a dense stream asked for per summary
TAIL_SPAN = 1024                     # messages a NAK of a stream's tail asks for at most (a lost
                                     # tail is a datagram or two; more is data still in flight)
TAIL_PATIENCE = TIMING.tail_patience
TAIL_SEQ = 0xFFFFFFFF                # "and everything after" in a tail NAK
TAIL_ANY = 1 << 64                   # a tail bound past any stream seq
OWED_NOTHING = 1 << 62               # the acknowledgement of a member that takes no reliable topic
INF = float("inf")
IDLE_PERIODS, IDLE_MIN = 4, TIMING.idle_min
RETRY_MIN, RETRY_TIMES = TIMING.repair_retry_min, 2.0
RECORD_TTL = TIMING.record_ttl
SETTLE_REPORT, SETTLE_FOR = TIMING.settle_report, TIMING.settle_for
IDLE_FROM = TIMING.idle_from
JOIN_TRIES = 20                      # asks for a join point before starting at the first cached




class RecoveryPath:
    """Caches, MaxContiguous, NAKs and repairs (see module docstring)."""

    def _init_recovery(self) -> None:
        self._reliable: Set[int] = frozenset()
        self._protocols: dict[int, str] = {}     # reliable topic -> its protocol's domain key
        self._own_domains: frozenset[str] = frozenset()  # the keys of _protocols' values
        self._agents: dict[str, tuple[str, int]] = {}   # protocol -> this member's agent
        self._replies: dict[str, AgentReply] = {}           # protocol -> its agent's latest reply
        self._cache: list[tuple] = []      # own unstable: (sseq, topic, session, seq, ctype, payload)
        self._cache_head = 0
        # (topic, session) -> [fs, fss, ls, lss] while any of its messages is unstable, else
        # its last seq (compact, in C: a publisher going round thousands of topics moves each
        # between the two states every few messages)
        self._tails = TailTable()
        self._stalls: dict[int, int] = {}        # source -> highest sseq delivered at the last
                                                 # summary
        self._behind: dict[int, float] = {}      # source -> since when its record names more
                                                 # than this member saw, the stream standing still
        self._evidence = TailEvidence()          # whether a stream's tail may be asked for
        self.loss_seen_at = -INF                 # when a channel last showed a datagram lost
        self.data_seen_at = -INF                 # when a channel's datagram last came
        self._peer_cache = PeerCache()           # peers' runs kept to repair others with
        self._cacher = False
        self._last_sseq = KeyTable()  # (topic, source, session) -> last delivered sseq
        self._records: dict[int, SenderRecord] = {}   # source -> its record
        self._positions = StreamPositions()      # sseqs taken per source (for dense streams)
        self._taken_keys: dict[int, KeyDigest] = {}  # source -> keys delivered from it
        self._digested: dict[tuple, int] = {}  # (source, session) -> its keys in _taken_keys
        self._forgotten: set[tuple] = set()      # keys taken out of them again (see forget_keys)
        self._published = KeyDigest()            # own (topic, session) keys sent, all reliable
        self._sent_unreliable = False            # (if not: no stream is dense)
        self._beat = 0                           # own summaries with a record (its heartbeat)
        self._nak_at: dict[tuple, float] = {}    # (topic, source, session, lo) -> last NAKed
        self.retry_at = INF                      # when a hole NAKed may be asked for again
        self.settle_at = INF                     # when to report again while idle (see _settling)
        self._moved_at = -INF                    # when this member last sent or delivered
        self._repair_avg = 0.0                   # recent repair time (s), a moving average
        self.hole_opened = False                 # a new hole: NAK it now, not at the next period
        self.progressed = False                  # sent or delivered since the last summary
        self._unknown_sources: set[int] = set()  # to NAK, not known yet: to look up
        self.repair_ms: deque[float] = deque(maxlen=4096)  # gap seen -> filled, latest gaps
        self._gap_at: dict[tuple, list] = {}      # key -> [(hole's last seq, opened at)]
        self._max_seen: dict[int, int] = {}      # source -> highest sseq delivered (reliable)
        self._hi: dict[int, int] = {}            # source -> highest any member delivered
        self._tail_asks: dict[int, list] = {}    # source -> [seen when first asked, when]
        self.stable_sseq = 0      # own stream: everything up to here is stable (read by the app)
        self.released_bytes = 0   # own bytes no longer held for the window (read by the app)
        self._period = 0.05
        self._last_summary = 0.0
        self._cached_history: frozenset[int] = frozenset()  # topics whose joiners replay first
        self._join_points: dict[int, dict] = {}  # receiver -> {(topic, session): first owed seq}
        self._starts: dict[tuple, int] = {}      # key -> join point, until caught up with it
        self._asks: dict[tuple, list] = {}       # key -> [asks sent, last sent]
        self._repairs = RepairServer(self._capacity, self._send_repair, self.stats)

    # ------------------------------------------------------------------- control installs

    def install_recovery(self, agents: dict[str, tuple[str, int]], protocols: dict[int, str],
                         cached: set[int] = frozenset()) -> None:
        """This member's agents (per protocol) and its reliable topics' protocols."""
        self._agents = agents
        self._protocols = protocols
        self._own_domains = frozenset(protocols.values())
        self.forget_keys(self._reliable - protocols.keys())
        self._reliable = protocols.keys()  # a view: no second table of thousands of topics
        self._tables_changed()
        self._cached_history = frozenset(cached)
        self._replies = {k: r for k, r in self._replies.items() if k in agents}

    # ------------------------------------------------------------------------- the sender

    def _release_own(self, stable: int) -> None:
        """Everything of this member's stream up to `stable` is held by every regular member."""
        if stable <= self.stable_sseq:
            return
        cache, head, tails = self._cache, self._cache_head, self._tails
        stop = bisect.bisect_right(cache, stable, lo=head, key=entry_sseq)
        freed = tails.release(cache, head, stop) + MESSAGE_COST * (stop - head)
        cache[head:stop] = [None] * (stop - head)
        head = stop
        if head > 4096 and head * 2 > len(cache):
            del cache[:head]
            head = 0
        self._cache_head = head
        self.released_bytes += freed
        self.stable_sseq = stable
        self.stats["stable_sseq"] = stable
        self._space.set()

    def _own_record(self) -> SenderRecordWire:
        """What is on the wire, the unstable runs per topic, a heartbeat, the horizon, the keys
        sent (count, digest): a receiver NAKs a tail only up to the first (what is still queued
        here is not lost, only not sent yet); the heartbeat moves with every summary, so
        receivers tell a sender that waits (on its window) from one that is gone; a receiver
        whose stream is not dense acknowledges no further than the horizon (topics it does not
        name may have lost tails there)."""
        self._beat += 1
        named, horizon = self._tails.record(self._cache, self._cache_head, self.handed,
                                            RECORD_SCAN, MAX_RECORD_TOPICS)
        keys = (0, 0) if self._sent_unreliable else (self._published.count, self._published.digest)
        return SenderRecordWire(self.handed, named, self._beat, horizon, *keys)

    def stability_digest(self) -> str:
        """What holds this member's own messages back, for a flush that timed out: how far
        they are stable and each agent's latest word on them (from an application thread:
        copies, each taken at once)."""
        now = time.monotonic()
        replies = dict(self._replies)
        words = []
        for key, (host, port) in dict(self._agents).items():
            r = replies.get(key)
            if r is None:
                said = "never answered"
            else:
                stable = r.down.get(self.member_id)
                said = f"answered {now - r.at:.1f}s ago, " + (
                    "not naming this stream yet" if stable is None else f"stable up to {stable}")
            words.append(f"{key} agent at {host}:{port} {said}")
        return f"stable up to stream seq {self.stable_sseq} of {self.handed} sent; " \
            + ("; ".join(words) or "no recovery agent yet")

    def _look_up(self, member_id: int) -> None:
        """A member this one must talk to but does not know (in another scope): the control
        thread looks it up in the root's directory (see `held_senders`)."""
        if member_id not in self._unknown_sources:
            self._unknown_sources.add(member_id)
            self.unknown_sender.set()

    # --------------------------------------------------------------------- joins (3.2.14)

    def _note_receivers(self, receivers: set[int]) -> None:
        """Record where this member's streams stood when each receiver its scope lists now
        first appeared: its join points (topics not started yet begin at 1 for it). A receiver
        keeps its join point while it is a member (a view may leave it out for a moment)."""
        new = receivers - self._join_points.keys()
        if new:
            points = {k: (t[2] if t.__class__ is list else t) + 1 for k, t in self._tails.items()}
            for member in new:
                self._join_points[member] = points  # shared: never changed after
        for member in [m for m in self._join_points if m not in receivers and m not in self._members]:
            del self._join_points[member]

    def _on_where(self, receiver: int, topic: int, session: int) -> None:
        """A receiver asks where its stream of `topic` starts: its join point, and the first
        message this member still holds (what is cached). A receiver this member was not told of
        (it receives through a forwarding member) joined no later than that first message:
        stability waited for it since it entered its recovery domain."""
        member = self._members.get(receiver)
        if member is None:  # answered when it asks again, once looked up
            self.stats["where_unanswered"] += 1
            self._look_up(receiver)
            return
        tail = self._tails.get((topic, session), 0)
        cached = tail[0] if tail.__class__ is list else tail + 1
        points = self._join_points.get(receiver)
        start = points.get((topic, session), 1) if points is not None else cached
        self._send_control(JoinPoint(topic, session, start, cached), (member.host, member.port))

    def _on_join_point(self, sender: int, topic: int, session: int, start: int,
                       cached: int) -> None:
        """The sender's answer: this member joined its stream of `topic` at `start`; it still
        holds everything from `cached` on."""
        key = (topic, sender, session)
        if self._asks.pop(key, None) is None or min(start, cached) < 1 or key in self._starts:
            return  # not asked, or answered already
        self._starts[key] = start
        if key not in self._next_seq:
            # what became stable before it is held by nobody any more: from the cache on
            start = cached if topic in self._cached_history else max(start, cached)
            held = self._early.get(key)
            if held and held[0].first < start:  # it listened before its sender noticed it
                start = held[0].first
            self._next_seq[key] = start
            self.stats["joined_at"] = start
            if key in self._early:
                self._release_early(key)
            self._deliver()

    def _asking(self, key: tuple, now: float) -> bool:
        """Ask `key`'s sender where this member joined its stream (again each period, a few
        times). True while the key must wait for the answer: a stream this member has not
        started yet."""
        ask = self._asks.get(key)
        if ask is None:
            if key in self._starts:
                return False
            ask = self._asks[key] = [0, 0.0]
        if ask[0] >= JOIN_TRIES:
            return False
        if now - ask[1] >= min(self._period, 0.25):
            member = self._members.get(key[1])
            if member is not None:
                self._send_control(WhereAsk(key[0], key[2]), (member.host, member.port))
            else:
                self._look_up(key[1])
            ask[0] += 1
            ask[1] = now
            if ask[0] == JOIN_TRIES:
                self.stats["join_point_unknown"] += 1
        return key not in self._next_seq

    def _pending(self, key: tuple) -> bool:
        ask = self._asks.get(key)
        return ask is not None and ask[0] < JOIN_TRIES

    def light(self) -> bool:
        """Still catching up with a stream it joined (thesis 3.2.14's light member)."""
        return any(self._pending(k) for k in self._asks) \
            or any(self._next_seq.get(k, 0) < start for k, start in self._starts.items())

    def _caught_up(self) -> None:
        for key in [k for k, a in self._asks.items() if a[0] >= JOIN_TRIES and k in self._next_seq]:
            del self._asks[key]  # never answered (its sender is gone): started without
        for key in [k for k, start in self._starts.items() if self._next_seq.get(k, 0) >= start]:
            del self._starts[key]
            self.stats["joins_caught_up"] += 1

    # ----------------------------------------------------------------------- the receiver

    def _owed(self, now: float) -> tuple[dict[int, int], list[Nak]]:
        """(MaxContiguous per sender stream, NAKs) of what this member is owed and misses.

        What a sender's record names beyond the last run received is NAKed only once the sender's
        stream has stalled since the last summary: while its runs keep coming it is in flight (or
        in this member's socket buffer), and asking for it would only make the sender send it
        twice. (The stream, not the topic: a sender going round thousands of topics moves each
        of them less often than once a period.)"""
        acks: dict[int, int] = {}
        naks: list[Nak] = []
        streams: list[tuple[int, int]] = []  # dense: (source, its tail to ask for up to)
        stalls, self._stalls = self._stalls, {}
        self._digest_keys()
        # a member that takes no reliable topic (a publisher only) is owed nothing of any stream:
        # it holds all it is owed of the newest messages too, not only of what the record it has
        # of their sender names (which, a token trip old, kept them unstable one trip more)
        owes = not self._reliable.isdisjoint(self._subs)
        for source, record in self._records.items():
            if source == self.member_id:
                continue
            seen = self._stalls[source] = self._max_seen.get(source, 0)
            stalled = stalls.get(source) == seen
            if not stalled:
                self._evidence.moved(source, self._behind.get(source), now)
            if record.top <= seen:
                self._behind.pop(source, None)
            elif not stalled or source not in self._behind:
                self._behind[source] = now
            wanted = self._tail_wanted(source, now, stalled, self._behind.get(source))
            acks[source] = self._owed_of(source, record, seen, wanted, now, naks, streams) \
                if owes else OWED_NOTHING
        self._owed_unnamed(acks, naks, now)
        for source, tail_top in streams:
            self._stream_naks(source, tail_top, naks)
        if self._reliable and self.handed:
            acks[self.member_id] = self.handed  # on the wire: nothing is stable before it is sent
        naks += self._tail_naks(now)
        self._evidence.period_done()
        return acks, naks

    def _tail_wanted(self, source: int, now: float, stalled: bool = True,
                     since: float | None = None) -> bool:
        """Whether this member may ask for what `source`'s record names beyond what it received
        (see tail_evidence). What a forwarding member lost and was repaired it forwards; a
        forwarding member further behind than the learnt bound is not waited for (the sender
        still holds it all)."""
        return self._evidence.wanted(source, now, stalled, since, self.loss_seen_at,
                                     self.data_seen_at, self._period)

    def _owed_of(self, source: int, record: SenderRecord, seen: int, stalled: bool, now: float,
                 naks: list, streams: list) -> int:
        """How far `source`'s stream is acknowledged; its NAKs go to `naks`, and a dense
        stream's tail to ask for to `streams`."""
        top = record.top
        # the sender sends nothing new either: what it handed before is all there is (not
        # within a period or two: a sender on a busy machine misses a period now and then)
        idle = now - record.top_at >= max(IDLE_PERIODS * self._period, IDLE_MIN)
        settled = max(record.settled, seen)
        # dense: the stream position is exact, and bounds the ack alone: what came after the
        # record is held as surely (acknowledged now, not once a newer record has come the
        # long way round: a flush waits one trip up and down the agents, not two); else what
        # the record names bounds it
        dense = self._dense(source, record.keys)
        position = self._positions.contiguous.get(source, 0)
        a = max(top, position) if dense else top
        if record.topics is None and not dense:
            # no longer dense since the record came (its topics were not read): what is
            # stable already, until the next record
            a = min(a, min((r.down.get(source, 0) for r in self._replies.values()), default=0))
        # a lost tail: all of it was on the wire a period ago (or before what this member has
        # seen), or the sender is idle. While it sends, the topic's next message may be a moment
        # old (going round thousands of topics, asking for those cost more than the data)
        tail_upto = (TAIL_ANY if idle else settled) if stalled else -1
        a = self._owed_by_topic(source, record, a, tail_upto, dense, now, naks)
        if dense:
            streams.append((source, (top if idle else min(top, settled)) if stalled else 0))
            return min(a, position)
        return min(a, record.horizon)

    def _owed_by_topic(self, source: int, record: SenderRecord, a: int, tail_upto: int, dense: bool,
                       now: float, naks: list) -> int:
        """The topics `source`'s record names: each one's holes NAKed (and its tail, when the
        tail's last stream seq is at most `tail_upto`); returns how far, up to `a`, they let the
        stream be acknowledged (a dense one: only where this member's start is not known yet)."""
        for (topic, session), (fs, fss, ls, lss) in (record.topics or {}).items():
            if topic not in self._reliable or topic not in self._subs:
                continue
            key = (topic, source, session)
            nxt = self._next_seq.get(key)
            if (nxt is None or key in self._asks) and self._asking(key, now):
                a = min(a, fss - 1)  # owed from a point not known yet: nothing acknowledged
                continue
            if nxt is None:
                held = self._early.get(key)
                # joined while these were unstable: owed from the first the sender still holds
                nxt = min(fs, held[0].first) if held else fs
                self._next_seq[key] = nxt
                if held:
                    self._release_early(key)
                    nxt = self._next_seq[key]
            if nxt > ls:  # joined after all the record names: owed nothing of it
                continue
            if nxt < fs:  # what the sender let go before `fs` is stable (see _pass_stable)
                held = self._early.get(key)
                self._skip_to(key, min(fs, held[0].first) if held else fs)
                nxt = self._next_seq[key]
            last = self._last_sseq.get(key, fss - 1)
            tail = (ls, min(lss, record.top)) if lss <= tail_upto else None
            if (self._nak_holes(key, nxt, last, naks, tail) or last < lss) and not dense:
                a = min(a, last)
        return a

    def _owed_unnamed(self, acks: dict[int, int], naks: list, now: float) -> None:
        """Gaps no record names (it has not come yet, or the record names only
        MAX_RECORD_TOPICS of the sender's topics): pulled from the sender all the same, and not
        acknowledged."""
        named = {(n.topic, n.source, n.session) for n in naks}
        for key in self._early:
            if key[0] not in self._reliable or key in named:
                continue
            if (nxt := self._next_seq.get(key)) is not None:
                last = self._last_sseq.get(key, 0)
                if self._nak_holes(key, nxt, last, naks) and key[1] in acks:
                    acks[key[1]] = min(acks[key[1]], last)
            else:
                self._asking(key, now)

    def _note_filled(self, key: tuple, given_up: bool) -> None:
        """Time the holes of `key` that the stream has now passed (repair time: from the run
        that revealed the hole to the message that filled it)."""
        marks = self._gap_at[key]
        nxt = self._next_seq.get(key, 0)
        now = time.monotonic()
        while marks and marks[0][0] < nxt:
            _end, since = marks.pop(0)
            if not given_up:
                self.repair_ms.append((now - since) * 1000)
                self.stats["repairs_timed"] += 1  # (how many of repair_ms are new: metrics)
                self._repair_avg += (now - since - self._repair_avg) / 8
        if not marks:
            del self._gap_at[key]

    def _dense(self, source: int, keys: tuple[int, int]) -> bool:
        """Whether this member took every (topic, session) `source` sent on, its record's `keys`
        (so it is owed every message of the stream: see stream_position)."""
        taken = self._taken_keys.get(source)
        return keys[0] > 0 and taken is not None and taken.same(*keys) \
            and source not in self._positions.untracked

    def _stream_naks(self, source: int, tail_top: int, naks: list) -> None:
        """NAKs of a dense stream's holes (by stream seq, any topic) that no per-topic NAK
        covers, and of its tail up to `tail_top`."""
        covered = [(n.lo_sseq, n.hi_sseq) for n in naks if n.source == source]
        end = self._positions.end(source)
        for lo, hi in [*self._positions.holes(source, MAX_STREAM_NAKS), (end + 1, tail_top)]:
            if lo <= hi and not any(c_lo <= lo and hi <= c_hi for c_lo, c_hi in covered):
                naks.append(Nak(source, ANY_TOPIC, 0, lo, TAIL_SEQ, lo, hi))
                if lo > end:
                    self.stats["nak_stream_tails"] += 1
                    self.stats[self._evidence.why(source)] += 1
                else:
                    self.stats["nak_stream_gaps"] += 1

    def forget_keys(self, topics) -> None:
        """This member no longer takes `topics`: their keys leave its digests, so no stream that
        carries them counts as dense (it would wait for messages it now drops)."""
        if not topics:
            return
        self._digest_keys()
        for key in self._last_sseq:
            if key[0] in topics and key not in self._forgotten:
                self._forgotten.add(key)  # (for good: a later subscription is not dense)
                self._taken_keys[key[1]].remove(key[0], key[2])

    def _digest_keys(self) -> None:
        """Add the keys first delivered since the last summary to their sources' digests."""
        for topic, source, session in self._last_sseq.added_since(self._digested):
            digest = self._taken_keys.get(source)
            if digest is None:
                digest = self._taken_keys[source] = KeyDigest()
            digest.add(topic, session)

    def _nak_holes(self, key: tuple, nxt: int, last: int, naks: list,
                   tail: tuple | None = None) -> bool:
        """Add the NAKs of `key`'s holes to `naks`; any?"""
        holes = self._holes(key, nxt, last, tail)
        if holes:
            topic, source, session = key
            naks += [Nak(source, topic, session, *h) for h in holes]
        return bool(holes)

    def _holes(self, key: tuple, nxt: int, last: int, tail: tuple | None = None) -> list[list]:
        """[seq lo, hi, sseq lo, hi] missing before, between and (`tail`: the sender's last seq
        and sseq) after the runs held for `key`: all NAKed at once, not one gap per period."""
        out = []
        for early in self._early.get(key, ()):
            first, sseq, n = early.first, early.run.first_sseq, len(early.run.lengths)
            if first > nxt:
                out.append([nxt, first - 1, last + 1, sseq - 1])
            if first + n > nxt:
                nxt, last = first + n, sseq + n - 1
        self.stats["nak_gaps"] += len(out)
        if tail is not None and nxt <= tail[0] and last < tail[1]:
            out.append([nxt, min(tail[0], nxt + TAIL_SPAN - 1), last + 1, tail[1]])
            self.stats["nak_tails"] += 1
            self.stats[self._evidence.why(key[1])] += 1
        return out

    def _tail_naks(self, now: float) -> list[Nak]:
        """Ask peers for what another member delivered beyond this one, from a sender whose
        heartbeat stopped (it is gone): so survivors of a sender's crash end on the same prefix.
        Every period until it catches up; it stops asking after TAIL_PATIENCE without progress
        (no peer holds it any more)."""
        out = []
        for source, hi in self._hi.items():
            seen = self._max_seen.get(source)
            if seen is None or hi <= seen or source == self.member_id:
                continue
            record = self._records.get(source)
            if record is not None and now - record.beat_at < 3 * max(self._period, 0.05):
                continue  # the sender lives: its own record names what is missing
            if not self._tail_wanted(source, now):
                continue
            asked = self._tail_asks.setdefault(source, [seen, now])
            if asked[0] != seen:
                asked[:] = [seen, now]
            if now - asked[1] < TAIL_PATIENCE:
                # per topic this member takes from that sender: only what it is owed comes back
                for (topic, src, session), nxt in self._next_seq.items():
                    if src == source and topic in self._reliable:
                        last = self._last_sseq.get((topic, src, session), 0)
                        out.append(Nak(source, topic, session, nxt, TAIL_SEQ, last + 1, hi))
                        self.stats["nak_gone_tails"] += 1
                        self.stats[self._evidence.why(source)] += 1
        return out

    # ----------------------------------------------------------------- the periodic push

    def _recovery_tick(self, now: float) -> None:
        """Every token period (and at once when a hole opens): summary to the agent, NAKs to
        senders for holes not NAKed within the last period."""
        self._repairs.new_period()
        if not (self._reliable or self._early):
            return
        self._last_summary = now
        if self.progressed:
            self._moved_at = now
        self.hole_opened = self.progressed = False
        self.settle_at = now + SETTLE_REPORT if self._settling(now) else INF
        acks, naks = self._owed(now)
        self._deliver()  # runs released by records that came
        self._caught_up()
        # each hole by itself: one found since the last tick is NAKed now, even on a stream
        # whose other holes were NAKed a moment ago; each again once a period passed
        missing = {(n.topic, n.source, n.session, n.lo) for n in naks}
        for key in [k for k in self._nak_at if k not in missing]:
            del self._nak_at[key]
        record = {self.member_id: self._own_record()} if self._taken_sseq else None
        protocols = self._protocols
        for key, agent in self._agents.items():
            summary = {"acks": acks, "seen": self._max_seen,
                       "naks": [n.row(self.member_id, self.address) for n in naks
                                if protocols.get(n.topic) == key][:MAX_NAKS]}
            if record is not None:
                summary["recs"] = record
            self._send_control(Summary(summary), agent)
            self.stats["summaries_sent"] += 1
            self.stats["naks_reported"] += len(summary["naks"])
        # the sender holds everything not yet stable: pull from it (again once a repair should
        # have come: a lost NAK or repair would otherwise cost a whole period, and the tail of
        # the repair times is those)
        nak_at = self._nak_at
        retry = min(self._period, max(RETRY_MIN, RETRY_TIMES * self._repair_avg))
        for nak in naks[:MAX_NAKS]:
            key = (nak.topic, nak.source, nak.session, nak.lo)
            if now - (last := nak_at.get(key, -INF)) < retry:
                continue
            self.stats["nak_retries"] += last > -INF  # (a NAK or its repair was lost, or late)
            nak_at[key] = now
            member = self._members.get(nak.source)
            if member is not None:
                self._send_control(nak.ask(), (member.host, member.port))
                self.stats["naks_sent"] += 1
            else:
                self._look_up(nak.source)
        self.retry_at = min(nak_at.values()) + retry if nak_at else INF
        self._expire_records(now)

    def _settling(self, now: float) -> bool:
        """Idle, a moment after its stream moved, holding what is not stable yet. A member's
        first report after an idle spell is answered before the agents turn active (the token
        that carries the news has not gone round yet), so its period stays idle: a second later
        it would report what let the data become stable (a receiver's ack of a sender whose
        record it has only just learned), and a flush of one message would take that long."""
        if self._period <= IDLE_FROM or now - self._moved_at > SETTLE_FOR:
            return False
        if len(self._cache) > self._cache_head:  # own messages not stable yet
            return True
        for source, seen in self._max_seen.items():
            stable = self._peer_stable(source)
            if stable is None or seen > stable:
                return True
        return False

    def _peer_stable(self, source: int) -> int | None:
        """How far a peer's stream is stable: where every agent that knows it says so (None if
        none does yet)."""
        known = [s for s in (r.down.get(source) for r in self._replies.values()) if s is not None]
        return min(known) if known else None

    def _expire_records(self, now: float) -> None:
        for source in [s for s, r in self._records.items() if now - r.received > RECORD_TTL]:
            del self._records[source]
            self._behind.pop(source, None)
            self._evidence.forget(source)

    def _on_instructions(self, body: dict, key: str) -> None:
        """Agent `key`'s reply (`agents.api` instructions, read here; ValueError or TypeError
        when malformed): stability and records from above, repairs to push."""
        if key not in self._agents:
            self._drop("stale_instructions")  # from an agent this member no longer has
            return
        ins = Instructions.from_wire(body)
        now = time.monotonic()
        reply = self._replies[key] = AgentReply(
            {}, ins.hi, self._period if ins.period is None else ins.period, ins.cacher, now)
        replies = self._replies.values()
        for source, (stable, record) in ins.down.items():
            reply.down[source] = stable
            if record is not None and source != self.member_id:  # (its own: nothing to learn)
                # a dead sender's last record may still come down (its agent keeps folding the
                # last summary in until the scope drops it): gone is when its heartbeat stops
                old = self._records.get(source)
                top, beat = record.top, record.beat
                keys = (record.key_count, record.key_digest)
                self._records[source] = SenderRecord(
                    top, None if self._dense(source, keys) else named_topics(record.named),
                    record.horizon, keys, now,
                    old.beat_at if old is not None and (old.top, old.beat) == (top, beat) else now,
                    beat, *self._top_moved(old, top, now))
        stables: dict[int, int] = {}  # peers' streams
        for source in reply.down:
            # stable where every agent says so (for a peer: every agent that knows its stream)
            if source == self.member_id:
                # own messages: where the agent of every protocol of its reliable topics says so
                # (an agent it keeps for another reason, e.g. a topic it closed, would hold
                # stability at that topic's last message for good)
                mine = [self._replies.get(k) for k in self._own_domains]
                if mine and None not in mine:
                    self._release_own(min(r.down.get(source) or 0 for r in mine))
            else:
                stable = stables[source] = self._peer_stable(source)
                self._peer_cache.prune(source, stable)
        self._pass_stable(stables)
        for push in ins.push:
            self.stats["pushes"] += 1
            self._serve(push.source, push.nak, push.address)
        self._hi = {}
        for r in replies:
            for source, v in r.hi.items():
                self._hi[source] = max(self._hi.get(source, v), v)
        self._period = min(r.period for r in replies)
        self.stats["token_period_ms"] = round(self._period * 1000)
        cacher = any(r.cacher for r in replies)
        if self._cacher and not cacher:
            self._peer_cache.clear()
        self._cacher = cacher

    def _top_moved(self, old: SenderRecord | None, top: int, now: float) -> tuple[float, int]:
        """(top_at, settled) of a sender's record that now says `top`."""
        if old is None:
            return now, 0
        settled = old.top if now - old.top_at >= self._period else old.settled
        return (old.top_at, old.settled) if old.top == top else (now, settled)

    def _pass_stable(self, stables: dict[int, int]) -> None:
        """Go on past holes in each peer's stream at or below its stable position (`stables`):
        the sender and the caches let those messages go, so no repair will come. A member
        stability waited for never has one; a member the scope dropped (silent too long) and
        took back under a new id, or demoted to client, may, and would otherwise wait for them
        for good (holding its domain's stability, and its sender's flush, with it). Counted as
        `unrecoverable`."""
        for source, stable in stables.items():
            c = self._positions.contiguous.get(source)
            if c is not None and c < stable:
                self._positions.mark(source, c + 1, stable)
        for key in [k for k in self._early if k[1] in stables and k[0] in self._reliable]:
            nxt = self._next_seq.get(key)
            early = self._early[key][0]
            first = early.first
            if nxt is not None and first > nxt and early.run.first_sseq - 1 <= stables[key[1]]:
                self._skip_to(key, first)
        self._deliver()

    def _skip_to(self, key: tuple, seq: int) -> None:
        """`key`'s messages before `seq` will not come: count them, expect `seq` next, and take
        the held runs that are next now."""
        self.stats["unrecoverable"] += seq - self._next_seq[key]
        self._next_seq[key] = seq
        if key in self._gap_at:
            self._note_filled(key, given_up=True)
        self._release_early(key)

    # -------------------------------------------------------------------------- repairs

    def _on_nak(self, sender: int, body) -> None:
        """A member asks this one (the sender) for messages it misses."""
        member = self._members.get(sender)
        if member is None:
            self._drop("nak_from_unknown")
            return
        self.stats["naks_received"] += 1
        self._serve(self.member_id, body, (member.host, member.port))

    def _serve(self, source: int, nak, address: tuple[str, int]) -> None:
        """Send the messages of `source` named by `nak` [topic, session, lo, hi, lo_sseq,
        hi_sseq] that this member holds (its own, or a peer's it caches) to `address`."""
        if source == self.member_id:
            self._repairs.serve_own(self.member_id, self._cache, self._cache_head, nak, address)
        else:
            self._repairs.serve_cached(self.member_id, source, *self._peer_cache.runs(source),
                                       nak, address)

    def _send_repair(self, datagram: bytes, address: tuple[str, int]) -> None:
        try:
            self._sock.sendmsg([datagram, self._auth.sign(datagram)], (), 0, address)
        except OSError:
            self.drops["repair_send_failed"] += 1  # asked again at the requester's next NAK
