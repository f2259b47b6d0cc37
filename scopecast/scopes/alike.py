"""One value for many topics on the wire: a scope shares one object between topics alike (a
coverage, an offers tuple); its wire form names the object once with its topics, and reading
it back shares one object again (at 100,000 topics, made, sent and read once, not once a topic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

V = TypeVar("V")


def grouped(by_topic: dict[int, V], to_wire: Callable[[V], object]) -> list[list]:
    """`by_topic` as [[topics, wire form], ...], each object (by identity) once."""
    groups: dict[int, tuple[V, list[int]]] = {}
    for tid, value in by_topic.items():
        groups.setdefault(id(value), (value, []))[1].append(tid)
    return [[topics, to_wire(value)] for value, topics in groups.values()]


def shared(body: list, from_wire: Callable[[object], V]) -> dict[int, V]:
    """The inverse of `grouped`: one object read per group, for each of its topics."""
    by_topic: dict[int, V] = {}
    for topics, wire_form in body:
        by_topic.update(dict.fromkeys(map(int, topics), from_wire(wire_form)))
    return by_topic
