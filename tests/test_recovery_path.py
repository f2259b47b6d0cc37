"""The member's side of recovery, as pure logic on one runtime (no agent, no peers): what a
member asks for when a sender goes quiet."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from scopecast.netio import repair_server, wire
from scopecast.netio.control_messages import JoinPoints, Nak
from scopecast.netio.delivery import Subscription
from scopecast.netio.pause_bound import PAUSE_MAX, TAIL_FALLBACK_MAX, PauseBound
from scopecast.netio.recovery_path import (
    BACKOFF_MOST,
    HOLE_DELAY,
    INF,
    LOST_DELAY,
    RETRY_MIN,
    SETTLE_FOR,
    SETTLE_REPORT,
    TAIL_SEQ,
)
from scopecast.netio.recovery_records import RECORD_ENTRY, named_topics
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig
from scopecast.netio.tail_evidence import TAIL_FALLBACK, TailEvidence

T, SOURCE = 3, 9
PROTOCOL = "token_ring"


@pytest.fixture
def member():
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig())
    rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
    rt.call_wait(rt.install_topics, {T: "T"})
    rt.call_wait(rt.add_subscription, Subscription(frozenset([T])))
    rt.call_wait(rt.install_recovery, {PROTOCOL: ("127.0.0.1", 9)}, {T: PROTOCOL})
    yield rt
    rt.close()


def _deliver(rt: MemberRuntime, first: int, count: int) -> None:
    rt.call_wait(_take, rt, first, count)


def _take(rt: MemberRuntime, first: int, count: int) -> None:
    """`_deliver` on the I/O thread."""
    payloads = [b"%d" % s for s in range(first, first + count)]
    rt.receiver.take_run(b"".join(payloads), [()], T, SOURCE, 1, first, SOURCE, first, 0, 0,
                         tuple(len(p) for p in payloads), 0)
    rt.delivery.deliver()


def _instructions(top: int, hi: int, beat: int = 7) -> dict:
    """What the agent passes down: the sender's record (unstable from 1 to `top`, with its
    heartbeat) and the furthest any member delivered."""
    return {"down": {str(SOURCE): [0, [top, [[T, 1, 1, 1, top, top]], beat]]},
            "hi": {str(SOURCE): hi}, "period": 0.02}


def _tail_naks_after(rt: MemberRuntime, instructions, seconds: float) -> list:
    """Feed the member its agent's replies every 10 ms for `seconds`, while its channels show
    datagrams lost (see `_lossy`); its tail NAKs then."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _lossy(rt)
        rt.call_wait(rt.recovery.on_instructions, instructions(), PROTOCOL)
        time.sleep(0.01)
    return rt.call_wait(lambda: rt.recovery._tail_naks(time.monotonic()))


def _lossy(rt: MemberRuntime) -> None:
    """A channel of the member has just shown a datagram lost (a gap in its datagram numbers:
    see test_window_probe): the evidence that lets it ask for a stream's tail."""
    rt.recovery.loss_seen_at = time.monotonic()


def test_a_member_behind_its_peers_asks_them_for_the_tail_once_the_senders_heartbeat_stops(member):
    """A killed sender's agent keeps passing its last record down until the scope drops it
    (seconds later): the record still arrives, but its heartbeat no longer moves. The survivor
    behind the others must not wait for the record to vanish (it used to, and a consumer's idle
    timeout could run out first)."""
    _deliver(member, 1, 400)
    naks = _tail_naks_after(member, lambda: _instructions(300, 500), 0.3)
    assert naks == [Nak(SOURCE, T, 1, 401, TAIL_SEQ, 401, 500)]


def test_no_tail_nak_while_the_sender_lives_even_when_it_waits_on_its_window(member):
    """A sender whose window is full sends nothing new, but its heartbeat moves: it will serve
    the NAKs of its own record, so peers are not asked as well (that doubled the repairs and
    stalled a 5% loss benchmark on stability)."""
    _deliver(member, 1, 400)
    beats = iter(range(10_000))
    assert _tail_naks_after(member, lambda: _instructions(300, 500, next(beats)), 0.3) == []


def test_a_member_behind_keeps_asking_for_the_tail_while_it_makes_no_progress(member):
    """Under load a repair can take many periods (a token round, a lost push): the survivor
    must not give up after a few tries (it did after 20 periods, and ended on a shorter prefix
    than its peers)."""
    _deliver(member, 1, 400)
    naks = _tail_naks_after(member, lambda: _instructions(300, 500), 1.5)  # 75 periods of 20 ms
    assert naks == [Nak(SOURCE, T, 1, 401, TAIL_SEQ, 401, 500)]


def test_a_member_that_joined_after_all_its_sender_named_owes_no_ack_of_it(member):
    """A member told it joined a stream past everything the sender's record names (it came in
    after those messages) is owed none of them: it must acknowledge them, or they never become
    stable and the sender's flush times out (seen with pattern subscribers of a new topic)."""
    key = (T, SOURCE, 1)

    def joined_after_100():
        member.joins._asks[key] = [1, time.monotonic()]
        member.joins.on_join_points(SOURCE, JoinPoints(1, (T, 101, 101)))
        member.recovery.on_instructions(_instructions(100, 0), PROTOCOL)
        return member.recovery._owed(time.monotonic())
    acks, naks = member.call_wait(joined_after_100)
    assert acks[SOURCE] == 100 and naks == []


def test_a_new_hole_is_asked_of_the_sender_at_once_even_if_another_of_its_stream_just_was(member):
    """Each hole is NAKed to the sender by itself: one that opens a moment after another of the
    same stream was NAKed does not wait a period behind it (it used to: repair p50 halved)."""
    def tick() -> int:
        member.recovery._recovery_tick(time.monotonic())
        return member.stats["naks_sent"]

    _deliver(member, 1, 10)
    _deliver(member, 20, 11)  # 11..19 missing
    first = member.call_wait(tick)
    _deliver(member, 40, 11)  # 31..39 missing too, a moment later
    second = member.call_wait(tick)
    assert (first, second) == (1, 2)  # the new hole now; the first not again within its period


def test_a_hole_a_channel_shows_lost_is_asked_for_sooner_than_one_that_may_be_a_reordering(member):
    """A hole opening right after a summary waits HOLE_DELAY (a run reordered across paths comes
    within it); where a channel's datagram numbers showed a datagram lost since that summary,
    only LOST_DELAY (at 1% loss and saturation that wait was a third of the slowest repairs)."""
    def hole_then_tick(first: int, lost: bool) -> tuple[int, int]:
        recovery = member.recovery
        recovery._recovery_tick(time.monotonic())
        last = recovery._last_summary
        before = member.stats["naks_sent"]
        _take(member, first, 3)  # a hole of 7 just before it
        if lost:
            recovery.loss_seen_at = last + LOST_DELAY / 2
        assert recovery.idle_timeout(None) == (LOST_DELAY if lost else HOLE_DELAY)  # the wait
        recovery.tick_if_due(last + (LOST_DELAY + HOLE_DELAY) / 2)
        early = member.stats["naks_sent"] - before
        # (a hair past: `last + HOLE_DELAY - last` rounds below HOLE_DELAY for some clock values,
        # e.g. whenever time.monotonic() is between 512 and 4,096 s)
        recovery.tick_if_due(last + HOLE_DELAY * 1.001)
        return early, member.stats["naks_sent"] - before

    _deliver(member, 1, 10)
    assert member.call_wait(lambda: hole_then_tick(18, False)) == (0, 1)
    assert member.call_wait(lambda: hole_then_tick(28, True)) == (1, 1)


def test_a_hole_is_asked_for_again_once_its_repair_is_overdue_not_a_period_later(member):
    """A lost NAK or repair used to cost a whole period (and the p99 of repair times was those):
    the hole is asked for again after twice the recent repair time, at least RETRY_MIN."""
    def naks_at(now: float) -> int:
        member.recovery._recovery_tick(now)
        return member.stats["naks_sent"]

    _deliver(member, 1, 10)
    _deliver(member, 20, 11)  # 11..19 missing
    t = time.monotonic()
    later = t + RETRY_MIN * 1.5
    sent = member.call_wait(lambda: [naks_at(t), naks_at(t + RETRY_MIN / 2), naks_at(later)])
    assert member.recovery._period >= 4 * RETRY_MIN  # (what it waited for before)
    assert sent == [1, 1, 2]
    # the step loop ticks when it is due again: twice as late as the time before (see below)
    assert member.recovery.retry_at == pytest.approx(later + 2 * RETRY_MIN)


def test_a_hole_asked_for_again_and_again_waits_twice_as_long_each_time_up_to_a_bound(member):
    """Repairs late because the machine has no CPU to spare must not be asked for every
    period: across three hosts on two cores the receivers asked again for 416 of 459 holes and
    the sender sent 45,139 repair datagrams for 1,042 NAKs. Each NAK of a hole comes twice as
    late as the one before, from RETRY_MIN to 2**BACKOFF_MOST times it."""
    def asked_at(ticks: int) -> list[float]:
        """On the I/O thread in one go (its own loop must not NAK the hole in between): the
        hole made, then the recovery ticked as the step loop ticks it."""
        _take(member, 1, 10)
        _take(member, 20, 11)  # 11..19 missing, never repaired
        when, now = [], time.monotonic()
        for _ in range(ticks):
            before = member.stats["naks_sent"]
            member.recovery._recovery_tick(now)
            if member.stats["naks_sent"] > before:
                when.append(now)
            now = max(now + RETRY_MIN / 4, member.recovery.retry_at)
        return when

    when = member.call_wait(lambda: asked_at(7))
    gaps = [round((b - a) / RETRY_MIN, 6) for a, b in zip(when, when[1:], strict=False)]
    assert gaps == [1, 2, 4, 2 ** BACKOFF_MOST, 2 ** BACKOFF_MOST, 2 ** BACKOFF_MOST]
    assert member.stats["nak_retries"] == 6


def test_an_idle_member_holding_what_is_not_stable_yet_reports_again_soon(member):
    """After an idle spell, a member's first report is answered before the agents turn active,
    so with the idle period: it used to wait that whole period (a second) for its next report,
    which the data's stability needed (a flush of one message took over a second). It reports
    again within SETTLE_REPORT while what it delivered is not stable, and only then."""
    def due(stable: int, period: float, moved_ago: float = 0.0) -> float:
        member.recovery.on_instructions({"down": {str(SOURCE): [stable, [15, [[T, 1, 1, 1, 15, 15]], 7]]},
                                 "hi": {}, "period": period}, PROTOCOL)
        now = time.monotonic()
        member.recovery._moved_at = min(member.recovery._moved_at, now - moved_ago)
        member.recovery._recovery_tick(now)
        return member.recovery.settle_at - now

    _deliver(member, 1, 10)
    assert member.call_wait(lambda: due(0, 1.0)) == pytest.approx(SETTLE_REPORT)
    assert member.call_wait(lambda: due(10, 1.0)) == INF  # all it delivered is stable
    _deliver(member, 11, 5)
    assert member.call_wait(lambda: due(10, 0.02)) == INF  # active: its period is short anyway
    assert member.call_wait(lambda: due(10, 1.0)) == pytest.approx(SETTLE_REPORT)
    assert member.call_wait(lambda: due(10, 1.0, 2 * SETTLE_FOR)) == INF  # not for ever


def test_a_topic_behind_the_record_is_asked_for_only_once_the_senders_stream_stalls(member):
    """A sender going round many topics moves each of them less often than once a period: a
    topic whose messages are still in flight must not be NAKed while the sender's stream keeps
    coming (per topic, members asked for thousands of spurious repairs a second at 3,000
    topics); once the stream stalls, what the record names beyond it is asked for."""
    u = T + 1
    member.call_wait(member.install_topics, {T: "T", u: "U"})
    member.call_wait(member.add_subscription, Subscription(frozenset([u])))
    member.call_wait(member.install_recovery, {PROTOCOL: ("127.0.0.1", 9)},
                     {T: PROTOCOL, u: PROTOCOL})
    _deliver(member, 1, 200)  # T 1..200 at stream seqs 1..200; the record names T up to 300
    record = {"down": {str(SOURCE): [0, [1000, [[T, 1, 1, 1, 300, 300]], 7]]},
              "hi": {str(SOURCE): 0}, "period": 0.02}

    def summary(u_seq: int | None) -> list:
        if u_seq is not None:  # the stream moves on another topic
            member.receiver.take_run(b"u", [()], u, SOURCE, 1, u_seq, SOURCE, 400 + u_seq, 0, 0, (1,), 0)
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(time.monotonic())[1]

    moving = [member.call_wait(summary, i) for i in range(1, 5)]
    _lossy(member)
    stalled = [member.call_wait(summary, None) for _ in range(2)]
    assert moving == [[]] * 4
    assert stalled[-1] == [Nak(SOURCE, T, 1, 201, 300, 201, 300)]


@pytest.mark.parametrize("sender", ["sending", "idle"])
def test_a_tail_the_sender_may_not_have_sent_yet_is_asked_for_only_once_it_was_on_the_wire(
        member, sender):
    """The record names a topic's unstable messages up to stream seq `lss`, which may be past
    what the sender has sent (`top`): while the sender keeps sending (other topics, to other
    members), the member asks for that topic's tail only once the stream was past `lss` a
    period ago, or the sender went idle (then up to `top`). Stalled members used to ask at
    once: at 3,000 topics every summary asked for hundreds of tails still on their way."""
    _deliver(member, 1, 200)  # T 1..200 at stream seqs 1..200: nothing more comes (stalled)

    def summary(top: int) -> list:
        time.sleep(0.03)  # each record a period (20 ms) after the one before
        member.recovery.on_instructions({"down": {str(SOURCE): [0, [top, [[T, 1, 1, 1, 300, 5000]], 7]]},
                                 "hi": {str(SOURCE): 0}, "period": 0.02}, PROTOCOL)
        return member.recovery._owed(time.monotonic())[1]

    tops = [4000, 4500, 4900] if sender == "sending" else [4000] * 5
    _lossy(member)
    before = [member.call_wait(summary, top) for top in tops]
    if sender == "sending":
        assert before == [[]] * 3  # 201..300 may all be past 4,900: not asked for
        member.call_wait(summary, 5100)  # the stream passes 5,000 ...
        after = member.call_wait(summary, 5200)  # ... a period ago
        assert after == [Nak(SOURCE, T, 1, 201, 300, 201, 5000)]
    else:  # idle at 4,000 for IDLE_PERIODS periods: what it has sent, it has sent
        assert before[0] == [] and before[-1] == [Nak(SOURCE, T, 1, 201, 300, 201, 4000)]


def test_a_hole_in_a_topic_the_record_does_not_name_holds_the_acknowledgement_back(member):
    """A sender's record names at most MAX_RECORD_TOPICS of its unstable topics: a hole in one it
    leaves out must still keep the member's acknowledgement of the stream below it (it did not:
    the message could become stable, leave every cache, and never be repaired)."""
    u = T + 1
    member.call_wait(member.install_topics, {T: "T", u: "U"})
    member.call_wait(member.add_subscription, Subscription(frozenset([u])))
    member.call_wait(member.install_recovery, {PROTOCOL: ("127.0.0.1", 9)},
                     {T: PROTOCOL, u: PROTOCOL})
    _deliver(member, 1, 10)  # T 1..10 at stream seqs 1..10: all the record names (T)
    record = {"down": {str(SOURCE): [0, [20, [[T, 1, 1, 1, 10, 10]], 7]]},
              "hi": {str(SOURCE): 0}, "period": 0.02}

    def owed():
        member.receiver.take_run(b"u", [()], u, SOURCE, 1, 1, SOURCE, 11, 0, 0, (1,), 0)
        member.receiver.take_run(b"u", [()], u, SOURCE, 1, 3, SOURCE, 15, 0, 0, (1,), 0)  # U 2 lost
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(time.monotonic())
    acks, naks = member.call_wait(owed)
    assert acks[SOURCE] == 11  # U 1, the last before the hole
    assert Nak(SOURCE, u, 1, 2, 2, 12, 14) in naks


def _unnamed_tail_case(member, keys: tuple[int, int]) -> tuple[dict, list]:
    """T 1..10 at stream seqs 1..10, U 1 at 11, U 2 (12) lost, T 11 at 13; the sender's record
    names T only (it has more unstable topics than a record names), with its horizon at 10."""
    u = T + 1
    member.call_wait(member.install_topics, {T: "T", u: "U"})
    member.call_wait(member.add_subscription, Subscription(frozenset([u])))
    member.call_wait(member.install_recovery, {PROTOCOL: ("127.0.0.1", 9)},
                     {T: PROTOCOL, u: PROTOCOL})
    _deliver(member, 1, 10)
    record = {"down": {str(SOURCE): [0, [20, [[T, 1, 1, 1, 11, 13]], 7, 10, *keys]]},
              "hi": {str(SOURCE): 0}, "period": 0.02}

    def owed():
        member.receiver.take_run(b"u", [()], u, SOURCE, 1, 1, SOURCE, 11, 0, 0, (1,), 0)
        member.receiver.take_run(b"t", [()], T, SOURCE, 1, 11, SOURCE, 13, 0, 0, (1,), 0)
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(time.monotonic())
    return member.call_wait(owed)


def test_a_lost_tail_of_a_topic_the_record_does_not_name_is_not_acknowledged(member):
    """Past MAX_RECORD_TOPICS unstable topics, the record leaves topics out: a member that lost
    the last message of one of them (nothing after it tells) acknowledged the stream past it
    (here 20), so it could become stable, leave every cache and never be repaired. Now it
    acknowledges no further than the record's horizon."""
    acks, naks = _unnamed_tail_case(member, (0, 0))
    assert acks[SOURCE] == 10
    assert naks == []  # (not known here: asked for once the record names U)


def test_a_dense_stream_is_acknowledged_and_repaired_by_stream_position(member):
    """A member that took every topic the sender sent on (the keys' digests agree) is owed every
    stream seq: it acknowledges its contiguous position and asks for the hole by stream seq,
    whatever its topic."""
    from scopecast.netio.repair_server import ANY_TOPIC
    from scopecast.netio.stream_position import KeyDigest
    sent = KeyDigest()
    sent.add(T, 1)
    sent.add(T + 1, 1)
    acks, naks = _unnamed_tail_case(member, (sent.count, sent.digest))
    assert acks[SOURCE] == 11
    assert naks == [Nak(SOURCE, ANY_TOPIC, 0, 12, TAIL_SEQ, 12, 12)]


@pytest.mark.parametrize("dense", [True, False])
def test_a_dense_stream_is_acknowledged_past_the_record_it_has_of_its_sender(member, dense):
    """The record a member has of a sender is a token trip old: a member owed every message of
    the stream (dense) acknowledges all it holds, beyond the record's top too, so the sender's
    last messages become stable one trip up and down the agents after they came, not two (the
    next record first, then the acknowledgement). Not dense: the record still bounds it."""
    from scopecast.netio.stream_position import KeyDigest
    sent = KeyDigest()
    sent.add(T, 1 if dense else 2)  # (another session: this member did not take all it sent)
    _deliver(member, 1, 30)  # T 1..30 at stream seqs 1..30; the record was made at 20
    record = {"down": {str(SOURCE): [0, [20, [[T, 1, 1, 1, 20, 20]], 7, 20, sent.count,
                                         sent.digest]]}, "hi": {str(SOURCE): 0}, "period": 0.02}

    def owed():
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(time.monotonic())
    acks, naks = member.call_wait(owed)
    assert acks[SOURCE] == (30 if dense else 20)
    assert naks == []


def test_a_member_that_takes_no_reliable_topic_acknowledges_every_stream_whole():
    """A publisher that subscribes to nothing is owed nothing: it acknowledges a sender's stream
    without bound, where it acknowledged only the top of the record it had of the sender (a
    token trip old: the sender's newest messages waited one trip more for it, as for a
    receiver)."""
    from scopecast.netio.recovery_path import OWED_NOTHING
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig())
    try:
        rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
        rt.call_wait(rt.install_topics, {T: "T"})
        rt.call_wait(rt.install_recovery, {PROTOCOL: ("127.0.0.1", 9)}, {T: PROTOCOL})

        def owed():
            rt.recovery.on_instructions(_instructions(20, 0), PROTOCOL)
            return rt.recovery._owed(time.monotonic())
        acks, naks = rt.call_wait(owed)
        assert acks[SOURCE] == OWED_NOTHING and naks == []
        sub = Subscription(frozenset([T]))
        rt.call_wait(rt.add_subscription, sub)  # a subscriber: held to what it holds
        assert rt.call_wait(owed)[0][SOURCE] == 0
    finally:
        rt.close()


def test_a_nak_of_any_topic_is_served_with_each_topics_messages_in_runs_of_their_own(member):
    """The sender answers a stream-seq NAK with every message it holds in the range, in runs
    that never join two topics (a run is one topic's consecutive seqs)."""
    from scopecast.netio import wire
    from scopecast.netio.repair_server import ANY_TOPIC
    sent: list[bytes] = []
    u = T + 1

    def serve():
        member.own.cache[:] = [(5, T, 1, 4, 0, b"t4"), (6, u, 1, 5, 0, b"u5"), (7, T, 1, 5, 0, b"t5")]
        member.own.head = 0
        member.repairs.server.send = lambda datagram, address: sent.append(datagram)
        member.repairs.serve(member.member_id, [ANY_TOPIC, 0, 5, TAIL_SEQ, 5, 7], ("127.0.0.1", 9))
    member.call_wait(serve)
    got = [(m.topic_id, m.seq, m.stream_seq, bytes(m.payload))
           for d in sent for m in wire.decode_data(d)[1]]
    assert got == [(T, 4, 5, b"t4"), (u, 5, 6, b"u5"), (T, 5, 7, b"t5")]


def test_a_caching_member_serves_a_peer_exactly_the_messages_named_out_of_the_runs_it_keeps(
        member):
    """A caching member keeps whole runs (the datagram, where the payloads are) rather than a
    copy per message; a peer's NAK gets just the messages it names, cut out of them, also when
    its range starts or ends inside a run."""
    from scopecast.netio import wire
    from scopecast.netio.repair_server import ANY_TOPIC
    sent: list[bytes] = []
    member.recovery.cacher = True
    _deliver(member, 1, 4)
    _deliver(member, 5, 6)

    def serve(nak):
        sent.clear()
        member.repairs.new_period()
        member.repairs.server.send = lambda datagram, address: sent.append(datagram)
        member.repairs.serve(SOURCE, nak, ("127.0.0.1", 9))
        return [(m.topic_id, m.seq, m.stream_seq, bytes(m.payload))
                for d in sent for m in wire.decode_data(d)[1]]
    assert member.call_wait(serve, [T, 1, 3, 6, 3, 6]) == [
        (T, q, q, b"%d" % q) for q in (3, 4, 5, 6)]
    assert member.call_wait(serve, [ANY_TOPIC, 0, 9, TAIL_SEQ, 9, 20]) == [
        (T, 9, 9, b"9"), (T, 10, 10, b"10")]
    assert member.call_wait(serve, [T + 1, 1, 1, 10, 1, 10]) == []


def test_a_caching_member_lets_go_of_runs_as_they_become_stable(member):
    """Stable runs leave the cache at once: their datagrams are freed, not when more than half
    of the list is stable and it is cut (a member caching a fast stream held up to twice what
    was unstable)."""
    member.recovery.cacher = True
    for first in (1, 3, 5, 7, 9, 11):
        _deliver(member, first, 2)
    cache = member.recovery.peer_cache
    assert member.call_wait(cache.count) == 6
    member.call_wait(cache.prune, SOURCE, 4)
    assert member.call_wait(cache.count) == 4
    runs = member.call_wait(lambda: list(cache.runs(SOURCE)[0]))
    assert [r.first_sseq if r else None for r in runs] == [None, None, 5, 7, 9, 11]
    member.call_wait(cache.prune, SOURCE, 8)  # more than half: the list is cut
    assert [r.first_sseq for r in member.call_wait(lambda: list(cache.runs(SOURCE)[0]))] \
        == [9, 11]


def test_a_dense_stream_asks_again_for_none_of_the_runs_it_holds_after_a_hole(member):
    """T 11 lost, T 12..20 held (in order per topic, they wait for it): the member asks for 11
    alone, not for what it holds, although nothing moves (one topic at 1% loss: every hole
    would have had the sender send everything after it again)."""
    from scopecast.netio.stream_position import KeyDigest
    sent = KeyDigest()
    sent.add(T, 1)
    _deliver(member, 1, 10)
    record = {"down": {str(SOURCE): [0, [20, [[T, 1, 1, 1, 20, 20]], 7, 20, sent.count,
                                          sent.digest]]}, "hi": {str(SOURCE): 0}, "period": 0.02}

    def owed():
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(time.monotonic())
    payloads = [b"%d" % s for s in range(12, 21)]
    member.call_wait(lambda: member.receiver.take_run(b"".join(payloads), [()], T, SOURCE, 1, 12, SOURCE,
                                              12, 0, 0, tuple(len(p) for p in payloads), 0))
    member.call_wait(owed)
    time.sleep(0.3)  # the sender idle since (its record the same): a stalled stream
    acks, naks = member.call_wait(owed)
    assert acks[SOURCE] == 10
    assert naks == [Nak(SOURCE, T, 1, 11, 11, 11, 11)]


def test_a_stream_is_no_longer_dense_once_the_member_drops_one_of_its_topics(member):
    """A member that unsubscribes from one of a dense stream's topics would wait for messages it
    now drops (acknowledging by stream position): the stream is no longer dense for it."""
    from scopecast.netio.stream_position import KeyDigest
    sent = KeyDigest()
    sent.add(T, 1)
    _deliver(member, 1, 10)
    record = _instructions(10, 0)
    record["down"][str(SOURCE)][1] += [10, sent.count, sent.digest]

    def dense() -> bool:
        member.recovery.on_instructions(record, PROTOCOL)
        member.recovery._owed(time.monotonic())
        return member.recovery._dense(SOURCE, member.recovery._records[SOURCE].keys)
    assert member.call_wait(dense)
    member.call_wait(member.remove_subscription, next(iter(member.tables.subscriptions)))
    member.call_wait(member.recovery.forget_keys, {T})  # again: counted once
    assert not member.call_wait(dense)
    assert member.recovery._taken_keys[SOURCE].count == 0


def test_a_record_names_its_topics_packed_and_a_cut_one_is_dropped(member):
    """The sender's record carries its named topics packed (agents pass it on every period);
    the receiver reads them back, and drops instructions whose record is cut short."""
    def own():
        member.own.tails[(T, 1)] = [1, 1, 5, 9]
        member.own.tails[(T + 1, 2)] = [3, 4, 3, 4]
        return member.own.record(member.sender.handed)
    record = member.call_wait(own)
    assert isinstance(record.named, bytes) and len(record.named) == 2 * RECORD_ENTRY.size
    assert named_topics(record.named) == {(T, 1): [1, 1, 5, 9], (T + 1, 2): [3, 4, 3, 4]}
    cut = {"down": {str(SOURCE): [0, [9, record.named[:-1], 7, 9, 0, 0]]}, "hi": {},
           "period": 0.02}
    with pytest.raises(ValueError):  # (the I/O loop counts it as bad_instructions)
        member.call_wait(member.recovery.on_instructions, cut, PROTOCOL)


def test_a_sender_releases_what_became_stable_and_keeps_each_topics_unstable_tail(member):
    """The sender's cache up to the stable stream seq goes; each topic's tail ([first unstable
    seq, a stream seq no later than its own, last seq, last stream seq]) moves past what went,
    and a topic wholly stable keeps only its last seq (its receivers' join point)."""
    U = T + 1
    member.call_wait(member.install_recovery, {PROTOCOL: ("127.0.0.1", 9)},
                     {T: PROTOCOL, U: PROTOCOL})
    for topic, seq in [(T, 1), (U, 1), (T, 2), (U, 2), (T, 3)]:
        member.publish(topic, 1, seq, 0, b"x" * 10)
    member.call_wait(member.sender.take_publishes)
    base = member.own.released_bytes
    member.call_wait(member.own.release, 3)
    assert dict(member.own.tails.items()) == {(T, 1): [3, 4, 3, 5], (U, 1): [2, 3, 2, 4]}
    member.call_wait(member.own.release, 5)
    assert dict(member.own.tails.items()) == {(T, 1): 3, (U, 1): 2}
    assert member.own.released_bytes - base == member.app_bytes
    assert [e for e in member.own.cache if e is not None] == []
    # a receiver appearing now joins each topic after its last message
    member.call_wait(member.joins.note_receivers, {99})
    assert member.joins._join_points[99] == {(T, 1): 4, (U, 1): 3}
    # a topic wholly stable that publishes again has a tail from its new message on, and only
    # the unstable topics are named in the record
    member.publish(U, 1, 3, 0, b"x" * 10)
    member.call_wait(member.sender.take_publishes)
    assert dict(member.own.tails.items()) == {(T, 1): 3, (U, 1): [3, 6, 3, 6]}
    record = member.call_wait(member.own.record, member.sender.handed)
    assert named_topics(record.named) == {(U, 1): [3, 6, 3, 6]}


def _delivered(rt: MemberRuntime) -> list[int]:
    """Seqs in the member's delivery queue."""
    (sub,) = rt.tables.subscriptions
    return [m.seq for batch, _n in sub.queue for m in batch]


@pytest.mark.parametrize("stable, passed", [(18, False), (19, True)])
def test_a_hole_stability_has_passed_is_given_up_and_what_waits_behind_it_delivered(
        member, stable, passed):
    """A member that misses messages its domain's stability has passed (it was dropped by its
    scope and rejoined, or demoted) will never get them: the sender and the caches let them go.
    It goes on past the hole, counted as unrecoverable, instead of holding its stream (and the
    sender's flush) for good. A hole not yet all stable is waited for."""
    _deliver(member, 1, 10)
    _deliver(member, 20, 11)  # 11..19 missing (stream seqs = seqs here)
    member.call_wait(member.recovery.on_instructions,
                     {"down": {str(SOURCE): [stable, 0]}, "hi": {}, "period": 0.02}, PROTOCOL)
    if passed:
        assert _delivered(member) == [*range(1, 11), *range(20, 31)]
        assert member.stats["unrecoverable"] == 9
    else:
        assert _delivered(member) == list(range(1, 11))
        assert member.stats["unrecoverable"] == 0


def test_messages_before_what_the_sender_still_holds_are_given_up(member):
    """The sender's record names a topic's unstable messages from 50 on: a member still
    expecting 11 will not get 11..49 from anyone, and asks only for what follows."""
    _deliver(member, 1, 10)

    def summary():
        member.recovery.on_instructions({"down": {str(SOURCE): [0, [60, [[T, 1, 50, 50, 60, 60]], 7]]},
                                 "hi": {}, "period": 0.02}, PROTOCOL)
        return member.recovery._owed(time.monotonic())
    acks, naks = member.call_wait(summary)
    assert member.stats["unrecoverable"] == 39
    assert member.receiver.next_seq[(T, SOURCE, 1)] == 50
    assert all(nak[3] >= 50 for nak in naks)


def test_the_stability_digest_tells_an_agent_that_has_not_named_the_stream_yet(member):
    """What a flush that timed out says of each agent: never answered, answered without this
    member's stream, or how far it is stable there."""
    assert "token_ring agent at 127.0.0.1:9 never answered" in member.recovery.stability_digest()
    member.call_wait(member.recovery.on_instructions, {"down": {}, "period": 0.02}, PROTOCOL)
    assert "not naming this stream yet" in member.recovery.stability_digest()
    member.call_wait(member.recovery.on_instructions, {"down": {"1": [0, None]}, "period": 0.02},
                     PROTOCOL)
    assert member.recovery.stability_digest().endswith("s ago, stable up to 0")


def test_a_stalled_streams_tail_is_asked_for_only_on_evidence_of_loss(member):
    """A stream that stands still while its sender's record names more is lost only if a
    datagram was: a forwarding member that pauses holds it as well (taken for a lost tail, that
    cost thousands of NAKs and as many repairs per LAN in the demo, with nothing lost). The
    member asks once a channel showed a datagram lost, or, without such evidence, once nothing
    new came on any channel for TAIL_FALLBACK (a safety net)."""
    _deliver(member, 1, 200)  # T 1..200; the record names T up to 300, sent long ago
    record = {"down": {str(SOURCE): [0, [300, [[T, 1, 1, 1, 300, 300]], 7]]},
              "hi": {str(SOURCE): 0}, "period": 0.02}
    tail = [Nak(SOURCE, T, 1, 201, 300, 201, 300)]

    def summary(at: float) -> list:
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(at)[1]

    start = time.monotonic()
    member.recovery.data_seen_at = start  # a datagram came just now (on some channel)
    quiet = [member.call_wait(summary, start + 0.03 * i) for i in range(5)]
    assert quiet == [[]] * 5  # stalled for 4 periods, nothing lost: not asked for
    assert member.call_wait(summary, start + TAIL_FALLBACK + 0.5) == tail  # quiet that long
    member.recovery.loss_seen_at = start + TAIL_FALLBACK + 0.6  # a channel shows a loss at once
    assert member.call_wait(summary, start + TAIL_FALLBACK + 0.62) == tail
    # each tail NAK counted by the evidence it was asked on
    assert [member.stats[k] for k in ("nak_tails", "tails_on_quiet", "tails_on_loss")] \
        == [2, 1, 1]


def _with_records_of(member):
    """The member has T 1..200 of SOURCE, and datagrams of other streams keep coming; its
    summary(top, at): the NAKs it would send at `at` with SOURCE's record naming T up to `top`
    (a fresh heartbeat each time)."""
    _deliver(member, 1, 200)
    beat = iter(range(10, 1000))

    def summary(top: int, at: float) -> list:
        member.recovery.data_seen_at = at  # datagrams keep coming (of other streams)
        member.recovery.on_instructions({"down": {str(SOURCE): [0, [top, [[T, 1, 1, 1, top, top]],
                                                            next(beat)]]},
                                 "hi": {str(SOURCE): 0}, "period": 0.02}, PROTOCOL)
        return member.recovery._owed(at)[1]

    return summary


def test_the_safety_nets_spell_counts_from_when_the_sender_sent_more(member):
    """A stream that stands still because its sender does (held by its window for seconds) is
    owed nothing: the safety net's spell starts when the sender's record first names more than
    the member saw, not when the stream last moved here. (The demo took a publisher's pause,
    followed by a forwarding member's moment of catching up, for a lost tail, and asked for tens
    of thousands of messages the forwarding member was about to send.)"""
    summary = _with_records_of(member)

    start = time.monotonic()
    # the sender sends nothing for longer than the safety net's spell: nothing is owed
    assert [member.call_wait(summary, 200, start + t) for t in (0, 1, 3, TAIL_FALLBACK_MAX + 1)] \
        == [[]] * 4
    sent = start + TAIL_FALLBACK_MAX + 2  # then it sends 201..300; the forwarding member lags
    assert [member.call_wait(summary, 300, sent + t) for t in (0, 0.05, 1, TAIL_FALLBACK_MAX - 1)] \
        == [[]] * 4
    # still nothing a whole spell after the sender sent it: asked for (the safety net)
    assert member.call_wait(summary, 300, sent + TAIL_FALLBACK_MAX + 0.1) \
        == [Nak(SOURCE, T, 1, 201, 300, 201, 300)]


def test_the_safety_net_waits_out_pauses_as_long_as_those_that_ended_by_themselves(member):
    """A forwarding member that works through another sender's burst holds a stream for seconds,
    at every burst. Once such a spell ended by itself (no NAK), the safety net waits twice as
    long before asking; evidence of loss is still asked for at once."""
    summary = _with_records_of(member)

    start = time.monotonic()
    pause = TAIL_FALLBACK_MAX - 1  # behind the record this long, then it came: a pause
    assert [member.call_wait(summary, 300, start + t) for t in (0, 1, pause)] == [[]] * 3
    _deliver(member, 201, 100)
    moved = start + pause + 0.5
    assert member.call_wait(summary, 400, moved) == []
    # behind again: past the default spell, not yet twice the pause seen
    assert [member.call_wait(summary, 400, moved + t) for t in (1, TAIL_FALLBACK_MAX + 1)] \
        == [[]] * 2
    tail = [Nak(SOURCE, T, 1, 301, 400, 301, 400)]
    assert member.call_wait(summary, 400, moved + 2 * (pause + 0.5) + 0.1) == tail
    member.recovery.loss_seen_at = moved + 30  # later, evidence of loss: asked for at once
    assert member.call_wait(summary, 400, moved + 30.01) == tail
    assert [member.stats[k] for k in ("tails_on_bound", "tails_on_loss")] == [1, 1]


def test_the_pause_bound_learns_from_pauses_that_ended_by_themselves():
    bound = PauseBound()
    assert bound.bound(1) == TAIL_FALLBACK_MAX
    bound.moved(1, since=0.0, now=4.0)  # a 4 s spell, no NAK
    assert bound.bound(1) == 8.0 and bound.bound(2) == TAIL_FALLBACK_MAX
    bound.asked(1)
    bound.moved(1, since=10.0, now=22.0)  # a spell that was NAKed teaches nothing
    assert bound.bound(1) == 8.0
    bound.moved(1, since=30.0, now=31.0)  # short spells neither: the default covers them
    assert bound.bound(1) == 8.0
    bound.moved(1, since=40.0, now=60.0)  # a long one: capped
    assert bound.bound(1) == PAUSE_MAX
    bound.forget(1)
    assert bound.bound(1) == TAIL_FALLBACK_MAX


def test_a_stream_that_moves_again_needs_new_evidence(member):
    """Evidence of loss counts for the stall it comes in (or just before): a loss seen while
    the stream was still moving does not make its later pause a lost tail."""
    summary = _behind_its_record(member)

    start = time.monotonic()
    member.recovery.loss_seen_at = member.recovery.data_seen_at = start
    member.call_wait(summary, start)
    _deliver(member, 201, 10)  # the stream moves on a second later ...
    member.call_wait(summary, start + 1.0)
    member.recovery.data_seen_at = start + 1.0
    # ... and stalls, with no new loss seen
    assert member.call_wait(summary, start + 1.05) == []


def test_a_member_leaving_is_evidence_that_a_stalled_streams_tail_is_lost(member):
    """What a member that left held for this one to forward is gone (a forwarding member that
    failed): the stalled stream's tail is asked for then, not after a safety-net timer."""
    summary = _behind_its_record(member)

    start = time.monotonic()
    member.recovery.data_seen_at = start
    assert [member.call_wait(summary, start + 0.03 * i) for i in range(3)] == [[]] * 3
    forwarder = MemberInfo(11, "forwarder", "127.0.0.1", 11)
    sender = MemberInfo(SOURCE, "src", "127.0.0.1", 9)
    member.call_wait(member.install_members, [sender, forwarder])
    assert member.call_wait(summary, start + 0.4) == []  # one joined: no evidence
    member.call_wait(member.install_members, [sender])  # the forwarder left
    assert member.call_wait(summary, start + 0.5) == [Nak(SOURCE, T, 1, 201, 300, 201, 300)]


def _behind_its_record(member):
    """The member has T 1..200 of SOURCE, whose record names T up to 300; its summary at a
    given time: the NAKs it would send then."""
    _deliver(member, 1, 200)
    record = {"down": {str(SOURCE): [0, [300, [[T, 1, 1, 1, 300, 300]], 7]]},
              "hi": {str(SOURCE): 0}, "period": 0.02}

    def summary(at: float) -> list:
        member.recovery.on_instructions(record, PROTOCOL)
        return member.recovery._owed(at)[1]
    return summary


def test_a_repair_its_server_cut_short_has_the_rest_asked_for_at_the_next_summary(
        member, monkeypatch):
    """A repair server gives each asker a budget of repair at once; the last datagram of a repair
    the budget cut short says so (FLAG_MORE), and the member asks for the rest at its next
    summary, though the repair itself just moved its stream and nothing else shows a loss (it
    would otherwise wait out TAIL_FALLBACK per budget). A repair that was whole asks for nothing."""
    monkeypatch.setattr(repair_server, "REPAIR_BURST", 20_000)  # ~20 messages of 900 bytes
    summary = _with_records_of(member)
    sent: list = []
    server = repair_server.RepairServer(1400, lambda d, _a: sent.append(d), Counter())
    cache = [(q, T, 1, q, 0, b"x" * 900) for q in range(201, 301)]

    def repair(hi: int) -> None:
        sent.clear()
        server.new_period()
        server.serve_own(SOURCE, cache, 0, [T, 1, 201, hi, 201, hi], ("127.0.0.1", 9))
        for d in sent:
            member.call_wait(member.receiver._on_data, wire.unpack_header(d), memoryview(d), d)

    start = time.monotonic()
    assert [member.call_wait(summary, 300, start + 0.03 * i) for i in range(2)] == [[]] * 2
    repair(205)  # whole
    assert not wire.unpack_header(sent[-1]).flags & wire.FLAG_MORE
    assert member.call_wait(summary, 300, start + 0.09) == []  # it moved, no evidence
    repair(300)  # cut short
    got = member.recovery.max_seen[SOURCE]
    assert 205 < got < 300 and wire.unpack_header(sent[-1]).flags & wire.FLAG_MORE
    assert member.call_wait(summary, 300, start + 0.12) == [Nak(SOURCE, T, 1, got + 1, 300, got + 1,
                                                            300)]
    assert member.stats["tails_on_cut"] == 1


def test_a_cut_repair_that_ends_in_fragments_says_so_on_its_last_fragment(member, monkeypatch):
    """A message larger than a datagram is repaired in fragments of its own; when it is the last
    one a cut repair holds, its last fragment is the repair's last datagram and carries FLAG_MORE,
    and the member asks for the rest at its next summary as after a cut repair of whole runs."""
    monkeypatch.setattr(repair_server, "REPAIR_BURST", 20_000)  # ~6 messages of 3,000 bytes
    summary = _with_records_of(member)
    sent: list = []
    server = repair_server.RepairServer(1400, lambda d, _a: sent.append(d), Counter())
    cache = [(q, T, 1, q, 0, b"y" * 3000) for q in range(201, 301)]

    start = time.monotonic()
    assert [member.call_wait(summary, 300, start + 0.03 * i) for i in range(2)] == [[]] * 2
    server.new_period()
    server.serve_own(SOURCE, cache, 0, [T, 1, 201, 300, 201, 300], ("127.0.0.1", 9))
    headers = [wire.unpack_header(d) for d in sent]
    assert all(h.flags & wire.FLAG_FRAGMENT for h in headers)
    assert [bool(h.flags & wire.FLAG_MORE) for h in headers] == [False] * (len(sent) - 1) + [True]
    for d in sent:
        member.call_wait(member.receiver._on_data, wire.unpack_header(d), memoryview(d), d)
    got = member.recovery.max_seen[SOURCE]
    assert 201 < got < 300
    assert member.call_wait(summary, 300, start + 0.12) == [Nak(SOURCE, T, 1, got + 1, 300, got + 1,
                                                            300)]
    assert member.stats["tails_on_cut"] == 1


def test_a_sender_forgotten_and_known_again_is_judged_from_then():
    """Once a sender's record expired, nothing of it is kept: known again, its stream's stall
    counts from then, not from when it last moved in its earlier life (which would make its
    first pause a lost tail at once)."""
    def wanted(evidence: TailEvidence) -> bool:
        return evidence.wanted(1, 100.0, True, None, 0.0, 100.0, 0.02)

    remembered, forgotten = TailEvidence(), TailEvidence()
    for evidence in (remembered, forgotten):
        evidence.moved(1, None, 0.0)
    forgotten.forget(1)
    assert wanted(remembered) and not wanted(forgotten)
