"""Which changes of a scope are laid: a caller whose change must be in place before it returns
(`subscribe`, `advertise`) waits for the first re-layout that began after its change, not for
the scope's re-layouts to stop. Under a stream of changes (thousands of members subscribing,
heartbeats re-laying a scope of 100,000 topics) they may not stop for a minute."""

from __future__ import annotations

import asyncio


class Relayouts:
    """Changes asked for (`kick`, numbered) and re-layouts done (`begin` says which changes a
    re-layout starting now covers, `done` that it ended)."""

    def __init__(self) -> None:
        self.kicked = 0   # changes asked for so far
        self.laid = 0     # changes a finished re-layout covered
        self._waiting: list[tuple[int, asyncio.Future]] = []

    def kick(self) -> int:
        """A change to lay; its number (see `laid_since`)."""
        self.kicked += 1
        return self.kicked

    def begin(self) -> int:
        """A re-layout starts: it covers every change asked for so far."""
        return self.kicked

    def done(self, covered: int) -> None:
        """The re-layout that covered changes up to `covered` ended (laid, or failed: a failed
        one is logged and the next change lays again; nobody waits on it forever)."""
        self.laid = max(self.laid, covered)
        still = []
        for change, waiter in self._waiting:
            if change <= self.laid:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                still.append((change, waiter))
        self._waiting = still

    async def laid_since(self, change: int) -> None:
        """Return once a re-layout that began after change `change` was asked for has ended."""
        if self.laid >= change:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append((change, waiter))
        await waiter
