"""Stream positions and key digests (pure logic): what a dense stream's receiver acknowledges."""

from __future__ import annotations

import random

from scopecast.netio.stream_position import MAX_AHEAD, KeyDigest, StreamPositions


def test_positions_follow_holes_and_close_them_in_any_order():
    pos = StreamPositions()
    pos.mark(1, 5, 9)            # the first taken: the stream starts here for this member
    pos.mark(1, 10, 12)
    pos.mark(1, 15, 16)          # 13..14 missing
    pos.mark(1, 17, 20)          # the stretch after the hole grows
    pos.mark(1, 25, 25)          # 21..24 missing
    assert pos.contiguous[1] == 12 and pos.holes(1, 8) == [(13, 14), (21, 24)]
    pos.mark(1, 22, 24)
    pos.mark(1, 3, 4)            # below the position: nothing changes
    assert pos.contiguous[1] == 12 and pos.holes(1, 8) == [(13, 14), (21, 21)]
    pos.mark(1, 13, 14)
    assert pos.contiguous[1] == 20 and pos.holes(1, 8) == [(21, 21)]
    pos.mark(1, 21, 21)
    assert pos.contiguous[1] == 25 and pos.holes(1, 8) == []


def test_positions_of_a_shuffled_stream_end_contiguous():
    rng = random.Random(7)
    cuts = sorted(rng.sample(range(2, 1000), 150))
    runs = [(lo, hi - 1) for lo, hi in zip([1, *cuts], [*cuts, 1000], strict=True)]
    first, rest = runs[0], runs[1:]
    rng.shuffle(rest)
    pos = StreamPositions()
    pos.mark(9, *first)
    for lo, hi in rest:
        pos.mark(9, lo, hi)
    assert pos.contiguous[9] == 999 and pos.holes(9, 8) == []


def test_a_stream_with_too_many_holes_is_no_longer_tracked():
    pos = StreamPositions()
    pos.mark(2, 1, 1)
    for i in range(MAX_AHEAD + 1):
        pos.mark(2, 3 + 2 * i, 3 + 2 * i)
    assert 2 in pos.untracked


def test_digests_agree_on_the_same_keys_in_any_order_and_differ_otherwise():
    keys = [(t, s) for t in range(1, 300) for s in (1, 2)]
    a, b, c = KeyDigest(), KeyDigest(), KeyDigest()
    for k in keys:
        a.add(*k)
    for k in reversed(keys):
        b.add(*k)
    for k in keys[:-1] + [(999, 1)]:
        c.add(*k)
    assert b.same(a.count, a.digest) and not c.same(a.count, a.digest)


def test_the_end_is_the_furthest_taken():
    pos = StreamPositions()
    pos.mark(4, 1, 10)
    assert pos.end(4) == 10
    pos.mark(4, 20, 30)
    assert pos.end(4) == 30 and pos.contiguous[4] == 10


def test_a_stream_taken_by_two_paths_at_once_ends_contiguous():
    """Runs of one stream that come by two paths (topics laid along different channels) arrive
    interleaved: every other one first, leaving a stretch per hole, then the rest one by one."""
    pos = StreamPositions()
    pos.mark(3, 1, 1)
    for s in range(3, 4002, 2):
        pos.mark(3, s, s)
    assert pos.contiguous[3] == 1 and len(pos.holes(3, 10_000)) == 2000
    for s in range(2, 4001, 2):
        pos.mark(3, s, s)
        assert pos.contiguous[3] == s + 1
    assert pos.holes(3, 8) == [] and pos.end(3) == 4001
