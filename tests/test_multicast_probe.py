"""The LAN multicast probe's two halves on real sockets (loopback multicast works here), and its
decision."""

from __future__ import annotations

import asyncio

from scopecast.scopes import multicast_probe

GROUP = "239.255.77.9"


def _heard(token_sent: bytes, token_wanted: bytes, port: int) -> int:
    listener = multicast_probe.Listener("127.0.0.1", GROUP, port, token_wanted)
    multicast_probe.send("127.0.0.1", GROUP, port, token_sent, count=5)
    return listener.heard(seconds=2.0)


def test_a_listener_hears_the_token_sent_to_the_group():
    token = multicast_probe.new_token()
    assert _heard(token, token, 47311) == 1  # stops at the first


def test_datagrams_without_the_token_are_not_counted_as_heard_but_logged(caplog):
    with caplog.at_level("WARNING", logger="scopecast.scopes.multicast_probe"):
        assert _heard(multicast_probe.new_token(), multicast_probe.new_token(), 47312) == 0
    assert "ignored 5 datagram(s) without its token" in caplog.text


def test_multicast_passes_only_when_every_listener_heard_it():
    assert multicast_probe.decide({"host-a": 1, "host-b": 1})
    assert not multicast_probe.decide({"host-a": 1, "host-b": 0})
    assert not multicast_probe.decide({})  # nobody answered: not shown to pass
    assert multicast_probe.probe_port(40000) == 40001 and multicast_probe.probe_port(65535) == 65534


class _Call:
    """`handle.method.remote(...)` of a host scope's actor, served by a local object (the
    actor's own methods do only this; Ray is not what is tested here)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class _HostScope:
    """A host scope's probe methods over real ears and real sockets on loopback; `deaf` ones
    join nothing (a network that drops multicast to them)."""

    def __init__(self, deaf: bool = False):
        self.ears = multicast_probe.ProbeEars()

        async def join(group, port, token):
            if not deaf:
                self.ears.join("127.0.0.1", group, port, token)

        async def send(group, port, token):
            await asyncio.to_thread(multicast_probe.send, "127.0.0.1", group, port, token, 3)

        self.probe_join, self.probe_send = _Call(join), _Call(send)
        self.probe_heard = _Call(self.ears.heard)


def _probe(hosts: dict) -> tuple[multicast_probe.LanProbe, list[bool]]:
    told: list[bool] = []

    async def run():
        probe = multicast_probe.LanProbe("lan-x", told.append)
        probe.tick(hosts, (GROUP, 47320))
        await probe._running
        probe.tick(hosts, (GROUP, 47320))  # the same hosts, verified or just probed: no probe
        assert probe._running.done()
        return probe
    return asyncio.run(run()), told


def test_a_lan_probe_turns_multicast_on_when_every_host_heard_it():
    probe, told = _probe({"h1": _HostScope(), "h2": _HostScope(), "h3": _HostScope()})
    assert told == [False, True]  # off while probing, then on
    assert probe.state.state == "passes" and probe.state.heard == {"h1": 1, "h2": 1, "h3": 1}
    assert probe.state.verified == {"h1", "h2", "h3"}


def test_a_lan_probe_leaves_multicast_off_when_a_host_heard_nothing():
    probe, told = _probe({"h1": _HostScope(), "h2": _HostScope(deaf=True)})
    assert told == [False, False]
    assert probe.state.state == "unicast-only" and probe.state.heard["h2"] == 0


def test_a_lan_of_one_host_needs_no_probe():
    told: list[bool] = []
    probe = multicast_probe.LanProbe("lan-x", told.append)

    async def tick():
        probe.tick({"h1": _HostScope()}, (GROUP, 47321))
    asyncio.run(tick())
    assert told == [True] and probe.state.state == "single host" and probe._running is None
