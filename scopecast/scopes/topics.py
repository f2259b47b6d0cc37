"""Topic metadata held by a topic's root scope."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

HISTORIES = ("from_join", "cached")


@dataclass(slots=True, frozen=True)
class TopicInfo:
    """What `create_topic` returns and members learn about a topic."""

    name: str
    id: int
    policy: str = "tree"
    recovery: str = "token_ring"
    history: str = "from_join"  # what a late joiner gets first: "from_join" or "cached"
    root: str = ""
    session: int = 1
    plugin: str = ""            # sha256 of the plug-in module `policy` names ("" for built-ins)
    recovery_plugin: str = ""   # sha256 of the plug-in module `recovery` names ("" for built-ins)
    schema: dict | None = None
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def recovery_key(self) -> str:
        """Which recovery domain serves the topic: a built-in's name or "sha256:<hex>"."""
        return f"sha256:{self.recovery_plugin}" if self.recovery_plugin else self.recovery
