"""The plug-in library the cluster scope manager keeps (SQLite, by digest): submission with
validation in a separate, resource-limited process, lookup by `name@version` or `sha256:<hex>`,
and the files for scope managers that run a plug-in."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from scopecast.actors import ray_private
from scopecast.actors.errors import PluginRejected
from scopecast.policies import trust
from scopecast.policies.registry import PluginRef, check_files, digest, parse_ref
from scopecast.timing import TIMING

VALIDATE_TIMEOUT = TIMING.plugin_validate_timeout
VALIDATE_MEMORY = 2 << 30
VALIDATE_CPU_SECONDS = 30


class PluginLibrary:
    def __init__(self, store, validator: str, trusted_keys: list[str] | None = None) -> None:
        """`validator`: the module that checks a submission in a process of its own (`python -m
        <validator> DIR MODULE`, printing one JSON line; see `scopecast.scopes.plugin_check`)."""
        self._store = store
        self._validator = validator
        self._trusted = [trust.public_key(k) for k in trusted_keys or ()]
        self._by_sha = {p["sha256"]: p for p in store.plugins()}

    @property
    def trusted(self) -> list[str]:
        return [trust.fingerprint(k) for k in self._trusted]

    async def submit(self, files: dict[str, bytes], signature: bytes | None = None) -> PluginRef:
        module = check_files(files)
        sha = digest(files)
        signer = trust.check(sha, signature, self._trusted)  # before running any of its code
        manifest = await _validate(files, module, self._validator)
        record = {"sha256": sha, "module": module, "manifest": manifest,
                  "kind": manifest["kind"], "name": manifest["name"],
                  "version": manifest["version"], "submitted": time.time(), "signer": signer,
                  "bytes": sum(len(b) for b in files.values())}
        same = self.find(f"{manifest['name']}@{manifest['version']}", missing_ok=True)
        if same is not None and same["sha256"] != sha:
            raise PluginRejected(f"{manifest['name']}@{manifest['version']} exists with other "
                                 "content; give the new code a new version")
        self._store.put_plugin(sha, manifest["name"], manifest["version"], record,
                               msgpack.packb(files, use_bin_type=True))
        self._by_sha[sha] = record
        return ref_of(record)

    def find(self, ref: str, missing_ok: bool = False) -> dict | None:
        kind, value = parse_ref(ref)
        if kind == "sha256":
            record = self._by_sha.get(value)
        else:
            record = next((p for p in self._by_sha.values()
                           if f"{p['name']}@{p['version']}" == value), None)
        if record is None and not missing_ok:
            raise PluginRejected(f"no plug-in {ref} in this cluster's library; submit it with "
                                 "cluster.submit_plugin(path) or `scopecast plugin submit PATH`")
        return record

    def files(self, sha: str) -> dict[str, bytes]:
        blob = self._store.plugin_files(sha)
        if blob is None:
            raise PluginRejected(f"no plug-in sha256:{sha} in the library")
        return msgpack.unpackb(blob, raw=False)

    def remove(self, ref: str, used_by: list[str]) -> PluginRef:
        record = self.find(ref)
        if used_by:
            raise PluginRejected(f"plug-in {ref} is used by topics {', '.join(used_by[:10])}; "
                                 "switch them to another policy first (update_topic)")
        self._store.delete_plugin(record["sha256"])
        del self._by_sha[record["sha256"]]
        return ref_of(record)

    def records(self) -> list[dict]:
        return sorted(self._by_sha.values(), key=lambda p: (p["name"], p["version"]))


def ref_of(record: dict) -> PluginRef:
    return PluginRef(record["kind"], record["name"], record["version"], record["sha256"])


def write_package(files: dict[str, bytes], root: Path, module: str) -> Path:
    """Write a plug-in's files under `root` as a package named `module` (a single-file plug-in
    becomes `module/__init__.py`); returns the package directory. Nothing else may read `root`
    meanwhile: see `materialize` for the node's shared cache."""
    for rel, body in files.items():
        target = root / _package_path(rel, module)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    return root / module


def _package_path(rel: str, module: str) -> str:
    return f"{module}/__init__.py" if rel == f"{module}.py" else rel


def plugin_cache() -> Path:
    """Where a node keeps the plug-ins its scope managers run (by digest)."""
    return Path(tempfile.gettempdir()) / "scopecast-plugins"


def materialize(files: dict[str, bytes], sha: str, module: str, cache: Path | None = None) -> Path:
    """The package of plug-in `sha` in the node's cache (`plugin_cache()`), as `write_package`
    lays it out, checked against its digest; returns the package directory.

    Every scope of the node that runs the plug-in calls this, and ships the directory it returns
    while others may be writing: so a plug-in's directory is written aside and renamed into
    place whole (a directory that is there is complete, and never changes), and what is read
    back from it must match `sha` before it is shipped. One found broken (a crash mid-write by
    an older version) is moved aside and written again."""
    cache = cache or plugin_cache()
    home = cache / sha
    for _ in range(MATERIALIZE_TRIES):
        if _intact(home, files, sha, module):
            return home / module
        cache.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(prefix=f".{sha[:16]}-", dir=cache))
        write_package(files, fresh, module)
        try:
            os.rename(fresh, home)  # atomic; refused while `home` holds anything
            continue
        except OSError:
            shutil.rmtree(fresh, ignore_errors=True)
        if home.exists() and not _intact(home, files, sha, module):
            aside = Path(tempfile.mkdtemp(prefix=f".{sha[:16]}-broken-", dir=cache))
            try:
                os.rename(home, aside / "old")
            except OSError:
                pass  # another scope moved it first
            shutil.rmtree(aside, ignore_errors=True)
    raise PluginRejected(f"plug-in sha256:{sha[:12]} could not be written to {home} intact")


MATERIALIZE_TRIES = 5


def _intact(home: Path, files: dict[str, bytes], sha: str, module: str) -> bool:
    """Whether `home` holds plug-in `sha`'s files whole (read back, digested)."""
    try:
        found = {rel: (home / _package_path(rel, module)).read_bytes() for rel in files}
    except OSError:
        return False
    return digest(found) == sha


def shipped(package: Path) -> dict:
    """A runtime_env whose py_modules carries `package` to whichever node runs the actor: the
    package is uploaded to Ray's GCS under a content-addressed URI, as `ray.init` does for
    job-level py_modules (an actor's own runtime_env accepts URIs only)."""
    return ray_private.upload_py_modules(str(package), str(package.parent))


def _limits() -> None:  # runs in the validator's process before it starts
    resource.setrlimit(resource.RLIMIT_DATA, (VALIDATE_MEMORY, VALIDATE_MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (VALIDATE_CPU_SECONDS, VALIDATE_CPU_SECONDS))


async def _validate(files: dict[str, bytes], module: str, validator: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="scopecast-validate-") as tmp:
        write_package(files, Path(tmp), module)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", validator, tmp, module,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=_limits)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), VALIDATE_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise PluginRejected(f"validation did not finish within {VALIDATE_TIMEOUT:.0f}s "
                                 "(does importing it, or its self-check, never return?)") from None
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if not lines:
        raise PluginRejected(f"the validator died (exit {proc.returncode}): "
                             f"{err.decode(errors='replace')[-500:]}")
    result = json.loads(lines[-1])
    if not result["ok"]:
        raise PluginRejected(f"plug-in rejected: {result['error']}")
    return result["manifest"]
