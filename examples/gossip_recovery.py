"""`gossip`: a recovery protocol as a scopecast plug-in (an example) — epidemic dissemination of acks.

Each agent keeps a table of what every peer of its group last reported about its bottom: per peer
index ``[acks, seen, counter, recs]`` (MaxContiguous and highest delivered per stream, the senders'
records it reported), where `counter` is bumped by the entry's owner whenever its bottom's summary
changes, so the newer entry wins a merge. Every period each agent sends `fanout` random peers its
whole table and its bottom's NAKs (push); a peer merges them and answers with its own table (pull).
Every agent decides stability by itself from its table: the minimum MaxContiguous of a stream once
every peer of the view has reported it. There is no token to lose and no leader inside a group: a
lost gossip only delays. In a group with an agent above, agent 0 hands the group's aggregate up and
spreads the stability decided above in its gossip (numbered: the newer decision wins). A caching agent whose
bottom holds a NAK's range has its bottom push the repair. The period is short while any sender has
unstable messages or NAKs are out, long when idle; an idle agent that turns active (its bottom, or a
peer's gossip) gossips at the next tick instead of at the end of the idle period.

Submit it to a running cluster and use it:

    ref = cluster.submit_plugin("examples/gossip_recovery.py")   # or: scopecast plugin submit ...
    cluster.create_topic("t", recovery="gossip@1.0")             # or recovery=f"sha256:{ref.sha256}"

Options: `fanout` (2), `active_period` (0.05 s), `idle_period` (1.0 s), `cache_all` (True).
Peer messages: ``{"k": "push" | "pull", "v": view version, "t": {peer index: [acks, seen, counter,
recs]}, "n": [nak, ...]}``, plus ``"d": [round, down, hi]`` once a decision came from
above.
"""

from __future__ import annotations

import random

from scopecast.agents.api import API_VERSION, DomainContext, PeerView, RecoveryProtocol

__scopecast_plugin__ = {"kind": "recovery", "name": "gossip", "version": "1.0", "api_version": 1,
                        "classes": ["GossipRecovery"]}

MAX_NAKS = 64  # of the bottom's NAKs, per gossip message
NAK_FIELDS = 10


def _ints(value) -> bool:
    return isinstance(value, dict) and all(type(v) is int for v in value.values())


def _record(value) -> bool:
    """``[max_sseq, named topics, heartbeat, horizon, key count, key digest]`` (the last four may
    be missing); the named topics packed (bytes) or ``[[topic, session, first_seq, first_sseq,
    last_seq, last_sseq], ...]``"""
    return (isinstance(value, list) and len(value) in (2, 3, 6) and type(value[0]) is int
            and all(type(x) is int for x in value[2:])
            and (isinstance(value[1], bytes) or isinstance(value[1], list) and all(
                isinstance(r, list) and len(r) == 6 and all(type(x) is int for x in r)
                for r in value[1])))


def _records(value) -> bool:
    return isinstance(value, dict) and all(_record(r) for r in value.values())


def _entry(value) -> bool:
    return (isinstance(value, list) and len(value) == 4 and _ints(value[0]) and _ints(value[1])
            and type(value[2]) is int and _records(value[3]))


def _nak(value) -> bool:
    return (isinstance(value, list) and len(value) == NAK_FIELDS
            and all(type(x) in (int, str) for x in value))


def _down(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(d, list) and len(d) == 2 and type(d[0]) is int and _record(d[1])
        for d in value.values())


class GossipRecovery(RecoveryProtocol):
    name = "gossip"
    api_version = API_VERSION

    def __init__(self, context: DomainContext) -> None:
        super().__init__(context)
        opts = context.options
        self.active_period = float(opts.get("active_period", 0.05))
        self.idle_period = float(opts.get("idle_period", 1.0))
        self.fanout = max(1, int(opts.get("fanout", 2)))
        self.cacher = bool(opts.get("cache_all", True))
        self.view: PeerView | None = None
        self.rng: random.Random | None = None   # seeded from the domain and index (on_view)
        self.bottom: dict = {}
        self.mine: list = [{}, {}, 0, {}]   # this agent's entry: its bottom's latest summary
        self.state: dict[int, list] = {}    # peer index -> [acks, seen, counter, recs]
        self.down: dict = {}
        self.hi: dict = {}
        self.round = 0                      # of the decision from above this agent holds
        self.pushes: list = []
        self.served: set[tuple] = set()     # NAKs pushed this period
        self.active = True
        self.heard_naks = False             # a peer's gossip this period carried NAKs
        self.next_at = 0.0                  # when this agent gossips next
        self.up: dict | None = None
        self.stats = {"rounds": 0, "gossips_sent": 0, "pulls_sent": 0, "merges": 0,
                      "naks_served": 0, "bad_messages": 0}

    @property
    def period(self) -> float:
        return self.active_period if self.active else self.idle_period

    def on_view(self, view: PeerView) -> None:
        self.view = view
        self.rng = random.Random(f"{self.context.domain}#{view.index}")
        self.state = {view.index: self.mine}  # the peers' indices may mean others now
        self._decide()

    # ------------------------------------------------------------------ bottom interface

    def on_summary(self, summary: dict, now: float) -> dict:
        self.bottom = summary
        acks, seen, recs = summary.get("acks", {}), summary.get("seen", {}), summary.get("recs", {})
        entry = [{s: a for s, a in acks.items() if type(a) is int} if isinstance(acks, dict) else {},
                 {s: a for s, a in seen.items() if type(a) is int} if isinstance(seen, dict) else {},
                 self.mine[2],
                 {s: r for s, r in recs.items() if _record(r)} if isinstance(recs, dict) else {}]
        if entry[:2] + entry[3:] != self.mine[:2] + self.mine[3:]:
            entry[2] += 1
            self._set_mine(entry)
        self._check_wake()
        pushes, self.pushes = self.pushes, []
        return {"down": self.down, "hi": self.hi, "push": pushes, "period": self.period,
                "cacher": self.cacher}

    def _set_mine(self, entry: list) -> None:
        self.mine = entry
        if self.view is not None:
            self.state[self.view.index] = entry
            self._decide()

    def _naks(self) -> list:
        naks = self.bottom.get("naks", [])
        return [n for n in naks if _nak(n)][:MAX_NAKS] if isinstance(naks, list) else []

    def _recs(self) -> dict:
        """The senders' records the table holds (the furthest, if two peers report a stream)."""
        recs: dict = {}
        for _acks, _seen, _counter, theirs in self.state.values():
            for stream, rec in theirs.items():
                if stream not in recs or rec[0] > recs[stream][0]:
                    recs[stream] = rec
        return recs

    def _seen(self) -> dict:
        """Per stream, the furthest any peer's bottom delivered."""
        hi: dict = {}
        for _acks, seen, _counter, _recs in self.state.values():
            for stream, s in seen.items():
                hi[stream] = max(hi.get(stream, s), s)
        return hi

    def _busy(self) -> bool:
        """NAKs are out, or a sender (of the group, or anywhere from above) has unstable messages."""
        return bool(self._naks() or self.heard_naks
                    or any(rec[1] for rec in self._recs().values())
                    or any(rec[1] for _stable, rec in self.down.values()))

    def _check_wake(self) -> None:
        """Turned active while idle: gossip at the next tick, not at the end of the idle period."""
        if not self.active and self._busy():
            self.active = True
            self.next_at = 0.0

    # --------------------------------------------------------------------- decision

    def _complete(self) -> bool:
        return len(self.state) == len(self.view.peers)

    def _aggregate(self) -> dict:
        """MaxContiguous per stream over the whole group: 0 where some peer did not report it;
        nothing while a member of the domain has no agent in the group."""
        if self.view.missing:
            return {}
        entries = [e[0] for e in self.state.values()]
        streams = {s for acks in entries for s in acks}
        return {s: min(acks.get(s, 0) for acks in entries) for s in streams}

    def _decide(self) -> None:
        """Without an agent above, every agent decides from its own table; stability never goes
        back (a newcomer far behind does not undo what the group held)."""
        if self.view.has_upper:
            return
        acks = self._aggregate() if self._complete() else {}
        old = self.down
        self.down = {s: [max(acks.get(s, 0), old.get(s, (0,))[0]), rec]
                     for s, rec in self._recs().items()}
        self.hi = self._seen()

    # ------------------------------------------------------------------------ gossip

    def _message(self, kind: str) -> dict:
        body = {"k": kind, "v": self.view.version, "t": dict(self.state), "n": self._naks()}
        if self.round:
            body["d"] = [self.round, self.down, self.hi]
        return body

    def on_tick(self, now: float) -> list[tuple[int, object]]:
        if self.view is None or now < self.next_at:
            return []
        self.served.clear()
        self.active = self._busy()
        self.heard_naks = False
        self.next_at = now + self.period
        self.stats["rounds"] += 1
        if self.view.has_upper and self.view.index == 0 and self._complete():
            self.up = {"acks": self._aggregate(), "recs": self._recs(), "seen": self._seen(),
                       "naks": []}
        others = [i for i in range(len(self.view.peers)) if i != self.view.index]
        targets = self.rng.sample(others, min(self.fanout, len(others)))
        self.stats["gossips_sent"] += len(targets)
        body = self._message("push")
        return [(t, body) for t in targets]

    def _valid(self, sender, body) -> bool:
        n = len(self.view.peers)
        table = body.get("t")
        return (type(sender) is int and 0 <= sender < n and sender != self.view.index
                and body.get("k") in ("push", "pull") and isinstance(table, dict)
                and all(type(i) is int and 0 <= i < n and _entry(e) for i, e in table.items())
                and isinstance(body.get("n", []), list) and all(_nak(k) for k in body.get("n", []))
                and ("d" not in body or (isinstance(body["d"], list) and len(body["d"]) == 3
                                         and type(body["d"][0]) is int and _down(body["d"][1])
                                         and _ints(body["d"][2]))))

    def on_peer(self, sender: int, body, now: float) -> list[tuple[int, object]]:
        if self.view is None or not isinstance(body, dict) or body.get("v") != self.view.version:
            return []
        if not self._valid(sender, body):
            self.stats["bad_messages"] += 1
            return []
        changed = False
        for index, entry in body["t"].items():
            if index == self.view.index:
                if entry[2] > self.mine[2]:  # this agent's former self: re-assert what it holds
                    self._set_mine([self.mine[0], self.mine[1], entry[2] + 1, self.mine[3]])
            elif index not in self.state or entry[2] > self.state[index][2]:
                self.state[index] = entry
                self.stats["merges"] += 1
                changed = True
        if changed:
            self._decide()
        if "d" in body and body["d"][0] > self.round and self.view.has_upper:
            self.round, self.down, self.hi = body["d"]
        self._serve(body.get("n", []))
        self.heard_naks = self.heard_naks or bool(body.get("n"))
        self._check_wake()
        if body["k"] == "push":
            self.stats["pulls_sent"] += 1
            return [(sender, self._message("pull"))]
        return []

    def _serve(self, naks: list) -> None:
        """Have the bottom push what it holds of a NAK's range (once a period per NAK): a tail NAK
        asks for what it delivered beyond the requester."""
        if not self.cacher:
            return
        have, delivered = self.mine[0], self.mine[1]
        for nak in naks:
            key = tuple(nak)
            if key not in self.served and max(have.get(nak[0], 0), delivered.get(nak[0], 0)) >= nak[6]:
                self.served.add(key)
                self.pushes.append(nak)
                self.stats["naks_served"] += 1

    # --------------------------------------------------------------- upper interface

    def upward(self) -> dict | None:
        up, self.up = self.up, None
        return up if self.view is not None and self.view.has_upper else None

    def on_down(self, instructions: dict) -> None:
        down, hi = instructions.get("down", {}), instructions.get("hi", {})
        if _down(down) and _ints(hi):
            self.round += 1
            self.down, self.hi = down, hi
        self._check_wake()
