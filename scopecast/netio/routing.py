"""Routing records and the matching/rewriting rule of thesis 3.2.5.

A routing record is a tuple of (X_i, Y_i) pairs ordered from the highest level K down to level 1
(level 1 is the member): X_i is the member of the level-(i+1) scope the message locally originated
from, Y_i the member it is in or entering. A `RoutingLabel` names one forwarding-table entry:
source path P_L..P_1, destination path Q_L..Q_1, and the local origin R it carries. The thesis'
label also names the topic T; here T is the key the forwarding table files the entry under, so
one label serves every topic of a channel (a member of 10,000 topics keeps a label a channel, not
one a topic).
"""

from __future__ import annotations

from dataclasses import dataclass

RoutingRecord = tuple  # tuple[tuple[str, str], ...], level K first


def origin_record(member: str) -> RoutingRecord:
    """The record of a message just published at `member`: it originated here and is still here."""
    return ((member, member),)


@dataclass(slots=True, frozen=True)
class RoutingLabel:
    """Channel label "P_L:...:P_1 - Q_L:...:Q_1, T:R" (paths written highest level first)
    without T, the forwarding table's key."""

    src: tuple[str, ...]
    dst: tuple[str, ...]
    origin: str

    def __post_init__(self) -> None:
        if not self.src or len(self.src) != len(self.dst):
            raise ValueError(f"source {self.src} and destination {self.dst} must be the same "
                             "non-empty length")

    @property
    def level(self) -> int:
        return len(self.src)

    def __str__(self) -> str:
        return f"{':'.join(self.src)}-{':'.join(self.dst)}, {self.origin}"


def matches(record: RoutingRecord, label: RoutingLabel) -> bool:
    """(K >= L and X_L = R) or (K < L and P_L = R)."""
    k, level = len(record), len(label.src)
    if k >= level:
        return record[k - level][0] == label.origin
    return label.src[0] == label.origin


def forward(record: RoutingRecord, label: RoutingLabel) -> RoutingRecord:
    """The record a message carries after crossing the channel `label`.

    Extend (for K < i <= L: X_i = Y_i = P_i), replace the levels inside the scope being left by those
    of the scope being entered (for i < L: X_i = Y_i = Q_i), then move it: Y_L = Q_L. Entries above L
    and the origin X_L stay as they are."""
    k, level = len(record), len(label.src)
    top = max(k, level)
    entries = {k - j: pair for j, pair in enumerate(record)}  # level -> (x, y)
    for i in range(k + 1, level + 1):
        p = label.src[level - i]
        entries[i] = (p, p)
    for i in range(1, level):
        q = label.dst[level - i]
        entries[i] = (q, q)
    entries[level] = (entries[level][0], label.dst[0])
    return tuple(entries[i] for i in range(top, 0, -1))
