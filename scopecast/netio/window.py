"""A destination's send queue and its bytes-bounded flow window.

Receivers acknowledge the highest datagram number they took from this destination's channel; the
window is the bytes sent after the slowest live receiver's acknowledgement. A receiver the control
plane announced holds the window from the moment it is announced; one silent for `ack_timeout`
while data is outstanding stops holding it (it will lose data until recovery exists for it).
"""

from __future__ import annotations

from collections import deque


class Feed:
    """Messages queued for one destination, and that destination's flow window."""

    __slots__ = ("address", "channel", "queue", "own", "dseq", "sent_bytes", "history",
                 "base_bytes", "acks", "frag")

    def __init__(self, address: tuple[str, int], channel: int) -> None:
        self.address = address
        self.channel = channel
        self.queue: deque = deque()
        self.own: deque[int] = deque()  # stream seqs of this member's own queued messages, in order
        self.dseq = 0
        self.sent_bytes = 0
        self.history: deque[tuple[int, int]] = deque()  # (dseq, sent_bytes after it)
        self.base_bytes = 0                              # sent_bytes at the slowest receiver's ack
        self.acks: dict[int, list] = {}                  # member -> [dseq, last heard]
        self.frag = None                                 # (entry, pieces iterator) while fragmenting

    def in_flight(self) -> int:
        return self.sent_bytes - self.base_bytes

    def expect(self, member: int, now: float) -> None:
        """A receiver the control plane says is there: it holds the window from now on."""
        if member not in self.acks:
            self.acks[member] = [self.dseq, now]

    def acknowledge(self, member: int, dseq: int, now: float) -> None:
        entry = self.acks.get(member)
        if entry is None:
            self.acks[member] = [dseq, now]
        else:
            if dseq > entry[0]:
                entry[0] = dseq
            entry[1] = now
        self._advance()

    def _advance(self) -> None:
        low = min((a[0] for a in self.acks.values()), default=self.dseq)
        history = self.history
        while history and history[0][0] <= low:
            self.base_bytes = history.popleft()[1]
        if not self.acks:
            self.base_bytes = self.sent_bytes

    def expire(self, now: float, timeout: float) -> list[int]:
        """Stop waiting for receivers silent for `timeout` while data is outstanding."""
        if self.in_flight() == 0:
            for a in self.acks.values():
                a[1] = now
            return []
        gone = [m for m, a in self.acks.items() if a[0] < self.dseq and now - a[1] > timeout]
        for m in gone:
            del self.acks[m]
        if gone:
            self._advance()
        return gone
