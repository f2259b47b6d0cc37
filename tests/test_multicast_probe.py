"""The LAN multicast probe's two halves on real sockets (loopback multicast works here), and its
decision."""

from __future__ import annotations

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
