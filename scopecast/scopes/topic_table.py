"""The topic table as it travels down the hierarchy: a *base* put once in Ray's object store and
a log of the changes since, each numbered by the root. A parent sends a child a *piece*: the
changes past the position the child has (the whole log, if it lacks the base), so a new topic
costs every scope and member its own entry, not the table (thousands of topics) nor every change
since the base. The root rebases when the log grows past a fraction of the table.

A piece is (base ref, members' base ref, base serial, since, [(serial, key, body)], upto); a
position is (base serial, serial). Serials start at the root's clock in nanoseconds, so a
restarted root's pieces are newer than anything its predecessor sent.
"""

from __future__ import annotations

import time

import ray

REBASE_MIN = 64        # changes logged before the root puts a new base
REBASE_FRACTION = 16   # ... or 1/16 of the table, whichever is more


def member_entry(fields: dict) -> tuple[str, int]:
    """What a member keeps of a topic's entry: its name and session."""
    return fields["name"], fields["session"]


def position(value) -> tuple[int, int] | None:
    """A position as a child states it (None if it has no table yet, or states it malformed:
    it is then sent the whole table)."""
    try:
        base, serial = map(int, value)
    except (TypeError, ValueError):
        return None
    return base, serial


class TopicTable:
    """Topic entries by id (str) -> TopicInfo fields, the position they are at, and the log of
    changes since the base (which a scope passes on to its children).

    A member's table is a `MemberTopicTable`.

    `early`: entries a scope fetched from the root before its parent's table brought them (a
    subscriber or publisher of a topic just made); they travel down beside the pieces and give
    way to the entry the table brings."""

    def __init__(self) -> None:
        self._reset({})  # self.entries
        self.position: tuple[int, int] | None = None
        self.early: dict[str, dict] = {}
        self.changed: set | None = None  # keys the last take changed (None: any)
        self._refs: tuple | None = None   # (base ref, members' base ref)
        self._log: dict[str, tuple[int, dict | None]] = {}  # key -> its last change, in order

    # ----------------------------------------------------------------------------- the root

    def load(self, entries: dict[str, dict]) -> None:
        self.entries = dict(entries)
        self.position = (0, time.time_ns())
        self._rebase()

    def change(self, key: str, body: dict | None) -> None:
        """Add, replace (body) or delete (None) one entry (at the root: it keeps whole ones)."""
        self._put(key, body)
        serial = self.position[1] + 1
        self._record(serial, key, body)
        self.position = (self.position[0], serial)
        if len(self._log) > max(REBASE_MIN, len(self.entries) // REBASE_FRACTION):
            self._rebase()

    def _rebase(self) -> None:
        base = dict(self.entries)
        members = {int(k): member_entry(v) for k, v in base.items()}
        self._refs = (ray.put(base), ray.put(members))
        self._log = {}
        serial = self.position[1] + 1
        self.position = (serial, serial)

    # ----------------------------------------------------------------------- sending down

    def piece(self, have: tuple[int, int] | None) -> tuple | None:
        """What a child at position `have` lacks; None if nothing (or nothing to send yet)."""
        if self._refs is None:
            return None
        base, serial = self.position
        if have is not None and have[0] == base:
            if have[1] >= serial:
                return None
            changes = []
            for key, (s, body) in reversed(self._log.items()):  # newest first: O(what it lacks)
                if s <= have[1]:
                    break
                changes.append((s, key, body))
            changes.reverse()
            return (*self._refs, base, have[1], changes, serial)
        if have is not None and have[0] > base:
            return None  # the child is ahead (this scope restarted): it waits for this one
        return (*self._refs, base, base, [(s, k, b) for k, (s, b) in self._log.items()], serial)

    # ----------------------------------------------------------------------- taking pieces

    def needs_base(self, piece: tuple) -> bool:
        return self.position is None or piece[2] > self.position[0]

    def base_ref(self, piece: tuple):
        """Which base of `piece` this table takes (when `needs_base`)."""
        return piece[0]

    def take(self, piece: tuple, base: dict | None) -> bool:
        """Take what a parent sent (`base`: the fetched base when `needs_base`); False if it
        brings nothing new, or cannot be taken: older than what this table has, or starting
        past its position (a piece lost on the way: the parent sends again from the position
        this scope reports)."""
        base_ref, members_ref, base_serial, since, changes, upto = piece
        have = self.position
        if base is None:
            if have is None or base_serial != have[0] or since > have[1] or upto <= have[1]:
                return False
            self.changed = set()
        else:
            if since != base_serial or (have is not None and base_serial <= have[0]):
                return False
            self._reset(base)
            self._log, self.changed = {}, None
            have = (base_serial, base_serial)
        if changes and self.changed is not None:
            self._will_change()
        for s, key, body in changes:
            if s <= have[1]:
                continue
            self._put(key, body)
            self.early.pop(key, None)
            self._record(s, key, body)
            if self.changed is not None:
                self.changed.add(key)
        if self.changed is None:
            self._put_early(self.early)
        self._refs, self.position = (base_ref, members_ref), (base_serial, upto)
        return True

    def take_early(self, early: dict[str, dict]) -> set[str]:
        """Entries a parent fetched early; the keys this table did not have."""
        new = {k: v for k, v in early.items() if not self._has(k)}
        self.early.update(new)
        if new:
            self._will_change()
        self._put_early(new)
        return set(new)

    def _put_early(self, early: dict[str, dict]) -> None:
        for key, body in early.items():
            if not self._has(key):
                self._put(key, body)

    # ------------------------------------------------------- how the entries are kept (hooks)

    def _has(self, key: str) -> bool:
        return key in self.entries

    def _reset(self, base: dict) -> None:
        self.entries = dict(base)

    def _will_change(self) -> None:
        """Entries are about to change in place (a member's table copies them first)."""

    def _put(self, key: str, body: dict | None) -> None:
        if body is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = body

    def _record(self, serial: int, key: str, body: dict | None) -> None:
        """Log a change taken, to pass on to this scope's children."""
        self._log.pop(key, None)
        self._log[key] = (serial, body)


class MemberTopicTable(TopicTable):
    """A member process's topic table: each topic's name and session by topic id (int), the two
    dicts its runtime looks them up in (`names`, `sessions`), taken from the members' base
    ({id: (name, session)}, which has only that: at thousands of topics the whole entries cost a
    member more memory than anything else it keeps per topic, and so did fetching them once).

    The runtime keeps the dicts it is given and reads them on its I/O thread, so a change that
    takes a piece copies them first (`_will_change`): a dict handed over is never changed."""

    def base_ref(self, piece: tuple):
        return piece[1]  # (the members' base: names and sessions only)

    def _record(self, serial: int, key: str, body: dict | None) -> None:
        pass  # (a member passes nothing on)

    @property
    def entries(self) -> dict[int, tuple[str, int]]:
        """(name, session) by topic id: made on demand (diagnostics and tests)."""
        return {k: (name, self.sessions[k]) for k, name in self.names.items()}

    def _has(self, key: str) -> bool:
        return int(key) in self.names

    def _reset(self, base: dict) -> None:
        self.names: dict[int, str] = {k: name for k, (name, _session) in base.items()}
        self.sessions: dict[int, int] = {k: session for k, (_name, session) in base.items()}

    def _will_change(self) -> None:
        self.names, self.sessions = dict(self.names), dict(self.sessions)

    def _put(self, key: str, body: dict | None) -> None:
        key = int(key)
        if body is None:
            self.names.pop(key, None)
            self.sessions.pop(key, None)
        else:
            self.names[key], self.sessions[key] = member_entry(body)
