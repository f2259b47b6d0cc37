"""Logging in scopecast's own processes (its actors and the CLI).

Library code never configures the root logger. scopecast's actors (scope managers, agent hosts)
log through the `scopecast` logger at the level `SCOPECAST_LOG_LEVEL` names (default WARNING; Ray
forwards an actor's stderr to the driver that started the cluster), so that a normal run prints
only what needs attention. Set the variable where the Ray nodes start (for an embedded Ray: in the
driver) to see more, e.g. `SCOPECAST_LOG_LEVEL=INFO`.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV = "SCOPECAST_LOG_LEVEL"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def level(default: str = "WARNING") -> int:
    """The level `SCOPECAST_LOG_LEVEL` names (a name such as INFO, or a number), else `default`;
    an unknown name falls back to `default` too."""
    value = os.environ.get(LEVEL_ENV, "").strip().upper() or default
    if value.isdigit():
        return int(value)
    number = logging.getLevelName(value)
    return number if isinstance(number, int) else logging.getLevelName(default)


def configure(default: str = "WARNING") -> None:
    """Give the `scopecast` logger its level and, once, a handler of its own (an actor process
    has no other logging set up; the root logger stays as the host process set it)."""
    logger = logging.getLogger("scopecast")
    logger.setLevel(level(default))
    if not any(getattr(h, "_scopecast", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._scopecast = True
        logger.addHandler(handler)
        logger.propagate = False
