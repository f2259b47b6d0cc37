"""A thread waiting in receive() runs its member's I/O loop itself (one wake-up per datagram
instead of a hand-off from the I/O thread): real runtimes on real sockets, no control plane."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

from member_pair import TOPIC, member_pair, received, wait_for

from scopecast.netio.delivery import Subscription
from scopecast.netio.runtime import PARK, PARK_MOST, RuntimeConfig


def publish(a, first: int, n: int) -> None:
    for seq in range(first, first + n):
        a.publish(TOPIC, 1, seq, 0, b"%d" % seq)


def take(rt, inbox: Subscription, n: int, timeout: float = 30.0) -> list:
    """Receive `n` messages as Subscriber.receive() does: leading the loop while none is there."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} messages"
        if not inbox.queue:
            rt.lead(lambda: bool(inbox.queue), 0.5)
        got += received(inbox)
    return got


def test_a_receiving_thread_takes_the_datagrams_itself_and_then_gives_the_lead_back():
    with member_pair(RuntimeConfig(), window=True) as (a, b, inbox):
        got: list = []
        receiving = threading.Thread(target=lambda: got.extend(take(b, inbox, 3000)))
        receiving.start()  # it waits, leading, before anything is sent
        wait_for(lambda: b.stats["receive_leads"] > 0, "the receiving thread leads")
        publish(a, 1, 3000)
        receiving.join(60)
        assert [m.seq for m in got] == list(range(1, 3001))
        stats = b.call_wait(lambda: dict(b.stats))
        assert stats["handovers"] >= 1 and stats["datagrams_in_receiving"] > 0
        # nobody receives now: the I/O thread takes the lead back and delivers on its own
        publish(a, 3001, 500)
        wait_for(lambda: sum(len(b_) for b_, _ in inbox.queue) == 500, "the I/O thread delivers")
        assert [m.seq for m in received(inbox)] == list(range(3001, 3501))


def test_a_second_receiving_thread_is_handed_its_messages_by_the_leader():
    with member_pair(RuntimeConfig()) as (a, b, inbox):
        other = Subscription(frozenset([TOPIC]))
        b.call_wait(b.add_subscription, other)
        first: list = []
        leading = threading.Thread(target=lambda: first.extend(take(b, inbox, 2000)))
        leading.start()
        wait_for(lambda: b.stats["receive_leads"] > 0, "the first thread leads")
        assert b.lead(lambda: bool(other.queue), 0.1) is False  # taken: wait as before
        publish(a, 1, 2000)
        second: list = []
        deadline = time.monotonic() + 30
        while len(second) < 2000 and time.monotonic() < deadline:
            other.waiting = True
            if not other.queue:
                other.event.wait(0.2)
            other.event.clear()
            other.waiting = False
            second += received(other)
        leading.join(30)
        assert [m.seq for m in first] == [m.seq for m in second] == list(range(1, 2001))


CTRL_C = textwrap.dedent('''
    import os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from member_pair import TOPIC, member_pair, received
    from scopecast.netio.runtime import RuntimeConfig
    with member_pair(RuntimeConfig()) as (a, b, inbox):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            b.lead(lambda: bool(inbox.queue), 30.0)  # nothing comes: only Ctrl-C ends it
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted", b.stats["internal_error"])
        for seq in range(1, 101):  # the member works on, its state whole
            a.publish(TOPIC, 1, seq, 0, b"x")
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            b.lead(lambda: bool(inbox.queue), 0.5)
            got += received(inbox)
        print("after", [m.seq for m in got] == list(range(1, 101)))
''')


def test_ctrl_c_in_a_receiving_main_thread_comes_out_of_receive_once_the_loop_is_left():
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", CTRL_C, here], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["interrupted", "0", "after", "True"], out.stdout + out.stderr


def test_a_call_the_io_thread_is_late_with_says_where_that_thread_is():
    """A control call the I/O thread does not run in time fails with the thread's innermost
    frames (a stalled member in a loaded run can then be told from a slow one)."""
    with member_pair(RuntimeConfig()) as (a, _b, _inbox):
        release = threading.Event()

        def hold_the_loop() -> None:
            release.wait(5)

        a.call(hold_the_loop)
        try:
            a.call_wait(a.snapshot, timeout=0.3)
            raise AssertionError("the call ran although the I/O thread was held")
        except TimeoutError as exc:
            message = str(exc)
        finally:
            release.set()
        assert "did not run snapshot within 0.3s" in message
        assert "it leads the loop, in: " in message
        assert "hold_the_loop (test_receive_lead.py:" in message
        assert a.call_wait(a.snapshot)["stats"] is not None  # the loop goes on afterwards


def test_the_io_thread_looks_ever_more_rarely_while_a_receiving_thread_keeps_the_lead():
    """While an application thread leads, the I/O thread looks PARK later whether it still does,
    then twice as late each time, up to PARK_MOST (a look every PARK, 500 wake-ups a second per
    receiving process, cost 12% of 1 KB 1 -> 4 at saturation); once it leads again, PARK."""
    with member_pair(RuntimeConfig()) as (a, b, inbox):
        assert PARK < PARK_MOST
        b.lead(lambda: b.park_for == PARK_MOST, 10.0)  # this thread leads: the looks grow rarer
        assert b.park_for == PARK_MOST
        wait_for(lambda: b.stats["receive_leads"] and b.call_wait(lambda: b._io_leads),
                 "the I/O thread leads again")
        assert b.park_for == PARK  # (set as it took the lead back)
        publish(a, 1, 100)
        assert [m.seq for m in take(b, inbox, 100)] == list(range(1, 101))
        # a member that forwards looks every PARK: a longer pause in what it forwards would be a
        # hole to the members that take the rest of the stream by another path
        b.call_wait(setattr, b.tables, "routes", {TOPIC + 1: []})
        looks = b.stats["park_looks"]
        b.lead(lambda: b.stats["park_looks"] >= looks + 8, 10.0)
        assert b.park_for == PARK
