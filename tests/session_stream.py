"""A stream across a session change (thesis 3.2.7), shared by the session and plug-in tests."""

from __future__ import annotations

import time


def stream_across_a_session_change(pub, change, timeout: float = 60.0) -> int:
    """Publish 1000 messages, call `change()` (it starts session 2), keep publishing in session 1
    until the publisher has moved to session 2 (once every member knows it), then publish 1000
    more; returns how many messages were published."""
    for i in range(1000):
        pub.publish(b"one %d" % i)
    change()
    total, deadline = 1000, time.monotonic() + timeout
    while pub.session == 1:
        assert time.monotonic() < deadline, "the publisher never moved to session 2"
        pub.publish(b"more")
        total += 1
        time.sleep(0.001)
    for i in range(1000):
        pub.publish(b"two %d" % i)
    return total + 1000
