"""The message handed to applications."""

from __future__ import annotations

import msgpack

from scopecast.netio.wire import ContentType


class Message:
    """A delivered message: topic name, source member name, session, sequence number, payload.

    `payload` is the bytes as published (msgpack bytes if a value was published); `value` is the
    decoded object, computed on first use so byte-oriented consumers never pay for decoding;
    `route` is the routing record the message arrived with."""

    __slots__ = ("topic", "source", "session", "seq", "payload", "content_type", "route", "_value")

    def __init__(self, topic: str, source: str, session: int, seq: int, payload: bytes,
                 content_type: int = ContentType.RAW, route: tuple = ()) -> None:
        self.topic = topic
        self.source = source
        self.session = session
        self.seq = seq
        self.payload = payload
        self.content_type = content_type
        self.route = route  # the routing record it arrived with (thesis 3.2.5)
        self._value = _UNSET

    @property
    def value(self):
        if self._value is _UNSET:
            if self.content_type == ContentType.MSGPACK:
                self._value = msgpack.unpackb(self.payload, raw=False, strict_map_key=False)
            else:
                self._value = self.payload
        return self._value

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, source={self.source!r}, session={self.session}, "
                f"seq={self.seq}, payload={len(self.payload)} bytes)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (self.topic, self.source, self.session, self.seq, self.payload) == (
            other.topic, other.source, other.session, other.seq, other.payload)

    __hash__ = None  # mutable cache slot; compare by value only


_UNSET = object()
