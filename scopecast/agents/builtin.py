"""The built-in recovery protocols, by the name a topic's `recovery=` gives (the one registry of
them; a plug-in protocol is named name@version or sha256:<hex> instead)."""

from __future__ import annotations

from scopecast.agents.ack_tree import AckTree
from scopecast.agents.api import RecoveryProtocol
from scopecast.agents.token_ring import TokenRing

NO_RECOVERY = "none"  # a topic without recovery: no agents, nothing cached, handed to the socket

BUILTIN_PROTOCOLS: dict[str, type[RecoveryProtocol]] = {cls.name: cls for cls in (TokenRing, AckTree)}

# what `recovery=` may name without a plug-in
RECOVERY_NAMES = (*BUILTIN_PROTOCOLS, NO_RECOVERY)
