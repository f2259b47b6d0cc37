"""The forwarding-policy API (thesis 3.2.3): what a policy sees and what it may ask for.

A forwarding policy is an object hosted by a scope, one instance per (scope, topic). The scope's
policy container feeds it the standard events — a member (a child scope or a member process) became
interested in the topic or left it, a *source* appeared in the scope (a member that publishes, or
the member through which the topic's traffic enters the scope) or went away — and the policy answers
each event with operations on its channels:

    Connect(src, dst, origin, filter=None, replicas=1)   lay a channel src -> dst for messages whose
                                                         origin in this scope is `origin`, that
                                                         pass `filter` if one is given
    Disconnect(src, dst, origin)                         remove it

Filters (thesis 3.2.4), built with the functions below and combined with `every`:
`modulo(n, k)` (sequence number modulo n, or `on="stream"`: the source's stream sequence number),
`topic_set(names and patterns)` and `origins(member names)`. A scope decides a topic set when it
lays the channel (a topic's channel carries that topic only), so it costs nothing per message.

`dst` may be `MULTICAST` where the scope allows IP multicast (`context.multicast`): one group
reaches every member of the scope. `replicas=n` asks the container to replicate the channel modulo
n over n members of the source sub-scope (3.2.4). The policy also picks, among the scope's members,
the *entry* member at which traffic from outside enters the scope and the *exit* members to which a
channel leaving the scope is delegated. A policy may instead *split* the channel entering the scope
into sub-channels (Figs 3.10-3.11): `split(members)` returns (member, filter) pairs, and a sender
outside sends each message to every member whose filter passes it; the built-in policies split
modulo n over the first n candidates when the topic's options say `{"split": n}`.

Policies are plain Python with no access to the scope manager: everything they know comes through
`PolicyContext` and the events, and everything they do is the operations they return, which the
container validates (an operation naming a non-member is ignored and counted). Built-in policies use
this same API; plug-ins subclass `ForwardingPolicy` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

API_VERSION = 1
MULTICAST = "*"  # the destination of a channel to the scope's multicast group


FilterSpec = tuple  # see modulo, topic_set, origins, every


def modulo(n: int, k: int, on: str = "seq") -> FilterSpec:
    """Messages whose sequence number (`on="stream"`: the stream sequence number of their
    source, across its topics) is k modulo n."""
    return ("modulo", n, k) if on == "seq" else ("modulo", n, k, on)


def topic_set(*names: str) -> FilterSpec:
    """Messages of the topics named or matched by the patterns (`"flights/*"`)."""
    return ("topics", *names)


def origins(*members: str) -> FilterSpec:
    """Messages published by these member processes of the scope (by name)."""
    return ("origin", *members)


def every(*specs: FilterSpec) -> FilterSpec:
    """Messages every one of the filters passes."""
    return ("all", *specs)


@dataclass(slots=True, frozen=True)
class Connect:
    src: str
    dst: str
    origin: str
    filter: FilterSpec | None = None   # modulo / topic_set / origins / every, or None
    replicas: int = 1


@dataclass(slots=True, frozen=True)
class Disconnect:
    src: str
    dst: str
    origin: str


Operation = Connect | Disconnect


@dataclass(slots=True, frozen=True)
class PolicyContext:
    """What a policy instance may inspect: where it runs and for which topic."""

    scope: str              # the scope's path ("" is the cluster scope)
    topic: str
    topic_id: int
    multicast: bool         # whether this scope may use one IP multicast group for its members
    options: dict = field(default_factory=dict)  # the topic's options (e.g. {"fanout": 3})


class ForwardingPolicy:
    """Base class of forwarding policies; the default handlers do nothing and choose the first
    member by name as entry and exit."""

    api_version = API_VERSION
    name = "base"
    # what the policy does for a topic depends only on the topic's options and its members and
    # sources, never on which topic it is or on the order of past events: a scope may then ask
    # once for all its topics alike (same options, same state before and wanted), and the
    # policy actor answers with a fresh instance brought to that state (see scopes/container).
    # Honoured for the built-ins only: a scope does not import a plug-in's code to read it.
    topic_independent = False

    def __init__(self, context: PolicyContext) -> None:
        self.context = context

    def member_added(self, member: str) -> list[Operation]:
        return []

    def member_removed(self, member: str) -> list[Operation]:
        return []

    def source_added(self, member: str) -> list[Operation]:
        return []

    def source_removed(self, member: str) -> list[Operation]:
        return []

    def entry(self, members: list[str]) -> str:
        """The member that traffic entering the scope is sent to (`members` sorted by name)."""
        return members[0]

    def exits(self, members: list[str], replicas: int) -> list[str]:
        """The members a channel leaving the scope is delegated to (`replicas` of them)."""
        return members[:replicas]

    def split(self, members: list[str]) -> list[tuple[str, FilterSpec | None]] | None:
        """The sub-channels traffic entering the scope is split into: (member, filter) pairs,
        each member one of `members` (sorted by name); None: it all enters at `entry`. By
        default, `{"split": n}` in the topic's options splits it modulo n over the first n."""
        n = min(int(self.context.options.get("split", 1) or 1), len(members))
        if n < 2:
            return None
        return [(m, modulo(n, k)) for k, m in enumerate(members[:n])]


class LayoutPolicy(ForwardingPolicy):
    """A policy defined by the channels it wants for its current members and sources: each event
    updates those sets and returns the difference between the old and new layout as operations."""

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.members: set[str] = set()
        self.sources: set[str] = set()
        self._laid: dict[tuple[str, str, str], Connect] = {}

    def layout(self, members: list[str], sources: list[str]) -> list[Connect]:
        """The channels wanted (members and sources sorted by name)."""
        raise NotImplementedError

    def member_added(self, member: str) -> list[Operation]:
        self.members.add(member)
        return self._relay()

    def member_removed(self, member: str) -> list[Operation]:
        self.members.discard(member)
        return self._relay()

    def source_added(self, member: str) -> list[Operation]:
        self.sources.add(member)
        return self._relay()

    def source_removed(self, member: str) -> list[Operation]:
        self.sources.discard(member)
        return self._relay()

    def _relay(self) -> list[Operation]:
        wanted = {(c.src, c.dst, c.origin): c
                  for c in self.layout(sorted(self.members), sorted(self.sources))}
        ops: list[Operation] = [Disconnect(*k) for k in self._laid if k not in wanted]
        ops += [c for k, c in wanted.items() if self._laid.get(k) != c]
        self._laid = wanted
        return ops


def audience(origin: str, members: list[str]) -> list[str]:
    """The members a message from `origin` must reach, in name order, origin first."""
    return [origin] + [m for m in members if m != origin]
