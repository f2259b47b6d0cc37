"""Label paths for delegated channels (thesis 3.2.5), as pure functions.

A channel laid in scope S between its members U and V is labelled with two paths of equal length
L_S (the depth of S's deepest member subtree): U's path down to the member that sends, V's path
down to the member (or multicast group) that receives. Subtrees of different depths are padded *at
the top* by repeating the scope's own name, so that level i of every record always names a member
of a level-i scope: a scope's own channels then match the same record entry whichever sibling the
message came from.

Delegation builds the sending path top-down: each scope the channel passes through appends one
`(name, L)` wrap — "my member `name`, in a scope whose labels have length L" — and the member
process at the bottom turns the wraps into the path (`sending_path`). Receiving paths are built
bottom-up: each scope offers its parent the path below itself (`Offer.chain`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scopecast.netio.filters import check_spec
from scopecast.policies.api import MULTICAST


def pad(path: list[str], length: int) -> list[str]:
    """`path` lengthened to `length` by repeating its first element at the top."""
    return [path[0]] * (length - len(path)) + path


def sending_path(wraps: list[tuple[str, int]]) -> list[str]:
    """The source path of a label from the wraps of the scopes the channel was delegated through
    (outermost first; the last wrap names the member process itself)."""
    path: list[str] = []
    for name, length in reversed(wraps):
        path = pad([name, *path], length)
    return path


def multicast_path(length: int) -> list[str]:
    return [MULTICAST] * length


@dataclass(slots=True, frozen=True)
class Offer:
    """What a scope offers as the receiving end of channels into it for one topic, or of one
    sub-channel of them where the scope splits its traffic: the path below itself, the endpoint
    (("u", host, port, member) or ("g", group, port)), the members a sender's window waits for,
    and the filter of the messages that go there (`netio.filters` spec; None: all of them)."""

    chain: tuple[str, ...]
    endpoint: tuple
    receivers: tuple[int, ...]
    filter: tuple | None = None

    def into(self, name: str, length: int) -> list[str]:
        """The destination path, in a scope with labels of `length`, of a channel into `name`."""
        return pad([name, *self.chain], length)

    def to_wire(self) -> list:
        return [list(self.chain), list(self.endpoint), list(self.receivers),
                list(self.filter) if self.filter else None]

    @classmethod
    def from_wire(cls, body: list) -> Offer:
        chain, endpoint, receivers, flt = body
        return cls(tuple(chain), tuple(endpoint), tuple(receivers), check_spec(flt))
