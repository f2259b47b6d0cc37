"""The built-in forwarding policies, written against the public policy API (`policies.api`).

Members are taken in name order; a message from `origin` reaches every other interested member.
    tree           origin at the root of a tree of fan-out `options["fanout"]` (default 2)
    chain          origin -> next -> next ...; entry is the first member, exit the last (Fig. 3.14)
    star           origin -> every member directly
    lan_multicast  origin -> the scope's IP multicast group where the scope allows it, else tree
    replicated     star, with every channel replicated modulo `options["replicas"]` (default 2)
"""

from __future__ import annotations

from scopecast.policies.api import MULTICAST, Connect, LayoutPolicy, audience


class TreePolicy(LayoutPolicy):
    name = "tree"
    topic_independent = True

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        fanout = max(1, int(self.context.options.get("fanout", 2)))
        out = []
        for origin in sources:
            order = audience(origin, members)
            for i in range(1, len(order)):
                out.append(Connect(order[(i - 1) // fanout], order[i], origin))
        return out


class ChainPolicy(LayoutPolicy):
    name = "chain"
    topic_independent = True

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        out = []
        for origin in sources:
            order = audience(origin, members)
            out += [Connect(a, b, origin) for a, b in zip(order, order[1:], strict=False)]
        return out

    def exits(self, members: list[str], replicas: int) -> list[str]:
        return members[-replicas:]


class StarPolicy(LayoutPolicy):
    name = "star"
    topic_independent = True

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        return [Connect(o, m, o) for o in sources for m in members if m != o]


class LanMulticastPolicy(TreePolicy):
    name = "lan_multicast"

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        if not self.context.multicast:
            return super().layout(members, sources)
        return [Connect(o, MULTICAST, o) for o in sources if set(members) - {o}]


class ReplicatedPolicy(LayoutPolicy):
    name = "replicated"
    topic_independent = True

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        n = max(1, int(self.context.options.get("replicas", 2)))
        return [Connect(o, m, o, replicas=n) for o in sources for m in members if m != o]


BUILTIN_POLICIES = {cls.name: cls for cls in
                    (TreePolicy, ChainPolicy, StarPolicy, LanMulticastPolicy, ReplicatedPolicy)}


def alike_topics(policy: str) -> bool:
    """Whether a scope may ask built-in `policy` once for its topics alike (see
    `ForwardingPolicy.topic_independent`); False for any other name (a plug-in's digest)."""
    cls = BUILTIN_POLICIES.get(policy)
    return cls is not None and cls.topic_independent
