"""Signed plug-ins: Ed25519 signatures over a plug-in's digest.

A cluster deployed with trusted public keys (`connect(trusted_keys=[...])`, `scopecast up
--trusted-key FILE`) accepts only plug-ins signed by one of them; a cluster without keys (the
default for an embedded local one) accepts unsigned plug-ins. A signature covers the digest, so it
vouches for exactly the code that was validated and stored.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scopecast.actors.errors import PluginRejected

CONTEXT = b"scopecast-plugin-v1:"  # domain separation: these signatures mean nothing elsewhere


def keygen(path: str | Path) -> tuple[Path, Path]:
    """Write a new private key to `path` (owner-only) and its public key to `path`.pub."""
    path = Path(path)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    public = path.with_name(path.name + ".pub")
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return path, public


def sign(sha256: str, private_key: str | Path) -> bytes:
    key = serialization.load_pem_private_key(Path(private_key).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise PluginRejected(f"{private_key} is not an Ed25519 private key")
    return key.sign(CONTEXT + bytes.fromhex(sha256))


def public_key(pem: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM text (or a path to a PEM file)."""
    if isinstance(pem, str) and not pem.lstrip().startswith("-----"):
        pem = Path(pem).read_bytes()
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, Ed25519PublicKey):
        raise PluginRejected("trusted keys must be Ed25519 public keys")
    return key


def fingerprint(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def check(sha256: str, signature: bytes | None, trusted: list[Ed25519PublicKey]) -> str | None:
    """The fingerprint of the trusted key that signed the digest (None when no key is trusted
    and the plug-in is unsigned); PluginRejected saying why otherwise."""
    if not trusted:
        return None
    if not signature:
        raise PluginRejected("this cluster accepts only signed plug-ins: sign it with "
                             "`scopecast plugin submit --sign KEY` by a key the cluster trusts")
    for key in trusted:
        try:
            key.verify(signature, CONTEXT + bytes.fromhex(sha256))
            return fingerprint(key)
        except InvalidSignature:
            continue
    raise PluginRejected("the plug-in's signature is not by any key this cluster trusts")
