"""Join points asked and answered in batches (netio.joins, control_messages): on one member
runtime, its control datagrams captured as they would go out (encoded as on the wire): a
period's asks go to a sender as few WhereAsks, and a sender answers many topics a datagram."""

from __future__ import annotations

import os

import pytest

from scopecast.netio import control_messages as cm
from scopecast.netio import wire
from scopecast.netio.control_messages import MAX_JOINS, MAX_WHERE, JoinPoints, WhereAsk
from scopecast.netio.runtime import MemberInfo, MemberRuntime, RuntimeConfig

SOURCE, SESSION, TOPICS = 9, 1, 500


@pytest.fixture
def member():
    rt = MemberRuntime(1, "m", os.urandom(32), RuntimeConfig())
    rt.call_wait(rt.install_members, [MemberInfo(SOURCE, "src", "127.0.0.1", 9)])
    sent: list = []

    def capture(message, address) -> None:  # encoded and read back, as a peer would
        ptype, body = cm.encode(message)
        data = wire.encode_control(ptype, 1, body)
        assert len(data) < 1400  # (one datagram under any MTU this runs on)
        sent.append((cm.decode(ptype, wire.decode_control(data)[1]), address))
    rt.receiver.send_control = capture
    rt.sent = sent
    yield rt
    rt.close()


def test_a_periods_asks_go_to_their_sender_a_few_datagrams_and_its_answer_starts_each(member):
    keys = [(t, SOURCE, SESSION) for t in range(1, TOPICS + 1)]

    def ask() -> list[bool]:
        waiting = [member.joins.asking(k, 100.0, 0.05) for k in keys]
        member.joins.send_asks()
        return waiting

    assert all(member.call_wait(ask))
    asks = [m for m, _a in member.sent]
    assert [len(m.topics) for m in asks] == [MAX_WHERE, MAX_WHERE, TOPICS - 2 * MAX_WHERE]
    assert all(m.__class__ is WhereAsk and m.session == SESSION for m in asks)
    assert [t for m in asks for t in m.topics] == list(range(1, TOPICS + 1))
    assert {a for _m, a in member.sent} == {("127.0.0.1", 9)}

    # the sender's answer, in datagrams of MAX_JOINS: each stream starts where it says
    points = [v for t in range(1, TOPICS + 1) for v in (t, 10 + t, 1)]
    answers = [JoinPoints(SESSION, tuple(points[i:i + 3 * MAX_JOINS]))
               for i in range(0, len(points), 3 * MAX_JOINS)]
    member.call_wait(lambda: [member.joins.on_join_points(SOURCE, a) for a in answers])
    starts = member.call_wait(lambda: [member.receiver.next_seq.get(k) for k in keys])
    assert starts == [10 + t for t in range(1, TOPICS + 1)]
    assert not member.call_wait(lambda: any(member.joins.pending(k) for k in keys))
    # an answer not asked for (again, or for another session) starts nothing
    member.call_wait(lambda: member.joins.on_join_points(SOURCE, JoinPoints(2, (1, 5, 1))))
    assert member.call_wait(lambda: member.receiver.next_seq.get((1, SOURCE, 2))) is None


def test_a_sender_answers_where_streams_start_many_topics_a_datagram(member):
    member.sent.clear()
    member.call_wait(member.joins.on_where, SOURCE, SESSION, tuple(range(1, TOPICS + 1)))
    answers = [m for m, _a in member.sent]
    assert all(m.__class__ is JoinPoints for m in answers)
    assert [len(m.points) // 3 for m in answers] == \
        [MAX_JOINS] * (TOPICS // MAX_JOINS) + [TOPICS % MAX_JOINS]
    # nothing published yet: each stream starts at 1 and everything from 1 is held
    assert [p for m in answers for p in m.triples()] == [(t, 1, 1) for t in range(1, TOPICS + 1)]
