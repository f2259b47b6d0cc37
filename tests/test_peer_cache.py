"""A caching member's cache of its peers' runs (pure): stream order, pruning at stability, and
the count of messages it holds (what the scale benchmark compares between caching settings)."""

from __future__ import annotations

from scopecast.netio.peer_cache import PeerCache
from scopecast.netio.repair_server import CachedRun


def _run(first: int, last: int) -> CachedRun:
    return CachedRun(first, last, b"", 1, 1, first, 0, (), 0)


def test_the_cache_counts_what_it_holds_until_stable_and_keeps_stream_order():
    cache = PeerCache()
    for first, last in ((1, 10), (21, 30), (11, 20)):  # (11-20 released after 21-30)
        cache.keep(7, _run(first, last))
    cache.keep(8, _run(1, 5))
    runs, head = cache.runs(7)
    assert [r.first_sseq for r in runs[head:]] == [1, 11, 21]
    assert (cache.held, cache.count(), cache.kept) == (35, 4, 4)
    cache.prune(7, 15)                  # 1-10 stable; 11-20 is not yet whole
    assert (cache.held, cache.count()) == (25, 3)
    cache.prune(7, 30)
    assert (cache.held, cache.count()) == (5, 1)
    cache.prune(7, 30)                  # nothing more
    assert cache.held == 5
    cache.clear()
    assert (cache.held, cache.count(), cache.kept) == (0, 0, 0)  # (no longer a cacher)
