"""The topic table as it travels down the hierarchy: a *base* put once in Ray's object store and
the *changes* since, so a new topic costs every scope and member a few entries, not the whole
table (thousands of topics). The root rebases when the changes grow past a fraction of the table.
"""

from __future__ import annotations

import ray

REBASE_MIN = 64        # changes carried inline before the root puts a new base
REBASE_FRACTION = 16   # ... or 1/16 of the table, whichever is more
_MISSING = object()


def member_entry(fields: dict) -> tuple[str, int]:
    """What a member keeps of a topic's entry: its name and session."""
    return fields["name"], fields["session"]


class TopicTable:
    """Topic entries by id (str) -> TopicInfo fields; `ref` is what is sent down:
    (base ObjectRef, {id: fields, or None for a deleted topic}, members' base ObjectRef).

    A `member`'s table keeps `member_entry` of each entry by topic id (int), and takes its base
    from the members' base, which has only that: at thousands of topics the whole entries cost a
    member more memory than anything else it keeps per topic, and so did fetching them once
    (Python keeps the memory it freed); int keys are the ids the member's own tables use."""

    def __init__(self, member: bool = False) -> None:
        self._member = member
        self.entries: dict[str, dict] = {}
        self.ref: tuple | None = None
        self._base: dict[str, dict] = {}
        self.changed: set[str] | None = None  # keys the last take() changed (None: any)

    # ----------------------------------------------------------------------------- the root

    def load(self, entries: dict[str, dict]) -> None:
        self.entries = dict(entries)
        self._rebase()

    def change(self, key: str, body: dict | None) -> None:
        """Add, replace (body) or delete (None) one entry (at the root: it keeps whole ones)."""
        self._put(self.entries, key, body)
        if self.ref is None:
            self._rebase()
            return
        base_ref, delta, members_ref = self.ref
        delta = {**delta, key: body}
        if len(delta) > max(REBASE_MIN, len(self.entries) // REBASE_FRACTION):
            self._rebase()
        else:
            self.ref = (base_ref, delta, members_ref)

    def _rebase(self) -> None:
        self._base = dict(self.entries)
        members = {int(k): member_entry(v) for k, v in self._base.items()}
        self.ref = (ray.put(self._base), {}, ray.put(members))

    # ----------------------------------------------------------------------- everyone else

    def needs_base(self, ref: tuple) -> bool:
        return self.ref is None or ref[0] != self.ref[0]

    def base_ref(self, ref: tuple):
        """Which base of `ref` this table takes (when `needs_base`)."""
        return ref[2] if self._member else ref[0]

    def take(self, ref: tuple, base: dict | None) -> bool:
        """Take what a parent sent (`base`: the fetched base when `needs_base`); False if it
        is what this table has already."""
        if ref == self.ref:
            return False
        if base is None and self.ref is not None:  # the same base: only what the changes change
            old, new = self.ref[1], ref[1]
            self.changed = {k for k, body in new.items() if old.get(k, _MISSING) != body}
            self.changed.update(k for k in old if k not in new)
            for key in self.changed:
                if key in new:
                    self._put(self.entries, key, new[key])
                else:  # (back to the base's entry, kept already)
                    self._put(self.entries, key, self._base.get(self._key(key)), kept=True)
            self.ref = ref
            return True
        if base is not None:
            self._base = base
        entries = dict(self._base)
        for key, body in ref[1].items():
            self._put(entries, key, body)
        self.entries, self.ref, self.changed = entries, ref, None
        return True

    def _key(self, key: str) -> str | int:
        return int(key) if self._member else key

    def _put(self, entries: dict, key: str, body: dict | None, kept: bool = False) -> None:
        key = self._key(key)
        if body is None:
            entries.pop(key, None)
        else:
            entries[key] = member_entry(body) if self._member and not kept else body
