"""Repair does not wait behind new data (issue 40 item 5; QSM gives recovery priority, thesis
4611-4616): a receiver stops taking its backlog when a hole opens, so the hole is NAKed at once;
the member's own socket (NAKs, repairs, acknowledgements) is read before its multicast sockets,
and while a hole waits for its repair a multicast socket is read only a few calls a pass; a
sender's pump yields to its sockets after PUMP_BYTES. Real runtimes on real sockets; how fast
repairs come is the loss suite's to measure."""

from __future__ import annotations

import selectors
import socket
import threading
import time

from member_pair import TOPIC, member_pair, received, wait_for

from scopecast.netio.receive_path import AWAITING_BUDGET
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.send_path import PUMP_BYTES

PROTOCOL = "token_ring"
KIB = 1 << 10


def _send_one(pub, seq: int, payload: bytes, lose: bool = False) -> None:
    """One message, in a datagram of its own (on `pub`'s I/O thread); with `lose`, numbered and
    built but never sent, as if the network dropped it."""
    def step():
        pub.publish(TOPIC, 1, seq, 0, payload)
        pub.sender.take_publishes()
        feed = next(iter(pub.sender._feeds.values()))
        if lose:
            pub.sender._pull(feed)
        else:
            pub.sender.pump()
            if pub.sender._batch_n:
                pub.sender._flush_batch()
    pub.call_wait(step)


def test_a_receiver_stops_taking_its_backlog_when_a_hole_opens():
    with member_pair(RuntimeConfig(ack_timeout=600.0), window=True) as (pub, sub, inbox):
        sub.call_wait(sub.install_recovery, {PROTOCOL: ("127.0.0.1", 9)}, {TOPIC: PROTOCOL})
        go, held, seen = threading.Event(), threading.Event(), {}

        def backlog():  # on the receiver's I/O thread: its socket fills meanwhile
            held.set()
            go.wait(10)
            sub.recovery.hole_opened = False
            before = sub.stats["datagrams_in"]
            sub.receiver.drain(sub._sock)
            seen["first pass"] = sub.stats["datagrams_in"] - before
            seen["hole"] = sub.recovery.hole_opened
            sub.receiver.drain(sub._sock)  # the hole is known now: the rest in one pass
            seen["both passes"] = sub.stats["datagrams_in"] - before

        paused = threading.Thread(target=sub.call_wait, args=(backlog,))
        paused.start()
        # (only once the I/O thread is held: else its own loop may take datagram 1 first)
        assert held.wait(10)
        try:
            _send_one(pub, 1, b"a")
            _send_one(pub, 2, b"b", lose=True)
            for seq in range(3, 7):
                _send_one(pub, seq, b"c")
            time.sleep(0.05)  # (loopback: the datagrams are in the receiver's socket)
        finally:
            go.set()
            paused.join(15)
        # 1 in order, 2 lost, 3 opens the hole: the pass ends there, 4-6 wait for the next
        assert seen == {"first pass": 2, "hole": True, "both passes": 5}
        got: list[int] = []
        wait_for(lambda: got.extend(m.seq for m in received(inbox)) or got == [1], "message 1")
        assert sub.stats["gaps"] == 0 and sub.reorder.held  # 3-6 held for the repair of 2


def test_the_members_own_socket_is_read_before_its_multicast_sockets():
    with member_pair(RuntimeConfig(ack_timeout=600.0)) as (pub, sub, inbox):
        group = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        group.bind(("127.0.0.1", 0))
        group.setblocking(False)
        order: list[str] = []

        def register():
            sub._sel.register(group, selectors.EVENT_READ)
            drain = sub.receiver.drain
            sub.receiver.drain = lambda sock: (order.append("own" if sock is sub._sock else "group"),
                                      drain(sock))
        sub.call_wait(register)
        try:
            go = threading.Event()
            holding = threading.Event()

            def both_ready():  # data on the "multicast" socket first, then the own socket's
                holding.set()  # the I/O thread is held here: nothing is read before _poll below
                go.wait(10)
                order.clear()
                sub._poll(sub._sel, 0)
                return list(order)

            result: list = []
            paused = threading.Thread(target=lambda: result.append(sub.call_wait(both_ready)))
            paused.start()
            assert holding.wait(10)
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sender.sendto(b"data", group.getsockname())
            time.sleep(0.02)
            sender.sendto(b"control", sub.address)
            time.sleep(0.02)
            go.set()
            paused.join(15)
            sender.close()
            assert result == [["own", "group"]]
        finally:
            sub.call_wait(lambda: sub._sel.unregister(group))
            group.close()


def test_while_a_hole_waits_a_multicast_socket_is_read_a_few_calls_a_pass():
    with member_pair(RuntimeConfig(ack_timeout=600.0)) as (pub, sub, inbox):
        group = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # (not in the loop's selector)
        group.bind(("127.0.0.1", 0))
        group.setblocking(False)
        sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        n = 3 * AWAITING_BUDGET

        def one_pass(waiting: bool) -> int:  # on the I/O thread: one drain of the group socket
            if waiting:
                sub.recovery.gap_at[(TOPIC, 99, 1)] = [(5, time.monotonic())]
            before = sub.stats["recv_calls"]
            try:
                sub.receiver.drain(group)
            finally:
                sub.recovery.gap_at.pop((TOPIC, 99, 1), None)
            return sub.stats["recv_calls"] - before

        try:
            for _ in range(n):  # (junk: each is read, and dropped as too short)
                sender.sendto(b"x", group.getsockname())
            time.sleep(0.02)
            assert sub.call_wait(one_pass, True) == AWAITING_BUDGET
            # no hole: the rest in one pass
            assert sub.call_wait(one_pass, False) == n - AWAITING_BUDGET
        finally:
            sender.close()
            group.close()


def test_a_senders_pump_looks_at_its_sockets_again_after_pump_bytes():
    config = RuntimeConfig(window_bytes=16 << 20, ack_timeout=600.0)
    with member_pair(config, window=True) as (pub, sub, inbox):
        got: list[int] = []
        n = 3 * PUMP_BYTES // (8 * KIB)

        def queue_and_pump_once():
            for seq in range(1, n + 1):
                pub.publish(TOPIC, 1, seq, 0, b"z" * (8 * KIB))
            pub.sender.take_publishes()
            feed = next(iter(pub.sender._feeds.values()))
            before = feed.sent_bytes
            pub.sender.pump()
            return feed.sent_bytes - before, feed.pending()

        sent, pending = pub.call_wait(queue_and_pump_once)
        assert PUMP_BYTES <= sent < PUMP_BYTES + 70 * KIB and pending  # one datagram over at most
        wait_for(lambda: got.extend(m.seq for m in received(inbox)) or len(got) == n, "all")
        assert got == list(range(1, n + 1))
