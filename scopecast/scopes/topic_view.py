"""The topics one scope knows: its copy of the topic table and a `TopicInfo` per entry.

The table travels down the hierarchy in pieces (`topic_table`); a scope keeps, beside it, the
entries as `TopicInfo`s by id and by name for layout and for its members' look-ups. They follow the
table one changed key at a time: rebuilding all of them on every change made creating 10,000
topics quadratic in every scope.
"""

from __future__ import annotations

from scopecast.scopes.topic_table import TopicTable
from scopecast.scopes.topics import TopicInfo


class ScopeTopics:
    """The table and its entries as `TopicInfo`s (`by_id`, `by_name`)."""

    def __init__(self) -> None:
        self.table = TopicTable()
        self.by_id: dict[int, TopicInfo] = {}
        self.by_name: dict[str, TopicInfo] = {}
        self._infos: dict[str, tuple[dict, TopicInfo]] = {}  # key -> (table entry, its info)

    def follow(self, keys: set[str] | None = None) -> None:
        """Bring the infos in line with the table: those of `keys` (None: all, keeping the infos
        whose entries are the same objects as before)."""
        if keys is None:
            old = self._infos
            self._infos = {k: old[k] if k in old and old[k][0] is v else (v, TopicInfo(**v))
                           for k, v in self.table.entries.items()}
            self.by_id = {int(k): info for k, (_v, info) in self._infos.items()}
            self.by_name = {info.name: info for info in self.by_id.values()}
            return
        for key in keys:
            old = self._infos.pop(key, None)
            if old is not None:
                self.by_id.pop(old[1].id, None)
                if self.by_name.get(old[1].name) is old[1]:
                    del self.by_name[old[1].name]
            body = self.table.entries.get(key)
            if body is not None:
                info = TopicInfo(**body)
                self._infos[key] = (body, info)
                self.by_id[info.id] = self.by_name[info.name] = info


def within(info: TopicInfo, path: str) -> bool:
    """Whether scope `path` lies inside the topic's root scope (where it may be used)."""
    root = info.root
    return root == "" or path == root or path.startswith(root + "/")
