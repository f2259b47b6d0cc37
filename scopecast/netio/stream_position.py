"""Where a receiver stands in each sender's stream, by stream sequence number (QSM's numbering per
region), and whether it is owed every message of that stream.

A sender numbers all its messages in one stream; a receiver that takes every topic the sender
publishes (a *dense* stream: both sides' `KeyDigest` of (topic, session) keys agree) is owed every
stream seq, so the contiguous position is what it may acknowledge and the holes above it are what
it asks for, whatever the topics: recovery then costs per sender, not per topic (the sender's
record names at most a few hundred topics; past that, only a dense stream stays exact and fast).
"""

from __future__ import annotations

from bisect import insort

MASK64 = (1 << 64) - 1
MAX_AHEAD = 1024    # stretches held beyond holes in one stream; past that it is not tracked


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads a key over 64 bits, so that XOR-ing keys makes a digest."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class KeyDigest:
    """A set of (topic, session) keys as its size and an order-free digest (each added once)."""

    __slots__ = ("count", "digest")

    def __init__(self) -> None:
        self.count = 0
        self.digest = 0

    def add(self, topic: int, session: int, count: int = 1) -> None:
        """Put a key in (`count=-1`: take out a key that was put in; XOR undoes itself)."""
        self.count += count
        self.digest ^= _mix((topic << 32) | (session & 0xFFFFFFFF))

    def remove(self, topic: int, session: int) -> None:
        self.add(topic, session, -1)

    def same(self, count: int, digest: int) -> bool:
        return self.count == count and self.digest == digest


class StreamPositions:
    """Per sender stream: the position up to which this member took every message (from the first
    it took), and the stretches it took beyond holes above it."""

    __slots__ = ("contiguous", "_ahead", "_starts", "_last", "untracked")

    def __init__(self) -> None:
        self.contiguous: dict[int, int] = {}
        self._ahead: dict[int, dict[int, int]] = {}   # source -> {first sseq: last sseq}
        # source -> the stretches' first sseqs in order: runs that come by several paths (topics
        # laid along different channels) leave thousands of stretches, and the position moves
        # over them one run at a time; sorting them at each move was quadratic
        self._starts: dict[int, list[int]] = {}
        self._last: dict[int, int] = {}               # source -> the stretch marked last
        self.untracked: set[int] = set()              # streams with too many holes to follow

    def mark(self, source: int, lo: int, hi: int) -> None:
        """Messages `lo`..`hi` of `source`'s stream were taken."""
        c = self.contiguous.get(source)
        if c is None or lo <= c + 1:
            if c is None or hi > c:
                ahead = self._ahead.get(source)
                self.contiguous[source] = self._absorb(source, ahead, hi) if ahead else hi
            return
        ahead = self._ahead.setdefault(source, {})
        start = self._last.get(source)
        if start is not None and ahead[start] + 1 == lo:
            ahead[start] = hi  # the common case after a hole: one stretch grows
        elif lo not in ahead:
            ahead[lo] = hi
            insort(self._starts.setdefault(source, []), lo)
            self._last[source] = lo
            if len(ahead) > MAX_AHEAD:
                self.untracked.add(source)
        elif ahead[lo] < hi:
            ahead[lo] = hi
            self._last[source] = lo

    def _absorb(self, source: int, ahead: dict[int, int], c: int) -> int:
        starts = self._starts[source]
        n = 0
        for start in starts:
            if start > c + 1:
                break
            c = max(c, ahead.pop(start))
            n += 1
        if n:
            del starts[:n]
            if self._last.get(source) not in ahead:
                self._last.pop(source, None)
            if not ahead:
                del self._ahead[source], self._starts[source]
        return c

    def end(self, source: int) -> int:
        """The furthest stream seq taken."""
        ahead = self._ahead.get(source)  # (stretches beyond holes are past the position)
        return max(ahead.values()) if ahead else self.contiguous.get(source, 0)

    def holes(self, source: int, limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (first, last) stream seqs missing between what was taken."""
        c = self.contiguous.get(source)
        ahead = self._ahead.get(source, {})
        out: list[tuple[int, int]] = []
        for start in self._starts.get(source, ()):
            if start > c + 1:  # (stretches may touch: no hole between them)
                if len(out) == limit:
                    break
                out.append((c + 1, start - 1))
            c = max(c, ahead[start])
        return out
