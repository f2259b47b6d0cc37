"""What a caching member keeps of its peers' streams until stable, to repair others with (thesis
3.2.12: members other than the sender serve repairs): per source, its `CachedRun`s in stream order
and a head before which every slot is stable (None; nothing looks there)."""

from __future__ import annotations

import bisect
from operator import itemgetter

from scopecast.netio.repair_server import CachedRun, entry_sseq

_last_sseq = itemgetter(1)  # of a CachedRun


class PeerCache:
    __slots__ = ("_runs", "_heads", "kept", "held")

    def __init__(self) -> None:
        self._runs: dict[int, list] = {}   # source -> its CachedRuns (None before the head)
        self._heads: dict[int, int] = {}   # source -> index of its first run not stable yet
        self.kept = 0                      # runs kept since it last became a cacher (status)
        self.held = 0                      # messages held now, not stable yet

    def keep(self, source: int, run: CachedRun) -> None:
        """Keep `run` (as received) until it is stable."""
        self.kept += 1
        self.held += run[1] - run[0] + 1
        cache = self._runs.get(source)
        if cache is None:
            cache = self._runs[source] = []
            self._heads[source] = 0
        if cache and run[0] < cache[-1][0]:
            # runs held early and released after later ones: put in stream order (repairs and
            # pruning look runs up by stream seq)
            cache.insert(bisect.bisect(cache, run[0], lo=self._heads[source], key=entry_sseq),
                         run)
            return
        cache.append(run)

    def prune(self, source: int, stable: int) -> None:
        """Let go of `source`'s runs up to stream seq `stable`: their datagrams at once, the
        list's slots when more than half of it is stable."""
        cache = self._runs.get(source)
        if not cache:
            return
        old = self._heads[source]
        head = bisect.bisect_right(cache, stable, lo=old, key=_last_sseq)
        for run in cache[old:head]:  # (each run is let go once: a sum, not a scan)
            self.held -= run[1] - run[0] + 1
        if head * 2 > len(cache):
            del cache[:head]
            head = 0
        elif head > old:
            cache[old:head] = [None] * (head - old)
        self._heads[source] = head

    def runs(self, source: int) -> tuple[list | None, int]:
        """(`source`'s cached runs, the index of the first not stable yet)."""
        return self._runs.get(source), self._heads.get(source, 0)

    def count(self) -> int:
        """Runs held, not stable yet."""
        return sum(len(c) - self._heads[s] for s, c in self._runs.items())

    def clear(self) -> None:
        """This member is no longer a cacher: let go of everything."""
        self._runs.clear()
        self._heads.clear()
        self.held = self.kept = 0
