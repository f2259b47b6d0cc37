"""Filters guarding sub-channels (thesis 3.2.4): cheap per-message predicates.

A filter sees the message's topic id, source member id, sequence number and stream sequence
number; filters are pure and stateless so that the per-message channel tree evaluation stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Filter(Protocol):
    def accepts(self, topic: int, source: int, seq: int, stream_seq: int) -> bool: ...


@dataclass(slots=True, frozen=True)
class ModuloFilter:
    """Passes messages whose sequence number is `k` modulo `n` (replication, 3.2.4).

    `on="seq"` uses the per-topic sequence number, `on="stream"` the stream sequence number."""

    n: int
    k: int
    on: str = "seq"

    def __post_init__(self) -> None:
        if self.n < 1 or not 0 <= self.k < self.n:
            raise ValueError(f"modulo filter needs n >= 1 and 0 <= k < n, got n={self.n} k={self.k}")
        if self.on not in ("seq", "stream"):
            raise ValueError(f"modulo filter keys on 'seq' or 'stream', not {self.on!r}")

    def accepts(self, topic: int, source: int, seq: int, stream_seq: int) -> bool:
        return (seq if self.on == "seq" else stream_seq) % self.n == self.k


@dataclass(slots=True, frozen=True)
class TopicFilter:
    """Passes messages of a set of topics (one channel serving many topics)."""

    topics: frozenset[int]

    def accepts(self, topic: int, source: int, seq: int, stream_seq: int) -> bool:
        return topic in self.topics


@dataclass(slots=True, frozen=True)
class OriginFilter:
    """Passes messages published by a set of source members."""

    sources: frozenset[int]

    def accepts(self, topic: int, source: int, seq: int, stream_seq: int) -> bool:
        return source in self.sources
