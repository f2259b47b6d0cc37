"""Python's cyclic garbage collector held off while a scope does bulk work.

A re-layout over 100,000 topics makes objects by the million, and the collections they set off,
each over the whole grown heap, took about half of a scope manager's CPU (py-spy --native:
`gc_collect_main` under the planner and the policy container). Whatever cycles the work left
behind are collected once the collector is on again.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_off():
    """The collector off for the block (as it was after it, also when the block raises)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
