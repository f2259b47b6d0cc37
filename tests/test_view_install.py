"""How a member process installs its scope's views (pure logic: the controlled element's install
step against a runtime that records what it is given).

A member of thousands of topics gets a view for every change anywhere in its scope; tables the
view leaves as they were are not made again, and the topics of one channel share one route."""

from __future__ import annotations

from scopecast.netio.auth import ClusterKeys
from scopecast.scopes.controlled_element import ControlledElement
from scopecast.scopes.topic_table import MemberTopicTable
from scopecast.scopes.views import MemberView, ViewRoute


class RecordingRuntime:
    """The runtime's install calls, recorded (no sockets, no I/O thread)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.routes: dict = {}
        self.publish_sessions: dict[int, int] = {}

    def install_members(self, members) -> None:
        self.calls.append("members")

    def install_topics(self, names, sessions=None) -> None:
        self.calls.append("topics")

    def install_groups(self, wanted, receivers=None) -> None:
        self.calls.append("groups")

    def install_routes(self, routes, receivers=None) -> None:
        self.calls.append("routes")
        self.routes = routes

    def install_recovery(self, agents, protocols, cached=frozenset()) -> None:
        self.calls.append("recovery")

    def install_keys(self, raw, generation) -> None:
        self.calls.append("keys")


def _element() -> ControlledElement:
    element = object.__new__(ControlledElement)  # (its constructor joins a Ray cluster)
    element.runtime = RecordingRuntime()
    element._installed, element._handed = None, None
    element._table = MemberTopicTable()
    element._session_moves = {}
    element._siblings, element._peers = [], {}
    element.demoted, element.member_id, element.scope = "", 1, "lan0"
    element._keys = ClusterKeys.first(b"k" * 32)
    return element


def _view(topics: range, protocol: str = "token_ring") -> MemberView:
    to_b = ViewRoute(("a",), ("b",), "a", ("u", "10.0.0.2", 5000, 2), None, "lan0", tuple(topics))
    to_c = ViewRoute(("a",), ("c",), "a", ("u", "10.0.0.3", 5000, 3), None, "lan0",
                     tuple(topics)[::2])
    return MemberView((), (to_b, to_c), (), {"10.0.0.2:5000": (2,), "10.0.0.3:5000": (3,)},
                      {protocol: ("10.0.0.9", 7000)}, dict.fromkeys(topics, protocol), (), {})


def test_the_topics_of_the_same_channels_share_one_route_tuple():
    element = _element()
    element._install(_view(range(100, 200)))
    routes = element.runtime.routes
    assert len(routes) == 100
    assert len({id(r) for r in routes.values()}) == 2  # to b and c, or to b alone
    assert routes[100] is routes[102] and routes[101] is routes[103]
    assert [r.label.dst for r in routes[100]] == [("b",), ("c",)]
    assert routes[100][0] is routes[101][0]  # one route a channel, whatever the topic


def test_a_view_that_leaves_a_table_as_it_was_does_not_install_it_again():
    element = _element()
    calls = element.runtime.calls
    first = _view(range(100, 200))
    element._install(first)
    assert {"topics", "routes", "recovery"} <= set(calls)
    calls.clear()
    element._install(_view(range(100, 200)))  # another view alike
    assert "routes" not in calls and "recovery" not in calls and "topics" not in calls
    # what it keeps to compare the next view with is what it installed, not a second copy
    assert element._installed.protocols is first.protocols
    assert element._installed.routes is first.routes
    element._install(_view(range(100, 200), protocol="ack_tree"))
    assert "recovery" in calls and "routes" not in calls
    calls.clear()
    element._install(_view(range(100, 201), protocol="ack_tree"))
    assert "routes" in calls and "recovery" in calls
    calls.clear()
    element._table.take_early({"300": {"name": "late", "session": 1}})  # (a change)
    element._install(_view(range(100, 201), protocol="ack_tree"))
    assert calls.count("topics") == 1 and "routes" not in calls
