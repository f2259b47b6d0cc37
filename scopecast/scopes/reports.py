"""What a child scope reports to its parent (thesis 3.2.3, cascading subscription), as typed
records with one versioned encoding at the edge.

A report is a heartbeat (`state` None: "I have revision `rev` in place") or carries the subtree's
state. The wire form is a dict of plain values (Ray pickles it) with the version `v`; a report of
another version, or malformed, raises `MalformedReport`, which the parent counts and drops.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopecast.netio import wire
from scopecast.scopes import alike
from scopecast.scopes.layout import Offer
from scopecast.scopes.topic_table import position

REPORT_VERSION = 3  # 3: topics by role, offers once for topics alike; 2: an offer per
# sub-channel, each with its filter
ROLES = ("member", "client")


class MalformedReport(ValueError):
    """A report this scope cannot read (another version, or malformed)."""


@dataclass(frozen=True, slots=True)
class SubtreeState:
    """A subtree's interest and entry points, as its scope reports them up."""

    depth: int                          # the length of labels of channels laid in the child, + 1
    subs: dict[int, str]                # topic -> "member" | "client" (the strongest below)
    pubs: frozenset[int]                # topics published below
    offers: dict[int, tuple[Offer, ...]]  # topic -> where its traffic enters the subtree
    joined: dict[str, list[int]]        # "group:port" -> members below that joined it
    regular: bool                       # some member below has forwarding duty
    recovering: dict[str, tuple[str, ...]]  # domain key -> chain down to its leader
    rebuilding: bool = False            # the child restarted and is rebuilding (see retirement)

    def to_wire(self) -> dict:
        """Topics by role, and each offers tuple once with its topics (the planner makes one for
        topics alike: at 100,000 topics a report was 100,000 offers, read one by one above)."""
        roles: dict[str, list[int]] = {}
        for t, role in self.subs.items():
            roles.setdefault(role, []).append(t)
        return {"depth": self.depth, "subs": roles,
                "pubs": sorted(self.pubs),
                "offers": alike.grouped(self.offers, lambda offers: [o.to_wire() for o in offers]),
                "joined": {k: list(v) for k, v in self.joined.items()},
                "regular": self.regular,
                "recovering": {p: list(c) for p, c in self.recovering.items()},
                "rebuilding": self.rebuilding}

    @classmethod
    def from_wire(cls, body: dict) -> SubtreeState:
        subs: dict[int, str] = {}
        for role, topics in body["subs"].items():
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r:.40}")
            subs.update(dict.fromkeys(map(int, topics), ROLES[ROLES.index(role)]))
        offers = alike.shared(body["offers"], lambda w: tuple(Offer.from_wire(o) for o in w))
        return cls(int(body["depth"]), subs, frozenset(int(t) for t in body["pubs"]), offers,
                   {str(k): [int(i) for i in v] for k, v in body["joined"].items()},
                   bool(body["regular"]),
                   {str(p): tuple(map(str, chain)) for p, chain in body["recovering"].items()},
                   bool(body.get("rebuilding", False)))


@dataclass(frozen=True, slots=True)
class ScopeReport:
    """One report of a child scope: who it is (`incarnation`), what it has in place (`acked`:
    the parent's delegation version, `table`: its topic table position), the revision of its
    state, and the state itself unless this is a heartbeat. `wire_version`: the datagram wire its
    members speak (None from a scope of a scopecast from before it was stated)."""

    incarnation: int
    rev: int
    acked: int
    table: tuple[int, int] | None
    state: SubtreeState | None = None
    wire_version: int | None = wire.VERSION

    def to_wire(self) -> dict:
        return {"v": REPORT_VERSION, "incarnation": self.incarnation, "rev": self.rev,
                "acked": self.acked, "table": self.table,
                "state": None if self.state is None else self.state.to_wire(),
                "wire": self.wire_version}

    @classmethod
    def from_wire(cls, body) -> ScopeReport:
        try:
            if body.get("v") != REPORT_VERSION:
                raise ValueError(f"version {body.get('v')!r}, not {REPORT_VERSION}")
            state = body["state"]
            found = body.get("wire")
            return cls(int(body["incarnation"]), int(body["rev"]), int(body["acked"]),
                       position(body.get("table")),
                       None if state is None else SubtreeState.from_wire(state),
                       found if found is None else int(found))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedReport(str(exc)) from None
