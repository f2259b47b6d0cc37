"""Topic names and patterns: what a name may be, and which names a pattern matches (checked by
publishers and subscribers as well as by scope managers), and what a publisher holds of a topic."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from scopecast.actors.errors import InvalidConfig

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
MAX_TOPIC_NAME = 200
_PATTERN = re.compile(r"^[A-Za-z0-9_.\-*?]+(/[A-Za-z0-9_.\-*?]+)*$")


def is_pattern(name: str) -> bool:
    return "*" in name or "?" in name


GRAMMAR = ("a topic name is '/'-separated parts of letters, digits, '_', '-' and '.' (at most "
           f"{MAX_TOPIC_NAME} characters); a pattern may also use '*' (any characters within one "
           "part: 'flights/*' matches 'flights/JFK', not 'flights/JFK/late') and '?' (one "
           "character); '**' is not supported")


def topic_matcher(pattern: str) -> re.Pattern:
    """A topic pattern as a regular expression: `*` matches within one `/`-separated part, `?` one
    character of it (`flights/*` matches `flights/JFK`, not `flights/JFK/late`)."""
    if not isinstance(pattern, str) or len(pattern) > MAX_TOPIC_NAME \
            or not _PATTERN.match(pattern) or "**" in pattern:
        raise InvalidConfig(f"bad topic pattern {pattern!r}: {GRAMMAR}")
    body = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body + r"\Z")


def name_filter(names) -> Callable[[str], bool]:
    """A test of topic names: one of `names`, or matched by one of its patterns."""
    for name in names:
        if not isinstance(name, str):
            raise InvalidConfig(f"topic names and patterns are strings, not {name!r}")
    exact = {n for n in names if not is_pattern(n)}
    patterns = [topic_matcher(n) for n in names if is_pattern(n)]
    if not patterns:
        return exact.__contains__
    return lambda name: name in exact or any(p.match(name) for p in patterns)


def check_topic_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > MAX_TOPIC_NAME or not _TOPIC_NAME.match(name):
        raise InvalidConfig(f"bad topic name {name!r}: {GRAMMAR}")
    return name


def check_subscription(name: str) -> str:
    """A name or pattern to subscribe to, checked against the grammar (InvalidConfig)."""
    if isinstance(name, str) and is_pattern(name):
        topic_matcher(name)
        return name
    return check_topic_name(name)


class Advertised(NamedTuple):
    """What a publisher needs of its topic, as `advertise` returns it: a few fields, not the
    TopicInfo (a process publishing thousands of topics holds one per topic)."""

    id: int
    session: int
    reliable: bool
