"""What each scope's administrator chose (thesis 3.2.3, 3.2.9-3.2.10: "every scope manager maintains
a mapping from topics to their forwarding policies"; "in each department, a different protocol
could be used locally"): pure, no Ray, no I/O.

A scope's `ScopeAdmin` names a default forwarding policy and recovery protocol for the topics
within the scope, and overrides by topic name or pattern. Either may be left unset, and is then
inherited.

**Precedence**, for one topic at one scope, each of the two choices on its own:
1. the nearest scope, this one first and then each ancestor up to the root, whose settings set it
   for the topic; within one scope, its overrides in the order given (the first whose pattern
   matches and that sets the choice), then its default;
2. where no scope on the path sets it, the topic's own (`create_topic(policy=, recovery=)`).

So an administrator's setting wins over a topic's own, and a scope nearer the members wins over
one further up. A topic created with `recovery="none"` stays unreliable: a scope chooses how
reliable topics are recovered, not whether.

**Recovery domains across heterogeneous scopes.** A topic's recovery *chain* at a scope is its
protocol at every scope from the root down to this one. A scope's recovery domains are keyed by
the chain (`chain_key`: just the protocol's name where the whole chain uses one protocol, which
is every domain of a cluster nobody configured). A child scope's domain of chain `k` is a member
of its parent's domain of chain `upper_key(k)`, which may run another protocol: the parent's
agent standing for the child takes the aggregate of the child's domain through the protocol-neutral
summary and instructions of `agents.api` (thesis 3.2.9-3.2.10: inter-department recovery through
each department's aggregate state). A child with two domains under one parent domain (its topics
recovered by two protocols that the parent recovers with one) is two members of it
(`domain_member`).

The root holds every scope's settings in its state database; each scope gets, with its parent's
delegation, those of its ancestors, itself and its subtree (`subtree`).

A recovery plug-in found faulty anywhere (it raised, hung, outgrew its memory or killed its
process: `recovery_domain`) is *failed* cluster-wide: every scope then runs FALLBACK_RECOVERY
wherever a chain named it, so the chains stay consistent between levels.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from scopecast.actors.errors import InvalidConfig
from scopecast.agents.builtin import NO_RECOVERY
from scopecast.netio.topic_names import check_subscription, is_pattern, topic_matcher
from scopecast.policies.registry import PLUGIN_PREFIX

ADMIN_VERSION = 1
MAX_OVERRIDES = 64  # per scope
# cooperative caching (QSM; the token ring's options): which members of each partition of a
# domain keep peers' messages until stable, and how many agents a partition has
CACHING = {"cachers": (1, 64), "partition": (2, 64)}
CHAIN_SEP = ">"
FALLBACK_RECOVERY = "token_ring"  # where a failed recovery plug-in was chosen


@dataclass(frozen=True, slots=True)
class Choice:
    """A policy and a recovery protocol, either unset (None: inherited); a plug-in's digest
    beside its name (`ring@1.0` and the sha256 of its module)."""

    policy: str | None = None
    recovery: str | None = None
    plugin: str = ""
    recovery_plugin: str = ""

    def key(self, field: str) -> str | None:
        """The policy actor's or the recovery domain's key: a built-in's name or sha256:<hex>."""
        name, digest = ((self.policy, self.plugin) if field == "policy"
                        else (self.recovery, self.recovery_plugin))
        if name is None:
            return None
        return f"{PLUGIN_PREFIX}{digest}" if digest else name

    def to_wire(self) -> dict:
        return {k: v for k, v in (("policy", self.policy), ("recovery", self.recovery),
                                  ("plugin", self.plugin),
                                  ("recovery_plugin", self.recovery_plugin)) if v}

    @classmethod
    def from_wire(cls, body) -> Choice:
        if not isinstance(body, Mapping):
            raise InvalidConfig(f"a scope's choice is a mapping, not {body!r:.80}")
        unknown = set(body) - {"policy", "recovery", "plugin", "recovery_plugin"}
        if unknown:
            raise InvalidConfig(f"unknown keys in a scope's choice: {sorted(unknown)}")
        values = {k: body.get(k) for k in ("policy", "recovery")}
        for k, v in values.items():
            if v is not None and (not isinstance(v, str) or not v or len(v) > 200):
                raise InvalidConfig(f"a scope's {k} is a name, not {v!r:.80}")
        if values["recovery"] == NO_RECOVERY:
            raise InvalidConfig("a scope chooses how reliable topics are recovered, not whether: "
                                "recovery='none' is a topic's own setting")
        digests = {k: body.get(k) or "" for k in ("plugin", "recovery_plugin")}
        for v in digests.values():
            if not isinstance(v, str) or len(v) > 64:
                raise InvalidConfig(f"bad plug-in digest {v!r:.80}")
        return cls(values["policy"], values["recovery"], digests["plugin"],
                   digests["recovery_plugin"])


@lru_cache(maxsize=1024)
def _matcher(pattern: str):
    return topic_matcher(pattern).match if is_pattern(pattern) else pattern.__eq__


@dataclass(frozen=True, slots=True)
class ScopeAdmin:
    """One scope's settings: a default and overrides by topic name or pattern, in order."""

    default: Choice = Choice()
    overrides: tuple[tuple[str, Choice], ...] = ()
    caching: tuple[tuple[str, int], ...] = ()  # ("cachers", n), ("partition", n): see CACHING

    def rule(self, topic: str, field: str) -> Choice | None:
        """The choice that sets `field` for `topic` here (first matching override, then the
        default), or None."""
        for pattern, choice in self.overrides:
            if choice.key(field) is not None and _matcher(pattern)(topic):
                return choice
        return self.default if self.default.key(field) is not None else None

    @property
    def empty(self) -> bool:
        return self.default == Choice() and not self.overrides and not self.caching

    def to_wire(self) -> dict:
        return {"v": ADMIN_VERSION, "default": self.default.to_wire(),
                "overrides": [[p, c.to_wire()] for p, c in self.overrides],
                **dict(self.caching)}

    @classmethod
    def from_wire(cls, body) -> ScopeAdmin:
        """InvalidConfig for anything but what `to_wire` makes (this version)."""
        if not isinstance(body, Mapping) or body.get("v") != ADMIN_VERSION:
            raise InvalidConfig(f"scope settings of another version or shape: {body!r:.80}")
        overrides = body.get("overrides") or []
        if not isinstance(overrides, list) or len(overrides) > MAX_OVERRIDES:
            raise InvalidConfig(f"a scope has at most {MAX_OVERRIDES} overrides")
        out = []
        for item in overrides:
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise InvalidConfig(f"an override is [pattern, choice], not {item!r:.80}")
            out.append((check_subscription(item[0]), Choice.from_wire(item[1])))
        caching = []
        for key, (low, high) in CACHING.items():
            value = body.get(key)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidConfig(f"a scope's {key} is a whole number in [{low}, {high}], "
                                    f"not {value!r:.40}")
            caching.append((key, value))
        unknown = set(body) - {"v", "default", "overrides", *CACHING}
        if unknown:
            raise InvalidConfig(f"unknown keys in scope settings: {sorted(unknown)}")
        return cls(Choice.from_wire(body.get("default") or {}), tuple(out), tuple(caching))

    def describe(self) -> dict:
        """For status and the CLI: names only (digests are the root's)."""
        def names(c: Choice) -> dict:
            return {k: v for k, v in (("policy", c.policy), ("recovery", c.recovery)) if v}
        return {"default": names(self.default),
                "overrides": [{"pattern": p, **names(c)} for p, c in self.overrides],
                **dict(self.caching)}


# ------------------------------------------------------------------------- recovery chains

def chain_key(chain: Iterable[str]) -> str:
    """A recovery domain's key from its chain of protocols (root first)."""
    chain = tuple(chain)
    return chain[0] if len(set(chain)) == 1 else CHAIN_SEP.join(chain)


def protocol_of(key: str) -> str:
    """The protocol a domain of chain `key` runs (its last)."""
    return key.rsplit(CHAIN_SEP, 1)[-1]


def upper_key(key: str) -> str:
    """The key of the parent's domain a child's domain `key` is a member of."""
    chain = key.split(CHAIN_SEP)
    return key if len(chain) == 1 else chain_key(chain[:-1])


def domain_member(child: str, key: str) -> str:
    """The name under which child scope `child`'s domain `key` is a member of its parent's domain
    `upper_key(key)`: the child's own name where both run one protocol, else the name with the
    child's protocol (a child has at most one domain per protocol under one parent domain)."""
    protocol = protocol_of(key)
    if protocol == protocol_of(upper_key(key)):
        return child
    short = protocol[:len(PLUGIN_PREFIX) + 16] if protocol.startswith(PLUGIN_PREFIX) else protocol
    return f"{child}~{short}"


def _ancestry(path: str) -> list[str]:
    """The scope paths from `path` up to the root ("")."""
    parts = path.split("/") if path else []
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def related(path: str, other: str) -> bool:
    """Whether `other` is `path`, one of its ancestors, or inside its subtree."""
    def under(a: str, b: str) -> bool:  # a is b or inside b
        return b == "" or a == b or a.startswith(b + "/")
    return under(path, other) or under(other, path)


class ScopeChoices:
    """The settings that apply at scope `path` (its own and its ancestors', and those of its
    subtree to hand down) and what they make of each topic."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.admins: dict[str, ScopeAdmin] = {}
        self.failed: frozenset[str] = frozenset()  # recovery plug-ins replaced everywhere
        self._up = _ancestry(path)          # this scope, then each ancestor
        self._levels = self._up[::-1]       # the root first: a recovery chain's order
        self._cache: dict[tuple, tuple[str, str]] = {}

    def set(self, admins: Mapping[str, ScopeAdmin]) -> bool:
        """Take the settings (of this scope's ancestors, itself and its subtree); True if those
        that apply here changed."""
        admins = {p: a for p, a in admins.items() if related(self.path, p) and not a.empty}
        if admins == self.admins:
            return False
        before = {p: self.admins.get(p) for p in self._up}
        self.admins = admins
        self._cache.clear()
        return before != {p: admins.get(p) for p in self._up}

    def set_failed(self, failed) -> bool:
        """Take the recovery plug-ins found faulty (keys "sha256:<hex>"); True if that changed."""
        failed = frozenset(failed)
        if failed == self.failed:
            return False
        self.failed = failed
        self._cache.clear()
        return True

    def subtree(self, child: str) -> dict[str, ScopeAdmin]:
        """What child scope `child` gets handed down."""
        return {p: a for p, a in self.admins.items() if related(child, p)}

    def _at(self, level_up: list[str], topic: str, field: str) -> str | None:
        for scope in level_up:
            admin = self.admins.get(scope)
            if admin is not None:
                choice = admin.rule(topic, field)
                if choice is not None:
                    return choice.key(field)
        return None

    def keys(self, info) -> tuple[str, str]:
        """(policy key, recovery domain key) of topic `info` (a `TopicInfo`) here."""
        if not self.admins and not self.failed:
            return info.policy_key, info.recovery_key
        ck = (info.id, info.session, info.name, info.policy, info.plugin, info.recovery_key)
        got = self._cache.get(ck)
        if got is None:
            policy = self._at(self._up, info.name, "policy") or info.policy_key
            recovery = info.recovery_key
            if recovery != NO_RECOVERY:
                chain = (self._at(self._up[self._up.index(level):], info.name, "recovery")
                         or recovery for level in self._levels)
                recovery = chain_key(FALLBACK_RECOVERY if p in self.failed else p for p in chain)
            got = self._cache[ck] = (policy, recovery)
            if len(self._cache) > 200_000:
                self._cache.clear()
        return got

    def caching(self) -> dict[str, int]:
        """The caching options of this scope's recovery domains: each from the nearest scope
        that sets it (none set: the protocol's defaults)."""
        out: dict[str, int] = {}
        for scope in reversed(self._up):  # the root first: nearer ones overwrite
            admin = self.admins.get(scope)
            if admin is not None:
                out.update(admin.caching)
        return out

    def policy_key(self, info) -> str:
        if not self.admins:  # (every scope of a cluster nobody configured: per topic, per view)
            return info.policy_key
        return self.keys(info)[0]

    def recovery_key(self, info) -> str:
        if not self.admins and not self.failed:
            return info.recovery_key
        return self.keys(info)[1]

    def describe(self) -> dict:
        """For status: this scope's own settings and those it inherits."""
        own = self.admins.get(self.path)
        return {"settings": own.describe() if own else None,
                "inherited": {p or "/": self.admins[p].describe() for p in self._up[1:]
                              if p in self.admins},
                **({"failed_recovery": sorted(self.failed)} if self.failed else {})}
