"""The policy container of one scope (thesis 3.2.3).

Per topic it keeps what the topic's policy instance was last told (interested members, sources),
turns changes into the standard events, sends them to the policy actor, and applies the operations
that come back to the topic's channel set after checking them: an operation naming a non-member or
a non-source, or a malformed one, is ignored, logged and counted — a policy cannot make the scope
lay a channel to someone who is not there. The channel sets of all topics are what the scope
manager superimposes and delegates; the container itself never calls Ray (`PolicyCalls` does).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from scopecast.policies.api import MULTICAST
from scopecast.scopes import policy_filters

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Channel:
    src: str
    dst: str
    origin: str
    filter: tuple | None = None
    replicas: int = 1


@dataclass(slots=True)
class TopicLayout:
    policy: str
    context: dict
    members: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)
    channels: dict[tuple[str, str, str], Channel] = field(default_factory=dict)
    entry: str | None = None
    # the sub-channels traffic entering the scope is split into (member, filter spec), if the
    # policy splits it (else it all enters at `entry`)
    split: tuple[tuple[str, tuple | None], ...] = ()
    exits: dict[int, list[str]] = field(default_factory=dict)  # replicas -> members
    choices_for: tuple | None = None
    error: str | None = None
    fresh: bool = True  # the policy actor has no instance yet (or lost it)

    def entries(self) -> tuple[tuple[str, tuple | None], ...]:
        """Where traffic from outside enters the scope: (member, filter spec) per sub-channel."""
        if self.split:
            return self.split
        return ((self.entry, None),) if self.entry is not None else ()


class PolicyContainer:
    """`alike(policy)`: whether `policy` may be asked once for the topics alike (see
    `ForwardingPolicy.topic_independent`). Their layouts then share the answer's objects: the
    members and sources sets, the channels dict (copied before any change of one topic's)."""

    def __init__(self, scope: str, multicast: bool,
                 alike: Callable[[str], bool] = lambda policy: False) -> None:
        self.scope = scope
        self.multicast = multicast
        self.alike = alike
        self.topics: dict[int, TopicLayout] = {}
        self.rejected: Counter[str] = Counter()
        self.choices_moved = False  # a choice applied moved an entry, split or exits (reset by
        #                             the policy runner before each phase)

    # ---------------------------------------------------------------------------- requests

    def requests(self, wanted: dict[int, dict], phase: str) -> dict[str, list[dict]]:
        """Batch items per policy module for the topics' wanted state (`wanted[topic]`: policy,
        context, members, sources, candidates, replicas). Phase "choices" asks for the entry and
        exit members where the candidates changed; phase "events" sends the events. An item of
        topics alike names them all (`_topics`, see `topics_of`)."""
        batches: dict[str, list[dict]] = {}
        if phase == "choices":
            for topic in [t for t in self.topics if t not in wanted]:
                old = self.topics.pop(topic)
                if not self.alike(old.policy):  # (an instance is kept only per topic)
                    batches.setdefault(old.policy, []).append({"topic": topic, "drop": True})
        groups: dict[tuple, dict] = {}  # alike key -> the item of the topics alike
        frozen: dict[int, tuple] = {}   # id(options) -> the options as a key (one per object)
        alike_of: dict[str, bool] = {}  # policy -> self.alike(policy), asked once a call
        for topic, w in wanted.items():
            policy = w["policy"]
            layout = self.topics.get(topic)
            if layout is None or layout.policy != policy:
                if layout is not None and not self.alike(layout.policy):
                    batches.setdefault(layout.policy, []).append({"topic": topic, "drop": True})
                layout = self.topics[topic] = TopicLayout(policy, w["context"])
            if policy not in alike_of:
                alike_of[policy] = self.alike(policy)
            if not alike_of[policy]:
                item = self._choices(topic, layout, w) if phase == "choices" else \
                    self._events(topic, layout, w)
                if item is not None:
                    batches.setdefault(policy, []).append(item)
                continue
            options = w["context"]["options"]
            key = () if not options else frozen.get(id(options))  # (most topics have none)
            if key is None:
                key = frozen[id(options)] = _frozen(options)
            key = (policy, key, *self._state_key(layout, w, phase))
            if key in groups:
                if (item := groups[key]) is not None:
                    item["_topics"].append(topic)
                continue
            item = groups[key] = self._choices(topic, layout, w) if phase == "choices" else \
                self._events(topic, layout, w, alike=True)
            if item is not None:
                item["_topics"] = [topic]
                batches.setdefault(policy, []).append(item)
        return batches

    @staticmethod
    def _state_key(layout: TopicLayout, w: dict, phase: str) -> tuple:
        """What else topics asked alike must share: the choices asked for; or the state their
        policy had (none where fresh; their channels the same dict) and the state wanted."""
        if phase == "choices":
            return (tuple(w["candidates"]), tuple(sorted(w["replicas"])), layout.choices_for)
        had = None if layout.fresh else (frozenset(layout.members), frozenset(layout.sources),
                                         id(layout.channels))
        return (had, frozenset(w["members"]), frozenset(w["sources"]))

    @staticmethod
    def topics_of(item: dict) -> list[int]:
        """The topics a batch item stands for."""
        return item.get("_topics") or [item["topic"]]

    def _choices(self, topic: int, layout: TopicLayout, w: dict) -> dict | None:
        choices = (tuple(w["candidates"]), tuple(sorted(w["replicas"])))
        if choices == layout.choices_for or not w["candidates"]:
            return None
        return {"topic": topic, "context": layout.context, "members": list(choices[0]),
                "replicas": list(choices[1]), "_choices": choices}

    def _events(self, topic: int, layout: TopicLayout, w: dict, alike: bool = False) -> dict | None:
        item: dict = {"topic": topic, "context": layout.context}
        if layout.fresh:
            item["reset"] = True
            layout.members, layout.sources, layout.channels = set(), set(), {}
        if alike:  # the state to bring a fresh instance to (the topics' instances are not kept)
            item["had"] = (sorted(layout.members), sorted(layout.sources))
        events = ([("member_removed", m) for m in sorted(layout.members - w["members"])]
                  + [("source_removed", s) for s in sorted(layout.sources - w["sources"])]
                  + [("member_added", m) for m in sorted(w["members"] - layout.members)]
                  + [("source_added", s) for s in sorted(w["sources"] - layout.sources)])
        if not events and not layout.fresh:
            return None
        item["events"] = events
        item["_members"], item["_sources"] = set(w["members"]), set(w["sources"])
        return item

    # ----------------------------------------------------------------------------- results

    def apply(self, item: dict, result: dict | None) -> list[str]:
        """Apply a policy actor's answer to the batch item it was given (None: no answer);
        returns why operations were refused, if any were. The topics alike of an item share
        the outcome."""
        layout = self.topics.get(item["topic"])
        if layout is None or item.get("drop"):
            return []
        rejected = self._apply_one(layout, item, result)
        choices = "_choices" in item
        for topic in self.topics_of(item)[1:]:
            other = self.topics.get(topic)
            if other is not None:
                if choices and _chosen(other) != _chosen(layout):
                    self.choices_moved = True
                _share(layout, other, choices)
        return rejected

    def _apply_one(self, layout: TopicLayout, item: dict, result: dict | None) -> list[str]:
        if result is None or result.get("error"):
            layout.error = (result or {}).get("error") or "policy actor did not answer"
            layout.fresh = True  # send the whole state again next time
            return []
        if result.get("lost"):  # the policy actor restarted without the instance: send it all
            layout.fresh = True
            return []
        layout.error = None
        if "_choices" in item:
            return self._apply_choices(layout, item, result)
        layout.fresh = False
        layout.members, layout.sources = item["_members"], item["_sources"]
        layout.channels = dict(layout.channels)  # (topics alike may share the dict: see _share)
        ops = result.get("ops", ())
        rejected = [why for why in (self._op(layout, op) for op in
                                    (ops if isinstance(ops, list) else ["not a list"]))
                    if why]
        # channels whose ends are no longer there go, whatever the policy said
        known = layout.members | layout.sources | {MULTICAST}
        for key in [k for k in layout.channels if k[0] not in known or k[1] not in known
                    or k[2] not in layout.sources]:
            del layout.channels[key]
        return rejected

    def host_lost(self, hosted) -> None:
        """The policy actor of the topics whose policy satisfies `hosted` was replaced: their
        instances went with it, so each is sent its whole state again next time."""
        for layout in self.topics.values():
            if hosted(layout.policy):
                layout.fresh = True

    def _apply_choices(self, layout: TopicLayout, item: dict, result: dict) -> list[str]:
        before = _chosen(layout)
        rejected = self._choose(layout, item, result)
        if _chosen(layout) != before:
            self.choices_moved = True
        return rejected

    def _choose(self, layout: TopicLayout, item: dict, result: dict) -> list[str]:
        layout.choices_for = item["_choices"]
        candidates = set(item["members"])
        rejected = []
        entry = result.get("entry")
        layout.entry = entry if entry in candidates else None
        if layout.entry is None:
            rejected.append(self._reject("entry", entry))
        layout.split = self._split(result.get("split"), candidates, rejected)
        layout.exits = {}
        for n, chosen in zip(item["replicas"], result.get("exits", ()), strict=False):
            good = [m for m in chosen if m in candidates] if isinstance(chosen, list) else []
            if not isinstance(chosen, list) or len(good) != len(chosen):
                rejected.append(self._reject("exit", chosen))
            layout.exits[n] = good[:n]
        return rejected

    def _split(self, split, candidates: set[str], rejected: list[str]) -> tuple:
        """A policy's split, checked: every part a candidate with a good filter; none (the
        whole channel at the entry) where any part is not."""
        if split is None:
            return ()
        try:
            if not isinstance(split, list) or not 1 <= len(split) <= 64:
                raise ValueError("not a list of 1 to 64 parts")
            parts = []
            for member, flt in split:
                if member not in candidates:
                    raise ValueError(f"{member!r:.80} is no candidate")
                parts.append((member, policy_filters.check(flt)))
            return tuple(parts)
        except (TypeError, ValueError) as exc:
            rejected.append(self._reject("split", f"{exc}: {split!r:.200}"))
            return ()

    def _op(self, layout: TopicLayout, op) -> str | None:
        """Apply one operation; returns why it was refused, or None."""
        try:
            kind, src, dst, origin = op[0], op[1], op[2], op[3]
        except (TypeError, IndexError, KeyError):
            return self._reject("malformed", op)
        ends = layout.members | layout.sources
        if kind == "disconnect":
            layout.channels.pop((src, dst, origin), None)
            return None
        if kind != "connect" or len(op) != 6:
            return self._reject("malformed", op)
        flt, replicas = op[4], op[5]
        if (src not in ends or origin not in layout.sources or src == dst
                or not (dst in ends or (dst == MULTICAST and self.multicast))):
            return self._reject("non-member", op)
        try:
            flt = policy_filters.check(flt)
        except ValueError:
            return self._reject("malformed", op)
        if not isinstance(replicas, int) or not 1 <= replicas <= 64:
            return self._reject("malformed", op)
        layout.channels[(src, dst, origin)] = Channel(src, dst, origin, flt, replicas)
        return None

    def _reject(self, why: str, what) -> str:
        self.rejected[why] += 1
        log.warning("scope %r: policy operation ignored (%s): %.200r", self.scope, why, what)
        return why

    def covered_topics(self) -> set[int]:
        """The topics this scope reaches its members of through its multicast group: each
        channels dict looked at once (topics alike share one)."""
        seen: dict[int, bool] = {}  # id(channels) -> covered (every dict alive meanwhile)
        out = set()
        for tid, layout in self.topics.items():
            channels = layout.channels
            found = seen.get(id(channels))
            if found is None:
                found = seen[id(channels)] = any(c.dst == MULTICAST for c in channels.values())
            if found:
                out.add(tid)
        return out

    def describe(self) -> dict:
        return {str(t): {"policy": lay.policy, "members": sorted(lay.members),
                         "sources": sorted(lay.sources), "entry": lay.entry,
                         **({"split": [[m, list(f) if f else None] for m, f in lay.split]}
                            if lay.split else {}),
                         "channels": [f"{c.src}->{c.dst} (origin {c.origin})"
                                      + (f" x{c.replicas}" if c.replicas > 1 else "")
                                      for c in lay.channels.values()],
                         **({"error": lay.error} if lay.error else {})}
                for t, lay in self.topics.items()}


def _chosen(layout: TopicLayout) -> tuple:
    """What a layout's choices decide: where traffic enters the scope, and its exits."""
    return layout.entry, layout.split, layout.exits


def _share(done: TopicLayout, other: TopicLayout, choices: bool) -> None:
    """`other`, asked alike with `done`, takes the outcome of the phase (`choices`, else the
    events): the same objects (none is changed in place: `apply` copies the channels before
    changing them)."""
    other.error, other.fresh = done.error, done.fresh
    if choices:
        other.choices_for, other.entry, other.split = done.choices_for, done.entry, done.split
        other.exits = done.exits
    else:
        other.members, other.sources, other.channels = done.members, done.sources, done.channels


def _frozen(value):
    """`value` (a topic's options: JSON-like) as a hashable key."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
