"""Warm publisher processes for `publish_dataframe`, kept by the driver between runs.

Starting a Ray worker process and importing scopecast, pyarrow and msgpack in it takes about a
second of CPU, which on a small machine is taken from the Spark conversion it runs beside. So the
publisher actors of a run that succeeded are kept, and the next run of this driver with the same
RuntimeConfig reuses them (each run still joins as a member of its own). Idle ones go with
`release_all()` (from `Cluster.shutdown()`) or when the driver exits, since they are its actors.
The actors of a run that failed are killed, not kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray

from scopecast.timing import TIMING

PING_TIMEOUT = TIMING.pool_ping_timeout
MAX_IDLE = 8        # idle actors kept (the oldest go first)

_idle: list[tuple[Any, Any]] = []  # (RuntimeConfig or None, actor), oldest first
_lock = threading.Lock()


def take(config: Any, n: int, start: Callable[[], Any]) -> tuple[list, int]:
    """`n` publisher actors for a run — idle ones started with `config` that still answer, then
    new ones from `start()` — and how many are new."""
    with _lock:
        picked = [e for e in _idle if e[0] == config][:n]
        for entry in picked:
            _idle.remove(entry)
    actors = [a for _, a in picked if _alive(a)]
    started = n - len(actors)
    return actors + [start() for _ in range(started)], started


def give_back(config: Any, actors: list) -> None:
    """Keep the actors of a run that succeeded for the next one."""
    with _lock:
        _idle.extend((config, a) for a in actors)
        extra = _idle[:-MAX_IDLE]
        del _idle[:-MAX_IDLE]
    kill([a for _, a in extra])


def release_all() -> None:
    """Stop every idle publisher actor of this driver."""
    with _lock:
        idle = [a for _, a in _idle]
        _idle.clear()
    kill(idle)


def kill(actors: list) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # gone already, or from a Ray session this driver left
            pass


def _alive(actor) -> bool:
    try:
        ray.get(actor.ping.remote(), timeout=PING_TIMEOUT)
        return True
    except Exception:
        kill([actor])
        return False
