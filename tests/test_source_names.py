"""A message names its source from the first: runs forwarded from a source this member has not
been told of yet (a publisher in another scope) wait until the control plane names it; runs of a
source that has left (repairs of a killed publisher's stream) keep its name and are not held."""

from __future__ import annotations

import os
import time

from scopecast.netio import wire
from scopecast.netio.auth import sealed
from scopecast.netio.delivery import Subscription
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig

T, FORWARDER, SOURCE = 3, 5, 9


def _received(sub: Subscription, n: int, timeout: float = 10.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        while sub.queue:
            batch, nbytes = sub.queue.popleft()
            sub.consumed_bytes += nbytes
            out += batch
        time.sleep(0.01)
    return out


def _take(rt: MemberRuntime, datagram: bytes) -> None:
    """Hand the member one datagram as its receive loop does (which delivers after each call)."""
    def take() -> None:
        rt.receiver._on_datagram(datagram)
        rt.delivery.deliver()
    rt.call_wait(take)


def test_runs_of_a_source_not_known_yet_are_delivered_under_its_name_once_it_is_known():
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig())
    try:
        sub = Subscription(frozenset([T]))
        forwarder = MemberInfo(FORWARDER, "fwd", "127.0.0.1", 9)
        rt.call_wait(rt.install_members, [forwarder])
        rt.call_wait(rt.install_topics, {T: "T"})
        rt.call_wait(rt.add_subscription, sub)
        msgs = [wire.WireMessage(T, SOURCE, 1, seq, SOURCE, seq, 0, (("A", "A"),), b"m%d" % seq)
                for seq in (1, 2, 3)]
        body = wire.encode_datagram(wire.PacketType.DATA, FORWARDER, 1, 1, msgs)
        _take(rt, sealed(rt.receiver._auth, body))
        assert not sub.queue  # (held: nothing came)
        assert SOURCE in rt.call_wait(rt.held_senders)  # the control thread looks it up
        rt.call_wait(rt.install_members, [forwarder, MemberInfo(SOURCE, "publisher", "127.0.0.1", 10)])
        got = _received(sub, 3)
        assert [(m.source, m.seq, m.payload) for m in got] == \
            [("publisher", 1, b"m1"), ("publisher", 2, b"m2"), ("publisher", 3, b"m3")]
        # the source leaves (killed): what peers still repair of its stream comes under its name
        rt.call_wait(rt.install_members, [forwarder])
        late = wire.WireMessage(T, SOURCE, 1, 4, SOURCE, 4, 0, (("A", "A"),), b"m4")
        body = wire.encode_datagram(wire.PacketType.REPAIR, FORWARDER, 0, 0, [late])
        _take(rt, sealed(rt.receiver._auth, body))
        assert [(m.source, m.seq) for m in _received(sub, 1)] == [("publisher", 4)]
    finally:
        rt.close()
