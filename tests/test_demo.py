"""The main job's arguments are checked before anything starts, and its content check is exact.
The job itself (`make demo`: Spark through RayDP, a submitted plug-in policy, routed topics created
on the fly, pattern subscribers in two LAN scopes with recovery on) runs end to end from the
installed wheel in test_wheel.py, and on three netns hosts in test_local_hosts.py."""

from __future__ import annotations

import io

import pytest

import scopecast
from scopecast.ray_cluster import demo


@pytest.mark.parametrize("rows", [0, -5, 2.5])
def test_a_bad_row_count_is_refused_before_anything_starts(rows):
    with pytest.raises(scopecast.InvalidConfig, match="rows must be a positive integer"):
        demo.run(out=io.StringIO(), rows=rows)


def test_the_content_check_ignores_order_and_finds_a_changed_or_missing_row():
    import pyarrow as pa

    a = pa.table({"origin": ["EWR", "JFK", None], "delay": [1.5, None, -3.0]})
    assert demo.same_rows(a, a.take([2, 0, 1]))
    assert not demo.same_rows(a, pa.table({"origin": ["EWR", "JFK", None], "delay": [1.5, None, -2.0]}))
    assert not demo.same_rows(a, a.slice(0, 2))
    assert not demo.same_rows(a, a.select(["delay", "origin"]))


def test_the_flow_of_rows_is_measured_from_the_publish_call():
    sampler = demo._Sampler(collector=None)
    sampler.began = 100.0
    # (seconds since the sampler began, messages per topic so far); the publish call at 0.5
    both = {"flights/EWR": 10, "flights/JFK": 5}
    sampler.samples = [(0.25, {}), (0.5, {"flights/EWR": 0}), (1.0, {"flights/EWR": 10}),
                       (1.25, both), (3.0, both), (3.5, {**both, "flights/EWR": 40}),
                       (4.0, {**both, "flights/EWR": 40})]
    first, last, gap = sampler.flow(since=100.5)
    assert (first, last, gap) == (0.5, 3.0, 2.25)  # 10 at 0.5, 15 at 0.75, all 45 at 3.0
    sampler.samples = sampler.samples[:2]
    assert sampler.flow(since=100.0) == (None, None, None)
