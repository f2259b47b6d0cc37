"""Where a scope's recovery domain keeps its agents (pure logic, with stand-ins for the agent
hosts): an agent is delegated again when it stops answering, or when the child scope it stands for
is led along another chain."""

from __future__ import annotations

import asyncio
import itertools

from ray.exceptions import ActorUnschedulableError

from scopecast.scopes import recovery_domain
from scopecast.scopes.recovery_domain import AgentRecord, RecoveryDomain

_ids = itertools.count(1)


class _Call:
    def __init__(self, fn) -> None:
        self.remote = fn


class _Host:
    """An AgentHost stand-in: answers ensure() with an address unless it is down (its node dead:
    Ray gives it up) or slow (the ping times out)."""

    def __init__(self, ip: str) -> None:
        self.ip, self.down, self.slow, self.dropped = ip, False, False, []
        self.version = 0  # the latest view version this host's agent was sent
        self._actor_id = next(_ids)
        self.ensure_all = _Call(self._ensure_all)
        self.statuses = _Call(self._statuses)
        self.calls = 0
        self.hold: asyncio.Event | None = None  # set: its calls wait until it is set (busy)
        self.view = _Call(self._view)
        self.drop = _Call(self.dropped.append)

    def _view(self, name: str, version: int, *view) -> None:
        self.version = version

    async def _statuses(self, names: list[str]):
        self.calls += 1
        return [{"view": self.version, "name": n} for n in names]

    async def _ensure_all(self, specs: list[dict]):
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.down:
            raise ActorUnschedulableError(f"the node of {self.ip} is dead")
        if self.slow:
            raise TimeoutError
        return [(self.ip, 7000, 1, 100, self.version) for _ in specs]


class _Tree:
    """A parent scope's view of its child scopes: their lead chains and the hosts they lead on."""

    def __init__(self) -> None:
        self.hosts = {"host-a": _Host("10.0.0.1"), "host-b": _Host("10.0.0.2"),
                      "fallback": _Host("10.0.0.9")}
        self.leads: dict[str, tuple] = {"lan2": ("host-a", "m1")}
        self.placed = 0

    async def place(self, name: str) -> AgentRecord:
        self.placed += 1
        chain = self.leads.get(name, ())
        host = self.hosts[chain[0] if chain else "fallback"]
        return AgentRecord(host, {"name": f"agent|{name}"}, ["/", name, *chain])

    def belongs(self, name: str):
        return self.leads.get(name) or None


def _update(domain: RecoveryDomain, tree: _Tree) -> None:
    asyncio.run(domain.update([("lan2", 0)], tree.place, tree.belongs))


def _ip(domain: RecoveryDomain) -> str:
    return domain.agents["lan2"].address[0]


def test_an_agent_placed_before_its_child_had_a_leader_moves_at_once():
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    leads, tree.leads = tree.leads, {}
    _update(domain, tree)
    assert domain.agents["lan2"].chain == ["/", "lan2"] and _ip(domain) == "10.0.0.9"
    tree.leads = leads  # the child's domain has a leader now
    _update(domain, tree)
    _update(domain, tree)  # (the new agent answers on the next ping)
    assert domain.agents["lan2"].chain == ["/", "lan2", "host-a", "m1"]
    assert _ip(domain) == "10.0.0.1" and tree.hosts["fallback"].dropped == ["agent|lan2"]


def test_an_agent_follows_a_new_leader_of_its_child_but_not_within_replace_after():
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    _update(domain, tree)
    _update(domain, tree)
    assert tree.placed == 1 and _ip(domain) == "10.0.0.1"  # where it belongs: kept
    tree.leads["lan2"] = ("host-b", "m2")
    _update(domain, tree)
    assert tree.placed == 1  # just placed: a leader that changes back and forth moves nothing
    domain.agents["lan2"].placed_at -= recovery_domain.REPLACE_AFTER
    _update(domain, tree)
    _update(domain, tree)
    assert tree.placed == 2 and _ip(domain) == "10.0.0.2"
    assert tree.hosts["host-a"].dropped == ["agent|lan2"]


def test_an_agent_whose_child_is_led_elsewhere_on_the_same_host_keeps_answering():
    """Delegated along the new chain to the host it runs on already (one per node), it is the
    same agent: it stays in the views at its address, with no new version, even while its host
    is too loaded to answer a ping."""
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    _update(domain, tree)
    _update(domain, tree)
    version, rec = domain.version, domain.agents["lan2"]
    tree.leads["lan2"] = ("host-a", "m2")  # another member leads the child, on the same node
    tree.hosts["host-a"].slow = True
    _age(domain, recovery_domain.REPLACE_AFTER)
    _update(domain, tree)
    assert tree.placed == 2 and domain.agents["lan2"] is rec
    assert rec.chain == ["/", "lan2", "host-a", "m2"] and _ip(domain) == "10.0.0.1"
    assert domain.version == version and rec.sent[3] == 0  # not missing
    assert tree.hosts["host-a"].dropped == []


def _age(domain: RecoveryDomain, seconds: float) -> None:
    domain.agents["lan2"].placed_at -= seconds


def test_an_agent_whose_host_is_gone_is_delegated_again_and_held_missing_meanwhile():
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    _update(domain, tree)
    tree.hosts["host-a"].down = True
    tree.leads["lan2"] = ("host-b", "m2")  # the child's next leader
    _update(domain, tree)
    assert tree.placed == 1 and domain.agents["lan2"].gone  # (just placed: not at once)
    _age(domain, recovery_domain.REPLACE_AFTER)
    _update(domain, tree)
    rec = domain.agents["lan2"]
    assert tree.placed == 2 and rec.address is None  # not answered yet: missing in the views
    _update(domain, tree)
    assert _ip(domain) == "10.0.0.2"


def test_a_host_is_asked_once_per_tick_for_all_its_agents_and_not_again_until_it_answers(
        monkeypatch):
    """A call a host has not answered yet stays queued there: asked again each tick, a loaded
    host fell further behind until no call answered in time (every agent's status timed out,
    and a group's stability with them)."""
    monkeypatch.setattr(recovery_domain, "PING_TIMEOUT", 0.01)
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    tree.leads["lan3"] = ("host-a", "m3")  # both agents on one host
    host, members = tree.hosts["host-a"], [("lan2", 0), ("lan3", 0)]

    async def ticks() -> None:
        await domain.update(members, tree.place, tree.belongs)
        assert host.calls == 1 and domain.address("lan3")[0] == "10.0.0.1"  # one for both
        host.hold = asyncio.Event()  # busy from now on
        for _ in range(5):
            await domain.update(members, tree.place, tree.belongs)
        assert host.calls == 2  # the one it has not answered: no more meanwhile
        assert domain.address("lan2") is not None and not domain.agents["lan2"].gone
        host.hold.set()
        await domain.update(members, tree.place, tree.belongs)  # its answer comes in
        assert host.calls == 2 and not domain._pings
        await domain.update(members, tree.place, tree.belongs)
        assert host.calls == 3
        status = await domain.agent_status(1.0)
        assert host.calls == 4 and status["lan3"]["name"] == "agent|lan3"
        assert status["lan2"]["chain"] == ["/", "lan2", "host-a", "m1"]

    asyncio.run(ticks())


def test_an_agent_on_a_slow_host_stays_where_it_is():
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    _update(domain, tree)
    tree.hosts["host-a"].slow = True
    _age(domain, 3600)
    _update(domain, tree)
    assert tree.placed == 1 and _ip(domain) == "10.0.0.1"  # a loaded machine moves nothing


def test_a_child_that_cannot_place_its_agent_holds_back_no_other_and_counts_missing():
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    tree.leads["lan3"] = ("host-b", "m2")
    members = [("lan2", 0), ("lan3", 0)]

    async def place(name: str) -> AgentRecord:
        if name == "lan3":
            raise TimeoutError  # its scope manager is slow to answer
        return await tree.place(name)

    assert not asyncio.run(domain.update([("lan3", 0)], place, tree.belongs))  # no agent yet
    for _ in range(2):
        asyncio.run(domain.update(members, place, tree.belongs))
    assert "lan3" not in domain.agents and _ip(domain) == "10.0.0.1"
    assert domain.agents["lan2"].sent[3] == 1  # its view holds stability for the missing one
    for _ in range(2):
        asyncio.run(domain.update(members, tree.place, tree.belongs))  # it answers at last
    assert domain.agents["lan3"].address[0] == "10.0.0.2" and domain.agents["lan2"].sent[3] == 0


def test_a_rebuilding_scope_holds_its_groups_stability_back_until_it_has_rebuilt():
    """A scope Ray restarted knows its children only as they report again: while it rebuilds
    (`hold`), every view counts one member missing, so nothing counts as held by the group."""
    tree, domain = _Tree(), RecoveryDomain("lan2", "token_ring", top=False)
    for _ in range(2):
        asyncio.run(domain.update([("lan2", 0)], tree.place, tree.belongs, hold=True))
    assert domain.agents["lan2"].sent[3] == 1
    asyncio.run(domain.update([("lan2", 0)], tree.place, tree.belongs))  # rebuilt
    assert domain.agents["lan2"].sent[3] == 0


def test_a_view_goes_out_once_per_version_and_a_restarted_scope_goes_on_past_its_agents():
    """A protocol takes messages of the same version as of the same view: a view sent again
    under its version (a new upper, say), taken by one agent before another, had a follower keep
    the rounds of the old one and drop every token of the new for good. Agents outlive a scope
    that Ray restarted: its new domain numbers from the latest version they were sent."""
    tree, domain = _Tree(), RecoveryDomain("lan1", "token_ring", top=False)
    host = tree.hosts["host-a"]
    for _ in range(2):
        _update(domain, tree)
    first = host.version
    domain.upper = ["10.0.0.5", 9000]  # the agent above moved
    _update(domain, tree)
    assert host.version == first + 1 == domain.version
    _update(domain, tree)
    assert host.version == first + 1  # nothing changed: nothing sent
    restarted = RecoveryDomain("lan1", "token_ring", top=False)
    for _ in range(2):
        _update(restarted, tree)
    assert host.version == restarted.version > first + 1


def test_a_member_process_joining_a_running_domain_is_light_and_one_coming_back_is_not():
    """Thesis 3.2.14: an agent made for a member process joining a domain that has agents already
    starts light (it holds nobody back until it reports); the domain's first members do not, nor
    does a process that comes back (dropped while stalled, then rejoined: it is regular, and
    stability must wait for what it still lacks)."""
    tree, domain = _Tree(), RecoveryDomain("", "token_ring", top=True)
    host = tree.hosts["host-a"]
    made: dict[str, bool] = {}  # agent -> light, as its host was asked to make it
    ensure = host.ensure_all.remote

    async def ensure_all(specs: list[dict]):
        made.update({s["name"]: bool(s.get("light")) for s in specs})
        return await ensure(specs)

    host.ensure_all = _Call(ensure_all)

    async def place(name: str) -> AgentRecord:
        return AgentRecord(host, {"name": name, "level": 1}, ["/"])

    def update(names: list[str]) -> dict[str, bool]:
        made.clear()
        asyncio.run(domain.update([(n, 0) for n in names], place, tree.belongs))
        return dict(made)

    assert update(["vm:1", "vm:2"]) == {"vm:1": False, "vm:2": False}
    assert update(["vm:1", "vm:2", "vm:3"])["vm:3"] is True
    update(["vm:1", "vm:3"])  # vm:2 dropped (stalled past the member timeout) ...
    assert update(["vm:1", "vm:2", "vm:3"])["vm:2"] is False  # ... and back: made again
