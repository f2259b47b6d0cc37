"""A change waits for the first re-layout that began after it, not for re-layouts to stop (pure
logic on an event loop)."""

from __future__ import annotations

import asyncio

from scopecast.scopes.relayouts import Relayouts


def test_a_change_waits_for_a_relayout_begun_after_it_and_only_that():
    async def scenario() -> list[str]:
        r, seen = Relayouts(), []
        first = r.begin()             # a re-layout under way before the change
        change = r.kick()
        waiter = asyncio.ensure_future(r.laid_since(change))
        waiter.add_done_callback(lambda _: seen.append("laid"))
        r.done(first)                 # it ended, but did not cover the change
        await asyncio.sleep(0)
        seen.append("first ended")
        second = r.begin()
        r.kick()                      # more changes keep coming: not waited for
        r.done(second)
        await asyncio.sleep(0)
        await r.laid_since(change)    # (already laid: returns at once)
        return seen

    assert asyncio.run(scenario()) == ["first ended", "laid"]


def test_a_failed_relayout_still_ends_the_wait():
    async def scenario() -> bool:
        r = Relayouts()
        waiter = asyncio.ensure_future(r.laid_since(r.kick()))
        covered = r.begin()
        r.done(covered)  # (the scope's loop calls it in `finally`)
        await asyncio.wait_for(waiter, 1)
        return waiter.done()

    assert asyncio.run(scenario())
