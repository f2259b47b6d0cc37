"""A receiver's acknowledgements, a part of the member runtime (see `member_parts`).

Which datagrams of each sender's channel came, acknowledged every `ack_period`, and at once when
a datagram asks (`wire.FLAG_ACK_NOW`: its sender's window is half full); withheld while an
application lags behind by more than `max_backlog_bytes`, so a slow consumer slows its senders
(see `feed` and `delay_window`). Datagram numbers that never came are the evidence of loss that
recovery acts on (`tail_evidence`).

A multicast channel's acknowledgements go up the channel's tree of receivers rather than each to
the sender (`ack_gathering`): this member reports for its subtree to its parent, and takes its
children's reports."""

from __future__ import annotations

import time
from collections.abc import Callable

from scopecast.netio import wire
from scopecast.netio.ack_gathering import GROUP_CHANNELS, Subtree, group_receivers, place, tree_order
from scopecast.netio.control_messages import Ack, GroupAck
from scopecast.netio.member_parts import MemberBasics, MemberTables, Recovering
from scopecast.timing import TIMING

ACK_REPEAT, ACK_REPEAT_IDLE = 0.02, 0.5  # seconds between repeats of an unchanged ack
ACK_NOW_GAP = TIMING.ack_now_gap
HELD_MOST_US = 60_000_000  # a child's report's wait beyond this is not believed


class ChannelAcks:
    """Positions of the channels this member receives, and their acknowledgements."""

    def __init__(self, basics: MemberBasics, tables: MemberTables,
                 send_control: Callable[[object, tuple[str, int]], None],
                 recovery: Recovering) -> None:
        self._config, self._stats = basics.config, basics.stats
        self._tables = tables
        self._send_control = send_control
        self._recovery = recovery  # told of loss and data as channels show them
        # (sender, channel) -> [dseq, dseq acked, when acked, when new data was last acked,
        # when it came]
        self._pos: dict[tuple[int, int], list] = {}
        self._last_ack = 0.0
        self._ack_now = False  # a datagram asked for an acknowledgement without delay
        self.due_at = 0.0      # when acknowledgements are due next (the I/O loop looks)
        self.member_id = basics.member_id
        self._groups: dict[int, tuple[int, ...]] = {}  # group channel -> the group's receivers
        self._trees: dict[tuple[int, int], Subtree] = {}  # (sender, group channel) -> my place
        self._tree_moved = False  # a child's report may move one of mine (due in a period)
        # tree parents this member has no address for (one in another host's scope: a view
        # names a group's receivers, not where they are): the control thread looks them up
        self._unknown: set[int] = set()
        self._look_up = basics.unknown_sender

    def to_look_up(self) -> set[int]:
        """Parents in a channel's tree this member must report to and does not know."""
        return self._unknown - self._tables.members.keys()

    def members_changed(self) -> None:
        """Forget the channels of members gone."""
        members = self._tables.members
        self._unknown -= members.keys()
        for key in [k for k in self._pos if k[0] not in members]:
            del self._pos[key]
            self._trees.pop(key, None)

    def groups_changed(self, receivers: dict[tuple[str, int], tuple[int, ...]]) -> None:
        """The receivers of each multicast group this member receives on: its places in those
        groups' channels' trees anew."""
        groups = group_receivers(receivers)
        if groups == self._groups:
            return
        self._groups = groups
        now = time.monotonic()
        for key in [k for k in self._pos if k[1] >= GROUP_CHANNELS]:
            self._lay(key, True, now)

    def _lay(self, key: tuple[int, int], streaming: bool, now: float) -> None:
        sender, channel = key
        receivers = self._groups.get(channel)
        placed = place(sender, self.member_id, tree_order(sender, receivers)) \
            if receivers else None
        if placed is None:  # (no place: acknowledged to the sender directly)
            self._trees.pop(key, None)
            return
        parent, children = placed
        tree = self._trees.get(key)
        if tree is None:
            tree = self._trees[key] = Subtree(parent)
        tree.lay(parent, children, streaming, now)

    def on_group_ack(self, child: int, msg: GroupAck) -> None:
        """A child's report in a channel's tree."""
        self._stats["group_acks_in"] += 1
        key = (msg.source, msg.channel)
        tree = self._trees.get(key)
        if tree is None and msg.channel in self._groups and msg.source in self._tables.members:
            # a child's report can come before this member's first datagram of the channel (its
            # I/O thread behind the child's): its place is known from the view alone
            self._lay(key, False, time.monotonic())
            tree = self._trees.get(key)
        held = min(msg.held_us, HELD_MOST_US) / 1e6  # (passed on up: bounded)
        moved = None if tree is None else tree.on_child(
            child, msg.dseq, held, msg.light, time.monotonic())
        if moved is None:
            self._stats["acks_ignored"] += 1  # not a child here (views differ for a moment)
        elif moved:
            if msg.urgent:
                self._ack_now = True
                self.due_at = min(self.due_at, self._last_ack + ACK_NOW_GAP)
            else:
                self._tree_moved = True
                self.due_at = min(self.due_at, self._last_ack + self._config.ack_period)

    def expire_children(self, now: float) -> None:
        """Stop waiting for children silent for `ack_timeout` while behind."""
        timeout = self._config.ack_timeout
        for key, tree in self._trees.items():
            if (pos := self._pos.get(key)) is None:  # (laid on a child's report: no data yet)
                continue
            gone = tree.expire(pos[0], now, timeout)
            if gone:
                self._stats["ack_children_timeouts"] += len(gone)

    def note(self, sender: int, channel: int, first: int, last: int, count: int,
             flags: int) -> None:
        """Datagrams `first`..`last` of a sender's channel came (`count`: runs in each; 0 for a
        probe)."""
        if flags & wire.FLAG_ACK_NOW:
            self._ack_now = True
            self.due_at = min(self.due_at, self._last_ack + ACK_NOW_GAP)
        key = (sender, channel)
        pos = self._pos.get(key)
        if pos is None:
            now = time.monotonic()
            self._pos[key] = [last, 0, 0.0, 0.0, now]
            if channel >= GROUP_CHANNELS:
                self._lay(key, False, now)
        elif last > pos[0]:
            now = time.monotonic()
            # datagrams of this channel that never came (a probe, a datagram of no runs,
            # re-announces the last one sent: that one too): the evidence of loss that lets
            # this member ask for a stream's tail (see RecoveryPath._tail_wanted)
            missing = first - pos[0] - (count != 0)
            if missing > 0:
                self._stats["channel_gaps"] += missing
                self._recovery.loss_seen_at = now
            pos[0] = last
            pos[4] = self._recovery.data_seen_at = now  # (acks say how long after it went)
        elif not count:
            # a full window's probe: its sender holds more for this channel (what a forwarding
            # member queued will come: see RecoveryPath._tail_wanted)
            self._recovery.data_seen_at = time.monotonic()

    def drained(self) -> None:
        """A socket is drained: a sender whose window is filling asked for an acknowledgement
        without delay (FLAG_ACK_NOW); it resumes as soon as this burst is taken."""
        if self._ack_now and (now := time.monotonic()) - self._last_ack >= ACK_NOW_GAP:
            self._send(now)

    def send_if_due(self, now: float) -> None:
        if now - self._last_ack >= (ACK_NOW_GAP if self._ack_now else self._config.ack_period):
            self._send(now)

    def timeout(self, tails_open: bool) -> float | None:
        """How soon an acknowledgement (or, `tails_open`, a tail probe of the send path) is due;
        None when nothing is waiting."""
        if self._ack_now:
            return ACK_NOW_GAP
        if tails_open or self._tree_moved or any(pos[0] != pos[1] for pos in self._pos.values()):
            return self._config.ack_period
        return None

    def _send(self, now: float) -> None:
        urgent = int(self._ack_now)
        self._last_ack = now
        self._ack_now = self._tree_moved = False
        self.due_at = now + self._config.ack_period
        limit = self._config.max_backlog_bytes
        for sub in self._tables.subscriptions:  # (not per topic: a pattern's one is under
            if sub.backlog() > limit:           # thousands)
                self._stats["acks_withheld"] += 1
                return
        members = self._tables.members
        light = int(self._recovery.promotion.light)
        trees = self._trees
        for (sender, channel), pos in self._pos.items():
            if trees and (tree := trees.get((sender, channel))) is not None:
                self._report(tree, sender, channel, pos, light, urgent, now)
                continue
            if pos[0] == pos[1]:
                if not _repeat_due(pos, now):
                    continue
            else:
                pos[3] = now
            member = members.get(sender)
            if member is None:
                continue
            pos[1] = pos[0]
            pos[2] = now
            # how long the acknowledged datagram waited for this ack (acks go every ack_period):
            # the sender's round-trip sample leaves it out (see delay_window)
            held = max(0, round((now - pos[4]) * 1e6))
            self._send_control(Ack(channel, pos[0], held, light), (member.host, member.port))

    def _report(self, tree: Subtree, sender: int, channel: int, pos: list, light: int,
                urgent: int, now: float) -> None:
        """This member's report for its subtree of a channel's tree, to its parent (the root's to
        the sender, as an `Ack`): sent when it changed, repeated as `_send` repeats an ack."""
        dseq, held, subtree_light = tree.report(pos[0], bool(light), pos[4], now)
        if dseq == tree.reported and subtree_light == tree.reported_light:
            if not _repeat_due(pos, now):
                return
        else:
            pos[3] = now
        parent = self._tables.members.get(tree.parent)
        if parent is None:  # (another scope's member: looked up, reported to once known)
            if tree.parent not in self._unknown:
                self._unknown.add(tree.parent)
                self._look_up.set()
            return
        tree.reported, tree.reported_light = dseq, subtree_light
        pos[1] = pos[0]
        pos[2] = now
        held_us = max(0, round(held * 1e6))
        if tree.parent == sender:
            message = Ack(channel, dseq, held_us, subtree_light)
        else:
            message = GroupAck(sender, channel, dseq, held_us, subtree_light, urgent)
        self._send_control(message, (parent.host, parent.port))


def _repeat_due(pos: list, now: float) -> bool:
    """An unchanged acknowledgement (or report) is due again: a lost one must not leave a
    sender's full window stalled (often for a second after the last new data, then rarely)."""
    return now - pos[2] >= (ACK_REPEAT if now - pos[3] < 1.0 else ACK_REPEAT_IDLE)
