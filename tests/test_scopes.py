"""The scope hierarchy for real (thesis 3.2.1-3.2.5, 3.2.10): the campus example of Figures
3.14-3.17 with five member processes in scopes X/P, X/Q and X/R under policy `chain`; a member
killed mid-stream; many members in many scopes subscribing at once; every built-in policy."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import ray

from scopecast.actors import declare
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes import controlled_element
from scopecast.scopes.paths import scope_actor_name
from scopecast.scopes.scope_manager import DEFAULT_SETTINGS
from scopecast.scopes.status import members, scope, walk
from scopecast.scopes.views import MemberView

pytestmark = pytest.mark.ray

Consumer = ray.remote(num_cpus=0)(TopicConsumer)


def wait_for(predicate, what: str, timeout: float = 60.0, period: float = 0.2):
    """Poll `predicate` until it returns something truthy (a liveness bound, not a timing)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f}s"
        time.sleep(period)
    return value


def everyone_gets(pub, actors: dict, n: int, tag: bytes = b"m", timeout: float = 120.0) -> None:
    """Publish n messages; each of `actors` (name -> consumer) receives all, in order."""
    pending = {name: actor.consume.remote(n, timeout) for name, actor in actors.items()}
    for i in range(n):
        pub.publish(b"%s %d" % (tag, i))
    pub.flush(timeout=timeout)
    for name, ref in pending.items():
        got = ray.get(ref, timeout=2 * timeout)
        assert (got["count"], got["gaps"], got["out_of_order"]) == (n, 0, 0), name


def labels(status: dict, root: str) -> dict[str, list[str]]:
    """Each member under scope `root`: the labels of the channels it sends along."""
    return {m["name"]: sorted(c["label"] for c in m["channels"])
            for m in members(scope(status, root))}


@pytest.fixture(scope="module")
def campus(cluster):
    """A publishes in X/P; B in X/P, C and D in X/Q, E in X/R subscribe (Ray actors)."""
    import scopecast

    info = cluster.create_topic("campus/T", policy="chain")
    a = scopecast.connect(name="A")
    actors = {name: Consumer.remote(info.name, scope=path, name=name)
              for name, path in (("B", "X/P"), ("C", "X/Q"), ("D", "X/Q"), ("E", "X/R"))}
    ray.get([actor.ready.remote() for actor in actors.values()])
    pub = a.publisher(info.name, scope="X/P")
    yield info, pub, actors
    pub.close()
    a.shutdown()
    for actor in actors.values():
        try:
            ray.get(actor.close.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            pass


def test_campus_channels_are_exactly_those_of_the_text(cluster, campus):
    info, pub, actors = campus
    t = info.id
    expected = {"A": [f"A-B, {t}:A"], "B": [f"P:B-Q:C, {t}:P"], "C": [f"C-D, {t}:C"],
                "D": [f"Q:D-R:E, {t}:P"], "E": []}
    got = wait_for(lambda: (lambda ls: ls if ls == expected else None)(
        labels(cluster.status(), "X")), f"channels {expected}")
    assert got == expected
    status = cluster.status()
    x = scope(status, "X")
    assert x["topics"][str(t)]["channels"] == ["P->Q (origin P)", "Q->R (origin P)"]
    # X names its member scopes, never the processes below them
    assert x["members"] == [] and {s["name"] for s in x["scopes"]} == {"P", "Q", "R"}
    assert {m["name"] for m in members(scope(status, "X/Q"))} == {"C", "D"}
    # the delegation records: X's channels were handed to B and D through P and Q
    assert [(d["scope"], d["dst"]) for d in scope(status, "X/P")["delegated_here"]] == \
        [("X", ["Q", "C"])]
    assert [(d["scope"], d["dst"]) for d in scope(status, "X/Q")["delegated_here"]] == \
        [("X", ["R", "E"])]

    everyone_gets(pub, actors, 5_000, b"lecture")


def test_campus_member_killed_mid_stream_is_routed_around(cluster, campus):
    """D forwards Q's traffic to R. Killed, it is removed; Q's channel to R is delegated to C and
    everyone left receives what is published after the re-layout."""
    info, pub, actors = campus
    t = info.id
    d_pid = next(m["pid"] for m in members(cluster.status()) if m["name"] == "D")
    # phase one is not checked (what D held when it died is the Reliability issue's to recover)
    first = {name: actor.consume.remote(10**9, 30.0, 3.0) for name, actor in actors.items()
             if name != "D"}
    for i in range(3_000):
        pub.publish(b"before %d" % i)
        if i == 1_000:
            os.kill(d_pid, signal.SIGKILL)
    pub.flush(timeout=60)
    wait_for(lambda: "D" not in labels(cluster.status(), "X"), "D removed",
             timeout=3 * DEFAULT_SETTINGS["member_timeout"] + 20)
    expected = {"A": [f"A-B, {t}:A"], "B": [f"P:B-Q:C, {t}:P"], "C": [f"Q:C-R:E, {t}:P"],
                "E": []}
    wait_for(lambda: labels(cluster.status(), "X") == expected, f"re-layout to {expected}")
    ray.get(list(first.values()), timeout=240)  # what got through while D died
    wait_for(lambda: all(m["installed"] == m["view"] for m in members(scope(cluster.status(),
                                                                           "X"))),
             "every member has its new tables in place")
    everyone_gets(pub, {name: actors[name] for name in first}, 2_000, b"after")


def test_campus_scope_manager_killed_is_restarted_and_its_members_rejoin(cluster, campus):
    """The scope manager of X/R dies (kill -9); Ray restarts it empty, E registers again (same
    id) and X lays Q's channel to R again: E keeps receiving."""
    info, pub, actors = campus
    before = scope(cluster.status(), "X/R")
    e_id = next(m["id"] for m in before["members"] if m["name"] == "E")
    os.kill(before["pid"], signal.SIGKILL)

    def rejoined():
        status = cluster.status()
        try:
            r = scope(status, "X/R")
        except KeyError:  # X dropped it, silent past scope_timeout while it restarted (loaded)
            return False
        return ("error" not in r  # (not answering while it restarts)
                and r["pid"] != before["pid"] and [m["id"] for m in r["members"]] == [e_id]
                and all(m["installed"] == m["view"] for m in members(scope(status, "X")))
                and any(c["label"].startswith("Q:") for m in members(scope(status, "X/Q"))
                        for c in m["channels"]))
    wait_for(rejoined, "X/R restarted and E back in it", timeout=90)
    everyone_gets(pub, {name: actors[name] for name in "BCE"}, 2_000, b"again")


@pytest.mark.timeout(600)  # (its own budget: waves up to 600 s, delivery 240 s; 315 s in one CI run)
def test_many_members_in_many_scopes_subscribe_at_once_and_converge(cluster):
    """32 member actors in 8 scopes subscribe, 8 at once (one in each scope); the views converge
    (every member has its latest tables in place) and all of them receive everything. (32
    processes started at once on 2 cores, late in the suite, starved everything: CI.)"""
    info = cluster.create_topic("many/T")
    actors = []
    for _ in range(4):
        wave = [Consumer.remote(info.name, scope=f"many/s{i}") for i in range(8)]
        ray.get([a.ready.remote() for a in wave], timeout=600)
        actors += wave
    with cluster.publisher(info.name, scope="many/s0") as pub:
        status = cluster.status()
        many = members(scope(status, "many"))
        assert len([m for m in many if info.id in m["subscribes"]]) == 32
        assert all(m["installed"] == m["view"] for m in many)
        assert len(scope(status, "many")["scopes"]) == 8
        everyone_gets(pub, dict(enumerate(actors)), 2_000, timeout=240.0)
    ray.get([a.close.remote() for a in actors], timeout=120)


@pytest.mark.parametrize("policy", ["tree", "star", "chain", "lan_multicast", "replicated"])
def test_each_builtin_policy_delivers_across_scopes(cluster, policy):
    info = cluster.create_topic(f"policies/{policy}", policy=policy)
    actors = [Consumer.remote(info.name, scope=f"pol-{policy}/{s}") for s in "abab"]
    ray.get([a.ready.remote() for a in actors])
    with cluster.publisher(info.name, scope=f"pol-{policy}/a") as pub:
        everyone_gets(pub, dict(enumerate(actors)), 3_000)
        status = cluster.status()
    top = scope(status, f"pol-{policy}")
    inside = members(top)
    if policy == "lan_multicast":  # one group for the whole scope, no member forwards
        group = top["multicast"]
        assert all(group in m["groups"] for m in inside if info.id in m["subscribes"])
        assert all(c["endpoint"][0] == "g" for m in inside for c in m["channels"])
    elif policy == "replicated":  # a's channel to b is split modulo 2 over two of a's members
        assert top["topics"][str(info.id)]["channels"] == ["a->b (origin a) x2"]
        filters = [c.get("filter") for m in inside for c in m["channels"]
                   if c["laid_in"] == top["path"]]
        assert sorted(filters) == [["modulo", 2, 0], ["modulo", 2, 1]]
    else:
        assert all(c["endpoint"][0] == "u" for m in inside for c in m["channels"])
        assert top["topics"][str(info.id)]["channels"] == ["a->b (origin a)"]
    ray.get([a.close.remote() for a in actors])


class _Publisher:
    """A member process that only publishes (Ray actor)."""

    def __init__(self, topic: str, scope: str, name: str) -> None:
        import scopecast

        self.cluster = scopecast.connect(name=name)
        self.pub = self.cluster.publisher(topic, scope=scope)

    def publish(self, n: int) -> int:
        for i in range(n):
            self.pub.publish(b"%d" % i)
        self.pub.flush(timeout=120.0)
        return n

    def close(self) -> None:
        self.pub.close()
        self.cluster.shutdown()


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests


def test_the_entry_is_a_subscriber_not_a_member_that_only_publishes(cluster):
    """Two publishers A1 and A2 next to a subscriber S: the scope's entry (which every local
    source's traffic also reaches, to leave the scope) is S, so each publisher sends to S alone.
    The first member by name, A1, was the entry: A2's stream went to A1 as well, for nothing."""
    info = cluster.create_topic("entry/T", policy="tree")
    sub = Consumer.remote(info.name, scope="entry/P", name="S")
    ray.get(sub.ready.remote())
    pubs = [ray.remote(num_cpus=0)(_Publisher).remote(info.name, "entry/P", name)
            for name in ("A1", "A2")]
    ray.get([p.__ray_ready__.remote() for p in pubs])
    t = info.id
    expected = {"A1": [f"A1-S, {t}:A1"], "A2": [f"A2-S, {t}:A2"], "S": []}
    wait_for(lambda: labels(cluster.status(), "entry") == expected, f"channels {expected}")
    pending = sub.consume.remote(2_000, 120.0)
    assert ray.get([p.publish.remote(1_000) for p in pubs], timeout=240) == [1_000, 1_000]
    got = ray.get(pending, timeout=240)
    assert (got["count"], got["gaps"], got["out_of_order"]) == (2_000, 0, 0)
    ray.get([p.close.remote() for p in pubs] + [sub.close.remote()], timeout=120)


def test_a_channel_serving_many_topics_reaches_its_member_as_one_route(cluster):
    """The scope superimposes topics' channels: a process publishing 40 topics along one group
    gets one route with the 40 topics in its view (not 40 routes), and installs all 40."""
    infos = [cluster.create_topic(f"alike/t{i}", policy="lan_multicast") for i in range(40)]
    with cluster.subscriber("alike/*", scope="alike/R") as sub:  # (another member)
        pubs = cluster.publishers([i.name for i in infos], scope="alike/S")
        element = pubs[0]._element
        _version, view, _piece = MemberView.from_wire(
            ray.get(element.manager.watch.remote(element.member_id, 0, 0)))
        assert len(view.routes) == 1
        assert sorted(view.routes[0].topics) == sorted(i.id for i in infos)
        for p in pubs:
            p.publish(b"x")
        got = {sub.receive(timeout=30).topic for _ in infos}
        assert got == {i.name for i in infos}
        status = cluster.status()
        me = [m for m in members(scope(status, "alike")) if m["id"] == element.member_id]
        assert len(me[0]["channels"]) == 40
        for p in pubs:
            p.close()


def test_a_multicast_sender_waits_for_every_member_on_its_group(cluster):
    """With one subscriber next to the publisher, the scope's group still carries the topic and
    the publisher's window waits for that subscriber (else a fast sender overruns it)."""
    info = cluster.create_topic("policies/solo", policy="lan_multicast")
    actor = Consumer.remote(info.name, scope="solo")
    ray.get(actor.ready.remote())
    with cluster.publisher(info.name, scope="solo") as pub:
        inside = members(scope(cluster.status(), "solo"))
        me = next(m for m in inside if m["pid"] == os.getpid())
        other = next(m for m in inside if m["pid"] != os.getpid())
        assert [c["endpoint"][0] for c in me["channels"]] == ["g"]
        assert {i for ids in me["receivers"].values() for i in ids} == {other["id"]}
        everyone_gets(pub, {"sub": actor}, 20_000)
    ray.get(actor.close.remote())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_unused_member_leaves_and_its_empty_scope_retires_until_named_again(cluster,
                                                                               monkeypatch):
    """This process's member in retire/a leaves once it has had no subscriber there for IDLE_MEMBER_LINGER;
    retire/a, empty, retires (its process ends, its parent forgets it), then so does retire; a
    member naming retire/a again has it made anew, and it delivers."""
    monkeypatch.setattr(controlled_element, "IDLE_MEMBER_LINGER", 1.0)
    info = cluster.create_topic("retire/T")
    sub = cluster.subscriber(info.name, scope="retire/a")
    # (the tree in status is what the scopes reported up: retire/a's report may be on its way)
    first = wait_for(lambda: next((s for s in walk(cluster.status()) if s["path"] == "retire/a"),
                                  None), "retire/a in the status")
    assert [m["pid"] for m in first["members"]] == [os.getpid()]
    sub.close()
    wait_for(lambda: all(s["name"] != "retire" for s in scope(cluster.status(), "/")["scopes"]),
             "retire/a and then retire retired", timeout=180)
    wait_for(lambda: not _alive(first["pid"]), "the process of retire/a ended")
    actor = Consumer.remote(info.name, scope="retire/a")
    ray.get(actor.ready.remote())
    with cluster.publisher(info.name, scope="retire/b") as pub:
        everyone_gets(pub, {"a": actor}, 1_000)
    assert scope(cluster.status(), "retire/a")["pid"] != first["pid"]
    ray.get(actor.close.remote())


def test_a_member_stays_while_its_first_subscribe_is_under_way(cluster, monkeypatch):
    """A subscribe that takes longer than IDLE_MEMBER_LINGER (one over thousands of topics on a loaded
    machine did) does not find its member gone: a member is not unused while it subscribes."""
    monkeypatch.setattr(controlled_element, "IDLE_MEMBER_LINGER", 0.2)
    real = controlled_element.call

    def slow(method, *args, **kwargs):
        if getattr(method, "_method_name", "") == "subscribe":
            time.sleep(3.0)  # the control thread looks at each heartbeat, about once a second
        return real(method, *args, **kwargs)
    monkeypatch.setattr(controlled_element, "call", slow)
    info = cluster.create_topic("slowsub/T")
    sub = cluster.subscriber(info.name, scope="slowsub/a")
    with cluster.publisher(info.name, scope="slowsub/b") as pub:
        for i in range(100):
            pub.publish(b"%d" % i)
    got: list = []
    wait_for(lambda: got.extend(sub.receive_batch(0.1)) or len(got) >= 100, "100 messages")
    assert [m.payload for m in got] == [b"%d" % i for i in range(100)]
    sub.close()


def test_a_scope_manager_ended_for_good_is_made_again_by_its_members(cluster):
    """Ray gives the scope manager of gone/a up (killed, no restart): its member finds it gone,
    has it made again and joins it; the stream goes on."""
    info = cluster.create_topic("gone/T")
    actor = Consumer.remote(info.name, scope="gone/a")
    ray.get(actor.ready.remote())

    def gone_a() -> dict:
        """gone/a as the tree shows it now ({} until its report is in, e.g. on a loaded machine)."""
        return next((s for s in walk(cluster.status()) if s["path"] == "gone/a"), {})
    before = wait_for(lambda: (a := gone_a()).get("pid") and a, "gone/a in the status tree")
    ray.kill(ray.get_actor(scope_actor_name("gone/a"), namespace=declare.NAMESPACE),
             no_restart=True)
    wait_for(lambda: not _alive(before["pid"]), "the process of gone/a ended")

    def rejoined():
        a = gone_a()
        return a.get("pid") not in (None, before["pid"]) and len(a.get("members", ())) == 1
    wait_for(rejoined, "gone/a made again with its member", timeout=90)
    with cluster.publisher(info.name, scope="gone/b") as pub:
        everyone_gets(pub, {"a": actor}, 1_000)
    ray.get(actor.close.remote())


def test_subscription_cascades_up_and_the_last_close_withdraws_it(cluster):
    """The first subscriber in casc/a makes casc/a subscribe in casc and casc in the cluster
    scope; when the last one closes, the subscription is withdrawn all the way up."""
    info = cluster.create_topic("casc/T")

    def subscribed() -> tuple[bool, bool] | None:
        """(casc/a subscribes in casc, casc in the cluster scope); None while a scope manager
        does not answer status in time (a loaded machine): asked again."""
        at_root = next((s for s in scope(cluster.status(), "/")["scopes"] if s["name"] == "casc"),
                       None)  # (None until casc's first report reached the cluster scope)
        if at_root is None:
            return None
        in_casc = next((s for s in at_root.get("scopes", ()) if s["name"] == "a"), None)
        if "error" in at_root or (in_casc is not None and "error" in in_casc):
            return None
        return (in_casc is not None and info.id in in_casc["subscribes"],
                info.id in at_root["subscribes"])

    first = cluster.subscriber(info.name, scope="casc/a")
    second = cluster.subscriber(info.name, scope="casc/a")
    wait_for(lambda: subscribed() == (True, True), "the subscription cascaded up")
    first.close()
    assert wait_for(subscribed, "an answer") == (True, True)  # one subscriber is left
    second.close()
    wait_for(lambda: subscribed() == (False, False), "the subscription withdrawn up")
