"""Channels (thesis 3.2.4): an address/protocol pair, an IP multicast group, or sub-channels
guarded by filters. A sender evaluates the filter tree per message, from the root, down to a list of
endpoints, and transmits the message to each."""

from __future__ import annotations

from dataclasses import dataclass

from scopecast.netio.filters import Filter


@dataclass(slots=True, frozen=True)
class UnicastEndpoint:
    """A UDP address of one member process."""

    host: str
    port: int
    member: int = 0

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass(slots=True, frozen=True)
class MulticastGroup:
    """An IP multicast group serving a scope (an external multicast mechanism)."""

    group: str
    port: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.group, self.port)


@dataclass(slots=True, frozen=True)
class FilteredChannel:
    """Sub-channels, each taken when its filter accepts the message."""

    branches: tuple[tuple[Filter, "Channel"], ...]


Channel = UnicastEndpoint | MulticastGroup | FilteredChannel
Endpoint = UnicastEndpoint | MulticastGroup


def endpoints(channel: Channel) -> tuple[Endpoint, ...]:
    """Every endpoint the channel may use, whatever the message."""
    if isinstance(channel, FilteredChannel):
        return tuple(e for _, sub in channel.branches for e in endpoints(sub))
    return (channel,)


def resolve(channel: Channel, topic: int, source: int, seq: int, stream_seq: int,
            out: list) -> None:
    """Append to `out` the endpoints this message goes to."""
    if isinstance(channel, FilteredChannel):
        for flt, sub in channel.branches:
            if flt.accepts(topic, source, seq, stream_seq):
                resolve(sub, topic, source, seq, stream_seq, out)
    else:
        out.append(channel)
