"""What travels between a member and its recovery agents about senders (see `agents.api`): a
sender's record, with its named topics packed, as a member keeps it, and what an agent's
instructions say that outlives them."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from scopecast.netio import wire

MAX_RECORD_TOPICS = 256
RECORD_ENTRY = struct.Struct("<IIQQQQ")  # a named topic in a record: topic, session, first seq,
                                         # first sseq, last seq, last sseq (packed: the agents
                                         # pass records on every period, and 1,536 msgpack
                                         # integers each time cost them most of their CPU)


def named_topics(runs) -> dict[tuple[int, int], list[int]]:
    """A record's named topics (packed, or lists as protocol tests write them), at most
    MAX_RECORD_TOPICS; ValueError or TypeError when malformed (seqs from wire.SEQ_LIMIT on
    included: the receiver keeps them in 64 bits)."""
    if isinstance(runs, bytes):
        if len(runs) % RECORD_ENTRY.size:
            raise ValueError("record entries cut short")
        entries = RECORD_ENTRY.iter_unpack(runs[:MAX_RECORD_TOPICS * RECORD_ENTRY.size])
        named = {(t, s): [fs, fss, ls, lss] for t, s, fs, fss, ls, lss in entries}
    else:
        named = {}
        for t, s, *rest in runs[:MAX_RECORD_TOPICS]:
            if len(rest) != 4:
                raise ValueError("a record entry is six numbers")
            named[(int(t), int(s))] = [int(v) for v in rest]
    if named and max(map(max, named.values())) >= wire.SEQ_LIMIT:
        raise ValueError("a record's seq out of range")
    return named


@dataclass(slots=True)
class SenderRecord:
    """A sender's record as this member last heard it (see `agents.api`), with when it moved."""

    top: int                # the sender's stream is on the wire up to here
    topics: dict | None     # (topic, session) -> [first seq, first sseq, last seq, last sseq]
                            # (None for a dense stream: not needed)
    horizon: int            # every unstable message up to here is of a topic it names
    keys: tuple[int, int]   # the (topic, session) keys it sent on: KeyDigest (count, digest)
    received: float
    beat_at: float          # when its heartbeat last moved (a sender that stops is gone)
    beat: int
    top_at: float           # when `top` last moved (a sender that stops sending)
    settled: int            # the latest `top` heard a period or more before this record


@dataclass(slots=True)
class AgentReply:
    """What the latest instructions of one of this member's agents (one per protocol) say that
    outlives them: combined over the agents into stability, `hi`, the period and caching."""

    down: dict[int, int]    # stream -> stable
    hi: dict[int, int]      # stream -> highest any member delivered
    period: float
    cacher: bool
    at: float               # when it came (time.monotonic())


def stability_digest(member: int, stable: int, handed: int, agents: dict[str, tuple[str, int]],
                     replies: dict[str, AgentReply]) -> str:
    """What holds a member's own messages back, for a flush that timed out: how far they are
    stable (`stable` of `handed` sent) and each agent's latest word on them."""
    now = time.monotonic()
    words = []
    for key, (host, port) in agents.items():
        r = replies.get(key)
        said = "never answered" if r is None else f"answered {now - r.at:.1f}s ago, " + (
            "not naming this stream yet" if (st := r.down.get(member)) is None
            else f"stable up to {st}")
        words.append(f"{key} agent at {host}:{port} {said}")
    return f"stable up to stream seq {stable} of {handed} sent; " \
        + ("; ".join(words) or "no recovery agent yet")
