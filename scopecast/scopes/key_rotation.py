"""Key rotation without loss, the root's side.

`rotate` makes a new cluster key under a new generation, a session of the cluster's keys, and
takes the hierarchy through three steps, each a ring (`netio.auth.ClusterKeys`) that goes down
with everything else the scopes send (each delegation, each member's view; every scope hands it
to the agent hosts running its agents at once):

1. ANNOUNCED: every process accepts the new key and still seals with the old one;
2. SEALING: every process seals with the new key and still accepts the old one;
3. RETIRED: the new key alone.

The root takes the next step once the whole hierarchy has in place what was sent for this one
(`ScopeManager.check`: every scope applied its delegation, every member acknowledged its view),
and OVERLAP seconds more (agent hosts are told without an answer, datagrams are in flight). So
no process seals with a key another does not accept yet, and the old key is accepted until the
new session is stable. A datagram sealed with the old key after that is refused and counted
(`bad_mac`); a lost data datagram is repaired like any other, under the new key. A member that
never acknowledges (stalled, or dead without leaving) holds a step back for at most STEP_WAIT: it
is expired by then, or comes back and takes the ring from its view.

Credentials (`scopes.credentials`) stay under the key the cluster had when it began: rotating the
packet key does not revoke them.

The keys are in the root's state (`cluster`: `key` the one sealing, `keys` the ring,
`credential_key`), so a root restarted mid-rotation goes on with it (`resume`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from scopecast.actors.errors import InvalidConfig
from scopecast.netio.auth import RETIRED, STEPS, ClusterKeys, new_cluster_key

log = logging.getLogger(__name__)

OVERLAP = 2.0       # seconds between the hierarchy taking a step in and the next step
STEP_WAIT = 60.0    # at most this long waiting for the hierarchy to take a step in
POLL = 0.5


class KeyRotation:
    """The cluster's keys at the root: rotated on request, in steps (see module docstring).

    `store` is the root's state database, `take(keys)` hands a ring down (Downlink.take_keys),
    `settled()` says whether everything sent has been taken in (ScopeManager.check)."""

    def __init__(self, store, take, settled) -> None:
        self._store = store
        self._take = take
        self._settled = settled
        cluster = store.get("cluster")
        self.keys = ClusterKeys.from_wire(cluster["keys"]) if "keys" in cluster \
            else ClusterKeys.first(bytes.fromhex(cluster["key"]))
        self.credential_key = bytes.fromhex(cluster.get("credential_key", cluster["key"]))
        self._steps: asyncio.Task | None = None

    @property
    def sealing(self) -> bytes:
        """The key a process that connects now seals with."""
        return self.keys.raw()[0]

    @property
    def under_way(self) -> bool:
        return self.keys.step != RETIRED

    async def rotate(self, wait: float = 0.0) -> ClusterKeys:
        """Start a rotation (see module docstring) and wait up to `wait` seconds for it to end;
        InvalidConfig while the last one is under way."""
        if self.under_way:
            raise InvalidConfig(f"key generation {self.keys.generation} is still being rolled "
                                f"out (step {STEPS[self.keys.step]}; its old key is accepted "
                                f"until it is in place everywhere): rotate again once that is "
                                f"done")
        self._set(self.keys.rotated(new_cluster_key()))
        self.resume()
        if wait > 0:
            await asyncio.wait([self._steps], timeout=wait)
        return self.keys

    def resume(self) -> None:
        """Take the rotation under way through its steps (a root restarted mid-rotation calls
        this as it starts)."""
        if self.under_way and (self._steps is None or self._steps.done()):
            self._steps = asyncio.get_running_loop().create_task(self._advance())

    async def _advance(self) -> None:
        generation = self.keys.generation
        began = time.monotonic()
        while self.under_way and self.keys.generation == generation:
            step_began = time.monotonic()
            while not await self._settled():
                if time.monotonic() - step_began >= STEP_WAIT:
                    log.warning("key generation %d: the hierarchy did not take step %s in within "
                                "%.0f s; going on (a process that missed it is refused until "
                                "its view brings the ring)", generation,
                                STEPS[self.keys.step], STEP_WAIT)
                    break
                await asyncio.sleep(POLL)
            await asyncio.sleep(OVERLAP)
            self._set(self.keys.advanced())
        log.info("key generation %d in place everywhere after %.1f s: the old key is no longer "
                 "accepted", generation, time.monotonic() - began)

    def _set(self, keys: ClusterKeys) -> None:
        cluster = self._store.get("cluster")
        cluster.setdefault("credential_key", cluster["key"])
        cluster["key"], cluster["keys"] = keys.raw()[0].hex(), keys.to_wire()
        self._store.put("cluster", cluster)
        self.keys = keys
        log.info("cluster keys: generation %d, step %s", keys.generation, STEPS[keys.step])
        self._take(keys)
