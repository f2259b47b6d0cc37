"""Runs that arrive ahead of their predecessors (channels replicated modulo n, re-layouts) wait a
little for them; a gap that never fills is delivered after `reorder_timeout`, counted; the first
run a member sees of a stream it joined late is where it starts."""

from __future__ import annotations

import os
import time

import pytest

from scopecast.netio import wire
from scopecast.netio.delivery import Subscription
from scopecast.netio.repair_server import cached_messages
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig

T, U, SOURCE = 3, 4, 9


@pytest.fixture
def member():
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig(reorder_timeout=0.3))
    sub = Subscription(frozenset([T, U]))
    rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
    rt.call_wait(rt.install_topics, {T: "T", U: "U"})
    rt.call_wait(rt.add_subscription, sub)
    yield rt, sub
    rt.close()


def run(rt: MemberRuntime, first: int, count: int) -> None:
    """Hand the member a run of `count` messages of (T, SOURCE, session 1) from `first`."""
    payloads = [b"%d" % s for s in range(first, first + count)]
    data = b"".join(payloads)

    def take():
        rt.receiver.take_run(data, [()], T, SOURCE, 1, first, 1, first, 0, 0,
                     tuple(len(p) for p in payloads), 0)
        rt.delivery.deliver()
    rt.call_wait(take)


def received(sub: Subscription, n: int, timeout: float = 10.0, topic: bool = False) -> list:
    """The seqs delivered (`topic`: (topic, seq) pairs), once there are `n` or at the timeout."""
    seqs: list = []
    deadline = time.monotonic() + timeout
    while len(seqs) < n and time.monotonic() < deadline:
        while sub.queue:
            batch, nbytes = sub.queue.popleft()
            sub.consumed_bytes += nbytes
            seqs += [(m.topic, m.seq) if topic else m.seq for m in batch]
        time.sleep(0.01)
    return seqs


def mixed(rt: MemberRuntime, first_sseq: int, entries: list[tuple[int, int]],
          session: int = 1) -> None:
    """Hand the member one datagram of a mixed run: (topic, seq) per message, consecutive stream
    seqs from `first_sseq`, through the decoder as it comes off the socket."""
    msgs = [wire.WireMessage(t, SOURCE, session, q, 1, first_sseq + i, 0, (("a", "b"),),
                             b"%d" % q)
            for i, (t, q) in enumerate(entries)]
    data = wire.encode_datagram(wire.PacketType.DATA, SOURCE, 1, first_sseq, msgs)
    def take() -> None:
        rt.receiver._on_data(wire.unpack_header(data), memoryview(data), data)
        rt.delivery.deliver()  # (as the receive loop does after each call's datagrams)
    rt.call_wait(take)


def kept(rt: MemberRuntime) -> list[tuple]:
    """(stream seq, topic, seq, payload) of what a caching member keeps of SOURCE's stream."""
    return rt.call_wait(lambda: [(e[0], e[1], e[3], e[5])
                                 for e in cached_messages(rt.recovery.peer_cache.runs(SOURCE)[0])])


def test_runs_out_of_order_are_delivered_in_order(member):
    rt, sub = member
    run(rt, 1, 2)
    run(rt, 6, 3)   # ahead of 3..5
    run(rt, 3, 3)
    assert received(sub, 8) == list(range(1, 9))
    assert rt.stats["gaps"] == 0 and rt.stats["held_early"] == 1


def test_a_gap_that_never_fills_is_delivered_late_and_counted(member):
    rt, sub = member
    run(rt, 1, 2)
    run(rt, 5, 2)   # 3 and 4 never come
    assert received(sub, 4) == [1, 2, 5, 6]
    assert rt.stats["gaps"] == 1


def test_a_late_joiner_starts_where_it_joined(member):
    rt, sub = member
    run(rt, 101, 2)  # the stream was at 100 when this member joined
    run(rt, 103, 1)
    assert received(sub, 3) == [101, 102, 103]
    assert rt.stats["gaps"] == 0


def test_duplicates_of_held_runs_are_dropped(member):
    rt, sub = member
    run(rt, 1, 1)
    run(rt, 3, 2)
    run(rt, 3, 2)   # the same run again, while held
    run(rt, 2, 1)
    assert received(sub, 4) == [1, 2, 3, 4]
    assert rt.stats["duplicates"] == 2


def test_mixed_runs_are_delivered_in_order_per_topic_holes_filled_duplicates_dropped(member):
    """A publisher going round topics T and U: its mixed runs (see `wire`) go by the one-pass
    path while in order, and by the per-run path (held, released, deduplicated) otherwise."""
    rt, sub = member
    mixed(rt, 1, [(T, 1), (U, 1), (T, 2), (U, 2)])
    mixed(rt, 7, [(T, 4), (U, 4)])  # ahead of T 3 and U 3
    mixed(rt, 5, [(T, 3), (U, 3)])
    mixed(rt, 1, [(T, 1), (U, 1), (T, 2), (U, 2)])  # again: duplicates
    got = received(sub, 8, topic=True)
    assert [q for t, q in got if t == "T"] == [1, 2, 3, 4]
    assert [q for t, q in got if t == "U"] == [1, 2, 3, 4]
    assert rt.stats["mixed_runs"] == 4 and rt.stats["held_early"] == 2
    assert rt.stats["duplicates"] == 4 and rt.stats["gaps"] == 0


def test_a_caching_member_keeps_a_mixed_run_in_stream_order(member):
    """Messages of a mixed run go by the one-pass path or by the per-run path (here the first
    seen of U); a caching member's copies stay in stream order whichever (repairs are looked up
    by stream seq)."""
    rt, sub = member
    rt.call_wait(rt.install_recovery, {"token_ring": ("127.0.0.1", 9)},
                 {T: "token_ring", U: "token_ring"})
    rt.recovery.cacher = True
    mixed(rt, 1, [(T, 1)])
    mixed(rt, 2, [(T, 2), (U, 1), (T, 3)])
    assert received(sub, 4) == [1, 2, 1, 3]
    assert kept(rt) == [(1, T, 1, b"1"), (2, T, 2, b"2"), (3, U, 1, b"1"), (4, T, 3, b"3")]


def test_mixed_runs_of_reliable_topics_at_once_or_one_by_one_agree(member):
    """A mixed run whose every message is the next of its own reliable topic is taken at once
    (the per-message work in C); one with a topic twice, a hole or a topic met for the first
    time goes message by message. Either way: delivered in order per topic, cached in stream
    order, the stream position and each topic's last stream seq moved on."""
    rt, sub = member
    rt.call_wait(rt.install_recovery, {"token_ring": ("127.0.0.1", 9)},
                 {T: "token_ring", U: "token_ring"})
    rt.recovery.cacher = True
    mixed(rt, 1, [(T, 1), (U, 1)])            # first seen of both
    mixed(rt, 3, [(T, 2), (U, 2)])            # at once
    mixed(rt, 5, [(T, 3), (U, 3), (T, 4)])    # T twice
    mixed(rt, 10, [(T, 6), (U, 5)])           # T 5 and U 4 (stream seqs 8, 9) missing: held
    mixed(rt, 8, [(T, 5), (U, 4)])            # one by one: they release the held ones
    mixed(rt, 12, [(U, 6), (T, 7)])           # at once again
    got = received(sub, 13, topic=True)
    assert [q for t, q in got if t == "T"] == [1, 2, 3, 4, 5, 6, 7]
    assert [q for t, q in got if t == "U"] == [1, 2, 3, 4, 5, 6]
    assert rt.stats["duplicates"] == 0 and rt.stats["gaps"] == 0
    assert [e[0] for e in kept(rt)] == list(range(1, 14))
    assert rt.recovery.positions.contiguous[SOURCE] == 13
    assert rt.recovery.last_sseq[(T, SOURCE, 1)] == 13 and rt.recovery.last_sseq[(U, SOURCE, 1)] == 12


def test_mixed_runs_of_a_session_never_announced_are_dropped_and_leave_no_state(member):
    """Authenticated but wrong (a buggy member): runs of a session the scope never announced are
    counted and dropped, and no per-session table is made for them (else each bogus session
    would hold memory for good)."""
    rt, sub = member
    rt.call_wait(rt.install_topics, {T: "T", U: "U"}, {T: 1, U: 1})
    for session in (5, 6, 7):
        mixed(rt, 1, [(T, 1), (U, 1)], session=session)
    mixed(rt, 1, [(T, 1), (U, 1)])
    assert received(sub, 2) == [1, 1]
    assert rt.stats["unannounced_session"] == 6
    assert rt.call_wait(lambda: (set(rt.receiver.next_seq.by_source), set(rt.recovery.last_sseq.by_source))) \
        == ({(SOURCE, 1)}, set())
