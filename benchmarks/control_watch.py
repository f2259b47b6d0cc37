"""What a scopecast case costs the control side while it runs, read from `status()` twice a second:
control datagrams and bytes per second sent by members (ACKs, summaries, NAKs, join asks) and by
recovery agents (tokens, answers), the token round time of the leading agents, and how many of
their peers' messages the members hold until stable (cooperative caching), per member on average.

Members report their counters with each heartbeat (about once a second), so the rates are over
the span between the first and the last reading, each source from its first reading on.
"""

from __future__ import annotations

import statistics
import threading
import time

from scopecast.scopes.status import members, walk

PERIOD = 0.5


class ControlWatch:
    """`with ControlWatch(cluster) as watch: run the case`; then `watch.summary()`."""

    def __init__(self, cluster, period: float = PERIOD) -> None:
        self._cluster = cluster
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-control-watch", daemon=True)
        self._first: dict[tuple, tuple[float, int, int]] = {}
        self._last: dict[tuple, tuple[float, int, int]] = {}
        self._rounds: list[float] = []
        self._held: list[float] = []  # per reading: peers' messages held, mean over members
        self._held_by: dict[str, list[int]] = {}  # member -> peers' messages held, per reading
        self._cachers: set[str] = set()           # members that said they cache
        self._errors = 0

    def __enter__(self) -> ControlWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._read(self._cluster.status(topics=False))
            except Exception:  # a status call that failed mid-case: the next one counts
                self._errors += 1

    def _read(self, status: dict) -> None:
        now = time.monotonic()
        subs = [m for m in members(status)
                if (m.get("counters") or {}).get("recovery") and m.get("subscriptions")]
        held = [m["counters"]["recovery"].get("cached_messages", 0) for m in subs]
        if held:
            self._held.append(sum(held) / len(held))
        for m, h in zip(subs, held, strict=True):
            self._held_by.setdefault(m["name"], []).append(h)
            if m["counters"]["recovery"].get("cacher"):
                self._cachers.add(m["name"])
        for m in members(status):
            stats = (m.get("counters") or {}).get("stats") or {}
            self._note(("member", m["scope"], m["name"]), now, stats.get("control_out", 0),
                       stats.get("control_bytes_out", 0))
        for scope in walk(status):
            for protocol in (scope.get("recovery") or {}).values():
                for name, agent in (protocol.get("agents") or {}).items():
                    stats = agent.get("stats") or {}
                    self._note(("agent", scope["path"], name), now, stats.get("datagrams_out", 0),
                               stats.get("bytes_out", 0))
                    ps = agent.get("protocol_stats") or {}
                    if agent.get("leader") and ps.get("rounds") and ps.get("round_time"):
                        self._rounds.append(ps["round_time"])

    def _note(self, key: tuple, now: float, datagrams: int, nbytes: int) -> None:
        self._first.setdefault(key, (now, datagrams, nbytes))
        self._last[key] = (now, datagrams, nbytes)

    def summary(self) -> dict:
        out = {"readings_failed": self._errors,
               "token_round_ms_p50": round(statistics.median(self._rounds) * 1e3, 2)
               if self._rounds else None,
               "cached_messages_per_member": round(statistics.mean(self._held), 1)
               if self._held else None}
        # (whether the cachers each hold what a member holds when all cache, or longer)
        cachers = [statistics.mean(h) for n, h in self._held_by.items() if n in self._cachers]
        if cachers:
            out["cachers"] = len(cachers)
            out["cached_messages_per_cacher"] = round(statistics.mean(cachers), 1)
        for kind in ("member", "agent"):
            keys = [k for k in self._first if k[0] == kind]
            dg = nb = 0.0
            for k in keys:
                (t0, d0, b0), (t1, d1, b1) = self._first[k], self._last[k]
                if t1 > t0:
                    dg += (d1 - d0) / (t1 - t0)
                    nb += (b1 - b0) / (t1 - t0)
            out[f"{kind}s"] = len(keys)
            out[f"{kind}_datagrams_per_s"] = round(dg, 1)
            out[f"{kind}_bytes_per_s"] = round(nb, 1)
        return out
