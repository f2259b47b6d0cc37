"""Serving repairs (thesis 3.2.12, a member as the source of repairs): a NAK names a stream seq
range (and a topic's seq range, or any topic); the server cuts those messages out of a cache and
sends them as REPAIR datagrams to the asker only, under a routing record no channel matches.

Two caches are served: a sender's own unstable messages (entries `(sseq, topic, session, seq,
ctype, payload)`) and the runs a caching member keeps of a peer's stream (`CachedRun`s, the
payloads cut out only to repair). Each requester gets REPAIR_BURST bytes of repair at once, and
more at REPAIR_RATE (and whole again each recovery period), counting a cost per message sent and
per cached message looked at, so that a storm of NAKs never stalls the I/O loop; the rest it gets
at its next NAK, which the last datagram of a repair cut short asks for (FLAG_MORE: the asker asks
on at its next period, see tail_evidence). (The rate is by time, not by period alone: a sender
whose own period is the idle one, a second, served a member repairing after its stream had ended
1 MB a second.)
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import islice, repeat
from typing import TYPE_CHECKING, NamedTuple

from scopecast.netio import wire
from scopecast.netio.feed import MESSAGE_COST

if TYPE_CHECKING:  # (the own stream's cache is ordered by `entry_sseq`, below)
    from scopecast.netio.member_parts import MemberBasics, MemberTables
    from scopecast.netio.own_stream import OwnStream
    from scopecast.netio.peer_cache import PeerCache

REPAIR_RECORD = (("~", "~"),) * 16   # longer than any label: matches no forwarding-table entry
REPAIR_TABLE = wire.encode_route_table([REPAIR_RECORD])
ANY_TOPIC = 0                        # a NAK's topic: every message in its stream seq range
REPAIR_BURST = 1 << 20               # bytes of repair one requester gets at once
REPAIR_RATE = 100 << 20              # ... and a second (a burst per active token period, 10 ms)
REPAIR_ENTRY_COST = 64               # ... counting this per message sent
REPAIR_SCAN_COST = 16                # ... and this per cached message looked at


class CachedRun(NamedTuple):
    """A run a caching member keeps until stable, as it came: the datagram and where the run's
    payloads are in it (one object per run; the payloads are cut out only to repair)."""

    first_sseq: int
    last_sseq: int
    data: bytes
    topic: int          # wire.MIXED: `lengths` is the mixed run's count (see wire.iter_runs)
    session: int
    first_seq: int
    ctype: int
    lengths: tuple | int
    offset: int         # of the first payload in `data`


def entry_sseq(entry: tuple) -> int:
    """The stream seq an own cache entry or a CachedRun starts at (a bisect key of both caches)."""
    return entry[0]


def cached_messages(runs: Iterable[CachedRun]):
    """The messages of cached runs, as own cache entries: (stream seq, topic, session, seq,
    content type, payload)."""
    for first_sseq, _last, data, topic, session, seq, ctype, lengths, off in runs:
        if topic == wire.MIXED:
            entries = wire.mixed_entries(data, off, lengths)
        else:
            entries = zip(repeat(topic), range(seq, seq + len(lengths)), lengths)
        for sseq, (t, q, n) in enumerate(entries, first_sseq):
            yield sseq, t, session, q, ctype, data[off:off + n]
            off += n


class RepairServer:
    """One member's repair serving. `send(datagram, address)` signs and sends one datagram;
    `capacity` is the bytes a datagram may carry before its MAC. The member's id is given with
    each NAK served (`me`): a member learns it only once its scope registered it."""

    def __init__(self, capacity: int, send: Callable[[bytes, tuple], None],
                 stats: Counter, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.send = send
        self._stats = stats
        self._clock = clock
        self._used: dict[tuple, tuple[int, float]] = {}  # requester -> (budget used, when)

    def new_period(self) -> None:
        """A recovery period begins: every requester's budget is whole again."""
        self._used.clear()

    def serve_own(self, me: int, cache: list[tuple], head: int, nak,
                  address: tuple[str, int]) -> None:
        """Serve `nak` [topic, session, lo, hi, lo_sseq, hi_sseq] out of member `me`'s own
        unstable messages `cache[head:]` (ordered by stream seq)."""
        lo_sseq = int(nak[4])
        start = bisect.bisect_left(cache, lo_sseq, lo=head, key=entry_sseq)
        self._serve(me, me, islice(cache, start, None), nak, address)

    def serve_cached(self, me: int, source: int, runs: list[CachedRun], head: int, nak,
                     address: tuple[str, int]) -> None:
        """Serve `nak` out of the runs of `source` member `me` keeps, `runs[head:]`."""
        if not runs:
            self._stats["repair_misses"] += 1
            return
        at = bisect.bisect_right(runs, int(nak[4]), lo=head, key=entry_sseq)  # the run that may
        self._serve(me, source, cached_messages(islice(runs, max(head, at - 1), None)), nak,
                    address)

    def _serve(self, me: int, source: int, messages, nak, address: tuple[str, int]) -> None:
        topic, session, lo, hi, lo_sseq, hi_sseq = (int(v) for v in nak)
        now = self._clock()
        used, at = self._used.get(address, (0, now))
        budget = REPAIR_BURST - max(0, used - int((now - at) * REPAIR_RATE))
        if budget <= 0:
            self._stats["repairs_deferred"] += 1
            return
        picked: list[tuple] = []
        left, more = budget, False
        for e in messages:
            if e[0] > hi_sseq or left <= 0:
                more = e[0] <= hi_sseq
                break
            left -= REPAIR_SCAN_COST
            if e[0] >= lo_sseq and (topic == ANY_TOPIC or e[1] == topic and e[2] == session
                                    and lo <= e[3] <= hi):
                picked.append(e)
                left -= len(e[5]) + REPAIR_ENTRY_COST
        self._used[address] = (REPAIR_BURST - left, now)
        if picked:
            self._send_entries(me, source, picked, address, more)
            self._stats["repairs_cut"] += more

    def _send_entries(self, me: int, source: int, entries: list[tuple],
                      address: tuple[str, int], more: bool = False) -> None:
        """Pack `entries` into REPAIR datagrams: runs of one topic's consecutive seqs, as many as
        fit in a datagram; a message larger than a datagram in fragments of its own. `more`: the
        budget cut the repair short, which the last datagram says (FLAG_MORE) so that the asker
        asks on at once, not once its stream has stood still long enough to be lost."""
        room = self.capacity - wire.HEADER.size - len(REPAIR_TABLE)
        parts: list = []
        runs = size = 0
        run: list = []

        def close_run() -> None:
            nonlocal runs
            first = run[0]
            parts.extend(wire.run_parts(first[1], source, first[2], first[3], source, first[0],
                                        first[4], 0, [e[5] for e in run]))
            runs += 1
            run.clear()

        def flush(flags: int = 0) -> None:
            nonlocal runs, size
            if run:
                close_run()
            if runs:
                self.send(wire.encode_data(wire.PacketType.REPAIR, me, 0, 0, REPAIR_TABLE, runs,
                                           parts, flags=flags), address)
            parts.clear()
            runs = size = 0

        for e in entries:
            n = len(e[5]) + MESSAGE_COST
            if wire.RUN.size + n > room:  # larger than a datagram: on its own, in fragments
                flush()  # (the last entry's last fragment is the repair's last datagram)
                self._send_fragments(me, source, e, address,
                                     wire.FLAG_MORE if more and e is entries[-1] else 0)
                continue
            extends = run and e[3] == run[-1][3] + 1 and e[0] == run[-1][0] + 1 \
                and e[1:3] == run[-1][1:3] and e[4] == run[-1][4]
            if size + n + (0 if extends else wire.RUN.size) > room:
                flush()
                extends = False
            if not extends and run:
                close_run()
            size += n + (0 if extends else wire.RUN.size)
            run.append(e)
        flush(wire.FLAG_MORE if more else 0)
        self._stats["repairs_sent"] += len(entries)

    def _send_fragments(self, me: int, source: int, e: tuple, address: tuple[str, int],
                        last_flags: int = 0) -> None:
        """`e` in fragments, `last_flags` on the last one."""
        sseq, topic, session, seq, ctype, payload = e
        chunk = self.capacity - wire.HEADER.size - len(REPAIR_TABLE) - wire.FRAGMENT.size \
            - wire.run_size(1, 0)
        for frag, piece in wire.fragments(payload, chunk):
            parts = wire.run_parts(topic, source, session, seq, source, sseq, ctype, 0, [piece])
            flags = last_flags if frag[1] == frag[2] - 1 else 0
            self.send(wire.encode_data(wire.PacketType.REPAIR, me, 0, 0, REPAIR_TABLE, 1, parts,
                                       frag, flags), address)


class MemberRepairs:
    """A member's repair serving, a part of the member runtime (see `member_parts`): a NAK of its
    own stream is answered from its unstable messages, one of a peer's stream (which its agent
    asks it to push) from the runs it caches."""

    def __init__(self, basics: MemberBasics, tables: MemberTables, own: OwnStream,
                 peer_cache: PeerCache, drop: Callable[[str], None]) -> None:
        self.member_id = basics.member_id  # (the runtime sets the id it is registered under)
        self._tables, self._own, self._peer_cache = tables, own, peer_cache
        self._stats, self._drops = basics.stats, basics.drops
        self._sock, self._auth = basics.sock, basics.auth
        self.server = RepairServer(basics.datagram - basics.auth.trailer_size, self._send,
                                   basics.stats)
        self._drop = drop  # counts (and logs) a datagram dropped

    def new_period(self) -> None:
        self.server.new_period()

    def on_nak(self, sender: int, nak) -> None:
        """A member asks this one (the sender) for messages it misses."""
        member = self._tables.members.get(sender)
        if member is None:
            self._drop("nak_from_unknown")
            return
        self._stats["naks_received"] += 1
        self.serve(self.member_id, nak, (member.host, member.port))

    def serve(self, source: int, nak, address: tuple[str, int]) -> None:
        """Send the messages of `source` named by `nak` [topic, session, lo, hi, lo_sseq,
        hi_sseq] that this member holds (its own, or a peer's it caches) to `address`."""
        if source == self.member_id:
            self.server.serve_own(self.member_id, self._own.cache, self._own.head, nak, address)
        else:
            self.server.serve_cached(self.member_id, source, *self._peer_cache.runs(source), nak,
                                     address)

    def _send(self, datagram: bytes, address: tuple[str, int]) -> None:
        try:
            self._sock.sendmsg(self._auth.seal(datagram), (), 0, address)
        except OSError:
            self._drops["repair_send_failed"] += 1  # asked again at the requester's next NAK
