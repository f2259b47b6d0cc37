"""What a scope hands a member process (thesis 3.2.5): its view, as typed records with one
versioned encoding at the edge.

A view is the answer to the member's standing `watch` call: its siblings, the channels it sends
along (`ViewRoute`, one per channel with the topics it serves), the multicast groups it receives
on, the members each destination's window waits for, its recovery agents and the recovery
protocol of each reliable topic it takes part in. The wire form is a dict of plain values (Ray
pickles it) with the version `v`; one of another version, or malformed, raises `MalformedView`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from scopecast.netio.auth import ClusterKeys
from scopecast.netio.filters import check_spec

VIEW_VERSION = 5  # 5: protocols as {protocol: its topics}; 4: the cluster's keys; 3: each group's
                  # receivers; 2: filters of every kind


class MalformedView(ValueError):
    """A view this member cannot read (another version, or malformed)."""


@dataclass(frozen=True, slots=True)
class ViewRoute:
    """One channel a member sends along: its label's paths and origin, where it goes (("u",
    host, port, member) or ("g", group, port)), an optional filter (a `netio.filters` spec), the scope
    that laid it, and the topics it serves."""

    src: tuple[str, ...]
    dst: tuple[str, ...]
    origin: str
    endpoint: tuple
    filter: tuple | None
    scope: str
    topics: tuple[int, ...]

    def to_wire(self) -> list:
        return [list(self.src), list(self.dst), self.origin, list(self.endpoint),
                list(self.filter) if self.filter else None, self.scope, list(self.topics)]

    @classmethod
    def from_wire(cls, body: list, ids: dict[int, int] | None = None) -> ViewRoute:
        """`ids`: the topic ids met so far in this view (see `_one_int`)."""
        src, dst, origin, endpoint, flt, scope, topics = body
        ids = {} if ids is None else ids
        endpoint = tuple(endpoint)
        if endpoint[0] == "u":
            endpoint = ("u", str(endpoint[1]), int(endpoint[2]), int(endpoint[3]))
        elif endpoint[0] == "g":
            endpoint = ("g", str(endpoint[1]), int(endpoint[2]))
        else:
            raise ValueError(f"unknown endpoint {endpoint!r}")
        return cls(tuple(map(str, src)), tuple(map(str, dst)), str(origin), endpoint,
                   check_spec(flt), str(scope),
                   tuple(_one_int(t, ids) for t in topics))

    @property
    def label(self) -> str:
        return f"{':'.join(self.src)}-{':'.join(self.dst)}"


@dataclass(frozen=True, slots=True)
class MemberView:
    """A member process's tables, as its scope computed them."""

    # its siblings: (id, name, host, port, the topics it may publish to or None: any)
    members: tuple[tuple[int, str, str, int, tuple[str, ...] | None], ...]
    routes: tuple[ViewRoute, ...]
    groups: tuple[tuple[str, int], ...]             # multicast groups it receives on
    receivers: dict[str, tuple[int, ...]]           # "host:port" -> members its window waits for
    agents: dict[str, tuple[str, int]]              # protocol -> its recovery agent's address
    protocols: dict[int, str]                       # reliable topic -> its protocol's domain key
    cached: tuple[int, ...]                         # topics whose history it caches
    early: dict[str, dict]                          # topic entries ahead of the table
    demoted: str = ""                               # why it was demoted to client, if it was
    # "group:port" -> the members receiving on it (the trees of acknowledgements: ack_gathering)
    joined: dict[str, tuple[int, ...]] = field(default_factory=dict)
    keys: ClusterKeys = ClusterKeys()  # the keys it seals with and accepts (key rotation)

    def to_wire(self, version: int, topics) -> dict:
        """The answer to `watch`: this view under `version`, with the piece of the topic table
        the member lacks (`topics`)."""
        return {"v": VIEW_VERSION, "version": version, "topics": topics,
                "members": [[*m[:4], None if m[4] is None else list(m[4])]
                            for m in self.members],
                "routes": [r.to_wire() for r in self.routes],
                "groups": [list(g) for g in self.groups],
                "joined": {k: list(v) for k, v in self.joined.items()},
                "receivers": {k: list(v) for k, v in self.receivers.items()},
                "agents": {p: list(a) for p, a in self.agents.items()},
                "protocols": _by_value(self.protocols),
                "cached": list(self.cached), "early": self.early, "demoted": self.demoted,
                "keys": self.keys.to_wire()}

    @classmethod
    def from_wire(cls, body) -> tuple[int, MemberView, object]:
        """(version, view, topic table piece) of a `watch` answer."""
        try:
            if body.get("v") != VIEW_VERSION:
                raise ValueError(f"version {body.get('v')!r}, not {VIEW_VERSION}")
            ids: dict[int, int] = {}
            view = cls(tuple((int(i), str(n), str(h), int(p),
                              None if lim is None else tuple(map(str, lim)))
                             for i, n, h, p, lim in body["members"]),
                       tuple(ViewRoute.from_wire(r, ids) for r in body["routes"]),
                       tuple((str(g), int(p)) for g, p in body["groups"]),
                       {str(k): tuple(map(int, v)) for k, v in body["receivers"].items()},
                       {str(p): (str(a[0]), int(a[1])) for p, a in body["agents"].items()},
                       _protocols(body["protocols"], ids),
                       tuple(_one_int(t, ids) for t in body["cached"]), dict(body["early"]),
                       str(body.get("demoted") or ""),
                       {str(k): tuple(map(int, v)) for k, v in body["joined"].items()},
                       ClusterKeys.from_wire(body["keys"]))
            return int(body["version"]), view, body["topics"]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise MalformedView(str(exc)) from None


def _by_value(table: dict[int, str]) -> dict[str, list[int]]:
    """{topic: protocol} as {protocol: its topics}: a few names on the wire, not one a topic (a
    member of 10,000 topics decoded 20,000 strings a view, and the heap they left behind stayed
    resident between the objects it keeps)."""
    out: dict[str, list[int]] = {}
    for topic, value in table.items():
        out.setdefault(value, []).append(topic)
    return out


def _protocols(wire: dict, ids: dict[int, int]) -> dict[int, str]:
    """{protocol: its topics} (`_by_value`) back to {topic: protocol}, each name interned once."""
    out: dict[int, str] = {}
    for protocol, topics in wire.items():
        name = sys.intern(str(protocol))
        out.update((_one_int(t, ids), name) for t in topics)
    return out


def _one_int(value, ids: dict[int, int]) -> int:
    """`value` as an int, the same object for the same topic id everywhere in a view: a member of
    10,000 topics keeps its routes, protocols and cached topics by id, and an int object apiece in
    each table is 28 bytes a topic more."""
    n = int(value)
    return ids.setdefault(n, n)
