"""Credentials: which topics a member may publish to and subscribe to (as NATS subject
permissions), issued by the cluster and checked by its scope managers and members.

A credential names its holder and two lists of topic names and patterns, `publish` and
`subscribe`. Its token is that description and an HMAC-SHA256 under a key derived from the cluster
key (`derive`): only a holder of the cluster key issues one, and every scope manager checks one.
A process that connects with a credential (`connect(credential=...)`) registers its member with
it; then
- its scope manager refuses a publisher or an explicit subscription outside the lists with
  `PermissionDenied` (at the caller), and a pattern subscription covers only the topics the
  credential lets it read;
- no channel of a topic it may not read is laid to it, not even to forward;
- its publish patterns travel with its entry in the member directory and its scope's views, and
  a member that receives a run published by it, of a topic outside them, drops it, counted as
  `forbidden` (a process that bypassed the API still cannot publish there).

What this does not do: the member's process holds the cluster key, since every datagram is sealed
under it (one group key; `netio.auth`). A process that misuses that key directly (forging another
member's id) is outside what credentials enforce; they bound what a member does through scopecast
and what its datagrams may carry, as NATS' permissions bound a client of a trusted server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass

from scopecast.actors.errors import PermissionDenied
from scopecast.netio.topic_names import check_subscription, is_pattern, name_filter

PREFIX = "scc1"
MAX_TOKEN = 16_384
MAX_PATTERNS = 256


@dataclass(frozen=True)
class Credential:
    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise PermissionDenied(f"a credential's name is 1 to 200 characters, not "
                                   f"{self.name!r:.80}")
        for field, names in (("publish", self.publish), ("subscribe", self.subscribe)):
            if len(names) > MAX_PATTERNS:
                raise PermissionDenied(f"a credential lists at most {MAX_PATTERNS} {field} names")
            for n in names:
                check_subscription(n)  # (InvalidConfig)
        object.__setattr__(self, "_may_publish", name_filter(self.publish))
        object.__setattr__(self, "_may_read", name_filter(self.subscribe))

    def may_publish(self, topic: str) -> bool:
        return self._may_publish(topic)

    def may_read(self, topic: str) -> bool:
        """Whether messages of `topic` may reach the holder."""
        return self._may_read(topic)

    def may_subscribe(self, name: str) -> bool:
        """A topic name it may read, or a pattern that one of its subscribe patterns covers as
        a whole (`flights/*` covers `flights/J*` and `flights/*`; a pattern it may not take
        whole is refused rather than quietly narrowed)."""
        if not is_pattern(name):
            return self.may_read(name)
        return any(p == name or _covers(p, name) for p in self.subscribe)

    def describe(self) -> dict:
        return {"name": self.name, "publish": list(self.publish),
                "subscribe": list(self.subscribe)}


def _covers(outer: str, inner: str) -> bool:
    """Every name pattern `inner` matches, pattern `outer` matches, judged part by part: a part
    `*` covers any part; else a part of inner with a wildcard only the same part, and a literal
    part whatever matches it."""
    a, b = outer.split("/"), inner.split("/")
    return len(a) == len(b) and all(
        x == "*" or x == y or (not is_pattern(y) and name_filter([x])(y))
        for x, y in zip(a, b, strict=True))


def derive(cluster_key: bytes) -> bytes:
    """The key credentials are signed with (never the cluster key itself)."""
    return hmac.digest(cluster_key, b"scopecast credentials v1", "sha256")


def issue(cluster_key: bytes, name: str, publish, subscribe) -> str:
    """A credential's token."""
    cred = Credential(name, tuple(publish), tuple(subscribe))
    body = _b64(json.dumps(cred.describe(), sort_keys=True, separators=(",", ":")).encode())
    mac = _b64(hmac.digest(derive(cluster_key), body.encode(), "sha256"))
    return f"{PREFIX}.{body}.{mac}"


def verify(cluster_key: bytes, token: str) -> Credential:
    """The credential a token carries; PermissionDenied unless this cluster issued it."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN or token.count(".") != 2:
        raise PermissionDenied("not a scopecast credential")
    prefix, body, mac = token.split(".")
    want = _b64(hmac.digest(derive(cluster_key), body.encode(), "sha256"))
    if prefix != PREFIX or not hmac.compare_digest(want, mac):
        raise PermissionDenied("this credential was not issued by this cluster (or was altered)")
    try:
        d = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        return Credential(d["name"], tuple(d["publish"]), tuple(d["subscribe"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise PermissionDenied(f"a malformed credential: {exc}") from None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def digest(token: str) -> str:
    """A short name of a token for logs (never the token)."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]
