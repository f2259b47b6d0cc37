"""A receiver's numbers per message key (next seq, last stream seq), kept per source session.

The key of a message is (topic, source, session). Every message of a mixed run shares its source
and session, so a table stored as (source, session) -> SeqTable (topic -> value, compact, in C:
see _seq_table.c) lets a run of a thousand topics be checked and moved by topic ids alone, in
one C loop: no key tuple is built, hashed and compared per message, and a topic's number is one
slot rather than a dict entry and two int objects cold in the cache (a cost that grew with the
number of topics). Elsewhere the table reads as a mapping keyed by (topic, source, session)."""

from __future__ import annotations

from collections.abc import Iterator

from scopecast.netio.native import SeqTable


class KeyTable:
    """(topic, source, session) -> int, stored as (source, session) -> {topic: int}. Keys are
    never taken out."""

    __slots__ = ("by_source",)

    def __init__(self) -> None:
        self.by_source: dict[tuple[int, int], SeqTable] = {}

    def topics(self, source: int, session: int) -> SeqTable:
        """The topic -> value table of one source's session (made empty if there is none)."""
        table = self.by_source.get((source, session))
        if table is None:
            table = self.by_source[(source, session)] = SeqTable()
        return table

    def get(self, key: tuple[int, int, int], default: int | None = None) -> int | None:
        table = self.by_source.get((key[1], key[2]))
        return default if table is None else table.get(key[0], default)

    def __getitem__(self, key: tuple[int, int, int]) -> int:
        return self.by_source[(key[1], key[2])][key[0]]

    def __setitem__(self, key: tuple[int, int, int], value: int) -> None:
        self.topics(key[1], key[2])[key[0]] = value

    def __contains__(self, key: tuple[int, int, int]) -> bool:
        table = self.by_source.get((key[1], key[2]))
        return table is not None and key[0] in table

    def __len__(self) -> int:
        return sum(map(len, self.by_source.values()))

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        return (key for key, _ in self.items())

    def items(self) -> Iterator[tuple[tuple[int, int, int], int]]:
        """(a snapshot: the caller may change the table meanwhile)"""
        for (source, session), table in list(self.by_source.items()):
            for topic, value in table.items():
                yield (topic, source, session), value

    def added_since(self, seen: dict[tuple[int, int], int]) -> list[tuple[int, int, int]]:
        """The keys put in since the last call with `seen` (source session -> how many keys it
        had then; brought up to date here): each table's last, keys never being taken out."""
        added = []
        for (source, session), table in self.by_source.items():
            new = len(table) - seen.get((source, session), 0)
            if new > 0:
                added += [(topic, source, session) for topic in table.keys_after(len(table) - new)]
                seen[(source, session)] = len(table)
        return added
