"""Acknowledgements of a multicast channel gathered up a tree of its receivers, so that a sender
handles a group's feedback in proportion to the tree's top, not to the receivers (QSM aggregates
its feedback: thesis 4553-4560).

A sender numbers its channel to a multicast group `group_channel(group, port)` (GROUP_CHANNELS
and up; a channel to one destination is numbered below). A receiver that knows the group (its
view lists the group's receivers) finds its place in that channel's tree: the receivers but the
sender, ordered by a key mixed from the sender's id (so trees of different senders put different
receivers on top), laid out as a FANIN-ary heap. Each receiver acknowledges to its parent, and
the first (the root) to the sender: the lowest datagram number its subtree's regular members took
(`Subtree.report`), or, when every one of them is light, that the subtree holds nothing. A
parent's key is below its child's whatever set of receivers either knows, so members whose views
differ for a moment make no cycle; a receiver that finds no place (a client, or a view behind)
acknowledges to the sender directly, as on a channel to one destination.

Acknowledgements asked for at once (`wire.FLAG_ACK_NOW`: the sender's window is filling) go up
at once, each level at most every `ack_now_gap`; the others once per ack period: the sender gets
about one per period whatever the number of receivers, at the cost of a period per level before
a datagram that no window waits for is acknowledged (`channel_acks`)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

GROUP_CHANNELS = 0x8000  # channel numbers from here on name a multicast group's tree
FANIN = 8                # children of a receiver in a channel's tree
_MASK = (1 << 64) - 1


def is_multicast(host: str) -> bool:
    """An IPv4 multicast address (224.0.0.0/4)."""
    head, _, _ = host.partition(".")
    return head.isdigit() and 224 <= int(head) <= 239


def group_channel(group: str, port: int) -> int:
    """The channel number of every sender's channel to `group`:`port`."""
    return GROUP_CHANNELS | (zlib.crc32(b"%s:%d" % (group.encode(), port)) & 0x7FFF)


def group_receivers(groups: dict[tuple[str, int], tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Each group's receivers by its channel number; groups whose numbers collide are left out
    (their channels are acknowledged to the sender directly)."""
    out: dict[int, tuple[int, ...]] = {}
    clash = set()
    for (group, port), ids in groups.items():
        channel = group_channel(group, port)
        if channel in out:
            clash.add(channel)
        out[channel] = tuple(ids)
    for channel in clash:
        del out[channel]
    return out


def _key(source: int, member: int) -> int:
    """A member's place among a source's receivers: a 64-bit mix (splitmix64) of both ids."""
    z = ((source << 32 | member) + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def tree_order(source: int, receivers: Iterable[int]) -> list[int]:
    """The receivers of `source`'s channel (never itself) in the order of its tree."""
    return sorted({m for m in receivers if m != source}, key=lambda m: (_key(source, m), m))


def root(source: int, receivers: Iterable[int]) -> int | None:
    """The receiver that acknowledges the whole tree to `source` (None: no receivers)."""
    order = tree_order(source, receivers)
    return order[0] if order else None


def place(source: int, member: int, order: list[int]) -> tuple[int, list[int]] | None:
    """(`member`'s parent, `source` for the root; its children) in a tree of `order`, None
    where it has no place."""
    try:
        i = order.index(member)
    except ValueError:
        return None
    parent = source if i == 0 else order[(i - 1) // FANIN]
    return parent, order[FANIN * i + 1:FANIN * i + FANIN + 1]


class Subtree:
    """What a receiver knows of its children in one channel's tree, and what it reports.

    A child listed when this receiver had seen nothing of the channel yet holds the report from
    the start; one listed later (a joiner, or a tree laid anew) once it reports as regular, as a
    sender's window treats its receivers (`feed`). One silent for `ack_timeout` while behind
    stops holding it until it reports again."""

    __slots__ = ("parent", "listed", "regular", "light", "reported", "reported_light")

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self.listed: set[int] = set()        # its children as laid
        self.regular: dict[int, list] = {}  # child -> [dseq, heard at, its news's wait (s)]
        self.light: dict[int, list] = {}    # children that hold nothing, the same way
        self.reported = -1                  # the last report's dseq (-1: none yet)
        self.reported_light = 0

    def lay(self, parent: int, children: list[int], streaming: bool, now: float) -> None:
        """This receiver's place anew: children not listed any more are dropped."""
        self.parent = parent
        self.listed = listed = set(children)
        for table in (self.regular, self.light):
            for child in [c for c in table if c not in listed]:
                del table[child]
        for child in children:
            if child not in self.regular and child not in self.light:
                (self.light if streaming else self.regular)[child] = [0, now, 0.0]

    def children(self) -> int:
        return len(self.regular) + len(self.light)

    def on_child(self, child: int, dseq: int, held: float, light: int, now: float) -> bool | None:
        """A child's report (`held`: seconds its news already waited); whether it may move this
        one's (None: not a child here)."""
        was_regular = child in self.regular
        entry = self.regular.pop(child, None) or self.light.pop(child, None)
        if entry is None:
            if child not in self.listed:
                return None
            entry = [dseq, now, held]  # back after it stopped holding the report (expire)
        (self.light if light else self.regular)[child] = entry
        moved = was_regular == bool(light) or not light and dseq > entry[0]
        if dseq > entry[0]:
            entry[0] = dseq
        entry[1] = now
        entry[2] = held
        return moved

    def report(self, own: int, own_light: bool, own_came: float,
               now: float) -> tuple[int, float, int]:
        """(dseq, held, light) for the parent: the lowest datagram number taken by the regular
        members of the subtree (this one's `own` unless it is light), how long that datagram's
        news waited on the way (the sender's round trip leaves it out), and 1 when none of them
        is regular."""
        low = -1
        held = 0.0
        if not own_light:
            low, held = own, now - own_came
        for entry in self.regular.values():
            if low < 0 or entry[0] < low:
                low, held = entry[0], entry[2] + now - entry[1]
        if low < 0:
            return own, 0.0, 1
        return low, max(0.0, held), 0

    def expire(self, own: int, now: float, timeout: float) -> list[int]:
        """Stop waiting for regular children silent for `timeout` while behind `own`."""
        gone = [c for c, e in self.regular.items() if e[0] < own and now - e[1] > timeout]
        for child in gone:
            del self.regular[child]
        return gone
