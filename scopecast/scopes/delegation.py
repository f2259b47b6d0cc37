"""What a scope hands a child scope (thesis 3.2.5): its delegation, as typed records with one
versioned encoding at the edge.

A delegation carries the cluster settings and keys, the topic entries ahead of the table, the
channels handed to the child (`exits`: each an `Obligation` — where the channel goes, who waits
for it, and the wraps of the scopes it was delegated through), the multicast coverage it takes
part in (`covered`, per topic), the addresses of the agents standing for its recovery domains in
this scope's (`upper`, by the child's domain key) and the administrators' settings of its
ancestors, itself and its subtree (`admins`, `scope_admin.ScopeAdmin` by scope path). Its wire form is a
dict of plain values (Ray pickles it) with the version `v`; one of another version, or
malformed, raises `MalformedDelegation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scopecast.netio.auth import ClusterKeys
from scopecast.netio.filters import check_spec
from scopecast.scopes.scope_admin import ScopeAdmin

DELEGATION_VERSION = 4  # 4: the cluster's keys; 3: filters of every netio.filters kind


class MalformedDelegation(ValueError):
    """A delegation this scope cannot read (another version, or malformed)."""


@dataclass(frozen=True, slots=True)
class Obligation:
    """One channel, or one multicast coverage, delegated down: the topic, the member it
    originates at, the receiving path and endpoint (("u", host, port, member) or ("g", group,
    port)), the members a sender's window waits for, an optional filter (a `netio.filters` spec), how
    many replicas the scope above asked for, the scope that laid it, and a (member, label
    length) wrap per scope it was delegated through, outermost first."""

    topic: int
    origin: str
    dst: tuple[str, ...]
    endpoint: tuple
    receivers: tuple[int, ...]
    filter: tuple | None = None
    replicas: int = 1
    scope: str = ""
    wraps: tuple[tuple[str, int], ...] = ()

    def to_wire(self) -> list:
        return [self.topic, self.origin, list(self.dst), list(self.endpoint),
                list(self.receivers), list(self.filter) if self.filter else None, self.replicas,
                self.scope, [list(w) for w in self.wraps]]

    @classmethod
    def from_wire(cls, body: list) -> Obligation:
        topic, origin, dst, endpoint, receivers, flt, replicas, scope, wraps = body
        return cls(int(topic), str(origin), tuple(map(str, dst)), tuple(endpoint),
                   tuple(map(int, receivers)),
                   check_spec(flt), int(replicas),
                   str(scope), tuple((str(n), int(length)) for n, length in wraps))

    def describe(self) -> dict:
        """For status."""
        return {"topic": self.topic, "origin": self.origin, "dst": list(self.dst),
                "endpoint": list(self.endpoint), "receivers": list(self.receivers),
                "filter": list(self.filter) if self.filter else None,
                "replicas": self.replicas, "scope": self.scope,
                "wraps": [list(w) for w in self.wraps]}


@dataclass(frozen=True, slots=True)
class Part:
    """One child's part of a scope's layout."""

    exits: tuple[Obligation, ...] = ()
    covered: dict[int, Obligation] = field(default_factory=dict)


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
                "covered": {str(t): o.to_wire() for t, o in self.part.covered.items()},
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
                        {int(t): Obligation.from_wire(o) for t, o in body["covered"].items()})
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
