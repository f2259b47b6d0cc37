"""Ctrl-C held back while the main thread runs a member's protocol code.

A thread waiting in `Subscriber.receive()` runs the member's I/O loop itself (see `runtime`). When
that thread is the main thread, SIGINT's Python handler (KeyboardInterrupt by default) could fire
between any two statements of that code and leave the member's state half changed. So while it
leads, SIGINT is only recorded (and the loop woken, so that it stops at once); the handler that was
installed runs as soon as the loop is left, where the state is whole.
"""

from __future__ import annotations

import signal
import threading


class HeldInterrupt:
    """`with HeldInterrupt(wake):` records SIGINT instead of handling it (main thread, Python
    handler only; elsewhere it does nothing), calls `wake()` when one comes, and hands it to the
    previous handler on leaving. `interrupted` says whether one came."""

    __slots__ = ("_wake", "_previous", "_frame", "interrupted")

    def __init__(self, wake) -> None:
        self._wake = wake
        self._previous = None
        self._frame = None
        self.interrupted = False

    def __enter__(self) -> HeldInterrupt:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, signum, frame) -> None:
        self.interrupted = True
        self._frame = frame
        self._wake()

    def __exit__(self, *exc) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if self.interrupted:
                previous(signal.SIGINT, self._frame)
