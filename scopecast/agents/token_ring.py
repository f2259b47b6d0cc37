"""`token_ring`, the default recovery protocol (QSM, thesis 4467-4560).

The peer group is cut into partitions of up to `partition` agents (5 by default), never across a
region (peers with identical subscription sets, kept together in the ring by the scope): a
partition's peers receive the same streams, so one can serve another's NAKs. In each partition a
token goes round every period, released by the partition's first agent: each agent folds in its
bottom's summary — the minimum MaxContiguous per sender stream (with a count, so a stream a peer has
not reported yet is not taken as held), the senders' records, and its bottom's NAKs. An agent whose
bottom caches a stream up to a NAK's end takes the NAK off the token and tells its bottom to push the
repair (neighbour repair); the members also pull what nobody serves from the sender itself.

The partition leaders form the regional ring, whose token (released by the group's leader, agent 0)
carries each partition's aggregate and its unserved NAKs (a leader whose bottom holds the range
pushes it: inter-partition repair). When the regional token is back, the leader has the whole
group's aggregate: it hands it up (the agent above treats it as its bottom's summary) or, at the top,
decides stability. Stability and the senders' records travel down the same way: in the regional
token to the partition leaders, in the partition tokens to every agent, in every agent's reply to its
bottom. The period is short while any sender has unstable messages or NAKs are out, long when idle;
an idle agent whose bottom (or partition) turns active wakes the leaders of its rings, which start a
round at once instead of at the end of the idle period. Activity is the whole group's: a partition
leader that learns from the regional token (or the group leader from above) that some sender is
unstable marks its tokens active, so a partition without a sender of its own keeps the short period too
(else its members report once per idle period and the sender's window turns over that seldom).
Caching members: the first `cachers` of each partition (so partition leaders cache).
"""

from __future__ import annotations

from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol
from scopecast.timing import TIMING

MAX_TOKEN_NAKS = 64
LOST_PERIODS = 4   # a token not back within this many periods (or rounds as long as the last one)
                   # is lost; twice as long after each loss in a row, up to LOST_MAX seconds
LOST_MAX = TIMING.token_lost_max
STATE_STREAMS = 16  # streams status shows the state of (describe)
MAX_OPEN_ROUNDS = 16  # rounds a leader waits for at once (taken as lost, a token may come back)


def _empty_token(kind: str, round_: int, version: int, down: dict, hi: dict) -> dict:
    return {"k": kind, "r": round_, "v": version, "acks": {}, "cnt": {}, "naks": [], "recs": {},
            "seen": {}, "down": down, "hi": hi, "act": False}


def _add_acks(token: dict, acks: dict) -> None:
    for stream, a in acks.items():
        token["acks"][stream] = min(token["acks"].get(stream, a), a)
        token["cnt"][stream] = token["cnt"].get(stream, 0) + 1


def partitions(n: int, regions: tuple[int, ...], size: int) -> list[list[int]]:
    """Peer indices 0..n-1 cut into partitions of about `size`, never across a region (no
    regions, or not one per peer: one region): each region's run into the number of partitions
    nearest its length / `size` (at least one), as even as they go. Not runs of at most `size`
    with the remainder left over: a tail of one peer would be its own cacher, caching for
    nobody (16 peers in partitions of 5: 6, 5 and 5, three cachers, not four)."""
    if len(regions) != n:
        regions = (0,) * n
    out: list[list[int]] = []
    start = 0
    for i in range(1, n + 1):
        if i < n and regions[i] == regions[start]:
            continue
        length = i - start
        k = max(1, int(length / size + 0.5))
        for j in range(k):
            lo = start + j * length // k
            out.append(list(range(lo, start + (j + 1) * length // k)))
        start = i
    return out


def _aggregate(token: dict, size: int) -> dict:
    """MaxContiguous per stream over the regular members of a ring of `size` (light ones, thesis
    3.2.14, are not counted): 0 where some regular member did not report it."""
    light = token.get("light", 0)
    size -= light if light.__class__ is int else 0
    return {s: (a if token["cnt"].get(s, 0) >= size else 0) for s, a in token["acks"].items()}


class _Ring:
    """One token ring among some peers (a partition, or the partition leaders)."""

    def __init__(self, kind: str, members: list[int], me: int) -> None:
        self.kind = kind
        self.members = members
        self.me = me
        self.round = 0
        self.outstanding = False
        self.started = 0.0
        self.starts: dict[int, float] = {}  # rounds not completed yet -> when each started
        self.done = 0           # the latest round completed
        self.carry: list = []   # NAKs the last round left unserved: offered again to the peers
        self.last_round = 0.0   # how long the last completed round took
        self.losses = 0         # tokens lost in a row

    @property
    def leads(self) -> bool:
        return self.members[0] == self.me

    def lost(self, now: float, period: float) -> bool:
        """Whether the outstanding token is lost (the leader then starts a new round; the old
        token, should it come back, is dropped as overtaken). Soon, since stability waits for
        the round: at 1% datagram loss a ring of five loses a token every twenty rounds. A
        round merely slower than that is not starved: each loss in a row doubles the wait."""
        wait = LOST_PERIODS * max(period, self.last_round) * 2 ** self.losses
        return now - self.started >= min(wait, LOST_MAX)

    def next_peer(self) -> int:
        return self.members[(self.members.index(self.me) + 1) % len(self.members)]


class TokenRing(RecoveryProtocol):
    name = "token_ring"

    def __init__(self, context: DomainContext) -> None:
        super().__init__(context)
        opts = context.options
        self.active_period = float(opts.get("active_period", 0.05))
        self.idle_period = float(opts.get("idle_period", 1.0))
        # every member caches by default: then whatever one survivor delivered, the others can
        # still get after the sender died (QSM cached on a subset: `cachers` per partition)
        self.cachers = int(opts.get("cachers", 5))
        self.partition = max(2, int(opts.get("partition", 5)))
        self.view: PeerView | None = None
        self.region = 0         # this agent's region in the view
        self.rings: dict[str, _Ring] = {}
        self.bottom: dict = {}
        self.down: dict = {}
        self.hi: dict = {}      # per stream, the furthest any member delivered (from the top)
        self.pushes: list = []
        self.part: dict | None = None   # this partition's latest aggregate (partition leaders)
        self.active = True
        self.group_active = False  # the regional token said some sender is unstable
        self.above_active = False  # the level above said so (a sender in another domain)
        self.up: dict | None = None
        self.wakes: list[int] = []  # leaders to wake: this agent turned active while they idle
        self.stats = {"rounds": 0, "tokens_lost": 0, "naks_served": 0, "round_time": 0.0}

    @property
    def period(self) -> float:
        return self.active_period if self.active else self.idle_period

    def on_view(self, view: PeerView) -> None:
        self.view = view
        parts = partitions(len(view.peers), view.regions, self.partition)
        mine = next(p for p in parts if view.index in p)
        self.region = view.regions[view.index] if len(view.regions) == len(view.peers) else 0
        self.rings = {"p": _Ring("p", mine, view.index)}
        if mine[0] == view.index and len(parts) > 1:
            self.rings["g"] = _Ring("g", [p[0] for p in parts], view.index)
        self.part = None

    @property
    def cacher(self) -> bool:
        ring = self.rings.get("p")
        return ring is not None and ring.members.index(ring.me) < self.cachers

    def on_summary(self, summary: dict, now: float) -> dict:
        self.bottom = summary
        if summary.get("naks") or any(r[1] for r in summary.get("recs", {}).values()):
            self._activate()
        pushes, self.pushes = self.pushes, []
        return {"down": self.down, "hi": self.hi, "push": pushes, "period": self.period,
                "cacher": self.cacher}

    # ------------------------------------------------------------------------- tokens

    def _activate(self) -> None:
        """Something is unstable here: an agent that was idle wakes the leaders of its rings."""
        if not self.active:
            self.active = True
            self.wakes = [r.members[0] for r in self.rings.values() if not r.leads]

    def on_tick(self, now: float) -> list[tuple[int, object]]:
        out = [(leader, {"k": "wake", "v": self.view.version}) for leader in self.wakes]
        self.wakes = []
        # the period as the tick found it: a group leader woken by a partition that turned
        # active (its own partition idle) completes its partition's round first, which finds
        # nothing unstable and sets the idle period; read after that, the group's round waited
        # it out, and the woken partition's sender with it (a flush took 0.6-0.8 s)
        period = self.period
        for ring in self.rings.values():
            if not ring.leads:
                continue
            if ring.outstanding:
                if not ring.lost(now, period):
                    continue
                self.stats["tokens_lost"] += 1
                ring.losses += 1
            elif now - ring.started < period:
                continue
            ring.round += 1
            ring.started = ring.starts[ring.round] = now
            if len(ring.starts) > MAX_OPEN_ROUNDS:  # (lost for good)
                del ring.starts[min(ring.starts)]
            ring.outstanding = True
            token = _empty_token(ring.kind, ring.round, self.view.version, self.down, self.hi)
            token["naks"], ring.carry = ring.carry, []
            # what this agent knows of the rest: partitions learn it from the regional token
            token["act"] = self.above_active or (ring.kind == "p" and self.group_active)
            self._fold(ring, token)
            if len(ring.members) == 1:
                self._complete(ring, token, now)
            else:
                out.append((ring.next_peer(), token))
        return out

    def on_peer(self, sender: int, body, now: float) -> list[tuple[int, object]]:
        if self.view is None or body.get("v") != self.view.version:
            return []
        if body.get("k") == "wake":
            self.active = True  # the next tick starts this agent's rounds
            return []
        ring = self.rings.get(body.get("k"))
        if ring is None:
            return []
        if ring.leads:
            r = body.get("r")
            if ring.outstanding and r == ring.round:
                self._complete(ring, body, now)
            elif r in ring.starts and r > ring.done:
                # a round taken as lost, back after all: its aggregate was true when folded
                # (stability only moves up). Dropped as overtaken, a ring whose round trip
                # outgrew LOST_MAX (an agents' host seconds behind) never completed again
                self._complete(ring, body, now, late=True)
            return []
        if body.get("r", 0) <= ring.round:
            return []  # a duplicate, or a round overtaken by a newer one
        if ring.kind == "g":
            self.group_active = bool(body.get("act"))
        ring.round = body["r"]
        self.down = body.get("down", {})
        self.hi = body.get("hi", {})
        self._fold(ring, body)
        self.active = bool(body.get("act"))  # what the ring has shown so far, and this agent
        return [(ring.next_peer(), body)]

    def _fold(self, ring: _Ring, token: dict) -> None:
        """Add what this agent stands for to the token: its bottom (partition ring) or its
        partition's aggregate (regional ring); take NAKs its bottom can serve."""
        source = self.bottom if ring.kind == "p" else (self.part or {})
        if source.get("light"):  # a light member (or a partition of them) holds nothing back
            token["light"] = token.get("light", 0) + 1
        else:
            _add_acks(token, source.get("acks", {}))
        token["recs"].update(source.get("recs", {}))
        seen = token.setdefault("seen", {})
        for stream, s in source.get("seen", {}).items():
            seen[stream] = max(seen.get(stream, s), s)
        have = self.bottom.get("acks", {})
        delivered = self.bottom.get("seen", {})
        left = []
        for nak in token["naks"]:
            # served by a caching peer of the requester's region (it takes the same topics)
            # that delivered past the range (it sends what it holds of it; a tail NAK asks for
            # what it delivered beyond the requester); a peer of another region acknowledges a
            # topic it does not take as held, and would take the NAK off for nothing
            held = max(have.get(nak[0], 0), delivered.get(nak[0], 0))
            if self.cacher and held >= nak[6] and nak[10] == self.region:
                self.pushes.append(nak[:10])
                self.stats["naks_served"] += 1
            else:
                left.append(nak)
        # each agent's fresh NAKs, up to its share of the token, go before the older ones (its
        # bottom asks again next period): one member's many holes never starve the others'
        share = max(1, MAX_TOKEN_NAKS // len(ring.members))
        fresh = source.get("naks", ())
        if ring.kind == "p":  # the bottom's own: tagged with this agent's region
            fresh = [[*n[:10], self.region] for n in fresh]
        own = [n for n in fresh if n not in left][:share]
        token["naks"] = (own + left)[:MAX_TOKEN_NAKS]
        if token["naks"] or any(r[1] for r in token["recs"].values()):
            token["act"] = True

    def _complete(self, ring: _Ring, token: dict, now: float, late: bool = False) -> None:
        """Round `token["r"]` is back: its aggregate goes up (or, at the top, decides). A late
        one leaves the newer round that is out waiting; the loss timeout learns its trip."""
        started = ring.starts.pop(token["r"], ring.started)
        for r in [r for r in ring.starts if r < token["r"]]:
            del ring.starts[r]  # overtaken by this one
        ring.done = token["r"]
        ring.outstanding = ring.outstanding and late
        ring.last_round, ring.losses = now - started, 0
        ring.carry = token["naks"]
        if token.get("act"):
            self._activate()
        else:
            self.active = False
        acks = {} if self.view.missing else _aggregate(token, len(ring.members))
        agg = {"acks": acks, "recs": token["recs"],
               "naks": token["naks"], "seen": token.get("seen", {})}
        if token.get("light", 0) >= len(ring.members):
            agg["light"] = True  # every member light: so is the group, to the ring or level above
        if ring.kind == "p" and "g" in self.rings:
            self.part = agg  # the regional token takes it
            return
        if ring.kind == "g":
            self.group_active = bool(token.get("act"))
        self.stats["rounds"] += 1
        self.stats["round_time"] = now - started
        self.up = {**agg, "naks": []}
        if not self.view.has_upper:
            # the top decides: stable is what every regular member holds; it never goes back
            old = self.down
            self.down = {s: [max(agg["acks"].get(s, 0), old.get(s, (0,))[0]), rec]
                         for s, rec in agg["recs"].items()}
            self.hi = agg["seen"]

    def describe(self) -> dict:
        """Each ring's members, round and whether its token is out (and how many were lost in a
        row); how far this agent's latest word from above (`down`) and its bottom's summary
        (`acks`) take each stream (the first STATE_STREAMS of them)."""
        down, acks = list(self.down.items()), list(self.bottom.get("acks", {}).items())
        return {"active": self.active,
                "rings": {k: {"members": r.members, "round": r.round, "out": r.outstanding,
                              "lost_in_a_row": r.losses} for k, r in list(self.rings.items())},
                "down": {str(s): v[0] for s, v in down[:STATE_STREAMS]}, "down_streams": len(down),
                "acks": {str(s): a for s, a in acks[:STATE_STREAMS]}, "ack_streams": len(acks)}

    # ------------------------------------------------------------------- upper interface

    def upward(self) -> dict | None:
        up, self.up = self.up, None
        return up if self.view is not None and self.view.has_upper else None

    def on_down(self, instructions: dict) -> None:
        self.down = instructions.get("down", {})
        self.hi = instructions.get("hi", {})
        self.above_active = instructions.get("period") == self.active_period
        if self.above_active:
            self.active = True
