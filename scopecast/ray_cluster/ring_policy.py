"""`ring`: a forwarding policy as a scopecast plug-in.

Members in name order form a ring; a message from `origin` goes around it, origin -> next -> ...,
until every member has it (a chain that starts at the origin instead of the first member, so every
member forwards to the same neighbour whoever publishes). Submit it to a running cluster and use it:

    ref = cluster.submit_plugin("examples/ring_policy.py")     # or: scopecast plugin submit ...
    cluster.create_topic("lectures", policy="ring@1.0")         # or policy=f"sha256:{ref.sha256}"
"""

from scopecast.policies.api import API_VERSION, Connect, LayoutPolicy

__scopecast_plugin__ = {"kind": "policy", "name": "ring", "version": "1.0",
                        "api_version": API_VERSION, "classes": ["RingPolicy"]}


class RingPolicy(LayoutPolicy):
    name = "ring"

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        out = []
        for origin in sources:
            ring = sorted(set(members) | {origin})
            start = ring.index(origin)
            order = ring[start:] + ring[:start]
            out += [Connect(a, b, origin) for a, b in zip(order, order[1:], strict=False)]
        return out
