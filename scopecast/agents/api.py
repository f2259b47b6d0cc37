"""The recovery-protocol plug-in interface (thesis 3.2.11-3.2.12), shared registry with policies.

A recovery protocol is hosted by a recovery agent, one per (recovery domain, peer group). The agent
tells it the domain's view and hands it the members' ACK/NAK summaries (the bottom interface); it
answers with instructions (repair, cleanup) for the members and what to report to the agent above.
The Reliability issue fills in the agents; this is the interface plug-ins are written against, at
`API_VERSION` (the same number as the forwarding-policy API).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scopecast.policies.api import API_VERSION

__all__ = ["API_VERSION", "DomainContext", "RecoveryProtocol"]


@dataclass(slots=True, frozen=True)
class DomainContext:
    """What a recovery protocol may inspect: its domain and options."""

    domain: str                 # the scope path whose domain this is
    level: int                  # 1 for a member domain, higher up the hierarchy
    options: dict = field(default_factory=dict)


class RecoveryProtocol:
    """Base class of recovery protocols; the defaults acknowledge nothing and repair nothing."""

    api_version = API_VERSION
    name = "base"

    def __init__(self, context: DomainContext) -> None:
        self.context = context

    def on_view(self, members: list[str], version: int) -> list[tuple]:
        """A new view of the domain (members by name, its version); returns instructions."""
        return []

    def on_summary(self, member: str, summary: dict) -> list[tuple]:
        """A member's summary {stream: (max_contiguous, [missing ranges])}; returns
        instructions such as ("repair", from_member, to_member, stream, first, last) or
        ("cleanup", stream, up_to)."""
        return []

    def aggregate(self) -> dict:
        """What this domain reports to the agent above (e.g. per-stream stability)."""
        return {}
