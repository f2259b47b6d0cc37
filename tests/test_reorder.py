"""Runs that arrive ahead of their predecessors (channels replicated modulo n, re-layouts) wait a
little for them; a gap that never fills is delivered after `reorder_timeout`, counted; the first
run a member sees of a stream it joined late is where it starts."""

from __future__ import annotations

import os
import time

import pytest

from scopecast.netio.delivery import Subscription
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig

T, SOURCE = 3, 9


@pytest.fixture
def member():
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig(reorder_timeout=0.3))
    sub = Subscription(frozenset([T]))
    rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
    rt.call_wait(rt.install_topics, {T: "T"})
    rt.call_wait(rt.add_subscription, sub)
    yield rt, sub
    rt.close()


def run(rt: MemberRuntime, first: int, count: int) -> None:
    """Hand the member a run of `count` messages of (T, SOURCE, session 1) from `first`."""
    payloads = [b"%d" % s for s in range(first, first + count)]
    data = b"".join(payloads)

    def take():
        rt._take_run(data, [()], T, SOURCE, 1, first, 1, first, 0, 0,
                     tuple(len(p) for p in payloads), 0)
        rt._deliver()
    rt.call_wait(take)


def received(sub: Subscription, n: int, timeout: float = 10.0) -> list[int]:
    seqs: list[int] = []
    deadline = time.monotonic() + timeout
    while len(seqs) < n and time.monotonic() < deadline:
        while sub.queue:
            batch, nbytes = sub.queue.popleft()
            sub.consumed_bytes += nbytes
            seqs += [m.seq for m in batch]
        time.sleep(0.01)
    return seqs


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
