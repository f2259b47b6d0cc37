"""The root's state, mirrored into Ray's GCS so that it survives the loss of the root's node.

The root keeps its state in SQLite on its own node (`scopes/state`): fast, transactional,
migrated forward. Ray restarts the root on *any* node (`max_restarts=-1`), where that file is not.
So every write of the root's store is also put into the GCS's key-value store before the call
that wrote returns, and a root that starts takes the mirror's state when it is newer than the
file it finds (or finds none). Writes are numbered by the database itself (its generation), so
"newer" is exact: a root moved back to a node it ran on before does not take up the file it left
there.

What is mirrored: an image of the whole database now and then, and between images a log of the
writes since, each write one record (the store method and its arguments: every write of the store
is a deterministic function of the state and those). A write costs one small put, whatever the
size of the state (100,000 topics are a 24 MiB database); the log is folded into a new image
when it has grown to a quarter of the image (or LOG_MOST records), and at once after a restore.

Why the GCS and not the LAN scope managers: the GCS is the one place every Ray process reaches
and the only one that outlives every worker node; without Ray's GCS fault tolerance the head node
is Ray's single point of failure anyway, and with it (an external Redis, `RAY_REDIS_ADDRESS`) the
GCS and so this mirror survive the head too. Replicas on the LAN scope managers would add a quorum
protocol for no node that the GCS does not already outlive.

Layout in scopecast's namespace of the store: `root-state` holds a small JSON head (the image's
generation, chunk count, size, SHA-256 of the compressed image); `root-state/<generation>/<i>` the
zlib-compressed image in chunks of CHUNK bytes (the store's values are gRPC messages: no single
value is large); `root-state/log/<generation>` the write of that generation. A new image is
written chunks first, head last, then the old chunks and the log it covers are deleted, so a
reader sees one whole image or the one before it, with the log since.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from typing import NamedTuple

import msgpack

from scopecast.actors import ray_private

log = logging.getLogger(__name__)

HEAD = b"root-state"
LOG = HEAD + b"/log/"
CHUNK = 4 << 20
LEVEL = 1  # zlib: the image is mostly JSON; level 1 takes it to about a tenth, fast
LOG_MOST = 512  # records between images, at most
RECORD_MOST = 256 << 10  # a write larger than this (packed) goes as an image instead


class Image(NamedTuple):
    generation: int
    data: bytes  # the database, as sqlite3.Connection.serialize() gives it


class Record(NamedTuple):
    generation: int
    method: str   # the ScopeStore method that wrote
    args: list
    kwargs: dict


class Mirrored(NamedTuple):
    image: Image
    records: list[Record]  # the writes after the image, in order, without a gap


class StateMirror:
    """Puts and gets the root's state: `image` and `record` after each write (`ScopeStore`
    chooses which by `wants_image`), `load` when the store opens."""

    def __init__(self, kv=ray_private) -> None:
        self._kv = kv  # kv_get/kv_put/kv_delete/kv_keys (tests: a dict-backed stand-in)
        self._chunks: list[bytes] = []  # keys of the image in the store now
        self._logged: list[bytes] = []  # keys of the records since
        self._image_bytes = 0
        self._log_bytes = 0
        self.images = 0
        self.records = 0

    def wants_image(self) -> bool:
        """Whether the log has grown enough to be folded into a new image."""
        return not self._chunks or len(self._logged) >= LOG_MOST or \
            self._log_bytes > self._image_bytes // 4

    def image(self, image: Image) -> None:
        packed = zlib.compress(image.data, LEVEL)
        keys = [b"%s/%d/%d" % (HEAD, image.generation, i)
                for i in range(max(1, -(-len(packed) // CHUNK)))]
        for i, key in enumerate(keys):
            self._kv.kv_put(key, packed[i * CHUNK:(i + 1) * CHUNK])
        self._kv.kv_put(HEAD, json.dumps({
            "generation": image.generation, "chunks": len(keys), "bytes": len(packed),
            "sha256": hashlib.sha256(packed).hexdigest()}).encode())
        for key in [k for k in self._chunks if k not in keys] + self._logged:
            self._kv.kv_delete(key)
        self._chunks, self._logged = keys, []
        self._image_bytes, self._log_bytes = len(packed), 0
        self.images += 1

    def record(self, record: Record) -> bool:
        """Log one write; False if it is too large for a record (the caller takes an image)."""
        packed = msgpack.packb([record.method, record.args, record.kwargs], use_bin_type=True)
        if len(packed) > RECORD_MOST:
            return False
        key = LOG + b"%d" % record.generation
        self._kv.kv_put(key, packed)
        self._logged.append(key)
        self._log_bytes += len(packed)
        self.records += 1
        return True

    def load(self) -> Mirrored | None:
        """The newest whole image and the writes since, or None (none kept, or an image that does
        not check out: logged)."""
        raw = self._kv.kv_get(HEAD)
        if raw is None:
            return None
        try:
            head = json.loads(raw)
            generation, chunks = int(head["generation"]), int(head["chunks"])
            keys = [b"%s/%d/%d" % (HEAD, generation, i) for i in range(chunks)]
            packed = b"".join(self._kv.kv_get(k) or b"" for k in keys)
            if len(packed) != head["bytes"] or \
                    hashlib.sha256(packed).hexdigest() != head["sha256"]:
                raise ValueError("its chunks do not add up to the image the head describes")
            data = zlib.decompress(packed)
        except (ValueError, KeyError, TypeError, zlib.error) as exc:
            log.error("the state image in the GCS is unusable (%s): not restored", exc)
            return None
        self._chunks, self._image_bytes = keys, len(packed)
        records = self._records_after(generation)
        for key in self._kv.kv_keys(HEAD + b"/"):  # what a root left half-written
            if key not in keys and key not in self._logged:
                self._kv.kv_delete(key)
        return Mirrored(Image(generation, data), records)

    def _records_after(self, generation: int) -> list[Record]:
        """The logged writes after `generation`, up to the first gap (a write whose put failed:
        the store took an image at its next write, so nothing after a gap is newer than that
        image... unless the image failed too: then the gap is where the mirror ends)."""
        found = {}
        for key in self._kv.kv_keys(LOG):
            try:
                found[int(key[len(LOG):])] = key
            except ValueError:
                continue
        records = []
        while generation + 1 in found:
            generation += 1
            key = found[generation]
            raw = self._kv.kv_get(key)
            try:
                method, args, kwargs = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            except Exception as exc:  # (a garbled record: the mirror ends before it)
                log.error("state log record %d unreadable (%s): restored up to before it",
                          generation, exc)
                break
            records.append(Record(generation, method, args, kwargs))
            self._logged.append(key)
        return records
