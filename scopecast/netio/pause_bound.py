"""How long a stream may stand still behind its sender's record before a member asks for its tail
without evidence of loss.

A receiver asks for a lost tail at once on evidence of loss (a gap in a channel's datagram
numbers, a run it had no room for, a member that left; see `recovery_path`). Without evidence, a
stream standing still behind what its sender's record names is most often a pause: a forwarding
member working through another sender's burst holds it for seconds, and does so at every burst.
Asking then only has the sender send it twice. So the bound learns: it is TAIL_FALLBACK_MAX, or
twice the longest spell lately that ended by itself (with no NAK), at most PAUSE_MAX. An earlier
spell counts for PAUSE_DECAY of itself at each new one.
"""

from __future__ import annotations

from scopecast.timing import TIMING

TAIL_FALLBACK_MAX = TIMING.tail_fallback_max
PAUSE_MAX = TIMING.tail_pause_max
PAUSE_DECAY = 0.8
PAUSE_MIN = TIMING.tail_fallback  # shorter spells teach nothing: the default bound covers them


class PauseBound:
    """Per sender: the longest spell lately that ended by itself, and whether the current spell
    was asked for."""

    def __init__(self) -> None:
        self._pauses: dict[int, float] = {}
        self._asked: set[int] = set()

    def bound(self, source: int) -> float:
        return min(PAUSE_MAX, max(TAIL_FALLBACK_MAX, 2 * self._pauses.get(source, 0.0)))

    def asked(self, source: int) -> None:
        """The member asked for `source`'s tail in the current spell."""
        self._asked.add(source)

    def moved(self, source: int, since: float | None, now: float) -> None:
        """`source`'s stream moved again; it had stood still behind the record `since` then."""
        if source in self._asked:
            self._asked.discard(source)
        elif since is not None and now - since > PAUSE_MIN:
            self._pauses[source] = max(now - since, PAUSE_DECAY * self._pauses.get(source, 0.0))

    def forget(self, source: int) -> None:
        self._pauses.pop(source, None)
        self._asked.discard(source)
