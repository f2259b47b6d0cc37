"""Issue 8 item 3 where a lost host has a LAN neighbour: four hosts in two LANs, and the host that
leads lan2 (where the root's recovery agent for lan2 runs, beside the member the cross-LAN channel
delivers to) is lost halfway through a stream from host 1. The root's agent for lan2 is delegated
again, to the surviving host of lan2; every surviving subscriber gets every message."""

from __future__ import annotations

import contextlib
import time

import pytest

from scopecast.ray_cluster.local_hosts import LocalHosts
from tests.conftest import is_root
from tests.test_local_hosts import HaltingDriver, _complete, lan_scope_pid, lose, restarted_later, status_json

pytestmark = pytest.mark.skipif(not is_root(), reason="network namespaces need root")


@pytest.fixture(scope="module")
def hosts():
    cluster = LocalHosts(hosts=4, lans=2, prefix="scloss", net=80)
    cluster.down(quiet=True)
    cluster.up(progress=lambda line: None)
    yield cluster
    cluster.down(quiet=True)


def _root_agents(hosts: LocalHosts) -> dict[str, str]:
    """Child scope -> the address of the root's token_ring agent standing for it."""
    domain = status_json(hosts)["scopes"]["recovery"]["token_ring"]
    return {name: a["address"].rsplit(":", 1)[0] for name, a in domain["agents"].items()
            if a.get("address")}


@pytest.mark.timeout(600)  # (HaltingDriver.finish reports first)
@pytest.mark.parametrize("fault", ["cut off", "killed", "cut off with its LAN's scope manager"])
def test_the_host_leading_a_lan_lost_mid_stream_its_neighbour_loses_nothing(hosts, fault):
    """The third case is what the first meets when Ray happened to place lan2's scope manager on
    the lost host: lan2 is silent until Ray declares the host dead, then restarted elsewhere, and
    rebuilds from its hosts (here, wherever it runs, so that the case does not depend on
    placement: stopped for longer than the scope timeout, then killed)."""
    h1, h2, h3, h4 = hosts.hosts
    n = 20_000
    with HaltingDriver(hosts, "loss/" + "".join(w[0] for w in fault.split()), n) as driver:
        deadline = time.monotonic() + 60
        while (leader := _root_agents(hosts).get("lan2")) not in (h3.address, h4.address):
            assert time.monotonic() < deadline, f"the root's agent for lan2 is at {leader}"
            time.sleep(0.5)
        lost, neighbour = (h3, h4) if leader == h3.address else (h4, h3)
        lan2 = lan_scope_pid(hosts, "lan2")
        try:
            lose(hosts, lost, "killed" if fault == "killed" else "cut off")
            with (restarted_later(lan2) if fault.endswith("scope manager")
                  else contextlib.nullcontext()):
                r = driver.finish()
        finally:
            hosts.restart_host(lost)  # for the next case
    assert _complete(r["got"], n) == {h1.address, h2.address, neighbour.address}
    assert not [s["path"] for s in r["scopes"] if s["ip"] == lost.address]  # the tree converged
    agents = [a["ip"] for s in r["scopes"] for a in s["agents"]]
    assert agents and set(agents) <= {h1.address, h2.address, neighbour.address}, agents
    # the root's agent for lan2 was delegated again, down to the surviving host of lan2
    root = next(s for s in r["scopes"] if s["path"] == "/")
    assert [a["ip"] for a in root["agents"] if a["chain"][1] == "lan2"] == [neighbour.address], \
        root["agents"]
