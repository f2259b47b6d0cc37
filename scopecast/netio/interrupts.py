"""Ctrl-C held back while the main thread runs a member's protocol code.

A thread waiting in `Subscriber.receive()` runs the member's I/O loop itself (see `runtime`). When
that thread is the main thread, SIGINT's Python handler (KeyboardInterrupt by default) could fire
between any two statements of that code and leave the member's state half changed. So the first
time the main thread leads, SIGINT's handler is wrapped: while the main thread leads, an interrupt
is only recorded (and the loop woken, so that it stops at once); the wrapped handler runs as soon
as the loop is left, where the state is whole. Outside the loop it runs at once, as before.

The wrapper is installed once, not around every lead: changing a signal handler costs several
microseconds here, about a datagram's worth of protocol work. A handler the application installs
after that replaces the wrapper and runs as it is.
"""

from __future__ import annotations

import signal
import threading

MAIN = threading.main_thread().ident


class InterruptGuard:
    """The process's one guard (`GUARD`): `hold(wake)` before the main thread leads, `release()`
    after; `interrupted` says whether SIGINT came meanwhile."""

    __slots__ = ("_previous", "_installed", "_wake", "_frame", "interrupted")

    def __init__(self) -> None:
        self._previous = None
        self._installed = False
        self._wake = None
        self._frame = None
        self.interrupted = False

    def hold(self, wake) -> bool:
        """Hold SIGINT back from now on (`wake()` when one comes); False, doing nothing, on any
        thread but the main one (Python runs signal handlers only there)."""
        if threading.get_ident() != MAIN:
            return False
        if not self._installed:
            self._installed = True
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
        self._wake = wake
        return True

    def release(self) -> None:
        """Stop holding SIGINT back; one that came meanwhile goes to its handler now."""
        self._wake = None
        if self.interrupted:
            self.interrupted = False
            frame, self._frame = self._frame, None
            if self._previous is not None:
                self._previous(signal.SIGINT, frame)

    def _handle(self, signum, frame) -> None:
        wake = self._wake
        if wake is None:  # not inside the loop: as the wrapped handler would
            self._previous(signum, frame)
            return
        self.interrupted = True
        self._frame = frame
        wake()


GUARD = InterruptGuard()
