"""QSM regions in a scope's multicast (thesis 4416-4424): pure, no Ray, no I/O.

Where a scope reaches its members of some topics through IP multicast, the children that take the
same set of those topics form a *region*, and each region has an IP multicast group of its own. A
member then joins the group of its region only, and its socket receives the datagrams of the
topics it takes and of no others; a publisher multicasts each message once per region its topic
spans (the per-group request split into per-region ones, thesis Fig. 4.8, the decomposition of
3.2.4). A channel to a region's group has sequence numbers of its own (its datagram numbers: a
sender numbers each channel apart), and so does the window that waits for that region's members.

One region is the whole scope where every child takes the same topics (the common case): it
uses the scope's own group, as a scope without regions did. Where there are several, the region
of the first child by name keeps the scope's group and each other region gets a group named after
the scope and its own first child. So a region keeps its group while members join it, leave it
(all but its first) or topics come and go that all its members take; only a child that changes
what it takes moves, to another region's group. What is in flight to a group a member just left
is repaired like any other loss.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

Group = tuple[str, int]  # (IP multicast address, port)


@dataclass(frozen=True, slots=True)
class Region:
    """The children (names, sorted) that take the same covered topics, and their group."""

    members: tuple[str, ...]
    group: Group


def group_address(path: str, prefix: tuple[int, int, int], salt: str = "") -> str:
    """An IP multicast address in 239.`prefix[1]`.x.y named after `path` (and `salt`: a
    region's first member)."""
    h = zlib.crc32((path + ("\0" + salt if salt else "")).encode())
    return "239.%d.%d.%d" % (prefix[1], (prefix[2] + (h >> 8)) & 0xFF, 1 + h % 254)


@dataclass(frozen=True, slots=True)
class Regions:
    """A scope's regions: which region each child taking covered topics is in, and which
    regions each covered topic spans (in region order)."""

    of_child: dict[str, Region]
    spans: dict[int, tuple[Region, ...]]

    @classmethod
    def plan(cls, path: str, scope_group: Group, prefix: tuple[int, int, int],
             takes: dict[int, set[str]]) -> Regions:
        """Regions from `takes`, per covered topic the children that take it (subscribe to it,
        or pass it on out of the scope)."""
        interest: dict[str, list[int]] = {}
        for tid in sorted(takes):
            for name in takes[tid]:
                interest.setdefault(name, []).append(tid)
        alike: dict[tuple[int, ...], list[str]] = {}
        for name in sorted(interest):
            alike.setdefault(tuple(interest[name]), []).append(name)
        of_child: dict[str, Region] = {}
        for i, names in enumerate(sorted(alike.values())):  # (the first child's region first)
            group = scope_group if i == 0 else (group_address(path, prefix, names[0]),
                                                scope_group[1])
            region = Region(tuple(names), group)
            for name in names:
                of_child[name] = region
        spans: dict[int, tuple[Region, ...]] = {}
        alike_spans: dict[frozenset, tuple[Region, ...]] = {}  # one tuple for topics alike
        for tid, names in takes.items():
            if names:
                key = frozenset(names)
                span = alike_spans.get(key)
                if span is None:
                    span = alike_spans[key] = tuple(sorted({of_child[n] for n in names},
                                                           key=_first))
                spans[tid] = span
        return cls(of_child, spans)

    def describe(self) -> list[dict]:
        """For status: each region's group and members."""
        seen = sorted(set(self.of_child.values()), key=_first)
        return [{"group": "%s:%d" % r.group, "members": list(r.members)} for r in seen]


def _first(region: Region) -> str:
    return region.members[0]
