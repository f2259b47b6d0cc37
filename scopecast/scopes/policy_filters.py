"""Filters as a forwarding policy names them, turned into the specs a channel carries
(`netio.filters`): a policy knows member names and topic names, a channel member ids and topic ids.

A policy's spec is `netio.filters`' with names allowed where ids go:

    ("topics", "flights/*", "weather", 7)   topic names and patterns (or ids)
    ("origin", "h1-pub", 12)                member processes of the scope by name (or member ids)

`check` bounds and canonicalises one as the container takes it (`netio.filters.check_spec`,
names allowed); `resolve` decides it for one
topic's channel when the scope lays it: every message of a topic's channel has that topic, so a
topics filter only says whether the channel is laid at all (nothing is evaluated per message);
names of origins become the ids of the scope's member processes by those names (a name that is
none of them passes nothing).
"""

from __future__ import annotations

import functools

from scopecast.netio import filters
from scopecast.netio.topic_names import check_subscription, name_filter

MAX_NAME = 200
MAX_TERMS = 8  # specs under one "all" of a policy's


def check(spec) -> tuple | None:
    """A policy's filter spec in canonical form (None for None); ValueError if it is none."""
    return filters.check_spec(spec, names=_check_name, most=MAX_TERMS)


def _check_name(kind: str, name: str) -> None:
    if not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"{kind} filter spec names are 1 to {MAX_NAME} characters")
    if kind == "topics":
        check_subscription(name)  # (InvalidConfig is a ValueError)


def resolve(spec: tuple | None, topic: int, name: str,
            members: dict[str, int]) -> tuple[bool, tuple | None]:
    """For the channel of topic `topic` (named `name`) in a scope whose member processes are
    `members` (name -> id): whether it is laid at all, and the channel's spec (ids only)."""
    if spec is None:
        return True, None
    kind = spec[0]
    if kind == "topics":
        ids = {x for x in spec[1:] if type(x) is int}
        names = [x for x in spec[1:] if isinstance(x, str)]
        return (topic in ids or bool(names) and _matcher(tuple(names))(name)), None
    if kind == "origin":
        ids = {x if type(x) is int else members.get(x) for x in spec[1:]} - {None}
        return bool(ids), ("origin", *sorted(ids)) if ids else None
    if kind == "all":
        laid, parts = True, []
        for s in spec[1:]:
            ok, part = resolve(s, topic, name, members)
            laid = laid and ok
            parts.append(part)
        return laid, filters.all_of(*parts) if laid else None
    return True, spec


@functools.lru_cache(maxsize=1024)
def _matcher(names: tuple[str, ...]):
    """A topic set's test, compiled once (a scope decides it for every topic it lays)."""
    return name_filter(names)
