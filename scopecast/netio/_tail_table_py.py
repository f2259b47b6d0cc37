"""The pure-Python twin of `_tail_table.c`, used where the extension was not built (no compiler)
or when SCOPECAST_PURE_PYTHON=1 forces it (see `native`).

A sender's tail of each of its own streams: (topic, session) -> where its unstable messages
start and where it ends. Same contract as the C table (types, results, errors), so that the unit
tests run over both; one difference no caller relies on: `items()` and an all-streams `record`
follow insertion order here, slot order there."""

from __future__ import annotations

import struct

from scopecast.netio._seq_table_py import SEQ_LIMIT, as_i64, as_u32

RECORD_ENTRY = struct.Struct("<IIQQQQ")  # recovery_records.RECORD_ENTRY
MAX_LIMIT = 4096


def _stream(topic: object, session: object) -> tuple[int, int]:
    """A topic and session as a stream's key, or the C side's error."""
    key = (as_u32(topic), as_u32(session))
    if key[0] == 0:
        raise ValueError("topic 0 is no stream's (wire.MIXED)")
    return key


def _key(k: object) -> tuple[int, int]:
    if not isinstance(k, tuple) or len(k) != 2:
        raise TypeError("a TailTable's keys are (topic, session) tuples")
    return _stream(k[0], k[1])


def _entry(e: object) -> tuple[tuple[int, int], int, int]:
    """A cache entry (sseq, topic, session, seq, ...) as (key, sseq, seq)."""
    if not isinstance(e, tuple) or len(e) < 4:
        raise TypeError("a cache entry is (sseq, topic, session, seq, ...)")
    return _stream(e[1], e[2]), as_i64(e[0]), as_i64(e[3])


def _span(cache: object, start: int, stop: int) -> None:
    if not isinstance(cache, list):
        raise TypeError("the cache is a list")
    if start < 0 or start > stop or stop > len(cache):
        raise IndexError("cache span out of range")


class TailTable:
    """(topic, session) -> a sender's stream tail; keys never taken out. A tail is held as
    [first unstable seq, its stream seq, last seq, last stream seq] (first > last: all stable)
    and read as that list while any message is unstable, else as the last seq."""

    __slots__ = ("_tails",)

    def __init__(self) -> None:
        self._tails: dict[tuple[int, int], list[int]] = {}

    @staticmethod
    def _read(tail: list[int]) -> int | list[int]:
        return tail[2] if tail[0] > tail[2] else list(tail)

    def _find(self, k: object) -> list[int] | None:
        try:
            return self._tails.get(_key(k))
        except (TypeError, ValueError, OverflowError):
            return None

    def __len__(self) -> int:
        return len(self._tails)

    def __getitem__(self, k: object) -> int | list[int]:
        tail = self._find(k)
        if tail is None:
            raise KeyError(k)
        return self._read(tail)

    def get(self, k: object, default: object = None) -> object:
        tail = self._find(k)
        return default if tail is None else self._read(tail)

    def __contains__(self, k: object) -> bool:
        return self._find(k) is not None

    def __setitem__(self, k: object, v: object) -> None:
        key = _key(k)
        if isinstance(v, int):
            f = [0, 0, as_i64(v), 0]
        else:
            f = list(v)
            if len(f) != 4:
                raise TypeError(f"a tail is 4 seqs, not {len(f)}")
            f = [as_i64(x) for x in f]
        if not all(0 <= x < SEQ_LIMIT for x in f):
            raise ValueError(f"a tail's seqs are in [0, 2**62): {v!r}")
        if isinstance(v, int):
            f[0] = f[2] + 1
        self._tails[key] = f

    def __delitem__(self, k: object) -> None:
        raise TypeError("a TailTable's keys are never taken out")

    def items(self) -> list:
        return [(key, self._read(tail)) for key, tail in self._tails.items()]

    def note(self, cache: list, start: int) -> list[tuple[int, int]]:
        """The cache entries from `start` on were just sent: each one's stream ends there, and
        starts its unstable part there if it had none. The keys met for the first time."""
        _span(cache, start, len(cache) if isinstance(cache, list) else 0)
        tails, made = self._tails, []
        for i in range(start, len(cache)):
            key, sseq, seq = _entry(cache[i])
            tail = tails.get(key)
            if tail is None:
                tail = tails[key] = [seq, sseq, seq, sseq]
                made.append(key)
            elif tail[0] > tail[2]:
                tail[0], tail[1] = seq, sseq
            tail[2], tail[3] = seq, sseq
        return made

    def release(self, cache: list, start: int, stop: int) -> int:
        """The cache entries in [start, stop) are stable: each stream's unstable part starts
        after its last one among them. The bytes of their payloads."""
        _span(cache, start, stop)
        tails, freed = self._tails, 0
        for i in range(start, stop):
            e = cache[i]
            key, sseq, seq = _entry(e)
            if len(e) > 5:
                freed += len(e[5])
            tail = tails.get(key)
            if tail is None or tail[0] > tail[2]:
                continue
            if seq >= tail[2]:
                tail[0] = tail[2] + 1
            else:
                tail[0], tail[1] = seq + 1, sseq + 1
        return freed

    def record(self, cache: list, head: int, handed: int, scan: int, limit: int) -> tuple:
        """(named, horizon): every unstable stream packed, horizon `handed`, when there are at
        most `limit` streams; else those of the oldest unstable messages (the cache from `head`,
        up to stream seq `handed`, at most `scan` looked at, at most `limit` streams) and the
        stream seq up to which every message looked at is of one of them."""
        if not all(isinstance(x, int) for x in (head, handed, scan, limit)):
            raise TypeError("record(cache, head, handed, scan, limit)")
        if scan < 1 or not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"scan >= 1 and limit in 1..{MAX_LIMIT}")
        _span(cache, head, len(cache) if isinstance(cache, list) else 0)
        tails = self._tails
        horizon = handed
        if len(tails) <= limit:
            chosen = list(tails.items())
        else:
            seen: dict = {}
            for i in range(head, min(len(cache), head + scan)):
                key, sseq, _seq = _entry(cache[i])
                if sseq > handed:
                    break
                if key not in seen:
                    if len(seen) == limit:
                        horizon = sseq - 1
                        break
                    seen[key] = None
                if i == head + scan - 1:  # (more may follow)
                    horizon = sseq
            chosen = [(key, tails[key]) for key in seen if key in tails]
        named = b"".join(RECORD_ENTRY.pack(*key, *tail) for key, tail in chosen
                         if tail[0] <= tail[2])
        return named, horizon

    def __repr__(self) -> str:
        return f"TailTable({len(self._tails)} streams)"
