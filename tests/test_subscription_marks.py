"""A subscription's end markers: every stream's last seq, and the latest MAX_MARKS markers for
`Subscriber.ended` (pure logic: one Subscription, no runtime)."""

from __future__ import annotations

from scopecast.netio.delivery import MAX_MARKS, Subscription


def test_it_remembers_the_latest_markers_and_a_marker_again_is_not_a_second_one():
    sub = Subscription({1})
    n = 3 * MAX_MARKS
    for i in range(n):
        sub.end((f"t/{i}", "pub", 1), i + 1)
    sub.end((f"t/{n - 1}", "pub", 1), n)  # the same marker again
    assert len(sub.ends) == n and sub.ends[("t/0", "pub", 1)] == 1
    assert len(sub.marks) == MAX_MARKS
    assert ("t/0", "pub", 1, 1) not in sub.marks  # the earliest are forgotten
    assert (f"t/{n - MAX_MARKS}", "pub", 1, n - MAX_MARKS + 1) in sub.marks
    assert (f"t/{n - MAX_MARKS - 1}", "pub", 1, n - MAX_MARKS) not in sub.marks
