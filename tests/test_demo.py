"""The main job's arguments are checked before anything starts. The job itself (`make demo`: Spark
through RayDP, a submitted plug-in policy, routed topics created on the fly, pattern subscribers in
two LAN scopes with recovery on) runs end to end from the installed wheel in test_wheel.py, and on
three netns hosts in test_local_hosts.py."""

from __future__ import annotations

import io

import pytest

import scopecast
from scopecast.ray_cluster import demo


@pytest.mark.parametrize("rows", [0, -5, 2.5])
def test_a_bad_row_count_is_refused_before_anything_starts(rows):
    with pytest.raises(scopecast.InvalidConfig, match="rows must be a positive integer"):
        demo.run(out=io.StringIO(), rows=rows)
