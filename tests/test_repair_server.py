"""The repair server on its own (pure logic: `send` collects the datagrams instead of a socket)."""

from __future__ import annotations

from collections import Counter

from scopecast.netio import wire
from scopecast.netio.repair_server import ANY_TOPIC, REPAIR_BURST, REPAIR_RATE, RepairServer

T = 3
ASKER = ("127.0.0.1", 9)
ME = 5  # the serving member (known only once registered: given with each NAK)


def _server(sent: list, clock=lambda: 0.0) -> tuple[RepairServer, Counter]:
    stats: Counter = Counter()
    return RepairServer(1400, lambda datagram, address: sent.append((datagram, address)),
                        stats, clock), stats


def _messages(sent: list) -> list[tuple]:
    return [(m.topic_id, m.seq, m.stream_seq) for d, _a in sent for m in wire.decode_data(d)[1]]


def test_each_requester_gets_a_budget_a_period_and_the_rest_at_its_next_nak():
    sent: list = []
    server, stats = _server(sent)
    n = 3 * REPAIR_BURST // 1000
    cache = [(q, T, 1, q, 0, b"x" * 900) for q in range(1, n + 1)]
    server.serve_own(ME, cache, 0, [ANY_TOPIC, 0, 1, n, 1, n], ASKER)
    first = _messages(sent)
    assert 0 < len(first) < n and all(a == ASKER for _d, a in sent)
    assert [s for _t, _q, s in first] == list(range(1, len(first) + 1))  # from the start, in order
    sent.clear()
    server.serve_own(ME, cache, 0, [ANY_TOPIC, 0, 1, n, 1, n], ASKER)  # same period: spent
    assert sent == [] and stats["repairs_deferred"] == 1
    server.serve_own(ME, cache, 0, [ANY_TOPIC, 0, 1, n, 1, n], ("127.0.0.1", 10))  # another asker
    assert sent
    sent.clear()
    server.new_period()
    rest = len(first) + 1
    server.serve_own(ME, cache, 0, [ANY_TOPIC, 0, rest, n, rest, n], ASKER)
    assert _messages(sent)[0][2] == rest


def test_the_budget_comes_back_with_time_whatever_the_period():
    """A sender whose token period is the idle one (a second) still repairs at REPAIR_RATE."""
    sent: list = []
    now = [100.0]
    server, stats = _server(sent, lambda: now[0])
    n = 3 * REPAIR_BURST // 1000
    cache = [(q, T, 1, q, 0, b"x" * 900) for q in range(1, n + 1)]
    nak = [ANY_TOPIC, 0, 1, n, 1, n]
    server.serve_own(ME, cache, 0, nak, ASKER)
    first = len(_messages(sent))
    sent.clear()
    now[0] += REPAIR_BURST / REPAIR_RATE / 4  # a quarter of a burst back: a quarter served
    server.serve_own(ME, cache, 0, nak, ASKER)
    assert 0 < len(_messages(sent)) < first
    sent.clear()
    server.serve_own(ME, cache, 0, nak, ASKER)  # none back yet
    assert sent == [] and stats["repairs_deferred"] == 1
    now[0] += 10 * REPAIR_BURST / REPAIR_RATE  # no more than a burst comes back
    server.serve_own(ME, cache, 0, nak, ASKER)
    assert len(_messages(sent)) == first


def test_a_peers_stream_not_cached_is_a_counted_miss():
    sent: list = []
    server, stats = _server(sent)
    server.serve_cached(ME, 7, [], 0, [T, 1, 1, 5, 1, 5], ASKER)
    assert sent == [] and stats["repair_misses"] == 1


def test_a_message_larger_than_a_datagram_goes_in_fragments_between_whole_runs():
    sent: list = []
    server, stats = _server(sent)
    cache = [(1, T, 1, 1, 0, b"a"), (2, T, 1, 2, 0, b"b" * 5000), (3, T, 1, 3, 0, b"c")]
    server.serve_own(ME, cache, 0, [T, 1, 1, 3, 1, 3], ASKER)
    assert stats["repairs_sent"] == 3
    decoded = [wire.decode_data(d) for d, _a in sent]
    # from the serving member, whose id it learned after the server was made
    assert all(h.ptype == wire.PacketType.REPAIR and h.sender == ME for h, _body in decoded)
    kinds = ["whole" if isinstance(body, list) else "fragment" for _h, body in decoded]
    assert kinds[0] == kinds[-1] == "whole" and kinds.count("fragment") >= 4  # 5,000 B in 1,400 B
    assert [bytes(m.payload) for _h, body in decoded if isinstance(body, list) for m in body] \
        == [b"a", b"c"]
