"""A DataFrame run's publisher waits for its run's `join` before it opens a feed or begins, and
that wait is bounded: a join that never ends is a typed error, not a run that hangs."""

from __future__ import annotations

import pytest

from scopecast.actors.errors import ControlTimeout
from scopecast.ray_cluster import run_publisher


def test_a_join_that_never_ends_is_a_typed_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(run_publisher, "JOIN_TIMEOUT", 0.2)
    pub = run_publisher.RunPublisher(None)  # (the class, not its actor: no join was sent)
    with pytest.raises(ControlTimeout, match="did not join the cluster within"):
        pub.open_feed(b"s" * 32, None)
    with pytest.raises(ControlTimeout):
        pub.begin(None)
    pub._joined.set()  # once joined, the wait passes at once
    pub._wait_joined()
