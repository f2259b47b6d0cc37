"""A feed's datagrams built and signed in C a GSO call at a time (`_datagram_batch.BatchSealer`).

What heads a feed goes this way when it is this member's messages that each fill a datagram alone
(`feed.LoneBatch`), plain chunks of one run each, or the fragments of a message larger than a
datagram; anything else the send path builds datagram by datagram in Python (`send_path._pull`).
A part of the send path: it runs on the I/O thread only."""

from __future__ import annotations

from collections import Counter

from scopecast.netio.auth import KeyRing
from scopecast.netio.feed import MESSAGE_COST, Feed, LoneBatch
from scopecast.netio.udp_batch import batch_limit


class SealedBatches:
    """Batches of `datagram`-byte datagrams sealed by the batch sealer of `keys` (see module
    docstring)."""

    def __init__(self, keys: KeyRing, datagram: int, stats: Counter) -> None:
        self._keys = keys
        self._datagram = datagram
        self._most = batch_limit(datagram)  # datagrams of one batch
        self.stats = stats

    def take(self, sender: int, feed: Feed, flags: int, room: int, now: float) -> tuple | None:
        """The next datagrams of `feed` from `sender`, as far as `room` bytes of window go (one
        batch at most), numbered and counted as sent: (buffer, GSO segment size, bytes of queued
        messages taken off the feed); None when what heads it goes the Python way."""
        taken = 0
        if feed.frag is None:
            head = feed.head()
            if head is None:
                return None
            if head.__class__ is LoneBatch:
                return self._lone(sender, feed, head, flags, room, now)
            if not head.oversized:
                return self._plain(sender, feed, flags, room, now)
            chunk = feed.take()
            taken = chunk.queued()
            feed.fragment(chunk)
        data, segment = self._fragments(sender, feed, flags, room, now)
        return data, segment, taken

    def _count(self, n: int) -> int:
        """Count `n` more datagrams sealed and sent; `n`."""
        self.stats["datagrams_out"] += n
        self.stats["datagrams_sealed"] += n
        return n

    def _fragments(self, sender: int, feed: Feed, flags: int, room: int, now: float) -> tuple:
        """The next fragments of the message `feed` is sending."""
        frags = feed.frag
        n = min(self._most, 1 + room // self._datagram, frags.left())
        r = frags.run
        runs = []
        for _ in range(n):
            frag, piece = frags.take()
            runs.append((r.topic, r.source, r.session, r.first_seq, r.stream, r.first_sseq,
                         r.ctype, [piece], frags.stamp, frag))
        if not frags.left():
            feed.frag = None
        first = feed.dseq + 1
        feed.dseq += n
        data, segment = self._keys.batch_sealer.seal(sender, feed.channel, first, flags,
                                                     frags.table, runs)
        feed.sent(len(data), now)
        self.stats["fragments_sealed"] += self._count(n)
        return data, segment

    def _lone(self, sender: int, feed: Feed, lone: LoneBatch, flags: int, room: int,
              now: float) -> tuple:
        """The next messages of the LoneBatch heading `feed`, a datagram each."""
        n = min(self._most, 1 + room // self._datagram, lone.left())
        data, segment, payload = self._keys.batch_sealer.seal_lone(
            sender, feed.channel, feed.dseq + 1, flags, lone.table, lone.source, lone.source,
            lone.stamp, lone.items, lone.next, n)
        feed.dseq += n
        feed.take_lone(n)
        feed.sent(len(data), now)
        self.stats["datagrams_sealed_lone"] += self._count(n)
        return data, segment, payload + n * MESSAGE_COST

    def _plain(self, sender: int, feed: Feed, flags: int, room: int, now: float) -> tuple | None:
        """The chunks heading `feed` that are one plain run each, a datagram each (None: the
        head is no such chunk)."""
        chunks = feed.take_plain(min(self._most, 1 + room // self._datagram))
        if not chunks:
            return None
        n = len(chunks)
        runs = []
        taken = 0
        for c in chunks:
            taken += c.queued()
            r = c.runs[0]
            runs.append((r.topic, r.source, r.session, r.first_seq, r.stream, r.first_sseq,
                         r.ctype, r.payloads, c.stamp))
        first = feed.dseq + 1
        feed.dseq += n
        data, segment = self._keys.batch_sealer.seal(sender, feed.channel, first, flags,
                                                     chunks[0].table, runs)
        feed.sent(len(data), now)
        self._count(n)
        return data, segment, taken
