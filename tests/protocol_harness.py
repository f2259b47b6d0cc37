"""An in-memory harness for recovery protocols as pure logic: agents wired to each other without
sockets, ticked once per simulated period (shared by the protocols' unit tests)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from scopecast.agents.api import DomainContext, PeerView

PERIOD = 0.06
CLOCK = [0.0]
REC = [1000, [[7, 1, 1, 1, 1000, 1000]]]  # sender 9 has messages 1..1000 of topic 7 unstable


def group(cls, n: int, has_upper: bool = False, regions: tuple = (), **options) -> list:
    """`n` agents of protocol `cls` in one peer group (view version 1)."""
    options.setdefault("idle_period", PERIOD)  # every period of the harness is a round
    agents = [cls(DomainContext(f"d|{i}", 1, options)) for i in range(n)]
    for i, a in enumerate(agents):
        a.on_view(PeerView(1, tuple(f"m{j}" for j in range(n)), i, has_upper, regions=regions))
    return agents


def run(agents: list, periods: int = 6, lose=lambda src, dst, body: False) -> None:
    """Tick every agent each period and deliver what they send (unless `lose` says so)."""
    for _ in range(periods):
        CLOCK[0] += PERIOD
        now = CLOCK[0]
        queue = [(i, dst, body) for i, a in enumerate(agents) for dst, body in a.on_tick(now)]
        while queue:
            src, dst, body = queue.pop(0)
            if not lose(src, dst, body):
                queue += [(dst, d, b) for d, b in agents[dst].on_peer(src, body, now)]


def summary(acks: dict, naks=(), recs=None) -> dict:
    return {"acks": acks, "naks": list(naks), "recs": recs or {}}


def load_example(name: str):
    """A module of examples/ (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent.parent / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
