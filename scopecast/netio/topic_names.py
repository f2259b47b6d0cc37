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


def topic_matcher(pattern: str) -> re.Pattern:
    """A topic pattern as a regular expression: `*` matches within one `/`-separated part, `?` one
    character of it (`flights/*` matches `flights/JFK`, not `flights/JFK/late`)."""
    if not isinstance(pattern, str) or len(pattern) > MAX_TOPIC_NAME or not _PATTERN.match(pattern):
        raise InvalidConfig(f"bad topic pattern {pattern!r}: topic-name characters plus '*' and "
                            "'?', in '/'-separated parts")
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
        raise InvalidConfig(f"bad topic name {name!r}: use letters, digits, '_', '-', '.' in "
                            f"'/'-separated parts, at most {MAX_TOPIC_NAME} characters")
    return name


class Advertised(NamedTuple):
    """What a publisher needs of its topic, as `advertise` returns it: a few fields, not the
    TopicInfo (a process publishing thousands of topics holds one per topic)."""

    id: int
    session: int
    reliable: bool
