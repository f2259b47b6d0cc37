"""The member's side of recovery (thesis 3.2.12's bottom interface; QSM's member state).

A part of `MemberRuntime` (see `member_parts`; it runs on the I/O thread only). The member keeps
its own state (its unstable messages, what it received and misses) and every token period pushes
a summary to its recovery agent: per sender stream the MaxContiguous position it holds everything
it is owed up to, its NAKs, and (as a sender) its record. The agent's reply carries stability
decided at the top, the senders' records (which reveal tail losses), and repairs to push.

- **Several domains**: one agent per recovery domain among its topics (`scopes.scope_admin`).
  Every agent gets the same acknowledgements (MaxContiguous is per stream) but only the NAKs of
  its domain's topics; a message is stable when every agent that knows it says so.
- **Receiver**: a run after a gap waits in the reorder buffer (with no timeout on reliable topics)
  while the member NAKs the range: to its agent (a neighbour that caches it pushes the repair) and,
  straight to the sender, which still holds everything not yet stable.
- **Caching members** (the agent says which) keep what they receive until stable, to serve NAKs.
- Where a member starts a stream it meets is the `joins` part's, when it counts `promotion`'s.

Repairs travel as REPAIR datagrams under a routing record no channel matches: a repair goes only
where it was asked for. A forwarding member that was repaired forwards the runs it got along the
stream's own path (the record its other runs came with), as it would have forwarded them: the
members below it missed them too, and a lost tail would otherwise show them no gap at all.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Set

from scopecast.netio.control_messages import Instructions, MemberSummary, Nak, Summary
from scopecast.netio.delivery import Delivery
from scopecast.netio.joins import Joins
from scopecast.netio.key_table import KeyTable
from scopecast.netio.member_parts import MemberBasics, MemberTables, Receiving, Sending
from scopecast.netio.own_stream import OwnStream
from scopecast.netio.peer_cache import PeerCache
from scopecast.netio.promotion import LIGHT_PERIOD, Promotion
from scopecast.netio.recovery_records import AgentReply, SenderRecord, named_topics, stability_digest
from scopecast.netio.reorder_buffer import ReorderBuffer
from scopecast.netio.repair_server import ANY_TOPIC, MemberRepairs
from scopecast.netio.stream_position import KeyDigest, StreamPositions
from scopecast.netio.tail_evidence import TailEvidence
from scopecast.timing import TIMING

MAX_NAKS = 64
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
BACKOFF_MOST = 3  # a hole asked for again waits twice as long each time, at most 2**3 retries
RECORD_TTL = TIMING.record_ttl
SETTLE_REPORT, SETTLE_FOR = TIMING.settle_report, TIMING.settle_for
IDLE_FROM = TIMING.idle_from
HOLE_DELAY, LOST_DELAY = TIMING.hole_delay, TIMING.lost_hole_delay


class RecoveryPath:
    """MaxContiguous, NAKs, summaries to the agents and their instructions, senders' records,
    peer caches and repairs (see module docstring)."""

    def __init__(self, basics: MemberBasics, tables: MemberTables, own: OwnStream,
                 joins: Joins) -> None:
        self.member_id, self.config, self.address = basics.member_id, basics.config, basics.address
        self.stats, self.drops = basics.stats, basics.drops
        self.unknown_sender = basics.unknown_sender
        self._own, self._joins, self.tables = own, joins, tables
        self.delivery: Delivery
        self._reorder: ReorderBuffer
        self._repairs: MemberRepairs
        self.receiver: Receiving
        self.sender: Sending
        self.reliable: Set[int] = frozenset()
        self._protocols: dict[int, str] = {}     # reliable topic -> its protocol's domain key
        self._own_domains: frozenset[str] = frozenset()  # the keys of _protocols' values
        self._agents: dict[str, tuple[str, int]] = {}  # protocol -> this member's agent
        self._replies: dict[str, AgentReply] = {}      # protocol -> its agent's latest reply
        self._stalls: dict[int, int] = {}        # source -> highest sseq delivered at last summary
        self._behind: dict[int, float] = {}      # source -> since when its record names more
                                                 # than this member saw, the stream standing still
        self.evidence = TailEvidence()           # whether a stream's tail may be asked for
        self.loss_seen_at = -INF                 # when a channel last showed a datagram lost
        self.data_seen_at = -INF                 # when a channel's datagram last came
        self.peer_cache, self.cacher = PeerCache(), False  # peers' runs kept to repair others with
        self.last_sseq = KeyTable()  # (topic, source, session) -> last delivered sseq
        self._records: dict[int, SenderRecord] = {}   # source -> its record
        self.positions = StreamPositions()       # sseqs taken per source (for dense streams)
        self._taken_keys: dict[int, KeyDigest] = {}  # source -> keys delivered from it
        self._digested: dict[tuple, int] = {}  # (source, session) -> its keys in _taken_keys
        self._forgotten: set[tuple] = set()      # keys taken out of them again (see forget_keys)
        # (topic, source, session, lo) -> (when it may be NAKed again, NAKs so far)
        self._nak_at: dict[tuple, tuple[float, int]] = {}
        self.retry_at = INF                      # when a hole NAKed may be asked for again
        self.settle_at = INF                     # when to report again while idle (see _settling)
        self._moved_at = -INF                    # when this member last sent or delivered
        self._repair_avg = 0.0                   # recent repair time (s), a moving average
        self.hole_opened = False                 # a new hole: NAK it now, not at the next period
        self.progressed = False                  # sent or delivered since the last summary
        self._unknown_sources: set[int] = set()  # to NAK, not known yet: to look up
        self.repair_ms: deque[float] = deque(maxlen=4096)  # gap seen -> filled, latest gaps
        self.gap_at: dict[tuple, list] = {}      # key -> [(hole's last seq, opened at)]
        self.max_seen: dict[int, int] = {}       # source -> highest sseq delivered (reliable)
        self._hi: dict[int, int] = {}            # source -> highest any member delivered
        self._tail_asks: dict[int, list] = {}    # source -> [seen when first asked, when]
        self._period, self._last_summary = 0.05, 0.0  # the token period; when it last reported
        self.tick_at, self.idle = 0.0, self._period > IDLE_FROM  # for the I/O loop: tick_if_due

    def connect(self, delivery: Delivery, reorder: ReorderBuffer, repairs: MemberRepairs,
                receiver: Receiving, sender: Sending) -> None:
        self.delivery, self._reorder, self._repairs = delivery, reorder, repairs
        self.receiver, self.sender = receiver, sender
        self.promotion = Promotion(self.stats, delivery)

    def tick_if_due(self, now: float) -> None:
        """The periodic push, every period; at once on a new hole, on a NAK due again, and on
        progress while the period is `idle` (a sender stalled on its window says so at once);
        soon again while idle and unstable (`_settling`). The I/O loop calls it only from
        `tick_at` (the next of these times), on a hole, or on progress while `idle`."""
        since = now - self._last_summary
        if since >= self._period or (
                (self.hole_opened or now >= self.retry_at or now >= self.settle_at
                 or self.progressed and self.idle) and since >= self._hole_delay()):
            self._recovery_tick(now)

    def _hole_delay(self) -> float:
        """A new hole's wait after the last summary: less where a channel showed a loss since."""
        return LOST_DELAY if self.hole_opened and self.loss_seen_at > self._last_summary else HOLE_DELAY

    def idle_timeout(self, timeout: float | None) -> float:
        """How long the I/O loop may wait before this path has something to do, at most
        `timeout` (the other paths' bound; None: 0.1 s)."""
        if self.hole_opened or self.progressed and self.idle:
            return self._hole_delay()
        if timeout is None:
            timeout = min(0.1, self._period) if self.reliable or self._reorder.held else 0.1
        due = min(self.retry_at, self.settle_at)  # (a NAKed hole to ask for again, a report)
        if due < INF:
            timeout = min(timeout, max(HOLE_DELAY, due - time.monotonic()))
        return timeout

    def to_look_up(self) -> set[int]:
        """Senders this member must ask for repairs and does not know."""
        return self._unknown_sources - set(self.tables.members)

    def status(self) -> dict:
        return {"agents": {p: "%s:%d" % a for p, a in self._agents.items()},
                "reliable_topics": len(self.reliable), "stable_sseq": self._own.stable_sseq,
                "cacher": self.cacher, "token_period": self._period, "light": self.promotion.light,
                "senders_known": sorted(self._records), "gaps": len(self._nak_at),
                "cached_runs": self.peer_cache.count(), "peer_runs_kept": self.peer_cache.kept,
                "cached_messages": self.peer_cache.held}

    # ------------------------------------------------------------------- control installs

    def install(self, agents: dict[str, tuple[str, int]], protocols: dict[int, str],
                cached: set[int] = frozenset()) -> None:
        """This member's agents (per protocol) and its reliable topics' protocols (the runtime
        then makes the per-topic lookups of the other paths again)."""
        self._agents, self._protocols = agents, protocols
        self._own_domains = frozenset(protocols.values())
        self.forget_keys(self.reliable - protocols.keys())
        self.reliable = protocols.keys()  # a view: no second table of thousands of topics
        self._joins.install(cached)
        self._replies = {k: r for k, r in self._replies.items() if k in agents}

    def stability_digest(self) -> str:
        """What holds this member's own messages back, for a flush that timed out: how far
        they are stable and each agent's latest word on them (from an application thread:
        copies, each taken at once)."""
        return stability_digest(self.member_id, self._own.stable_sseq, self.sender.handed,
                                dict(self._agents), dict(self._replies))

    def look_up(self, member_id: int) -> None:
        """A member this one must talk to but does not know (in another scope): the control
        thread looks it up in the root's directory (see `held_senders`)."""
        if member_id not in self._unknown_sources:
            self._unknown_sources.add(member_id)
            self.unknown_sender.set()

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
        owes = not self.reliable.isdisjoint(self.tables.subs)
        for source, record in self._records.items():
            if source == self.member_id:
                continue
            seen = self._stalls[source] = self.max_seen.get(source, 0)
            stalled = stalls.get(source) == seen
            if not stalled:
                self.evidence.moved(source, self._behind.get(source), now)
            if record.top <= seen:
                self._behind.pop(source, None)
            elif not stalled or source not in self._behind:
                self._behind[source] = now
            wanted = self._tail_wanted(source, now, stalled, self._behind.get(source))
            acks[source] = self._owed_of(source, record, seen, wanted, now, naks, streams) \
                if owes else OWED_NOTHING
        self._owed_unnamed(acks, naks, now)
        self._joins.send_asks()  # (the period's asks together: many topics a datagram)
        for source, tail_top in streams:
            self._stream_naks(source, tail_top, naks)
        if self.reliable and self.sender.handed:
            # on the wire: nothing is stable before it is sent
            acks[self.member_id] = self.sender.handed
        naks += self._tail_naks(now)
        self.evidence.period_done()
        return acks, naks

    def _tail_wanted(self, source: int, now: float, stalled: bool = True,
                     since: float | None = None) -> bool:
        """Whether this member may ask for what `source`'s record names beyond what it received
        (see tail_evidence). What a forwarding member lost and was repaired it forwards; a
        forwarding member further behind than the learnt bound is not waited for (the sender
        still holds it all)."""
        return self.evidence.wanted(source, now, stalled, since, self.loss_seen_at,
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
        position = self.positions.contiguous.get(source, 0)
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
        joins = self._joins
        for (topic, session), (fs, fss, ls, lss) in (record.topics or {}).items():
            if topic not in self.reliable or topic not in self.tables.subs:
                continue
            key = (topic, source, session)
            nxt = self.receiver.next_seq.get(key)
            if (nxt is None or joins.asked(key)) and joins.asking(key, now, self._period):
                a = min(a, fss - 1)  # owed from a point not known yet: nothing acknowledged
                continue
            if nxt is None:
                held = self._reorder.held.get(key)
                # joined while these were unstable: owed from the first the sender still holds
                nxt = min(fs, held[0].first) if held else fs
                self.receiver.next_seq[key] = nxt
                if held:
                    self._reorder.release(key)
                    nxt = self.receiver.next_seq[key]
            if nxt > ls:  # joined after all the record names: owed nothing of it
                continue
            if nxt < fs:  # what the sender let go before `fs` is stable (see _pass_stable)
                held = self._reorder.held.get(key)
                self._skip_to(key, min(fs, held[0].first) if held else fs)
                nxt = self.receiver.next_seq[key]
            last = self.last_sseq.get(key, fss - 1)
            tail = (ls, min(lss, record.top)) if lss <= tail_upto else None
            if (self._nak_holes(key, nxt, last, naks, tail) or last < lss) and not dense:
                a = min(a, last)
        return a

    def _owed_unnamed(self, acks: dict[int, int], naks: list, now: float) -> None:
        """Gaps no record names (it has not come yet, or the record names only
        MAX_RECORD_TOPICS of the sender's topics): pulled from the sender all the same, and not
        acknowledged."""
        named = {(n.topic, n.source, n.session) for n in naks}
        for key in self._reorder.held:
            if key[0] not in self.reliable or key in named:
                continue
            if (nxt := self.receiver.next_seq.get(key)) is not None:
                last = self.last_sseq.get(key, 0)
                if self._nak_holes(key, nxt, last, naks) and key[1] in acks:
                    acks[key[1]] = min(acks[key[1]], last)
            else:
                self._joins.asking(key, now, self._period)

    def note_filled(self, key: tuple, given_up: bool) -> None:
        """Time the holes of `key` that the stream has now passed (repair time: from the run
        that revealed the hole to the message that filled it)."""
        marks = self.gap_at[key]
        nxt = self.receiver.next_seq.get(key, 0)
        now = time.monotonic()
        while marks and marks[0][0] < nxt:
            _end, since = marks.pop(0)
            if not given_up:
                self.repair_ms.append((now - since) * 1000)
                self.stats["repairs_timed"] += 1  # (how many of repair_ms are new: metrics)
                self._repair_avg += (now - since - self._repair_avg) / 8
        if not marks:
            del self.gap_at[key]

    def _dense(self, source: int, keys: tuple[int, int]) -> bool:
        """Whether this member took every (topic, session) `source` sent on, its record's `keys`
        (so it is owed every message of the stream: see stream_position)."""
        taken = self._taken_keys.get(source)
        return keys[0] > 0 and taken is not None and taken.same(*keys) \
            and source not in self.positions.untracked

    def _stream_naks(self, source: int, tail_top: int, naks: list) -> None:
        """NAKs of a dense stream's holes (by stream seq, any topic) that no per-topic NAK
        covers, and of its tail up to `tail_top`."""
        covered = [(n.lo_sseq, n.hi_sseq) for n in naks if n.source == source]
        end = self.positions.end(source)
        for lo, hi in [*self.positions.holes(source, MAX_STREAM_NAKS), (end + 1, tail_top)]:
            if lo <= hi and not any(c_lo <= lo and hi <= c_hi for c_lo, c_hi in covered):
                naks.append(Nak(source, ANY_TOPIC, 0, lo, TAIL_SEQ, lo, hi))
                if lo > end:
                    self.stats["nak_stream_tails"] += 1
                    self.stats[self.evidence.why(source)] += 1
                else:
                    self.stats["nak_stream_gaps"] += 1

    def forget_keys(self, topics) -> None:
        """This member no longer takes `topics`: their keys leave its digests, so no stream that
        carries them counts as dense (it would wait for messages it now drops)."""
        if not topics:
            return
        self._digest_keys()
        for key in self.last_sseq:
            if key[0] in topics and key not in self._forgotten:
                self._forgotten.add(key)  # (for good: a later subscription is not dense)
                self._taken_keys[key[1]].remove(key[0], key[2])

    def _digest_keys(self) -> None:
        """Add the keys first delivered since the last summary to their sources' digests."""
        for topic, source, session in self.last_sseq.added_since(self._digested):
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
        for early in self._reorder.held.get(key, ()):
            first, sseq, n = early.first, early.run.first_sseq, len(early.run.lengths)
            if first > nxt:
                out.append([nxt, first - 1, last + 1, sseq - 1])
            if first + n > nxt:
                nxt, last = first + n, sseq + n - 1
        self.stats["nak_gaps"] += len(out)
        if tail is not None and nxt <= tail[0] and last < tail[1]:
            out.append([nxt, min(tail[0], nxt + TAIL_SPAN - 1), last + 1, tail[1]])
            self.stats["nak_tails"] += 1
            self.stats[self.evidence.why(key[1])] += 1
        return out

    def _tail_naks(self, now: float) -> list[Nak]:
        """Ask peers for what another member delivered beyond this one, from a sender whose
        heartbeat stopped (it is gone): so survivors of a sender's crash end on the same prefix.
        Every period until it catches up; it stops asking after TAIL_PATIENCE without progress
        (no peer holds it any more)."""
        out = []
        for source, hi in self._hi.items():
            seen = self.max_seen.get(source)
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
                for (topic, src, session), nxt in self.receiver.next_seq.items():
                    if src == source and topic in self.reliable:
                        last = self.last_sseq.get((topic, src, session), 0)
                        out.append(Nak(source, topic, session, nxt, TAIL_SEQ, last + 1, hi))
                        self.stats["nak_gone_tails"] += 1
                        self.stats[self.evidence.why(source)] += 1
        return out

    # ----------------------------------------------------------------- the periodic push

    def _recovery_tick(self, now: float) -> None:
        """Every token period (and at once when a hole opens): summary to the agent, NAKs to
        senders for holes not NAKed within the last period."""
        self._repairs.new_period()
        if not (self.reliable or self._reorder.held):
            return
        self._last_summary = now
        if self.progressed:
            self._moved_at = now
        self.hole_opened = self.progressed = False
        self.settle_at = now + SETTLE_REPORT if self._settling(now) else INF
        acks, naks = self._owed(now)
        self.delivery.deliver()  # runs released by records that came
        self._joins.caught_up()
        self.promotion.check(self._joins.light())
        light = self.promotion.light
        # each hole by itself: one found since the last tick is NAKed now, even on a stream
        # whose other holes were NAKed a moment ago; each again once a period passed
        missing = {(n.topic, n.source, n.session, n.lo) for n in naks}
        for key in [k for k in self._nak_at if k not in missing]:
            del self._nak_at[key]
        record = {self.member_id: self._own.record(self.sender.handed)} \
            if self.sender.taken_sseq else None
        protocols = self._protocols
        for key, agent in self._agents.items():
            mine = [n for n in naks if protocols.get(n.topic) == key][:MAX_NAKS]
            summary = MemberSummary(acks, self.max_seen, mine, record, light)
            self.receiver.send_control(Summary(summary.to_wire(self.member_id, self.address)),
                                       agent)
            self.stats["summaries_sent"] += 1
            self.stats["naks_reported"] += len(mine)
        # the sender holds everything not yet stable: pull from it (again once a repair should
        # have come: a lost NAK or repair would otherwise cost a whole period, and the tail of
        # the repair times is those); each time again later (TCP's backoff), so that repairs
        # late for want of CPU are not asked for every period until they drown the sender
        nak_at = self._nak_at
        retry = min(self._period, max(RETRY_MIN, RETRY_TIMES * self._repair_avg))
        for nak in naks[:MAX_NAKS]:
            key = (nak.topic, nak.source, nak.session, nak.lo)
            due, tries = nak_at.get(key, (-INF, 0))
            if now < due:
                continue
            self.stats["nak_retries"] += tries > 0  # (a NAK or its repair was lost, or late)
            nak_at[key] = (now + retry * (1 << min(tries, BACKOFF_MOST)), tries + 1)
            member = self.tables.members.get(nak.source)
            if member is not None:
                self.receiver.send_control(nak.ask(), (member.host, member.port))
                self.stats["naks_sent"] += 1
            else:
                self.look_up(nak.source)
        self.retry_at = min(due for due, _ in nak_at.values()) if nak_at else INF
        self.tick_at = min(now + self._period, self.retry_at, self.settle_at)
        self._expire_records(now)

    def _settling(self, now: float) -> bool:
        """Idle, a moment after its stream moved, holding what is not stable yet: its first
        report after an idle spell is answered before the agents turn active, so its period
        stays idle, and a flush of one message would wait a second for its next report."""
        if self._period <= IDLE_FROM or now - self._moved_at > SETTLE_FOR:
            return False
        if self._own.unstable():  # own messages not stable yet
            return True
        for source, seen in self.max_seen.items():
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
            self.evidence.forget(source)

    def on_instructions(self, body: dict, key: str) -> None:
        """Agent `key`'s reply (`agents.api` instructions, read here; ValueError or TypeError
        when malformed): stability and records from above, repairs to push."""
        if key not in self._agents:
            self.receiver.drop("stale_instructions")  # from an agent this member no longer has
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
                    self._own.release(min(r.down.get(source) or 0 for r in mine))
            else:
                stable = stables[source] = self._peer_stable(source)
                self.peer_cache.prune(source, stable)
        self._pass_stable(stables)
        for push in ins.push:
            self.stats["pushes"] += 1
            self._repairs.serve(push.source, push.nak, push.address)
        self._hi = {}
        for r in replies:
            for source, v in r.hi.items():
                self._hi[source] = max(self._hi.get(source, v), v)
        self._period = min(r.period for r in replies)
        if self.promotion.light:
            self._period = min(self._period, LIGHT_PERIOD)
        self.idle = self._period > IDLE_FROM
        self.tick_at = min(self._last_summary + self._period, self.retry_at, self.settle_at)
        self.stats["token_period_ms"] = round(self._period * 1000)
        cacher = any(r.cacher for r in replies)
        if self.cacher and not cacher:
            self.peer_cache.clear()
        self.cacher = cacher

    def _top_moved(self, old: SenderRecord | None, top: int, now: float) -> tuple[float, int]:
        """(top_at, settled) of a sender's record that now says `top`."""
        if old is None:
            return now, 0
        settled = old.top if now - old.top_at >= self._period else old.settled
        return (old.top_at, old.settled) if old.top == top else (now, settled)

    def _pass_stable(self, stables: dict[int, int]) -> None:
        """Go on past holes in each peer's stream at or below its stable position (`stables`):
        no repair will come. A member stability waited for never has one; a member the scope
        dropped (silent too long) and took back under a new id, or demoted to client, may, and
        would otherwise wait for them for good (holding its domain's stability, and its sender's
        flush). Counted as `unrecoverable` (a light member's, who starts later: `light_skipped`)."""
        for source, stable in stables.items():
            c = self.positions.contiguous.get(source)
            if c is not None and c < stable:
                self.positions.mark(source, c + 1, stable)
        for key in [k for k in self._reorder.held if k[1] in stables and k[0] in self.reliable]:
            nxt = self.receiver.next_seq.get(key)
            early = self._reorder.held[key][0]
            first = early.first
            if nxt is not None and first > nxt and early.run.first_sseq - 1 <= stables[key[1]]:
                self._skip_to(key, first)
        self.delivery.deliver()

    def _skip_to(self, key: tuple, seq: int) -> None:
        """`key`'s messages before `seq` will not come: count them, expect `seq`, take what is next."""
        skipped = seq - self.receiver.next_seq[key]
        if self.promotion.light:  # nothing delivered yet: the stream starts at `seq`
            self.stats["light_skipped"] += skipped
            self.delivery.forget(*key, seq)
        else:
            self.stats["unrecoverable"] += skipped
        self.receiver.next_seq[key] = seq
        if key in self.gap_at:
            self.note_filled(key, given_up=True)
        self._reorder.release(key)
