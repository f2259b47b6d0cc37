"""Two member runtimes on real sockets, wired by hand as their scopes would wire them (shared by
the data-plane tests that need no control plane)."""

from __future__ import annotations

import contextlib
import os
import time

from scopecast.netio.channel import UnicastEndpoint
from scopecast.netio.delivery import Subscription
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig

TOPIC = 7


@contextlib.contextmanager
def member_pair(config: RuntimeConfig | None = None, session: int = 1, window: bool = False,
                registered: bool = False):
    """Members A (1) and B (2) that know each other; A's topic 7 ("T") goes to B by unicast
    (`window`: B holds A's flow window, as an announced receiver does); B subscribes. Yields
    (A, B, B's subscription); both closed afterwards. `registered`: each is made with id 0 and
    given its id afterwards, as a member's scope registers it."""
    key = os.urandom(32)
    a = MemberRuntime(0 if registered else 1, "A", key, config or RuntimeConfig())
    b = MemberRuntime(0 if registered else 2, "B", key, config or RuntimeConfig())
    if registered:
        a.member_id, b.member_id = 1, 2
    try:
        members = [MemberInfo(rt.member_id, rt.name, *rt.address) for rt in (a, b)]
        for rt in (a, b):
            rt.call_wait(rt.install_members, members)
            rt.call_wait(rt.install_topics, {TOPIC: "T"}, {TOPIC: session})
        inbox = Subscription(frozenset([TOPIC]))
        b.call_wait(b.add_subscription, inbox)
        a.call_wait(a.install_routes, {TOPIC: [Route(RoutingLabel(("A",), ("B",), "A"),
                                                     UnicastEndpoint(*b.address))]},
                    {b.address: {2}} if window else None)
        yield a, b, inbox
    finally:
        a.close()
        b.close()


def received(inbox: Subscription) -> list:
    """The messages waiting in `inbox`, taken (as a consumer takes them)."""
    out = []
    while inbox.queue:
        batch, nbytes = inbox.queue.popleft()
        inbox.consumed_bytes += nbytes
        out += batch
    return out


def wait_for(predicate, what: str = "", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.01)
