"""Plug-in modules: how they are packed, named and identified (thesis 3.2.3: policies "stored
online in protocol libraries, downloaded as needed").

A plug-in is a single `.py` file or a package directory. It is identified by its content: the
SHA-256 over its files' (relative path, bytes) pairs in path order, `__pycache__` left out, so the
same code has the same digest wherever it is packed. It declares itself with a module-level manifest

    __scopecast_plugin__ = {"kind": "policy", "name": "ring", "version": "1.0",
                            "api_version": 1, "classes": ["RingPolicy"]}

and is referred to as `name@version` or `sha256:<hex>`. Plug-ins run with the rights of a Ray
worker in a process of their own: that isolates faults, not privileges; signatures (`trust`) are
the trust boundary.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from scopecast.actors.errors import PluginRejected

MAX_FILES = 256
MAX_BYTES = 4 << 20
KINDS = ("policy", "recovery")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_VERSION = re.compile(r"^[A-Za-z0-9_.+\-]{1,32}$")
PLUGIN_PREFIX = "sha256:"  # how a plug-in is named by its digest, and keyed where it runs
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


@dataclass(slots=True, frozen=True)
class PluginRef:
    """What `submit_plugin` returns: a stored plug-in's kind, name, version and digest."""

    kind: str
    name: str
    version: str
    sha256: str

    def __str__(self) -> str:
        return f"{self.name}@{self.version} (sha256:{self.sha256[:12]}...)"


def collect(path: str | Path) -> dict[str, bytes]:
    """The files of a plug-in at `path` (a `.py` file or a package directory), by relative path."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".py":
            raise PluginRejected(f"{path}: a plug-in is a .py file or a package directory")
        files = {path.name: path.read_bytes()}
    elif path.is_dir():
        if not (path / "__init__.py").is_file():
            raise PluginRejected(f"{path}: a package directory needs an __init__.py")
        files = {}
        for f in sorted(path.rglob("*")):
            rel = f.relative_to(path.parent)
            if f.is_file() and "__pycache__" not in rel.parts and f.suffix != ".pyc":
                files[rel.as_posix()] = f.read_bytes()
                if len(files) > MAX_FILES:
                    raise PluginRejected(f"{path}: more than {MAX_FILES} files")
    else:
        raise PluginRejected(f"{path}: no such file or directory")
    check_files(files)
    return files


def check_files(files: dict[str, bytes]) -> str:
    """Check the shape of a plug-in's files (as they arrive from anywhere); returns its module
    name (the file's stem, or the package's name)."""
    if not isinstance(files, dict) or not files or len(files) > MAX_FILES:
        raise PluginRejected(f"a plug-in has 1 to {MAX_FILES} files")
    if sum(len(b) for b in files.values() if isinstance(b, bytes)) > MAX_BYTES:
        raise PluginRejected(f"a plug-in is at most {MAX_BYTES >> 20} MiB")
    tops = set()
    for rel, body in files.items():
        parts = rel.split("/") if isinstance(rel, str) else []
        if (not isinstance(body, bytes) or not parts or any(p in ("", ".", "..") for p in parts)
                or rel.startswith("/") or "\\" in rel):
            raise PluginRejected(f"bad file name in plug-in: {rel!r:.80}")
        tops.add(parts[0])
    if len(tops) != 1:
        raise PluginRejected("a plug-in is one module or one package")
    top = tops.pop()
    if top.endswith(".py") and len(files) == 1:
        module = top[:-3]
    elif f"{top}/__init__.py" in files:
        module = top
    else:
        raise PluginRejected("a plug-in is a .py file or a package with an __init__.py")
    if not _NAME.match(module):
        raise PluginRejected(f"plug-in module name {module!r} is not a Python identifier")
    return module


def digest(files: dict[str, bytes]) -> str:
    """SHA-256 over the sorted (relative path, bytes) pairs."""
    h = hashlib.sha256()
    for rel in sorted(files):
        body = files[rel]
        h.update(rel.encode())
        h.update(b"\0")
        h.update(len(body).to_bytes(8, "big"))
        h.update(body)
    return h.hexdigest()


def check_manifest(manifest, api_version: int) -> dict:
    """The manifest's fields, checked; PluginRejected saying what is wrong."""
    if not isinstance(manifest, dict):
        raise PluginRejected("the module has no __scopecast_plugin__ manifest dict")
    want = {"kind", "name", "version", "api_version", "classes"}
    if set(manifest) != want:
        raise PluginRejected(f"the manifest has keys {sorted(manifest)}, expected {sorted(want)}")
    if manifest["kind"] not in KINDS:
        raise PluginRejected(f"manifest kind {manifest['kind']!r} is not one of {KINDS}")
    if not isinstance(manifest["name"], str) or not _NAME.match(manifest["name"]):
        raise PluginRejected(f"manifest name {manifest['name']!r} is not an identifier")
    if not isinstance(manifest["version"], str) or not _VERSION.match(manifest["version"]):
        raise PluginRejected(f"manifest version {manifest['version']!r} is not a version string")
    if manifest["api_version"] != api_version:
        raise PluginRejected(f"the plug-in is written for API version {manifest['api_version']!r}; "
                             f"this scopecast has API version {api_version}")
    classes = manifest["classes"]
    if (not isinstance(classes, list) or not classes
            or not all(isinstance(c, str) and _NAME.match(c) for c in classes)):
        raise PluginRejected("manifest classes must be a non-empty list of class names")
    return dict(manifest)


def parse_ref(ref: str) -> tuple[str, str]:
    """("sha256", hex) or ("name", "name@version") for a plug-in reference."""
    m = _DIGEST.match(ref)
    if m:
        return "sha256", m.group(1)
    name, sep, version = ref.partition("@")
    if sep and _NAME.match(name) and _VERSION.match(version):
        return "name", ref
    raise PluginRejected(f"{ref!r} is not a plug-in reference (name@version or sha256:<hex>)")
