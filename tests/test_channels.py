"""Channels guarded by filters (thesis 3.2.4): `resolve` walks a FilteredChannel tree per message
down to the endpoints the message goes to; filters validate their parameters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scopecast.netio.channel import (
    FilteredChannel,
    MulticastGroup,
    UnicastEndpoint,
    endpoints,
    resolve,
)
from scopecast.netio.filters import ModuloFilter, OriginFilter, TopicFilter

A = UnicastEndpoint("127.0.0.1", 5001, member=1)
B = UnicastEndpoint("127.0.0.1", 5002, member=2)
C = UnicastEndpoint("127.0.0.1", 5003, member=3)
G = MulticastGroup("239.255.0.1", 6000)
H = MulticastGroup("239.255.0.2", 6000)


def where(channel, topic=1, source=1, seq=1, stream_seq=1) -> list:
    out: list = []
    resolve(channel, topic, source, seq, stream_seq, out)
    return out


def test_plain_channels_resolve_to_themselves():
    assert where(A) == [A]
    assert where(G) == [G]
    assert endpoints(A) == (A,) and endpoints(G) == (G,)
    assert A.address == ("127.0.0.1", 5001) and G.address == ("239.255.0.1", 6000)


def test_resolve_appends_to_out():
    out = [C]
    resolve(A, 1, 1, 1, 1, out)
    assert out == [C, A]


def test_modulo_replication_sends_each_message_to_exactly_one_replica():
    replicas = FilteredChannel(tuple((ModuloFilter(3, k), e) for k, e in enumerate((A, B, C))))
    assert [where(replicas, seq=s) for s in range(1, 7)] == [[B], [C], [A], [B], [C], [A]]
    assert endpoints(replicas) == (A, B, C)


def test_modulo_on_stream_sequence_number():
    ch = FilteredChannel(((ModuloFilter(2, 0, on="stream"), A), (ModuloFilter(2, 1, on="stream"), B)))
    # the per-topic sequence number is ignored; the stream sequence number decides
    assert where(ch, seq=1, stream_seq=10) == [A]
    assert where(ch, seq=1, stream_seq=11) == [B]
    assert where(ch, seq=2, stream_seq=11) == [B]


def test_topic_filter_shares_one_channel_between_topics():
    ch = FilteredChannel(((TopicFilter(frozenset({1, 2})), G), (TopicFilter(frozenset({2, 3})), H)))
    assert where(ch, topic=1) == [G]
    assert where(ch, topic=2) == [G, H]  # every accepting branch, in branch order
    assert where(ch, topic=3) == [H]
    assert where(ch, topic=4) == []


def test_origin_filter():
    ch = FilteredChannel(((OriginFilter(frozenset({7})), A), (OriginFilter(frozenset({8, 9})), B)))
    assert where(ch, source=7) == [A]
    assert where(ch, source=9) == [B]
    assert where(ch, source=1) == []


def test_nested_filters():
    # topic 1 is replicated modulo 2 over two members; topic 2 from source 5 goes to a group,
    # and every message of topic 2 also goes to C
    ch = FilteredChannel((
        (TopicFilter(frozenset({1})), FilteredChannel((
            (ModuloFilter(2, 0), A),
            (ModuloFilter(2, 1), B),
        ))),
        (TopicFilter(frozenset({2})), FilteredChannel((
            (OriginFilter(frozenset({5})), G),
            (ModuloFilter(1, 0), C),
        ))),
    ))
    assert where(ch, topic=1, seq=4) == [A]
    assert where(ch, topic=1, seq=5) == [B]
    assert where(ch, topic=2, source=5) == [G, C]
    assert where(ch, topic=2, source=6) == [C]
    assert where(ch, topic=3) == []
    assert endpoints(ch) == (A, B, G, C)


def test_three_levels_deep():
    inner = FilteredChannel(((OriginFilter(frozenset({1})), A), (OriginFilter(frozenset({2})), B)))
    middle = FilteredChannel(((ModuloFilter(2, 1), inner), (ModuloFilter(2, 0), C)))
    outer = FilteredChannel(((TopicFilter(frozenset({9})), middle),))
    assert where(outer, topic=9, source=1, seq=1) == [A]
    assert where(outer, topic=9, source=2, seq=3) == [B]
    assert where(outer, topic=9, source=3, seq=3) == []
    assert where(outer, topic=9, source=2, seq=2) == [C]
    assert where(outer, topic=8, source=1, seq=1) == []


def test_empty_filtered_channel():
    assert where(FilteredChannel(())) == []
    assert endpoints(FilteredChannel(())) == ()


def test_the_same_endpoint_on_two_branches_is_listed_twice():
    ch = FilteredChannel(((TopicFilter(frozenset({1})), A), (OriginFilter(frozenset({1})), A)))
    assert where(ch, topic=1, source=1) == [A, A]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 12), seq=st.integers(0, 2**64 - 1), stream_seq=st.integers(0, 2**64 - 1),
       on=st.sampled_from(["seq", "stream"]))
def test_modulo_partition_property(n, seq, stream_seq, on):
    targets = [UnicastEndpoint("127.0.0.1", 7000 + k) for k in range(n)]
    ch = FilteredChannel(tuple((ModuloFilter(n, k, on=on), t) for k, t in enumerate(targets)))
    key = seq if on == "seq" else stream_seq
    assert where(ch, seq=seq, stream_seq=stream_seq) == [targets[key % n]]


# ------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("n, k", [(0, 0), (-1, 0), (3, 3), (3, -1), (1, 1)])
def test_modulo_filter_rejects_bad_n_k(n, k):
    with pytest.raises(ValueError, match="modulo filter"):
        ModuloFilter(n, k)


@pytest.mark.parametrize("on", ["sequence", "", "STREAM", "topic"])
def test_modulo_filter_rejects_unknown_key(on):
    with pytest.raises(ValueError, match="'seq' or 'stream'"):
        ModuloFilter(2, 0, on=on)


def test_filters_are_immutable_values():
    f = ModuloFilter(4, 1)
    assert f == ModuloFilter(4, 1, on="seq") and hash(f) == hash(ModuloFilter(4, 1))
    with pytest.raises(AttributeError):
        f.k = 2  # type: ignore[misc]
    assert TopicFilter(frozenset({1})) == TopicFilter(frozenset({1}))
    assert OriginFilter(frozenset({1})) != OriginFilter(frozenset({2}))
