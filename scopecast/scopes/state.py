"""The root scope's durable state, in SQLite at `$SCOPECAST_HOME/state.db` (default
`~/.scopecast/state.db`) on the node that hosts the cluster scope manager; an embedded cluster's in
a temporary directory of its own, removed when it ends (`connect`).

It holds what must survive the scope manager's process: the cluster's identity, key and multicast
settings, topics with their session numbers, the member id counter and the member directory, the
plug-in library (each plug-in's manifest and files, by digest) and each administered scope's
settings. One state
directory serves one cluster at a time: two clusters running at once on one machine need distinct
`SCOPECAST_HOME`s (the tests and the benchmark harness use their own).

Given a `StateMirror`, every write is mirrored into Ray's GCS before it returns (a record of the
write, or an image of the whole database), under a generation the database counts ("generation"
in meta), and a store that opens takes the mirror's state when it is newer than its file: so a
root Ray restarts on another node has its state (scopes/state_mirror says how, and why the GCS).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
from pathlib import Path

from scopecast.actors.errors import IncompatibleVersion
from scopecast.scopes.state_mirror import Image, Mirrored, Record, StateMirror

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


def _writes(method):
    """A write of the store: once it is done (committed), the mirror gets it."""
    @functools.wraps(method)
    def write(self: ScopeStore, *args, **kwargs):
        out = method(self, *args, **kwargs)
        self._mirrored(method.__name__, args, kwargs)
        return out
    return write


class ScopeStore:
    """Small typed access to the state database; every write commits (WAL, synchronous=NORMAL)
    and, with a mirror, is mirrored before it returns."""

    def __init__(self, path: Path | None = None, mirror: StateMirror | None = None) -> None:
        self.path = path or state_path()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._mirror = mirror
        self._replaying = False
        self._image_due = True  # the mirror's next put is a whole image (see _mirrored)
        self.restored: int | None = None  # the generation taken from the mirror, if one was
        self.mirror_failures = 0
        found = self._load_mirror() if mirror is not None else None
        on_file = _generation_of(self.path)
        # the mirror as this file is (a root restarted on its own node): nothing to put again
        current = found is not None and _last_generation(found) == on_file and on_file > 0
        if found is not None and _last_generation(found) > on_file:
            self._replace_file(found.image)
        else:
            found = None
        self.path.touch(mode=0o600, exist_ok=True)  # it holds the cluster key: owner only
        os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._migrate()
        self.generation = int(self.get("generation") or 0)
        if found is not None:
            self._replay(found.records)
            self.restored = self.generation
            log.warning("%s: state restored from the GCS mirror (generation %d): this root ran "
                        "on another node before", self.path, self.generation)
        if current:
            self._image_due = False  # (its records continue the mirror's log)
        elif mirror is not None:  # the mirror from here on is this file, whole
            self._put_image()

    def _load_mirror(self) -> Mirrored | None:
        try:
            return self._mirror.load()
        except Exception as exc:  # (no GCS reachable: the file is all there is)
            log.warning("%s: the state mirror could not be read (%s); using the file", self.path,
                        exc)
            return None

    def _replace_file(self, image: Image) -> None:
        aside = self.path.with_name(self.path.name + ".restoring")
        aside.write_bytes(image.data)
        os.chmod(aside, 0o600)
        for stale in ("-wal", "-shm"):  # an old log must never be replayed onto the image
            self.path.with_name(self.path.name + stale).unlink(missing_ok=True)
        os.replace(aside, self.path)

    def _replay(self, records: list[Record]) -> None:
        """Apply the writes logged after the image, as they were made."""
        self._replaying = True
        try:
            for r in records:
                getattr(self, r.method)(*r.args, **r.kwargs)
                self.generation = r.generation
                self._put("generation", self.generation)
        finally:
            self._replaying = False

    def _mirrored(self, method: str, args: tuple, kwargs: dict) -> None:
        if self._mirror is None or self._replaying or self._db.in_transaction:
            return
        self.generation += 1
        self._put("generation", self.generation)
        if self._image_due or self._mirror.wants_image():
            self._put_image()
            return
        try:
            if not self._mirror.record(Record(self.generation, method, list(args), kwargs)):
                self._put_image()  # (too large for a record)
        except Exception as exc:  # the GCS is Ray's: without it little else works either
            self._failed(exc)

    def _put_image(self) -> None:
        try:
            self._mirror.image(Image(self.generation, self._db.serialize()))
            self._image_due = False
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """A put the GCS refused: counted, and the next put is a whole image (a restore stops
        at a gap in the log)."""
        self._image_due = True
        self.mirror_failures += 1
        if self.mirror_failures in (1, 10, 100) or self.mirror_failures % 1000 == 0:
            log.error("%s: the state mirror failed (%d times so far): %s; a root restarted on "
                      "another node would miss this write", self.path, self.mirror_failures, exc)

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
                self._put("schema", target)
            log.info("%s: state schema %d -> %d", self.path, target - 1, target)

    # ------------------------------------------------------------------------------- meta

    def get(self, key: str):
        row = self._db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    @_writes
    def put(self, key: str, value) -> None:
        self._put(key, value)

    def _put(self, key: str, value) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)",
                         (key, json.dumps(value)))

    @_writes
    def next_id(self, counter: str, count: int = 1) -> int:
        """Atomically take the next `count` values of a counter (1, 2, ...; the first is
        returned); never reused."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            value = (self.get(counter) or 0) + 1
            self._put(counter, value + count - 1)
        return value

    # ----------------------------------------------------------------------------- topics

    def topics(self) -> list[dict]:
        return [json.loads(b) for (b,) in self._db.execute("SELECT body FROM topics ORDER BY id")]

    def put_topic(self, name: str, topic_id: int, body: dict) -> None:
        self.put_topics([(name, topic_id, body)])

    @_writes
    def put_topics(self, topics: list[tuple[str, int, dict]]) -> None:
        """Keep (name, id, body) of each topic, in one transaction."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR REPLACE INTO topics (name, id, body) VALUES (?, ?, ?)",
                                 [(n, i, json.dumps(b)) for n, i, b in topics])

    @_writes
    def delete_topic(self, name: str) -> None:
        self._db.execute("DELETE FROM topics WHERE name = ?", (name,))

    # ---------------------------------------------------------------------------- members

    def members(self) -> list[dict]:
        return [json.loads(b) for (b,) in self._db.execute("SELECT body FROM members ORDER BY id")]

    @_writes
    def put_member(self, member_id: int, body: dict) -> None:
        self._db.execute("INSERT OR REPLACE INTO members (id, body) VALUES (?, ?)",
                         (member_id, json.dumps(body)))

    @_writes
    def delete_member(self, member_id: int) -> None:
        self._db.execute("DELETE FROM members WHERE id = ?", (member_id,))

    # ---------------------------------------------------------------------------- plug-ins

    def plugins(self) -> list[dict]:
        return [json.loads(b) for (b,) in
                self._db.execute("SELECT body FROM plugins ORDER BY name, version")]

    @_writes
    def put_plugin(self, sha256: str, name: str, version: str, body: dict, files: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO plugins (sha256, name, version, body, files) "
                         "VALUES (?, ?, ?, ?, ?)", (sha256, name, version, json.dumps(body), files))

    def plugin_files(self, sha256: str) -> bytes | None:
        row = self._db.execute("SELECT files FROM plugins WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else row[0]

    @_writes
    def delete_plugin(self, sha256: str) -> None:
        self._db.execute("DELETE FROM plugins WHERE sha256 = ?", (sha256,))

    # ------------------------------------------------------------------------ scope settings

    def scope_admins(self) -> dict[str, dict]:
        return {p: json.loads(b) for p, b in
                self._db.execute("SELECT path, body FROM scope_admin ORDER BY path")}

    @_writes
    def put_scope_admin(self, path: str, body: dict | None) -> None:
        """Keep (None: forget) the settings of scope `path`."""
        if body is None:
            self._db.execute("DELETE FROM scope_admin WHERE path = ?", (path,))
        else:
            self._db.execute("INSERT OR REPLACE INTO scope_admin (path, body) VALUES (?, ?)",
                             (path, json.dumps(body)))

    def close(self) -> None:
        self._db.close()


def _last_generation(found: Mirrored) -> int:
    return found.records[-1].generation if found.records else found.image.generation


def _generation_of(path: Path) -> int:
    """The generation of the database at `path` (0: none, or not a state database)."""
    if not path.exists() or path.stat().st_size == 0:
        return 0
    try:
        db = sqlite3.connect(path)
        try:
            row = db.execute("SELECT v FROM meta WHERE k = 'generation'").fetchone()
        finally:
            db.close()
        return int(json.loads(row[0])) if row else 0
    except (sqlite3.Error, ValueError, TypeError):
        return 0
