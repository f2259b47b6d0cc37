"""The root scope's durable state, in SQLite at `$SCOPECAST_HOME/state.db` (default
`~/.scopecast/state.db`) on the node that hosts the cluster scope manager; an embedded cluster's in
a temporary directory of its own, removed when it ends (`connect`).

It holds what must survive the scope manager's process: the cluster's identity, key and multicast
settings, topics with their session numbers, the member id counter and the member directory, the
plug-in library (each plug-in's manifest and files, by digest) and each administered scope's
settings. One state
directory serves one cluster at a time: two clusters running at once on one machine need distinct
`SCOPECAST_HOME`s (the tests and the benchmark harness use their own).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

from scopecast.actors.errors import IncompatibleVersion

log = logging.getLogger(__name__)

# version 1: what a new database starts from; MIGRATIONS then take it to SCHEMA_VERSION
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, id INTEGER UNIQUE NOT NULL,
                                   body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS plugins (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL,
                                    version TEXT NOT NULL, body TEXT NOT NULL, files BLOB NOT NULL);
"""
# version -> the statements that take a database of the version before to it, each migration in
# one transaction (forward only: a database of a newer scopecast is refused, never misread)
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("CREATE INDEX IF NOT EXISTS plugins_by_name ON plugins (name, version)",),
    # each scope's administration (`scope_admin.ScopeAdmin.to_wire()`), by scope path
    3: ("CREATE TABLE IF NOT EXISTS scope_admin (path TEXT PRIMARY KEY, body TEXT NOT NULL)",),
}
SCHEMA_VERSION = max(MIGRATIONS)


def state_path() -> Path:
    home = os.environ.get("SCOPECAST_HOME") or "~/.scopecast"
    return Path(home).expanduser() / "state.db"


class ScopeStore:
    """Small typed access to the state database; every write commits (WAL, synchronous=NORMAL)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_path()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.touch(mode=0o600, exist_ok=True)  # it holds the cluster key: owner only
        os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """Take the database to SCHEMA_VERSION (a new one starts at 1: the version is stored as
        the "schema" meta key, a string "1" in version 1); IncompatibleVersion for a newer one."""
        stored = self.get("schema")
        try:
            version = 1 if stored is None else int(stored)
        except (TypeError, ValueError):
            version = None
        if version is None or version > SCHEMA_VERSION or version < 1:
            raise IncompatibleVersion.of(
                f"{self.path}: state schema", version if version is not None else stored,
                SCHEMA_VERSION, "written by a newer scopecast: run that one, or move the file "
                "away to start the cluster afresh (its key, topics and plug-ins are in it)")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                for statement in MIGRATIONS[target]:
                    self._db.execute(statement)
                self.put("schema", target)
            log.info("%s: state schema %d -> %d", self.path, target - 1, target)

    # ------------------------------------------------------------------------------- meta

    def get(self, key: str):
        row = self._db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)",
                         (key, json.dumps(value)))

    def next_id(self, counter: str, count: int = 1) -> int:
        """Atomically take the next `count` values of a counter (1, 2, ...; the first is
        returned); never reused."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            value = (self.get(counter) or 0) + 1
            self.put(counter, value + count - 1)
        return value

    # ----------------------------------------------------------------------------- topics

    def topics(self) -> list[dict]:
        return [json.loads(b) for (b,) in self._db.execute("SELECT body FROM topics ORDER BY id")]

    def put_topic(self, name: str, topic_id: int, body: dict) -> None:
        self.put_topics([(name, topic_id, body)])

    def put_topics(self, topics: list[tuple[str, int, dict]]) -> None:
        """Keep (name, id, body) of each topic, in one transaction."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO topics (name, id, body) VALUES (?, ?, ?)",
                                 [(n, i, json.dumps(b)) for n, i, b in topics])

    def delete_topic(self, name: str) -> None:
        self._db.execute("DELETE FROM topics WHERE name = ?", (name,))

    # ---------------------------------------------------------------------------- members

    def members(self) -> list[dict]:
        return [json.loads(b) for (b,) in self._db.execute("SELECT body FROM members ORDER BY id")]

    def put_member(self, member_id: int, body: dict) -> None:
        self._db.execute("INSERT OR REPLACE INTO members (id, body) VALUES (?, ?)",
                         (member_id, json.dumps(body)))

    def delete_member(self, member_id: int) -> None:
        self._db.execute("DELETE FROM members WHERE id = ?", (member_id,))

    # ---------------------------------------------------------------------------- plug-ins

    def plugins(self) -> list[dict]:
        return [json.loads(b) for (b,) in
                self._db.execute("SELECT body FROM plugins ORDER BY name, version")]

    def put_plugin(self, sha256: str, name: str, version: str, body: dict, files: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO plugins (sha256, name, version, body, files) "
                         "VALUES (?, ?, ?, ?, ?)", (sha256, name, version, json.dumps(body), files))

    def plugin_files(self, sha256: str) -> bytes | None:
        row = self._db.execute("SELECT files FROM plugins WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else row[0]

    def delete_plugin(self, sha256: str) -> None:
        self._db.execute("DELETE FROM plugins WHERE sha256 = ?", (sha256,))

    # ------------------------------------------------------------------------ scope settings

    def scope_admins(self) -> dict[str, dict]:
        return {p: json.loads(b) for p, b in
                self._db.execute("SELECT path, body FROM scope_admin ORDER BY path")}

    def put_scope_admin(self, path: str, body: dict | None) -> None:
        """Keep (None: forget) the settings of scope `path`."""
        if body is None:
            self._db.execute("DELETE FROM scope_admin WHERE path = ?", (path,))
        else:
            self._db.execute("INSERT OR REPLACE INTO scope_admin (path, body) VALUES (?, ?)",
                             (path, json.dumps(body)))

    def close(self) -> None:
        self._db.close()
