"""Whether a receiver may ask for a sender stream's tail: what its sender's record names beyond
what the receiver got, the stream standing still.

A stream that stands still while its sender has sent more is lost only if something was lost: a
forwarding member that pauses holds it as well, and asking then only has the sender send it twice.
So a tail is asked for on evidence, and the evidence is kept (each tail NAK is counted by it, so
`status` tells a loss from a pause waited out):
- `tails_on_loss`: a channel showed a datagram lost since the stream last moved (a gap in its
  datagram numbers, revealed by the next datagram or by the sender's tail probe), a run the member
  had no room to hold, or a member that left (what it held to forward is gone);
- `tails_on_cut`: a repair came that its server's budget cut short (the REPAIR datagram says more
  follows): the rest is asked for at the next period, whether or not the stream stood still;
- `tails_on_bound`: it stood still for the bound `PauseBound` learns;
- `tails_on_quiet`: it stood still for TAIL_FALLBACK with no new datagram on any channel.
"""

from __future__ import annotations

from scopecast.netio.pause_bound import PauseBound
from scopecast.timing import TIMING

TAIL_FALLBACK = TIMING.tail_fallback


class TailEvidence:
    """Per sender stream: when the stream last moved, the learnt pause bound, repairs cut short,
    and the evidence each tail was last asked for on (a stats key)."""

    def __init__(self) -> None:
        self._moved: dict[int, float] = {}  # source -> the summary that first saw it there
        self._pauses = PauseBound()         # how long a spell behind the record may last, learnt
        self._cut: set[int] = set()         # sources a repair cut short came of, this period
        self._why: dict[int, str] = {}

    def moved(self, source: int, since: float | None, now: float) -> None:
        """`source`'s stream moved at this summary; it had stood behind its record `since`."""
        self._moved[source] = now
        self._pauses.moved(source, since, now)

    def cut_short(self, source: int) -> None:
        """A repair of `source`'s stream came that its server's budget cut short."""
        self._cut.add(source)

    def period_done(self) -> None:
        """The summary asked for what the repairs cut short named."""
        self._cut.clear()

    def wanted(self, source: int, now: float, stalled: bool, since: float | None,
               loss_seen_at: float, data_seen_at: float, period: float) -> bool:
        """Whether to ask for `source`'s tail now. The spells count from `since` when given: when
        the sender was first known to have sent more than this member saw, not when the stream
        last moved here (a sender held by its window sends nothing for seconds; what it sends
        after that is in flight, not late); else from the move (the record names no more than
        that: a topic's tail lost below later messages of other topics)."""
        moved = self._moved.setdefault(source, now)
        still = now - (moved if since is None else since)
        if source in self._cut:
            self._why[source] = "tails_on_cut"
        elif not stalled:
            return False
        elif loss_seen_at >= moved - 2 * period:
            self._why[source] = "tails_on_loss"
        elif still >= self._pauses.bound(source):
            self._why[source] = "tails_on_bound"
        elif still >= TAIL_FALLBACK and now - data_seen_at >= TAIL_FALLBACK:
            self._why[source] = "tails_on_quiet"
        else:
            return False
        self._pauses.asked(source)
        return True

    def why(self, source: int) -> str:
        """The evidence `source`'s tail was last asked for on."""
        return self._why.get(source, "tails_on_loss")

    def forget(self, source: int) -> None:
        """`source`'s record expired: nothing of it is kept (a sender known again later is
        judged from then)."""
        self._moved.pop(source, None)
        self._cut.discard(source)
        self._why.pop(source, None)
        self._pauses.forget(source)
