"""What a scope hands a child scope (thesis 3.2.5): its delegation, as typed records with one
versioned encoding at the edge.

A delegation carries the cluster settings and keys, the topic entries ahead of the table, the
channels handed to the child (`exits`: each an `Obligation` — where the channel goes, who waits
for it, and the wraps of the scopes it was delegated through), the multicast coverage it takes
part in (`covered`, per topic, one object for topics alike), the addresses of the agents standing
for its recovery domains in this scope's (`upper`, by the child's domain key) and the
administrators' settings of its ancestors, itself and its subtree (`admins`,
`scope_admin.ScopeAdmin` by scope path). Its wire form is a dict of plain values (Ray pickles it)
with the version `v`; one of another version, or malformed, raises `MalformedDelegation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from scopecast.netio.auth import ClusterKeys
from scopecast.netio.filters import check_spec
from scopecast.scopes import alike
from scopecast.scopes.scope_admin import ScopeAdmin

DELEGATION_VERSION = 6  # 6: a coverage once for the topics it covers alike; 5: regions of a
# coverage; 4: the cluster's keys; 3: filters of every netio.filters kind


class MalformedDelegation(ValueError):
    """A delegation this scope cannot read (another version, or malformed)."""


@dataclass(frozen=True, slots=True)
class Obligation:
    """One channel, or one multicast coverage, delegated down: the topic, the member it
    originates at, the receiving path and endpoint (("u", host, port, member) or ("g", group,
    port)), the members a sender's window waits for, an optional filter (a `netio.filters` spec), how
    many replicas the scope above asked for, the scope that laid it, and a (member, label
    length) wrap per scope it was delegated through, outermost first. A multicast coverage has
    topic 0: one object stands for every topic it covers alike (`Part.covered` says which)."""

    topic: int
    origin: str
    dst: tuple[str, ...]
    endpoint: tuple
    receivers: tuple[int, ...]
    filter: tuple | None = None
    replicas: int = 1
    scope: str = ""
    wraps: tuple[tuple[str, int], ...] = ()
    # a multicast coverage: every region the topic spans, (its group endpoint, its members),
    # to each of which a publisher sends (`endpoint` is the region of the child it is handed to)
    regions: tuple[tuple[tuple, tuple[int, ...]], ...] = ()

    def spread(self) -> list[Obligation]:
        """What a publisher sends along for this coverage: one channel per region the topic
        spans (this one where it spans none)."""
        if not self.regions:
            return [self]
        return [replace(self, endpoint=endpoint, receivers=receivers)
                for endpoint, receivers in self.regions]

    def to_wire(self) -> list:
        return [self.topic, self.origin, list(self.dst), list(self.endpoint),
                list(self.receivers), list(self.filter) if self.filter else None, self.replicas,
                self.scope, [list(w) for w in self.wraps],
                [[list(e), list(r)] for e, r in self.regions]]

    @classmethod
    def from_wire(cls, body: list) -> Obligation:
        topic, origin, dst, endpoint, receivers, flt, replicas, scope, wraps, regions = body
        return cls(int(topic), str(origin), tuple(map(str, dst)), tuple(endpoint),
                   tuple(map(int, receivers)),
                   check_spec(flt), int(replicas),
                   str(scope), tuple((str(n), int(length)) for n, length in wraps),
                   tuple((_group_endpoint(e), tuple(map(int, r))) for e, r in regions))

    def describe(self) -> dict:
        """For status."""
        return {"topic": self.topic, "origin": self.origin, "dst": list(self.dst),
                "endpoint": list(self.endpoint), "receivers": list(self.receivers),
                "filter": list(self.filter) if self.filter else None,
                "replicas": self.replicas, "scope": self.scope,
                "wraps": [list(w) for w in self.wraps],
                **({"regions": [list(e) for e, _r in self.regions]} if self.regions else {})}


def _group_endpoint(endpoint: list) -> tuple:
    """A region's endpoint as sent: ("g", address, port)."""
    kind, address, port = endpoint
    if kind != "g":
        raise ValueError(f"a region's endpoint is a group, not {kind!r}")
    return ("g", str(address), int(port))


@dataclass(frozen=True, slots=True)
class Part:
    """One child's part of a scope's layout."""

    exits: tuple[Obligation, ...] = ()
    # topic -> its multicast coverage: one object for the topics covered alike (at 100,000
    # topics, made, sent and read once, not once a topic)
    covered: dict[int, Obligation] = field(default_factory=dict)

    def covered_wire(self) -> list:
        """`covered` as [[topics, coverage], ...], each coverage object once."""
        return alike.grouped(self.covered, Obligation.to_wire)

    @staticmethod
    def covered_from_wire(body: list) -> dict[int, Obligation]:
        return alike.shared(body, Obligation.from_wire)

    def describe_covered(self) -> dict[str, dict]:
        """For status: each covered topic's coverage."""
        return {str(t): {**cov.describe(), "topic": t} for t, cov in self.covered.items()}


NO_PART = Part()


@dataclass(frozen=True, slots=True)
class Delegation:
    """What a child scope gets from its parent (besides the topic table's piece)."""

    settings: dict
    early: dict[str, dict]
    part: Part
    upper: dict[str, list]    # the child's domain key -> the agent standing for it above
    admins: dict[str, ScopeAdmin] = field(default_factory=dict)
    failed: tuple[str, ...] = ()  # recovery plug-ins replaced everywhere (`scope_admin`)
    keys: ClusterKeys = ClusterKeys()  # the cluster's keys (netio.auth; rotated by the root)

    def to_wire(self, version: int, topics) -> dict:
        return {"v": DELEGATION_VERSION, "version": version, "topics": topics,
                "settings": dict(self.settings), "early": self.early,
                "exits": [o.to_wire() for o in self.part.exits],
                "covered": self.part.covered_wire(),
                "upper": self.upper,
                "admins": {p: a.to_wire() for p, a in self.admins.items()},
                "failed_recovery": list(self.failed), "keys": self.keys.to_wire()}

    @classmethod
    def from_wire(cls, body) -> tuple[int, Delegation, object]:
        """(version, delegation, topic table piece)."""
        try:
            if body.get("v") != DELEGATION_VERSION:
                raise ValueError(f"version {body.get('v')!r}, not {DELEGATION_VERSION}")
            part = Part(tuple(Obligation.from_wire(o) for o in body["exits"]),
                        Part.covered_from_wire(body["covered"]))
            admins = {str(p): ScopeAdmin.from_wire(a) for p, a in body["admins"].items()}
            failed = tuple(map(str, body["failed_recovery"]))
            return (int(body["version"]),
                    cls(dict(body["settings"]), dict(body["early"]), part,
                        dict(body.get("upper") or {}), admins, failed,
                        ClusterKeys.from_wire(body["keys"])),
                    body["topics"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # (a bad scope setting is an InvalidConfig, a ValueError)
            raise MalformedDelegation(str(exc)) from None
