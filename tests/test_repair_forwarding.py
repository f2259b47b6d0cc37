"""A forwarding member that was repaired forwards what the repair brought along the stream's own
path: the members below it missed it too. Had it not, a lost last datagram of a burst showed them
no gap at all, and only a timer could tell their stall from a pause (issue 40 item 6). Real
runtimes on real sockets: A's topic goes to B, which forwards it to C."""

from __future__ import annotations

import contextlib
import os

from member_pair import TOPIC, received, wait_for

from scopecast.netio.channel import UnicastEndpoint
from scopecast.netio.delivery import Subscription
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig

PROTOCOL = "token_ring"


@contextlib.contextmanager
def member_chain():
    """A (1) publishes topic 7 to B (2) by unicast; B forwards it to C (3), which subscribes.
    The topic is reliable everywhere (A keeps what it sent until stable, to repair)."""
    key = os.urandom(32)
    config = RuntimeConfig(ack_timeout=600.0)
    a, b, c = (MemberRuntime(i, name, key, config) for i, name in enumerate("ABC", 1))
    try:
        members = [MemberInfo(rt.member_id, rt.name, *rt.address) for rt in (a, b, c)]
        for rt in (a, b, c):
            rt.call_wait(rt.install_members, members)
            rt.call_wait(rt.install_topics, {TOPIC: "T"}, {TOPIC: 1})
            rt.call_wait(rt.install_recovery, {PROTOCOL: ("127.0.0.1", 9)}, {TOPIC: PROTOCOL})
        inbox = Subscription(frozenset([TOPIC]))
        c.call_wait(c.add_subscription, inbox)
        a.call_wait(a.install_routes, {TOPIC: [Route(RoutingLabel(("A",), ("B",), "A"),
                                                     UnicastEndpoint(*b.address))]})
        b.call_wait(b.install_routes, {TOPIC: [Route(RoutingLabel(("B",), ("C",), "A"),
                                                     UnicastEndpoint(*c.address))]})
        yield a, b, c, inbox
    finally:
        for rt in (a, b, c):
            rt.close()


def test_a_forwarding_member_forwards_the_runs_a_repair_brought_it():
    with member_chain() as (a, b, c, inbox):
        got: list[int] = []
        for seq in range(1, 6):
            a.publish(TOPIC, 1, seq, 0, b"m%d" % seq)
        wait_for(lambda: got.extend(m.seq for m in received(inbox)) or got == [1, 2, 3, 4, 5],
                 "1-5 through B")

        def lose_the_last():  # numbered and built on A, never sent: as if the network lost it
            sseq = a.publish(TOPIC, 1, 6, 0, b"m6")
            a.sender.take_publishes()
            a.sender._pull(next(iter(a.sender._feeds.values())))
            return sseq
        sseq = a.call_wait(lose_the_last)
        assert got == [1, 2, 3, 4, 5] and b.stats["repair_datagrams_in"] == 0
        # B asked A for it (how B learns it misses it is test_window_probe's and
        # test_recovery_path's): A repairs B alone, under a record no channel matches
        a.call_wait(a.repairs.serve, a.member_id, [TOPIC, 1, 6, 6, sseq, sseq], b.address)
        wait_for(lambda: got.extend(m.seq for m in received(inbox)) or got[-1:] == [6],
                 "6 forwarded by B after its repair")
        assert got == [1, 2, 3, 4, 5, 6]
        assert b.stats["repair_datagrams_in"] == 1 and c.stats["repair_datagrams_in"] == 0
        assert c.stats["naks_sent"] == 0  # C asked nobody: what B got, B forwarded
