"""Delivery latency: each data datagram carries its publisher's stamp (`wire.stamp_now`), a
forwarding member passes it on, and a subscribing member times delivery by it once a receive
call (status `latency_ms`, the metrics' histogram)."""

from __future__ import annotations

from member_pair import TOPIC, member_pair, received, wait_for

from scopecast.netio import wire


def test_a_stamps_age_wraps_and_what_is_no_latency_is_refused():
    wrap = wire.STAMP_WRAP
    assert wire.stamp_age_ms(1000, 3500) == 2.5
    assert wire.stamp_age_ms(wrap - 500, 1500) == 2.0  # across the wrap
    assert wire.stamp_age_ms(0, 5) is None  # no stamp (repairs, control datagrams)
    assert wire.stamp_age_ms(5000, 4000) is None  # the receiver's clock behind the sender's
    assert wire.stamp_age_ms(1, 2 + wire.STAMP_MOST_US) is None  # older than any latency
    assert 0 < wire.stamp_now() < wrap


def _record_stamps(rt) -> list[int]:
    """The stamps `rt`'s receive path times deliveries by, as it times them."""
    stamps: list[int] = []
    timed = rt.receiver._time_delivery

    def record() -> None:
        stamps.append(rt.receiver.stamp_in)
        timed()
    rt.receiver._time_delivery = record
    return stamps


def test_a_subscriber_times_delivery_by_the_publishers_stamp_and_status_reports_it():
    with member_pair() as (a, b, inbox):
        stamps = _record_stamps(b)
        before = wire.stamp_now()
        got: list = []
        for seq in range(1, 21):
            a.publish(TOPIC, 1, seq, 0, b"x" * 100)
            wait_for(lambda n=seq: got.extend(received(inbox)) or len(got) == n, f"message {seq}")
        after = wire.stamp_now()
        snap = b.call_wait(b.snapshot)
        assert snap["latency_ms"]["count"] == snap["stats"]["latency_timed"] == len(stamps) > 0
        assert snap["latency_ms"]["max"] >= snap["latency_ms"]["p50"] >= 0
        # each stamp was made at A between the first publish and the last delivery
        for stamp in stamps:
            assert wire.stamp_age_ms(before, stamp) is not None, (before, stamp)
            assert wire.stamp_age_ms(stamp, after) is not None, (stamp, after)


def test_a_forwarded_run_keeps_the_stamp_it_came_with():
    """A forwarder sends what it forwards in datagrams of its own, under the stamp of the
    datagram that brought it: latency is timed from the publisher, not the last hop. A stamp
    ahead of the receiver's clock is counted, not timed."""
    with member_pair() as (a, b, inbox):
        stamps = _record_stamps(b)
        ahead = (wire.stamp_now() + 10_000_000) % wire.STAMP_WRAP or 1  # 10 s in the future
        a.call_wait(lambda: a.sender.forward_run(TOPIC, a.member_id, 1, 1, a.member_id, 1, 0,
                                                 a.sender._origin, [b"forwarded"], ahead))
        wait_for(lambda: inbox.queue, "the forwarded message at B")
        assert [m.payload for m in received(inbox)] == [b"forwarded"]
        assert stamps == [ahead]
        stats = b.call_wait(lambda: dict(b.stats))
        assert stats["latency_unclocked"] == 1 and stats.get("latency_timed", 0) == 0
