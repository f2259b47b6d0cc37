"""The replay guard's window, epochs and age bound (pure logic; a real member refusing replays
is test_bad_input's test_replayed_stale_and_old_epoch_control_datagrams_are_refused_and_counted)."""

from __future__ import annotations

from scopecast.netio import wire
from scopecast.netio.replay_guard import WINDOW, ControlNumbers, ReplayGuard

NOW = 1_000_000_000


def admit(guard: ReplayGuard, dseq: int, sender: int = 5, stamp: int = NOW, t: float = 0.0):
    return guard.admit(sender, dseq, stamp, NOW, t)


def test_each_number_passes_once_in_any_order_within_the_window():
    n = ControlNumbers(epoch=7)
    total = WINDOW + 200
    numbers = [n.next() for _ in range(total)]
    guard = ReplayGuard()
    # a whole socket's batch read before another's: far out of order, yet within the window
    order = (numbers[:50] + numbers[60:100] + numbers[50:60][::-1] + numbers[100:200]
             + numbers[300:] + numbers[200:300])
    assert [admit(guard, d) for d in order] == [None] * total
    assert {admit(guard, d) for d in numbers[-WINDOW:]} == {"replayed"}
    assert admit(guard, numbers[total - WINDOW - 2]) == "replayed"  # below the window


def test_an_older_epoch_is_stale_a_newer_one_starts_afresh_and_senders_are_apart():
    guard = ReplayGuard()
    new, old = ControlNumbers(epoch=100), ControlNumbers(epoch=99)
    assert admit(guard, new.next()) is None
    assert admit(guard, old.next()) == "stale_epoch"
    assert admit(guard, old.next(), sender=6) is None  # another sender: its own state
    newer = ControlNumbers(epoch=101)
    assert admit(guard, newer.next()) is None and admit(guard, new.next()) == "stale_epoch"


def test_a_counter_that_would_wrap_starts_the_next_epoch():
    n = ControlNumbers(epoch=0xFFFFFFFF)
    n.counter = 0xFFFFFFFF
    d = n.next()
    assert (d >> 32, d & 0xFFFFFFFF) == (0, 1)
    guard = ReplayGuard()
    assert admit(guard, (0xFFFFFFFF << 32) | 5) is None and admit(guard, d) is None  # 0 after max


def test_a_stamp_too_far_from_the_clock_either_way_or_none_is_stale():
    guard = ReplayGuard(max_age=30.0)
    n = ControlNumbers(epoch=1)
    assert admit(guard, n.next(), stamp=(NOW - 29_000_000)) is None
    assert admit(guard, n.next(), stamp=(NOW - 31_000_000)) == "stale_control"
    assert admit(guard, n.next(), stamp=(NOW + 31_000_000) % wire.STAMP_WRAP) == "stale_control"
    assert admit(guard, n.next(), stamp=0) == "stale_control"
    near_wrap = ReplayGuard()  # the stamp wraps every 71 minutes: ages are taken across it
    assert near_wrap.admit(1, n.next(), wire.STAMP_WRAP - 1_000_000, 1_000_000, 0.0) is None


def test_idle_senders_are_forgotten_and_the_table_is_bounded():
    guard = ReplayGuard(idle=60.0, limit=3)
    for sender in range(5):
        assert admit(guard, ControlNumbers(epoch=1).next(), sender=sender, t=sender) is None
    assert len(guard) == 3  # the oldest went
    guard.expire(62.5)
    assert len(guard) == 2
    assert admit(guard, ControlNumbers(epoch=2).next(), sender=2, t=62.6) is None
    guard.expire(63.2)  # within a second of the last scan: not scanned again (3 idle now)
    assert len(guard) == 3
    guard.expire(64.0)
    assert len(guard) == 2
