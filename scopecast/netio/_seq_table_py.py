"""The pure-Python twin of `_seq_table.c`, used where the extension was not built (no compiler)
or when SCOPECAST_PURE_PYTHON=1 forces it (see `native`).

It keeps the C module's contract to the letter: the same types, methods, results and errors,
so that the unit tests run over both. What it does not keep is the speed: a topic is a dict
entry here, and a mixed run is taken message by message in the interpreter."""

from __future__ import annotations

import struct
from collections.abc import Iterator

SEQ_LIMIT = 1 << 62  # wire.SEQ_LIMIT (not imported: wire imports this module)
ENTRY = struct.Struct("!IQI")  # wire.MIXED_ENTRY: topic, seq, payload length
_U32 = 0xFFFFFFFF
_I64 = 1 << 63


def as_u32(value: object) -> int:
    """`value` as a 32-bit unsigned int, or TypeError / OverflowError (as the C side raises)."""
    if not isinstance(value, int):
        raise TypeError(f"an integer is required, not {type(value).__name__}")
    if not 0 <= value <= _U32:
        raise OverflowError(f"{value!r} is not a 32-bit id")
    return value


def as_i64(value: object) -> int:
    """`value` as a signed 64-bit int, or TypeError / OverflowError (as the C side raises)."""
    if not isinstance(value, int):
        raise TypeError(f"an integer is required, not {type(value).__name__}")
    if not -_I64 <= value < _I64:
        raise OverflowError(f"{value!r} is beyond 64 bits")
    return value


class SeqTable:
    """topic id (u32) -> 64-bit int; keys never taken out; iteration in insertion order."""

    __slots__ = ("_values", "_order")

    def __init__(self) -> None:
        self._values: dict[int, int] = {}
        self._order: list[int] = []

    def _put(self, key: int, value: int) -> None:
        if key not in self._values:
            self._order.append(key)
        self._values[key] = value

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, key: object) -> int:
        try:
            return self._values[key]
        except (KeyError, TypeError):
            raise KeyError(key) from None

    def __setitem__(self, key: object, value: object) -> None:
        if not isinstance(key, int) or not 0 <= key <= _U32:
            raise OverflowError(f"topic id out of range: {key!r}")
        self._put(key, as_i64(value))

    def __delitem__(self, key: object) -> None:
        raise TypeError("a SeqTable's keys are never taken out")

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._values
        except TypeError:
            return False

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._order))

    def get(self, key: object, default: object = None) -> object:
        try:
            return self._values.get(key, default)
        except TypeError:
            return default

    def items(self) -> list[tuple[int, int]]:
        values = self._values
        return [(key, values[key]) for key in self._order]

    def keys_after(self, n: int) -> list[int]:
        return self._order[max(n, 0):]

    def __repr__(self) -> str:
        return f"SeqTable({len(self._values)} topics)"


class NameTable:
    """NameTable({topic id: name}): topic id (u32) -> str, fixed when made."""

    __slots__ = ("_names",)

    def __init__(self, names: dict) -> None:
        if not isinstance(names, dict):
            raise TypeError(f"NameTable() takes a dict, not {type(names).__name__}")
        for key, name in names.items():
            as_u32(key)
            if not isinstance(name, str):
                raise TypeError(f"a topic's name is a str, not {name!r}")
        self._names = dict(names)

    def __len__(self) -> int:
        return len(self._names)

    def get(self, key: object, default: object = None) -> object:
        try:
            return self._names.get(key, default)
        except TypeError:
            return default


def mixed_extent(view, offset: int, n: int) -> int:
    """The payload bytes of the n mixed-run entries at `offset` of `view`, or -1 if they run
    past its end, -2 if one names topic 0, -3 if a seq is not below SEQ_LIMIT."""
    buf = memoryview(view)
    if not (0 <= offset <= buf.nbytes and 0 <= n <= (buf.nbytes - offset) // ENTRY.size):
        return -1
    total = 0
    for topic, seq, length in ENTRY.iter_unpack(buf[offset:offset + n * ENTRY.size]):
        if topic == 0:
            return -2
        if seq >= SEQ_LIMIT:
            return -3
        total += length
    return total


def mixed_parts(head: bytes, messages: list) -> list:
    """[head, entries, payload, ...]: the byte strings of a mixed run of `messages`, each a
    cache entry (sseq, topic, session, seq, ctype, payload)."""
    if not isinstance(head, bytes) or not isinstance(messages, list):
        raise TypeError("mixed_parts(bytes, list)")
    entries = []
    payloads = []
    for m in messages:
        if not isinstance(m, tuple) or len(m) < 6:
            raise TypeError("a mixed run's messages are cache entries")
        topic = as_u32(m[1])
        seq = m[3]
        if not isinstance(seq, int):
            raise TypeError(f"an integer is required, not {type(seq).__name__}")
        if not 0 <= seq < 1 << 64:
            raise OverflowError(f"{seq!r} is not a 64-bit seq")
        payload = m[5]
        length = len(payload)  # (TypeError for what has no length)
        if length > _U32:
            raise ValueError(f"a payload of {length} bytes")
        entries.append(ENTRY.pack(topic, seq, length))
        payloads.append(payload)
    return [head, b"".join(entries), *payloads]


def take_mixed(next_seqs: SeqTable, last: SeqTable, names: NameTable, data: bytes, offset: int,
               n: int, first_sseq: int) -> tuple | None:
    """(names, seqs, payloads, payload bytes) of a mixed run of n messages whose payloads start
    at `offset` in `data` (its entries just before), taken if every message is the next of its
    topic in `next_seqs` (of a topic not in it yet, its first: seq 1) and every topic has a name
    in `names`: each topic's next seq moves past its message and its last stream seq (in `last`)
    becomes the message's. Else nothing changes (but that a topic not in `next_seqs` may be there
    now, expecting 1: as it would be taken) and None. A topic may come twice (its seqs then
    follow on)."""
    if not (isinstance(next_seqs, SeqTable) and isinstance(last, SeqTable)
            and isinstance(names, NameTable) and isinstance(data, bytes)):
        raise TypeError("take_mixed(SeqTable, SeqTable, NameTable, bytes, int, int, int)")
    size = len(data)
    if (n <= 0 or offset > size or n > offset // ENTRY.size or first_sseq < 0
            or first_sseq + n > SEQ_LIMIT):
        raise ValueError("a mixed run's entries out of its datagram")
    entries = list(ENTRY.iter_unpack(memoryview(data)[offset - n * ENTRY.size:offset]))
    values, by_id = next_seqs._values, names._names
    out_names = []
    end = offset
    for topic, seq, length in entries:
        name = by_id.get(topic)
        value = values.get(topic)
        if value is None and seq == 1 and name is not None:  # its topic's first
            value = 1
            next_seqs._put(topic, value)
        if (name is None or value is None or seq >= SEQ_LIMIT or value != seq
                or length > size - end):
            for moved, _seq, _length in entries[:len(out_names)]:  # put back what moved
                values[moved] -= 1
            return None
        end += length
        values[topic] = value + 1
        out_names.append(name)
    payloads = []
    at = offset
    for _topic, _seq, length in entries:
        payloads.append(data[at:at + length])
        at += length
    for i, (topic, _seq, _length) in enumerate(entries):
        last._put(topic, first_sseq + i)
    return out_names, [seq for _topic, seq, _length in entries], payloads, end - offset
