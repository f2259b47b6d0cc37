"""A DataFrame run's publisher opens its feed before its run's `join` has ended (Spark's
executors send while it joins; the intake keeps what comes), begins only after the join, and
that wait is bounded: a join that never ends is a typed error, not a run that hangs."""

from __future__ import annotations

import pytest

from scopecast.actors.errors import ControlTimeout
from scopecast.ray_cluster import run_publisher
from scopecast.ray_cluster.spark_feed import FeedShare


def test_a_join_that_never_ends_is_a_typed_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(run_publisher, "JOIN_TIMEOUT", 0.2)
    pub = run_publisher.RunPublisher(None)  # (the class, not its actor: no join was sent)
    host, port = pub.open_feed(b"s" * 32, FeedShare(0, 1, False, 1))  # (no wait for the join)
    try:
        assert port > 0 and host
        with pytest.raises(ControlTimeout, match="did not join the cluster within"):
            pub.begin(None)
    finally:
        pub.stop("the test ends")
    pub._joined.set()  # once joined, the wait passes at once
    pub._wait_joined()
