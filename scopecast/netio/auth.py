"""Packet protection: every datagram ends with a trailer that authenticates it under the cluster
key, and in an encrypting cluster everything after its header is encrypted too.

Three sealers (the cluster picks one; every member uses the same):

* ``gmac`` (default): AES-256-GCM over an empty plaintext with the datagram as associated data, i.e.
  GMAC (NIST SP 800-38D): authenticated, not encrypted: anyone on the LAN can read the payloads.
  Trailer: 12-byte nonce + 16-byte tag. With AES-NI and carry-less multiplication it costs about
  2 us per 64 KB datagram here, against 34 us for HMAC-SHA256: on the hot path that is the
  difference between the MAC dominating a member's CPU and not.
* ``aes-256-gcm`` (`connect(encrypt=True)`, `scopecast up --encrypt`): the same construction with
  the 28-byte header (wire.HEADER: magic, version, type, sender, channel, datagram number; what a
  receiver needs before it decrypts) as associated data and the rest as plaintext: payloads,
  routing tables and control bodies are encrypted; the header is authenticated, in clear. Same
  trailer, same cost per byte with AES-NI.
* ``hmac-sha256``: HMAC-SHA256 truncated to 16 bytes; the conservative choice, for deployments
  that prefer a hash-based MAC (authenticated, not encrypted).

Nonces (GCM) are a random 64-bit prefix per process plus a 32-bit counter, so they never repeat
under one key. The hot path seals and opens batches in C (`_datagram_batch.c`, the same
construction); these classes serve every other datagram.

Key rotation: a `KeyRing` holds the cluster's keys a process accepts, the one it seals with first,
under the rotation's generation; `ClusterKeys` is what the root hands down, a rotation's steps
(see scopes/key_rotation).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from scopecast.netio.native import BatchScanner, BatchSealer

KEY_SIZE = 32
MAX_TRAILER = 28
CLEAR = 28  # wire.HEADER.size: the bytes an encrypting sealer leaves in clear
NONCE, TAG = 12, 16


def new_cluster_key() -> bytes:
    return os.urandom(KEY_SIZE)


class Sealer(Protocol):
    """Seals outgoing datagrams and opens incoming ones under one cluster key."""

    name: str
    trailer_size: int
    encrypts: bool

    def seal(self, data) -> list:
        """The two buffers to send for datagram `data`, in one sendmsg: its body as sent (`data`
        itself where nothing is encrypted), then its trailer."""
        ...

    def open(self, data, n: int):
        """`data` as it was sealed (decrypted where it was encrypted, `data` itself where nothing
        was; the trailer kept, so its length is `data`'s) if `data[n:]` is its valid trailer;
        else None."""
        ...


class GcmSealer:
    """AES-256-GCM under the cluster key: GMAC, or (`encrypt`) the header authenticated and the
    rest encrypted."""

    trailer_size = NONCE + TAG

    def __init__(self, key: bytes, encrypt: bool = False) -> None:
        self.encrypts = encrypt
        self.name = "aes-256-gcm" if encrypt else "gmac"
        self._aead = AESGCM(_check_key(key))
        self._prefix = os.urandom(8)
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        if self._counter > 0xFFFFFFFF:
            self._prefix = os.urandom(8)
            self._counter = 1
        return self._prefix + self._counter.to_bytes(4, "big")

    def seal(self, data) -> list:
        nonce = self._nonce()
        if not self.encrypts:
            return [data, nonce + self._aead.encrypt(nonce, b"", data)]
        view = memoryview(data)
        out = memoryview(self._aead.encrypt(nonce, view[CLEAR:], view[:CLEAR]))
        return [bytes(view[:CLEAR]) + out[:-TAG], nonce + out[-TAG:]]

    def open(self, data, n: int):
        if n < CLEAR or len(data) - n != NONCE + TAG:
            return None
        view = memoryview(data)
        try:
            if not self.encrypts:
                self._aead.decrypt(view[n:n + NONCE], view[n + NONCE:], view[:n])
                return data
            plain = self._aead.decrypt(view[n:n + NONCE], bytes(view[CLEAR:n]) + view[n + NONCE:],
                                       view[:CLEAR])
        except InvalidTag:
            return None
        return bytes(view[:CLEAR]) + plain + bytes(view[n:])  # (as long as `data`: see open)


GmacAuthenticator = GcmSealer  # (its default: encrypt=False)


def sealed(sealer: Sealer, data) -> bytes:
    """`data` as one sealed datagram (what `seal`'s two buffers make on the wire)."""
    return b"".join(bytes(part) for part in sealer.seal(data))


class HmacAuthenticator:
    name = "hmac-sha256"
    trailer_size = 16
    encrypts = False

    def __init__(self, key: bytes) -> None:
        self._key = _check_key(key)

    def sign(self, data) -> bytes:
        return hmac.digest(self._key, data, "sha256")[:16]

    def check(self, data: bytes, n: int) -> bool:
        if n <= 0 or len(data) - n != 16:
            return False
        mac = hmac.digest(self._key, memoryview(data)[:n], "sha256")[:16]
        return hmac.compare_digest(mac, data[n:])

    def seal(self, data) -> list:
        return [data, self.sign(data)]

    def open(self, data, n: int):
        return data if self.check(data, n) else None


AUTHENTICATORS = {"gmac": GcmSealer, "aes-256-gcm": lambda key: GcmSealer(key, encrypt=True),
                  "hmac-sha256": HmacAuthenticator}
ENCRYPTING = "aes-256-gcm"


HEX_KEY = KEY_SIZE * 2
MAX_RING = 2  # a generation's key, and while its rotation is under way the one before


# the steps of a rotation (ClusterKeys.step): its new key accepted everywhere before anyone seals
# with it, and everyone sealing with it before the old one is refused
ANNOUNCED, SEALING, RETIRED = 0, 1, 2
STEPS = ("announced", "sealing", "retired")


@dataclass(frozen=True, slots=True)
class ClusterKeys:
    """The cluster's keys as the root hands them down (delegations, member views, agent hosts):
    a rotation's generation, the keys accepted (hex, the generation's new key first, then the
    old one while it is still accepted) and its step. ANNOUNCED: both accepted, the old one
    seals; SEALING: both accepted, the new one seals; RETIRED: the new one alone. Generation 0:
    none known (a scope before its first delegation). `describe` shows no key."""

    generation: int = 0
    keys: tuple[str, ...] = ()
    step: int = RETIRED

    @classmethod
    def first(cls, key: bytes) -> ClusterKeys:
        return cls(1, (bytes(key).hex(),))

    def rotated(self, new: bytes) -> ClusterKeys:
        """A rotation's first step: `new` announced under the next generation."""
        return ClusterKeys(self.generation + 1, (bytes(new).hex(), self.keys[0]), ANNOUNCED)

    def advanced(self) -> ClusterKeys:
        """The rotation's next step (the new key seals; then the old one is retired)."""
        if self.step == ANNOUNCED:
            return ClusterKeys(self.generation, self.keys, SEALING)
        return ClusterKeys(self.generation, self.keys[:1], RETIRED)

    def supersedes(self, other: ClusterKeys) -> bool:
        """Whether a process holding `other` takes this ring: a later generation or step (never
        back: rings of one rotation may arrive out of order along different paths)."""
        return (self.generation, self.step) > (other.generation, other.step)

    def raw(self) -> list[bytes]:
        """The keys accepted, the one that seals first (what KeyRing.set takes)."""
        keys = [bytes.fromhex(k) for k in self.keys]
        return keys[::-1] if self.step == ANNOUNCED else keys

    def describe(self) -> dict:
        return {"generation": self.generation, "accepted": len(self.keys),
                "step": STEPS[self.step]}

    def to_wire(self) -> list:
        return [self.generation, list(self.keys), self.step]

    @classmethod
    def from_wire(cls, body) -> ClusterKeys:
        """ValueError, TypeError: not a ring of 1 to MAX_RING keys of KEY_SIZE bytes in a step
        that fits it."""
        generation, keys, step = body
        keys = tuple(str(k) for k in keys)
        if not isinstance(generation, int) or generation < 0 or len(keys) > MAX_RING \
                or (generation > 0) != bool(keys) or step not in (ANNOUNCED, SEALING, RETIRED) \
                or (len(keys) == 2) != (step != RETIRED) \
                or any(len(k) != HEX_KEY or bytes.fromhex(k).hex() != k for k in keys):
            raise ValueError(f"malformed key ring (generation {generation!r}, {len(keys)} keys, "
                             f"step {step!r})")
        return cls(generation, keys, step)


class KeyRing:
    """A Sealer over several keys of one authenticator: seals with the first, opens with any
    (the first tried first). `seal` and, with one key, `open` are the first sealer's own
    methods, so a process not rotating pays no call for the ring. With `batches` (a member's),
    it also holds the C batch sealer and scanner of the first key (`_datagram_batch`; AES-GCM
    only, None without the extension): the scanner refuses a batch under another key, which
    then takes the one-by-one path and `open`."""

    def __init__(self, name: str, keys, generation: int = 1, batches: bool = False) -> None:
        self.name = name
        self._batches = batches and name in ("gmac", ENCRYPTING) and BatchSealer is not None
        self.set(keys, generation)

    def set(self, keys, generation: int) -> None:
        """Accept `keys` (at least one) from now on, sealing with the first."""
        sealers = tuple(authenticator(self.name, bytes(k)) for k in keys)
        if not sealers:
            raise ValueError("a key ring needs a key")
        self.keys = tuple(bytes(k) for k in keys)
        self.generation = generation
        self.trailer_size, self.encrypts = sealers[0].trailer_size, sealers[0].encrypts
        self._sealers = sealers
        self.seal = sealers[0].seal
        self.open = sealers[0].open if len(sealers) == 1 else self._open_any
        secret = self.name == ENCRYPTING
        self.batch_sealer = BatchSealer(self.keys[0], secret) if self._batches else None
        self.batch_scanner = BatchScanner(self.keys[0], secret) if self._batches else None

    def _open_any(self, data, n: int):
        for sealer in self._sealers:
            opened = sealer.open(data, n)
            if opened is not None:
                return opened
        return None


def authenticator(name: str, key: bytes) -> Sealer:
    try:
        return AUTHENTICATORS[name](key)
    except KeyError:
        raise ValueError(f"unknown packet authenticator {name!r}; choose one of "
                         f"{', '.join(AUTHENTICATORS)}") from None


def _check_key(key: bytes) -> bytes:
    if len(key) != KEY_SIZE:
        raise ValueError(f"cluster key must be {KEY_SIZE} bytes, got {len(key)}")
    return bytes(key)
