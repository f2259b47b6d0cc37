"""A receiver's acknowledgements, a part of the member runtime (see `member_parts`).

Which datagrams of each sender's channel came, acknowledged every `ack_period`, and at once when
a datagram asks (`wire.FLAG_ACK_NOW`: its sender's window is half full); withheld while an
application lags behind by more than `max_backlog_bytes`, so a slow consumer slows its senders
(see `feed` and `delay_window`). Datagram numbers that never came are the evidence of loss that
recovery acts on (`tail_evidence`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from scopecast.netio import wire
from scopecast.netio.control_messages import Ack
from scopecast.netio.member_parts import MemberBasics, MemberTables, Recovering
from scopecast.timing import TIMING

ACK_REPEAT, ACK_REPEAT_IDLE = 0.02, 0.5  # seconds between repeats of an unchanged ack
ACK_NOW_GAP = TIMING.ack_now_gap


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

    def members_changed(self) -> None:
        """Forget the channels of members gone."""
        members = self._tables.members
        for key in [k for k in self._pos if k[0] not in members]:
            del self._pos[key]

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
            self._pos[key] = [last, 0, 0.0, 0.0, time.monotonic()]
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
        if tails_open or any(pos[0] != pos[1] for pos in self._pos.values()):
            return self._config.ack_period
        return None

    def _send(self, now: float) -> None:
        self._last_ack = now
        self._ack_now = False
        self.due_at = now + self._config.ack_period
        limit = self._config.max_backlog_bytes
        for sub in self._tables.subscriptions:  # (not per topic: a pattern's one is under
            if sub.backlog() > limit:           # thousands)
                self._stats["acks_withheld"] += 1
                return
        members = self._tables.members
        light = int(self._recovery.promotion.light)
        for (sender, channel), pos in self._pos.items():
            if pos[0] == pos[1]:
                # repeated: a lost ack must not leave a sender's full window stalled (often for
                # a second after the last new data, then rarely)
                if now - pos[2] < (ACK_REPEAT if now - pos[3] < 1.0 else ACK_REPEAT_IDLE):
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
