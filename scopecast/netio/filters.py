"""Filters guarding sub-channels (thesis 3.2.4): cheap per-message predicates, and their specs.

A filter sees the message's topic id, source member id, sequence number and stream sequence
number; filters are pure and stateless so that the per-message channel tree evaluation stays cheap.

What crosses a process boundary (a policy's `Connect`, a delegation, a member's view) is a filter's
*spec*, a tuple of plain values, checked by `check_spec` and made a filter by `build`:

    ("modulo", n, k)            seq % n == k              (replication, 3.2.4)
    ("modulo", n, k, "stream")  stream seq % n == k       (a source's messages of every topic)
    ("topics", id, ...)         the topic is one of these
    ("origin", id, ...)         the publishing member is one of these
    ("all", spec, spec, ...)    every one of the specs passes (a sub-channel of a sub-channel)

Specs are canonical (ids sorted, no duplicates; nested "all" flattened), so equal filters compare
and hash equal, and a member's routes alike but for the topic still merge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_IDS = 4096       # ids in one topics/origin spec
MAX_MODULO = 64      # n of a modulo spec (as replicas)
MAX_TERMS = 32       # specs under one "all" (each level of scopes may add one)
MAX_DEPTH = 4        # "all" within "all"


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


@dataclass(slots=True, frozen=True)
class AllFilter:
    """Passes messages every one of its filters passes."""

    parts: tuple[Filter, ...]

    def accepts(self, topic: int, source: int, seq: int, stream_seq: int) -> bool:
        for f in self.parts:
            if not f.accepts(topic, source, seq, stream_seq):
                return False
        return True


def check_spec(spec, depth: int = 0, names: Callable[[str, str], None] | None = None,
               most: int = MAX_TERMS) -> tuple | None:
    """`spec` (as it came: tuples or lists, from a policy or off the wire) in canonical form;
    None for None. ValueError where it is no filter spec or out of bounds. `names`: a topics or
    origin spec may name (kind, name) as well, which `names` checks (raising ValueError), as a
    policy's do (`scopes.policy_filters`); `most` specs under one "all"."""
    if spec is None:
        return None
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError(f"a filter spec is a tuple, not {spec!r:.80}")
    kind = spec[0]
    if kind == "modulo":
        if len(spec) not in (3, 4) or not all(type(x) is int for x in spec[1:3]):
            raise ValueError(f"modulo filter spec: ('modulo', n, k[, 'stream']), not {spec!r:.80}")
        n, k = spec[1], spec[2]
        if not 0 <= k < n <= MAX_MODULO:
            raise ValueError(f"modulo filter needs 0 <= k < n <= {MAX_MODULO}, got n={n} k={k}")
        if len(spec) == 3 or spec[3] == "seq":
            return ("modulo", n, k)
        if spec[3] != "stream":
            raise ValueError(f"modulo filter keys on 'seq' or 'stream', not {spec[3]!r:.40}")
        return ("modulo", n, k, "stream")
    if kind in ("topics", "origin"):
        items = spec[1:]
        if not 1 <= len(items) <= MAX_IDS or not all(
                type(x) is int and x >= 0 or names is not None and type(x) is str
                for x in items):
            raise ValueError(f"{kind} filter spec: ({kind!r}, id, ...) with 1 to {MAX_IDS} "
                             f"ids{' or names' if names else ''}, not {spec!r:.80}")
        for x in items:
            if type(x) is str:
                names(kind, x)
        return (kind, *sorted(set(items), key=_ids_first))
    if kind == "all":
        if not 1 <= len(spec) - 1 <= most or depth >= MAX_DEPTH:
            raise ValueError(f"an 'all' filter spec holds 1 to {most} specs, "
                             f"{MAX_DEPTH} deep at most")
        return all_of(*(check_spec(s, depth + 1, names, most) for s in spec[1:]), most=most)
    raise ValueError(f"unknown filter kind {kind!r:.40}")


def _ids_first(item: int | str) -> tuple[bool, int | str]:
    return (item.__class__ is str, item)


def all_of(*specs, most: int = MAX_TERMS) -> tuple | None:
    """The spec passing what every one of `specs` (canonical, or None: no filter) passes."""
    terms: list[tuple] = []
    for s in specs:
        if s is None:
            continue
        for t in (s[1:] if s[0] == "all" else (s,)):
            if t not in terms:
                terms.append(t)
    if not terms:
        return None
    if len(terms) > most:
        raise ValueError(f"more than {most} filters in one")
    return terms[0] if len(terms) == 1 else ("all", *sorted(terms, key=repr))


def build(spec: tuple | None) -> Filter | None:
    """The filter of a canonical spec (None for None)."""
    if spec is None:
        return None
    kind = spec[0]
    if kind == "modulo":
        return ModuloFilter(spec[1], spec[2], spec[3] if len(spec) == 4 else "seq")
    if kind == "topics":
        return TopicFilter(frozenset(spec[1:]))
    if kind == "origin":
        return OriginFilter(frozenset(spec[1:]))
    return AllFilter(tuple(build(s) for s in spec[1:]))

