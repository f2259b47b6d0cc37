"""`token_ring`, the default recovery protocol (QSM, thesis 4467-4560).

The agents of one peer group form a ring; the first (the leader) releases a token every period. As
the token passes, each agent folds in its bottom's summary: the minimum MaxContiguous per sender
stream (with a count, so a stream some peer has not reported yet is not taken as held), the senders'
records, and the NAKs of its bottom. An agent whose bottom caches a stream up to a NAK's end takes
that NAK off the token and tells its bottom to push the repair (neighbour repair); NAKs nobody can
serve are also pulled from the sender by the member itself. When the token is back, the leader has
the group's aggregate: it hands it up (the agent above treats it as its bottom's summary) or, at the
top, decides stability — which then travels down: in the next token to every peer, and in every
agent's reply to its bottom. The period is short while any sender has unstable messages or NAKs are
out, long when idle.
"""

from __future__ import annotations

from scopecast.agents.api import DomainContext, PeerView, RecoveryProtocol

MAX_TOKEN_NAKS = 64


class TokenRing(RecoveryProtocol):
    name = "token_ring"

    def __init__(self, context: DomainContext) -> None:
        super().__init__(context)
        opts = context.options
        self.active_period = float(opts.get("active_period", 0.05))
        self.idle_period = float(opts.get("idle_period", 1.0))
        self.cachers = int(opts.get("cachers", 2))
        self.view: PeerView | None = None
        self.bottom: dict = {}
        self.down: dict = {}
        self.pushes: list = []
        self.active = True
        self.round = 0
        self.outstanding = False
        self.started = 0.0
        self.up: dict | None = None
        self.stats = {"rounds": 0, "tokens_lost": 0, "naks_served": 0, "round_time": 0.0}

    @property
    def period(self) -> float:
        return self.active_period if self.active else self.idle_period

    @property
    def leader(self) -> bool:
        return self.view is not None and self.view.index == 0

    def on_view(self, view: PeerView) -> None:
        self.view = view
        self.round = 0
        self.outstanding = False  # a token of the old view is ignored when it comes back

    def on_summary(self, summary: dict, now: float) -> dict:
        self.bottom = summary
        if summary.get("naks") or any(r[1] for r in summary.get("recs", {}).values()):
            self.active = True
        pushes, self.pushes = self.pushes, []
        cacher = self.view is not None and self.view.index % 5 < self.cachers
        return {"down": self.down, "push": pushes, "period": self.period, "cacher": cacher}

    def on_tick(self, now: float) -> list[tuple[int, object]]:
        if not self.leader:
            return []
        if self.outstanding:
            if now - self.started < max(4 * self.period, 0.2):
                return []
            self.stats["tokens_lost"] += 1
        elif now - self.started < self.period:
            return []
        self.round += 1
        self.started = now
        self.outstanding = True
        token = {"r": self.round, "v": self.view.version, "acks": {}, "cnt": {}, "naks": [],
                 "recs": {}, "down": self.down, "act": False}
        self._fold(token)
        if len(self.view.peers) == 1:
            self._complete(token, now)
            return []
        return [(1, token)]

    def on_peer(self, sender: int, body, now: float) -> list[tuple[int, object]]:
        if self.view is None or body.get("v") != self.view.version:
            return []
        if self.leader:
            if self.outstanding and body.get("r") == self.round:
                self._complete(body, now)
            return []
        if body.get("r", 0) <= self.round:
            return []  # a duplicate, or a round overtaken by a newer one
        self.round = body["r"]
        self.down = body.get("down", {})
        self.active = bool(body.get("act"))
        self._fold(body)
        return [((self.view.index + 1) % len(self.view.peers), body)]

    def _fold(self, token: dict) -> None:
        """Add this agent's bottom to the token; take NAKs this bottom can serve."""
        b = self.bottom
        acks, cnt = token["acks"], token["cnt"]
        have = b.get("acks", {})
        for stream, a in have.items():
            acks[stream] = min(acks.get(stream, a), a)
            cnt[stream] = cnt.get(stream, 0) + 1
        token["recs"].update(b.get("recs", {}))
        cacher = self.view.index % 5 < self.cachers
        left = []
        for nak in token["naks"]:
            if cacher and have.get(nak[0], 0) >= nak[6]:
                self.pushes.append(nak)
                self.stats["naks_served"] += 1
            else:
                left.append(nak)
        left += b.get("naks", [])
        token["naks"] = left[:MAX_TOKEN_NAKS]
        if token["naks"] or any(r[1] for r in token["recs"].values()):
            token["act"] = True

    def _complete(self, token: dict, now: float) -> None:
        self.outstanding = False
        self.stats["rounds"] += 1
        self.stats["round_time"] = now - self.started
        self.active = bool(token.get("act"))
        n = len(self.view.peers)
        agg = {s: (a if token["cnt"].get(s, 0) >= n else 0) for s, a in token["acks"].items()}
        self.up = {"acks": agg, "recs": token["recs"], "naks": []}
        if not self.view.has_upper:
            # the top decides: stable is what every regular member holds; it never goes back
            old = self.down
            self.down = {s: [max(agg.get(s, 0), old.get(s, (0,))[0]), rec]
                         for s, rec in token["recs"].items()}

    def upward(self) -> dict | None:
        up, self.up = self.up, None
        return up if self.view is not None and self.view.has_upper else None

    def on_down(self, instructions: dict) -> None:
        self.down = instructions.get("down", {})
        if instructions.get("period", self.period) == self.active_period:
            self.active = True
