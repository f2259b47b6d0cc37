"""The main job (`make demo`) on a slice of the flights table, inside the suite: Spark through
RayDP, a submitted plug-in policy, routed topics created on the fly, pattern subscribers in two
LAN scopes with recovery on; it must report every row delivered to both LANs, the same content."""

from __future__ import annotations

import io

import pytest

import scopecast
from scopecast.ray_cluster import demo


@pytest.mark.parametrize("rows", [0, -5, 2.5])
def test_a_bad_row_count_is_refused_before_anything_starts(rows):
    with pytest.raises(scopecast.InvalidConfig, match="rows must be a positive integer"):
        demo.run(out=io.StringIO(), rows=rows)


@pytest.mark.ray
def test_the_main_job_delivers_every_row_to_both_lans(cluster, spark, tmp_path):
    out = io.StringIO()
    plot = tmp_path / "demo.png"
    try:
        result = demo.run(out=out, plot=str(plot), rows=20_000, spark=spark, timeout=300.0)
    finally:  # the demo's topics leave the session's cluster as they were (its plug-in unused)
        for t in cluster.topics():
            if t.name in ("flights", "routes") or t.name.startswith("flights/"):
                cluster.delete_topic(t.name)
    text = out.getvalue()
    assert result.ok and result.exit_code == 0, text
    assert "Spark read 20,000 flights" in text and "every subscriber got every row" in text
    # each LAN's NAKs are reported (without loss there should be next to none: `make bench`
    # counts them against its target), with what they asked for
    assert list(result.lans) == list(demo.LANS) and result.rows == 20_000
    for lan, counters in result.lans.items():
        assert f"{lan}: {counters['naks']:,} NAKs" in text and "DIFFERS" not in text
        assert set(demo.NAK_KINDS) <= counters.keys()
    assert plot.stat().st_size > 0
