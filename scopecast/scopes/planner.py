"""What a scope lays and hands down, computed from what it knows (thesis 3.2.4-3.2.6): pure, no
Ray, no I/O.

From its children's interest (who subscribes to and publishes which topic), the channels delegated
to it from above and the layouts its policies chose (`container`), the planner computes
- what each topic's policy is asked to lay (`wanted`),
- each child's part of the layout: the channels it sends along and the multicast coverage it takes
  part in (`delegate`), and from that a member process's tables (`member_view`),
- the state this scope reports to its parent: cascading subscription, offers, joined groups and the
  chains to the leaders of its recovery domains (`report_state`),
- each recovery protocol's domain: its members in ring order with their regions (`domain_members`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from scopecast.agents.builtin import NO_RECOVERY
from scopecast.netio.filters import all_of
from scopecast.policies.api import MULTICAST
from scopecast.scopes import policy_filters
from scopecast.scopes.container import Channel, PolicyContainer
from scopecast.scopes.delegation import NO_PART, Delegation, Obligation, Part
from scopecast.scopes.layout import Offer, multicast_path, sending_path
from scopecast.scopes.membership import Child, MemberProcess, Membership
from scopecast.scopes.regions import Region, Regions, group_address
from scopecast.scopes.reports import SubtreeState
from scopecast.scopes.scope_admin import ScopeChoices, domain_member, upper_key
from scopecast.scopes.topic_view import ScopeTopics, within
from scopecast.scopes.topics import TopicInfo
from scopecast.scopes.views import MemberView, ViewRoute

log = logging.getLogger(__name__)

NO_DELEGATION = Delegation({}, {}, NO_PART, {})


class Planner:
    """The layout arithmetic of one scope. `delegation` is the parent's latest (its channels
    handed to this scope); the domains are cached until `forget_domains` (any change of children
    or topics)."""

    def __init__(self, path: str, top: bool, members: Membership, topics: ScopeTopics,
                 container: PolicyContainer, settings: dict, choices: ScopeChoices) -> None:
        self.path = path
        self.top = top
        self.members = members
        self.topics = topics
        self.container = container
        self.settings = settings
        self.choices = choices
        self.delegation = NO_DELEGATION
        self.last_regions = Regions({}, {})  # of the latest `delegate` (for status)
        self._domains: dict[str, list[tuple[str, int]]] | None = None
        # (domain key, member name) -> (child scope, its domain key) for child scopes' domains
        self._sources: dict[tuple[str, str], tuple[str, str]] = {}

    @property
    def children(self) -> dict[str, Child]:
        return self.members.children

    # ------------------------------------------------------------------------ what is wanted

    def relevant(self, info: TopicInfo) -> bool:
        return within(info, self.path)

    def interest(self) -> tuple[dict[int, set[str]], dict[int, set[str]], dict[int, set[str]]]:
        """Per topic: interested children (subscribers), publishing children, and children
        to which channels delegated from above were handed (exits)."""
        subs: dict[int, set[str]] = {}
        pubs: dict[int, set[str]] = {}
        for c in self.children.values():
            for t in c.subs:
                subs.setdefault(t, set()).add(c.name)
            for t in c.pubs:
                pubs.setdefault(t, set()).add(c.name)
        exits: dict[int, set[str]] = {}
        for x in self.delegation.part.exits:
            exits.setdefault(x.topic, set()).update(self.exit_members(x))
        return subs, pubs, exits

    def exit_members(self, exit_: Obligation) -> list[str]:
        """The members a channel delegated from above goes to: the policy's choice, or the first
        forwarder where no policy runs for the topic here (a topic covered by a multicast group)."""
        layout = self.container.topics.get(exit_.topic)
        chosen = layout.exits.get(exit_.replicas) if layout is not None else None
        return chosen or self.forwarders(exit_.topic)[:1]

    def forwarders(self, topic: int) -> list[str]:
        """The members that may pass `topic` on: regular ones (any, where none is), less member
        processes whose credential does not let them read it (`scopes/credentials`)."""
        children = self.children
        names = sorted(c.name for c in children.values() if c.regular) or sorted(children)
        if not any(getattr(c, "credential", None) for c in children.values()):
            return names
        info = self.topics.by_id.get(topic)
        return [n for n in names if children[n].kind != "member"
                or (info is not None and children[n].may_read(info.name))]

    def wanted(self, policy_key) -> dict[int, dict]:
        """Per topic, what its policy is asked for; `policy_key(info)` names the policy actor."""
        subs, pubs, exits = self.interest()
        covered = set(self.delegation.part.covered)
        replicas: dict[int, set[int]] = {}
        for x in self.delegation.part.exits:
            replicas.setdefault(x.topic, set()).add(x.replicas)
        regular = {name for name, c in self.children.items() if c.regular}
        wanted = {}
        for tid in sorted(subs.keys() | pubs.keys() | exits.keys()):  # (no one's: nothing to lay)
            info = self.topics.by_id.get(tid)
            if info is None or tid in covered or not self.relevant(info):
                continue
            takers = subs[tid] & regular if tid in subs else set()
            members = takers | exits.get(tid, set())
            sources = set(pubs.get(tid, ()))
            up = not self.top and self.path != info.root
            if up and (tid in subs or tid in exits):
                layout = self.container.topics.get(tid)
                for entry, spec in layout.entries() if layout is not None else ():
                    if entry in self.children and self.channel_filter(tid, spec)[0]:
                        # (traffic from outside starts there)
                        sources.add(entry)
                        members.add(entry)
            if not members and not sources and tid not in subs:
                continue
            wanted[tid] = {"policy": policy_key(info),
                           "context": {"scope": self.path, "topic": info.name, "topic_id": tid,
                                       "multicast": self.container.multicast,
                                       "options": info.options},
                           "members": members, "sources": sources,
                           # the policy picks the entry and exits among the regular
                           # subscribers, which take the traffic anyway (a member that only
                           # publishes, made the entry, would get every other source's traffic
                           # just to pass it on); among any members where none subscribes
                           "candidates": sorted(takers) or self.forwarders(tid),
                           "replicas": replicas.get(tid, {1})}
        return wanted

    # ------------------------------------------------------------------- the labels' lengths

    def length(self) -> int:
        """L: the length of the labels of channels laid in this scope."""
        return max((c.depth for c in self.children.values()), default=1)

    def depth(self) -> int:
        return 1 + self.length()

    def group(self) -> list:
        """This scope's multicast group and port."""
        return [group_address(self.path, self._prefix()), self.settings.get("port", 40000)]

    def _prefix(self) -> tuple[int, int, int]:
        return tuple(self.settings.get("group_prefix", (239, 192, 0)))

    def regions(self, subs: dict[int, set[str]], exits: dict[int, set[str]],
                covered: set[int] | None = None) -> Regions:
        """The regions of this scope's multicast (`regions`): children alike in the `covered`
        topics (the container's) they take."""
        takes = {tid: subs.get(tid, set()) | exits.get(tid, set())
                 for tid in (self.container.covered_topics() if covered is None else covered)}
        group = self.group()
        return Regions.plan(self.path, (group[0], group[1]), self._prefix(), takes)

    def _region_links(self, regions: Regions) -> dict[int, tuple]:
        """Per covered topic, the (group endpoint, members joined) of each region it spans."""
        link: dict[Region, tuple] = {r: (("g", *r.group), tuple(self.joined(list(r.group))))
                                     for r in set(regions.of_child.values())}
        alike: dict[int, tuple] = {}  # id(spans) -> their links (topics alike share both)
        out = {}
        for tid, spans in regions.spans.items():
            links = alike.get(id(spans))
            if links is None:
                links = alike[id(spans)] = tuple(link[r] for r in spans)
            out[tid] = links
        return out

    def joined(self, group: list) -> list[int]:
        """Regular members of this subtree that join `group`."""
        key = "%s:%d" % tuple(group)
        ids: set[int] = set()
        for c in self.children.values():
            ids.update(c.joined.get(key, ()))
        return sorted(ids)

    # --------------------------------------------------------------------------- handing down

    def delegate(self) -> dict[str, Part]:
        """Hand every channel to the member it concerns: own channels to their source member,
        channels delegated from above to the chosen exit members, multicast coverage to all."""
        length = self.length()
        exits_of: dict[str, list[Obligation]] = {}
        covered_of: dict[str, dict[int, Obligation]] = {}
        subs, pubs, exits = self.interest()
        group = self.group()
        covered = self.container.covered_topics()
        regions = self.last_regions = self.regions(subs, exits, covered)
        links = self._region_links(regions)
        regular = {name for name, c in self.children.items() if c.regular}
        # one coverage object a child for the topics it covers alike (see Part.covered)
        shared: dict[tuple, Obligation] = {}
        # coverage from above: every member interested in or publishing the topic joins / sends
        for tid, cov in self.delegation.part.covered.items():
            for name in subs.get(tid, set()) | pubs.get(tid, set()) | exits.get(tid, set()):
                ob = shared.get((id(cov), name))
                if ob is None:
                    ob = shared[(id(cov), name)] = replace(
                        cov, topic=0, wraps=(*cov.wraps, (name, length)))
                covered_of.setdefault(name, {})[tid] = ob
        # (a topic no child here takes: its publishers send to the scope's group)
        nobody = ((("g", *group), tuple(self.joined(group))),)
        for tid, layout in self.container.topics.items():
            channels = list(layout.channels.values())
            clients = subs[tid] - regular if tid in subs else ()
            channels += [Channel(o, c, o) for o in layout.sources for c in clients if c != o]
            if tid in covered:
                spans = links.get(tid) or nobody
                takers = regions.spans.get(tid, ())
                for name in subs.get(tid, set()) | pubs.get(tid, set()) | exits.get(tid, set()):
                    # one that takes the topic joins its own region's group
                    own = regions.of_child.get(name)
                    at = takers.index(own) if len(takers) > 1 and own in takers else 0
                    ob = shared.get((id(spans), at, name))
                    if ob is None:
                        ob = shared[(id(spans), at, name)] = Obligation(
                            0, name, tuple(multicast_path(length)), *spans[at],
                            scope=self.path, wraps=((name, length),),
                            regions=spans if len(spans) > 1 else ())
                    covered_of.setdefault(name, {})[tid] = ob
                channels = [c for c in channels if c.dst != MULTICAST]
            for ch in channels:
                obs = self.obligations(tid, ch, length) if ch.src in self.children else ()
                if obs:
                    exits_of.setdefault(ch.src, []).extend(obs)
        for x in self.delegation.part.exits:
            chosen = self.exit_members(x)
            n = len(chosen)
            for k, name in enumerate(chosen):
                flt = _both(x.filter, ("modulo", n, k)) if n > 1 else x.filter
                if flt is not NOT_LAID:
                    exits_of.setdefault(name, []).append(replace(
                        x, wraps=(*x.wraps, (name, length)), replicas=1, filter=flt))
        return {name: Part(tuple(exits_of.get(name, ())), covered_of.get(name, {}))
                for name in exits_of.keys() | covered_of.keys()}

    def obligations(self, tid: int, ch: Channel, length: int) -> list[Obligation]:
        """The delegated form of one channel laid here: where it goes, and who waits for it;
        one per sub-channel where the destination splits it (none where its entry is not known
        yet: laid when its report comes, or where its filter passes nothing of the topic)."""
        dst = self.children.get(ch.dst)
        offers = dst.offers_of(tid) if dst is not None else ()
        laid, flt = self.channel_filter(tid, ch.filter)
        if not laid:
            return []
        return [Obligation(tid, ch.origin, tuple(offer.into(dst.name, length)),
                           tuple(offer.endpoint), tuple(offer.receivers), both, ch.replicas,
                           self.path, ((ch.src, length),))
                for offer in offers if (both := _both(flt, offer.filter)) is not NOT_LAID]

    def channel_filter(self, tid: int, spec: tuple | None) -> tuple[bool, tuple | None]:
        """A policy's filter of a channel of topic `tid` laid here, decided for the topic and
        with member names made ids (`policy_filters.resolve`)."""
        if spec is None:
            return True, None
        info = self.topics.by_id.get(tid)
        ids = {c.name: c.id for c in self.children.values() if c.kind == "member"}
        return policy_filters.resolve(spec, tid, info.name if info else "", ids)

    def member_view(self, member: MemberProcess, part: Part, agents: dict[str, list]) -> MemberView:
        """A member process's tables from its part of the layout: the channels it sends along,
        the groups it receives on (where a multicast group covers a topic it subscribes to or
        forwards), its siblings, and `agents`, its recovery agents' addresses."""
        obligations = [(ob.topic, ob) for ob in part.exits]
        forwards = {ob.topic for ob in part.exits}
        groups = set()
        joined: dict[str, tuple[int, ...]] = {}  # (the trees its acknowledgements go up)
        spread: dict[int, list[Obligation]] = {}  # id(coverage) -> its channels (made once)
        for tid, cov in part.covered.items():
            if tid in member.pubs:  # (to every region the topic spans)
                if (sent := spread.get(id(cov))) is None:
                    sent = spread[id(cov)] = cov.spread()
                obligations += [(tid, ob) for ob in sent]
            if tid in member.subs or tid in forwards:
                groups.add((cov.endpoint[1], cov.endpoint[2]))
                joined["%s:%d" % cov.endpoint[1:3]] = cov.receivers
        receivers: dict[str, set[int]] = {}
        # one channel serves many topics: routes alike but for the topic travel as one entry
        # with their topics (a publisher of thousands of topics gets a few, not thousands)
        alike: dict[tuple, list[int]] = {}
        for tid, ob in obligations:
            ep = ob.endpoint
            receivers.setdefault("%s:%d" % (ep[1], ep[2]), set()).update(ob.receivers)
            key = (tuple(sending_path(ob.wraps)), ob.dst, ob.origin, ep, ob.filter, ob.scope)
            alike.setdefault(key, []).append(tid)
        reliable = self.reliable_topics(member)
        by_id = self.topics.by_id
        return MemberView(
            members=tuple(sorted((c.id, c.name, c.host, c.port, c.publish_limit)
                                 for c in self.children.values() if c.kind == "member")),
            routes=tuple(ViewRoute(*key, tuple(topics)) for key, topics in alike.items()),
            groups=tuple(sorted(groups)),
            joined=joined,
            receivers={k: tuple(sorted(v)) for k, v in receivers.items()},
            agents={p: (a[0], int(a[1])) for p, a in agents.items()},
            protocols=reliable,
            cached=tuple(sorted(t for t in reliable if by_id[t].history == "cached")),
            early=dict(self.topics.table.early),
            demoted=member.demoted)

    # ----------------------------------------------------------------------------- reporting

    def report_state(self, rebuilding: bool) -> SubtreeState:
        """This scope's state as its parent takes it (cascading subscription)."""
        subs: dict[int, str] = {}
        pubs: set[int] = set()
        for c in self.children.values():
            for t, role in c.subs.items():
                if subs.get(t) != "member":
                    subs[t] = role
            pubs |= c.pubs
        by_id = self.topics.by_id
        subs = {t: r for t, r in subs.items() if t in by_id
                and self.relevant(by_id[t]) and by_id[t].root != self.path}
        pubs = {t for t in pubs if t in by_id and by_id[t].root != self.path}
        joined: dict[str, set[int]] = {}
        for c in self.children.values():
            for key, ids in c.joined.items():
                joined.setdefault(key, set()).update(ids)
        return SubtreeState(self.depth(), subs, frozenset(pubs), self.offers(subs),
                            {k: sorted(v) for k, v in joined.items()},
                            any(c.regular for c in self.children.values()),
                            {p: self.lead_chain(p) for p in self.domain_members()}, rebuilding)

    def offers(self, subs: dict[int, str]) -> dict[int, tuple[Offer, ...]]:
        """For each topic this scope receives from its parent: where that traffic enters, one
        offer per sub-channel where this scope's policy splits it (thesis 3.2.4, Fig. 3.10)."""
        length = self.length()
        wanted = set(subs) | {x.topic for x in self.delegation.part.exits}
        out = {}
        regions: dict[int, tuple] | None = None  # (made once a covered topic needs them)
        alike: dict[object, tuple[Offer, ...]] = {}  # one offers tuple for topics alike
        covered = self.container.covered_topics()
        for tid in wanted:
            if tid in self.delegation.part.covered:
                continue
            if tid in covered:
                if regions is None:
                    _subs, _pubs, exits = self.interest()
                    regions = self._region_links(self.regions(_subs, exits, covered))
                    group = self.group()
                    nobody = ((("g", *group), tuple(self.joined(group))),)
                spans = regions.get(tid) or nobody
                # one offer per region: a sender outside sends to each (thesis Fig. 4.8)
                if (made := alike.get(id(spans))) is None:
                    made = alike[id(spans)] = tuple(
                        Offer(tuple(multicast_path(length)), endpoint, receivers)
                        for endpoint, receivers in spans)
                out[tid] = made
                continue
            layout = self.container.topics.get(tid)
            entries = layout.entries() if layout is not None else ()
            key = self._entries_key(entries, tid)
            if key is not None and key in alike:
                out[tid] = alike[key]
                continue
            parts = []
            for name, spec in entries:
                entry = self.children.get(name)
                laid, flt = self.channel_filter(tid, spec)
                if entry is None or not laid:
                    continue
                parts += [Offer(tuple(below.into(entry.name, length)), below.endpoint,
                                below.receivers, both)
                          for below in entry.offers_of(tid)
                          if (both := _both(flt, below.filter)) is not NOT_LAID]
            if parts:
                out[tid] = tuple(parts)
                if key is not None:
                    alike[key] = out[tid]
        return out

    def _entries_key(self, entries: tuple, tid: int) -> tuple | None:
        """What `tid`'s offers depend on where its entries are unfiltered: the entry children
        and what they offer (a member process the same for every topic; a child scope one
        tuple for its topics alike). None where a filter may depend on the topic."""
        key = []
        for name, spec in entries:
            entry = self.children.get(name)
            if spec is not None or entry is None:
                return None
            key.append((name, id(entry.offers.get(tid)) if entry.kind == "scope" else 0))
        return tuple(key)

    # ----------------------------------------------------------------------- recovery domains

    def reliable_topics(self, member: MemberProcess) -> dict[int, str]:
        """Topics a member process takes part in recovering (subscribed as a member, or
        published, with a recovery protocol), each with its domain's key here (`scope_admin`)."""
        mine = {t for t, role in member.subs.items() if role == "member"} | member.pubs
        by_id = self.topics.by_id
        key_of = self.choices.recovery_key
        return {t: key for t in mine if t in by_id and (key := key_of(by_id[t])) != NO_RECOVERY}

    def forget_domains(self) -> None:
        self._domains = None

    def domain_members(self) -> dict[str, list[tuple[str, int]]]:
        """Per domain key, the domain's members with their regions, in ring order: a member
        process, or a child scope's domain under this one (`scope_admin.domain_member`). Members
        that subscribe to the same topics share a region (QSM), numbered in order of their
        first member, and the ring keeps a region's members together. Kept until
        `forget_domains`: asked every tick, it costs a pass over every topic of every child."""
        if self._domains is None:
            self._domains = self._group_domains()
        return self._domains

    def _group_domains(self) -> dict[str, list[tuple[str, int]]]:
        grouped: dict[str, list[tuple[tuple, str]]] = {}
        sources: dict[tuple[str, str], tuple[str, str]] = {}
        for c in [*self.children.values(), *self.members.silent.values()]:
            interest = tuple(sorted(t for t, role in c.subs.items() if role == "member"))
            if c.kind == "scope":
                for below in c.recovering:
                    key, name = upper_key(below), domain_member(c.name, below)
                    sources[(key, name)] = (c.name, below)
                    grouped.setdefault(key, []).append((interest, name))
                continue
            for key in set(self.reliable_topics(c).values()):
                grouped.setdefault(key, []).append((interest, c.name))
        self._sources = sources
        out: dict[str, list[tuple[str, int]]] = {}
        for key, entries in grouped.items():
            numbers: dict[tuple, int] = {}
            out[key] = [(name, numbers.setdefault(interest, len(numbers)))
                        for interest, name in sorted(entries)]
        return out

    def source(self, key: str, name: str) -> tuple[Child, str] | None:
        """The child scope and its domain key that member `name` of domain `key` stands for
        (None: a member process, or gone)."""
        self.domain_members()
        found = self._sources.get((key, name))
        if found is None:
            return None
        child = self.children.get(found[0]) or self.members.silent.get(found[0])
        return (child, found[1]) if child is not None else None

    def lead_chain(self, key: str) -> tuple:
        """The chain from this scope down to the member process leading its domain `key`
        (child names, not domain member names)."""
        members = self.domain_members().get(key)
        if not members:
            return ()
        first = members[0][0]
        below = self.source(key, first)
        if below is None:
            return (first,)
        child, child_key = below
        return (child.name, *child.recovering.get(child_key, ()))

    def belongs(self, key: str, name: str) -> tuple | None:
        """Where the agent of domain member `name` belongs: the lead chain of the child scope's
        domain it stands for (None: a member process, or a child whose domain has no leader
        yet)."""
        below = self.source(key, name)
        if below is None or below[0].kind != "scope":
            return None
        return below[0].recovering.get(below[1]) or None

    def upper_addresses(self, child: str, address) -> dict[str, list]:
        """For child scope `child`: per domain of its, the address of the agent standing for it
        in this scope's domain (`address(key, member name)`, None where not placed yet)."""
        self.domain_members()
        out = {}
        for (key, name), (owner, below) in self._sources.items():
            if owner == child and (a := address(key, name)) is not None:
                out[below] = a
        return out


NOT_LAID = ("not laid",)


def _both(a: tuple | None, b: tuple | None) -> tuple | None:
    """The filter of a sub-channel of a filtered channel; NOT_LAID where the two hold more
    filters than a channel carries (`netio.filters.MAX_TERMS`: only scopes nested deeper than
    that, each splitting, get there)."""
    try:
        return all_of(a, b)
    except ValueError as exc:
        log.error("a sub-channel not laid: %s", exc)
        return NOT_LAID
