"""`ack_tree`, a recovery protocol after RMTP: acknowledgements aggregated up a tree of designated
receivers, repairs made locally by them.

token_ring passes one token round a ring (and a ring of partition leaders), so a round takes as
many hops as there are agents and a NAK is offered to every peer. Here the agents of a peer group
form a k-ary tree by index (parent of i is (i - 1) // fanout, `fanout` 4 by default; agent 0 is
the root), so news takes only as many hops as the tree is deep, and a NAK climbs only its
requester's path: the first caching agent on it whose bottom holds the range pushes the repair
(RMTP's local repair); what nobody on the path serves the members pull from the sender itself.

Every period each agent sends its parent an ACK for its subtree: per sender stream the minimum
MaxContiguous over its bottom and every child's latest ACK (with a count, so a stream some member
has not reported is not taken as held; a child that has not sent an ACK yet holds nothing), the
senders' records, the furthest delivered, the NAKs left unserved and whether anything in the
subtree is unstable. The root has the whole group's aggregate: it hands it up (the agent above
treats it as its bottom's summary) or, at the top, decides stability, which never goes back. A
DOWN message carries stability and the senders' records from the root to every agent, and every
agent's reply to its bottom carries them on.

The period is short while any sender has unstable messages or NAKs are out, long when idle. While
idle an agent passes a change on at once instead of at the end of the idle period (an ACK that
changes its subtree's report goes up, a root decision that changes goes down), so an idle tree
reacts within one tick; while active the period paces the messages.
Caching members: every agent (`cache_all`, the default), else the designated receivers (agents
with children).
"""

from __future__ import annotations

from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol

MAX_ACK_NAKS = 64
MAX_PEERS = 1 << 20  # a light count no group reaches
SLACK = 1e-6  # a tick lands on a period's edge give or take a rounding error: that one is due
_NUMBER = (int, float)


def _numbers(value) -> dict:
    """A {stream: number} map, checked (TypeError if it is not one)."""
    if not isinstance(value, dict) or not all(isinstance(v, _NUMBER) for v in value.values()):
        raise TypeError("not a map of numbers")
    return dict(value)


def _record(value):
    """A sender's record: [max_sseq, [unstable ranges], ...] (see `agents.api`)."""
    if not isinstance(value, list | tuple) or len(value) < 2 \
            or not isinstance(value[1], list | tuple | bytes):
        raise TypeError("not a record")
    return value


def _naks(value) -> list:
    if not isinstance(value, list | tuple):
        raise TypeError("not a list of NAKs")
    out = []
    for nak in value:
        if not isinstance(nak, list | tuple) or len(nak) < 7 or not isinstance(nak[6], _NUMBER):
            raise TypeError("not a NAK")
        hash(nak[0])  # the stream is a key of the acks
        out.append(list(nak))
    return out


def _report(body: dict, own: bool) -> dict | None:
    """A bottom's summary (`own`) or a child's ACK as one subtree's report; None if malformed."""
    try:
        acks = _numbers(body.get("acks", {}))
        recs = {s: _record(r) for s, r in dict(body.get("recs", {})).items()}
        naks = _naks(body.get("naks", []))
        cnt = dict.fromkeys(acks, 1) if own else _numbers(body.get("cnt", {}))
        busy = any(r[1] for r in recs.values()) if own else bool(body.get("act"))
        # light members (thesis 3.2.14) hold nothing back: counted, their acks left out
        light = int(body.get("light") is True) if own else body.get("light", 0)
        if light.__class__ is not int or not 0 <= light <= MAX_PEERS:
            raise ValueError("a light count out of range")
        if own and light:
            acks, cnt = {}, {}
        return {"acks": acks, "cnt": cnt, "recs": recs, "seen": _numbers(body.get("seen", {})),
                "naks": naks, "act": busy or bool(naks), "light": light}
    except (AttributeError, TypeError, ValueError):
        return None


def _stability(body: dict) -> tuple[dict, dict] | None:
    """The `down` and `hi` of a DOWN message or of the instructions from above; None if malformed."""
    try:
        down = {}
        for stream, entry in dict(body.get("down", {})).items():
            if not isinstance(entry, list | tuple) or len(entry) != 2 or not isinstance(entry[0], _NUMBER):
                return None
            down[stream] = [entry[0], _record(entry[1])]
        return down, _numbers(body.get("hi", {}))
    except (AttributeError, TypeError, ValueError):
        return None


_NOTHING = _report({}, own=True)


class AckTree(RecoveryProtocol):
    name = "ack_tree"

    def __init__(self, context: DomainContext) -> None:
        super().__init__(context)
        opts = context.options
        self.active_period = float(opts.get("active_period", 0.05))
        self.idle_period = float(opts.get("idle_period", 1.0))
        self.fanout = max(1, int(opts.get("fanout", 4)))
        # every member caches by default: then whatever one survivor delivered, the others can
        # still get after the sender died (RMTP cached at the designated receivers only)
        self.cache_all = bool(opts.get("cache_all", True))
        self.view: PeerView | None = None
        self.parent: int | None = None
        self.children: list[int] = []
        self.bottom: dict = _NOTHING
        self.kids: dict[int, dict] = {}     # each child's latest report (its unserved NAKs only)
        self.reported: dict | None = None   # the report last sent up (the root: last decided on)
        self.down: dict = {}
        self.hi: dict = {}
        self.pushes: list = []
        self.active = True
        self.above_active = False   # the agent above runs its short period (the root only)
        self.sent = float("-inf")   # when this agent last sent its ACK (the root: its DOWN)
        self.wake = False           # send at the next tick, whatever the period
        self.redown = False         # the root: stability came from above, to pass down at once
        self.round = 0              # of the latest DOWN (sent by the root, adopted elsewhere)
        self.up: dict | None = None
        self.last_up: dict | None = None
        self.stats = {"rounds": 0, "naks_served": 0, "acks_sent": 0}

    @property
    def period(self) -> float:
        return self.active_period if self.active else self.idle_period

    @property
    def cacher(self) -> bool:
        return self.view is not None and (self.cache_all or bool(self.children))

    def on_view(self, view: PeerView) -> None:
        self.view = view
        i, k = view.index, self.fanout
        self.parent = (i - 1) // k if i else None
        self.children = list(range(i * k + 1, min(i * k + k, len(view.peers) - 1) + 1))
        self.kids = {}
        self.reported = self.last_up = None
        self.round = 0
        self.sent = float("-inf")

    def on_summary(self, summary: dict, now: float) -> dict:
        report = _report(summary, own=True)
        if report is not None:
            idle = not self.active
            self.bottom = report
            self.active = self.active or report["act"]
            if idle and self._subtree() != self.reported:
                self.wake = True
        pushes, self.pushes = self.pushes, []
        return {"down": self.down, "hi": self.hi, "push": pushes, "period": self.period,
                "cacher": self.cacher}

    # ----------------------------------------------------------------------- the tree

    def on_tick(self, now: float) -> list[tuple[int, object]]:
        if self.view is None:
            return []
        if self.wake or now - self.sent >= self.period - SLACK:
            self.wake = False
            return self._decide(now, always=True) if self.parent is None else self._ack(now)
        if self.redown:
            return self._send_down()
        return []

    def on_peer(self, sender: int, body, now: float) -> list[tuple[int, object]]:
        if self.view is None or not isinstance(body, dict) or body.get("v") != self.view.version:
            return []
        if body.get("k") == "ack" and sender in self.children:
            report = _report(body, own=False)
            if report is None:
                return []
            report["naks"] = self._serve(report["naks"])
            self.kids[sender] = report
            if self.active:
                return []  # the period paces an active tree
            if self.parent is None:
                return self._decide(now, always=False)
            self.active = report["act"]
            return self._ack(now) if self._subtree() != self.reported else []
        if body.get("k") == "down" and sender == self.parent:
            stability = _stability(body)
            r = body.get("r")
            if stability is None or not isinstance(r, int) or r <= self.round:
                return []  # malformed, a duplicate, or overtaken by a newer one
            self.round = r
            self._adopt(*stability)
            self.active = bool(body.get("act")) or self._busy()
            return self._send_down()
        return []

    def _busy(self) -> bool:
        return self.bottom["act"] or any(kid["act"] for kid in self.kids.values())

    def _serve(self, naks: list) -> list:
        """Push the NAKs this agent's bottom can serve; the rest go on up."""
        have, delivered = self.bottom["acks"], self.bottom["seen"]
        left = []
        for nak in naks:
            # served by a caching agent whose bottom delivered past the range (it sends what it
            # holds of it; a tail NAK asks for what it delivered beyond the requester)
            if self.cacher and max(have.get(nak[0], 0), delivered.get(nak[0], 0)) >= nak[6]:
                if nak not in self.pushes:
                    self.pushes.append(nak)
                self.stats["naks_served"] += 1
            else:
                left.append(nak)
        return left

    def _subtree(self) -> dict:
        """This agent's subtree: its bottom and each child's latest report. A bottom's own NAKs
        go up unserved (its agent pushing them would have the requester repair itself)."""
        acks, cnt, recs, seen, naks, light = {}, {}, {}, {}, [], 0
        for rep in [*self.kids.values(), self.bottom]:  # the bottom's records are the freshest
            light += rep["light"]
            for stream, a in rep["acks"].items():
                acks[stream] = min(acks.get(stream, a), a)
                cnt[stream] = cnt.get(stream, 0) + rep["cnt"].get(stream, 0)
            recs.update(rep["recs"])
            for stream, s in rep["seen"].items():
                seen[stream] = max(seen.get(stream, s), s)
            naks += [n for n in rep["naks"] if n not in naks]
        return {"acks": acks, "cnt": cnt, "recs": recs, "seen": seen, "naks": naks[:MAX_ACK_NAKS],
                "act": self._busy(), "light": light}

    def _ack(self, now: float) -> list[tuple[int, object]]:
        self.reported = self._subtree()
        self.sent = now
        self.stats["acks_sent"] += 1
        return [(self.parent, {"k": "ack", "v": self.view.version, **self.reported})]

    def _decide(self, now: float, always: bool) -> list[tuple[int, object]]:
        """The root: the group's aggregate goes up, or at the top becomes stability; then DOWN
        goes to the children (`always` each period, else only if something changed)."""
        agg = self._subtree()
        n = len(self.view.peers) - agg["light"]
        # held by the group: what every regular member reported, nothing while some have no agent
        acks = {} if self.view.missing else {s: (a if agg["cnt"].get(s, 0) >= n else 0)
                                             for s, a in agg["acks"].items()}
        up = {"acks": acks, "recs": agg["recs"], "seen": agg["seen"], "naks": []}
        if n <= 0:
            up["light"] = True  # every member light: so is the group, to the level above
        down, hi = self.down, self.hi
        if not self.view.has_upper:
            # the top decides: stable is what every regular member holds; it never goes back
            down = {s: [max(acks.get(s, 0), self.down.get(s, (0,))[0]), rec]
                    for s, rec in agg["recs"].items()}
            hi = agg["seen"]
        active = agg["act"] or self.above_active
        if not always and (down, hi, active, up) == (self.down, self.hi, self.active, self.last_up):
            return []
        self.reported = agg
        self.down, self.hi, self.active = down, hi, active
        self.up = self.last_up = up
        self.sent = now
        self.stats["rounds"] += 1
        return self._send_down()

    def _send_down(self) -> list[tuple[int, object]]:
        if self.parent is None:
            self.round += 1
            self.redown = False
        body = {"k": "down", "v": self.view.version, "r": self.round, "down": self.down, "hi": self.hi,
                "act": self.active}
        return [(child, body) for child in self.children]

    def _adopt(self, down: dict, hi: dict) -> bool:
        """Take stability decided above; a stream's stable point never goes back. True if it
        changed anything."""
        down = {s: [max(stable, self.down.get(s, (stable,))[0]), rec] for s, (stable, rec) in down.items()}
        changed = (down, hi) != (self.down, self.hi)
        self.down, self.hi = down, hi
        return changed

    # ------------------------------------------------------------------- upper interface

    def upward(self) -> dict | None:
        up, self.up = self.up, None
        return up if self.view is not None and self.view.has_upper else None

    def on_down(self, instructions: dict) -> None:
        stability = _stability(instructions)
        if stability is None:
            return
        if self._adopt(*stability):
            self.redown = True
        self.above_active = instructions.get("period") == self.active_period
        if self.above_active and not self.active:
            self.active = self.wake = True
