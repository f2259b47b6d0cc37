"""Reliability under real loss and real crashes: iptables drops UDP datagrams at random (data,
tokens, summaries, NAKs and repairs alike), processes are stopped and killed with signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest
import ray
import ray.cloudpickle

from benchmarks import loss
from benchmarks.loss import available, dropped, udp_loss
from scopecast import FlushTimeout, RuntimeConfig, WindowFull
from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer
from scopecast.scopes.status import members, walk
from tests.conftest import TOKEN_PERIOD

pytestmark = pytest.mark.ray
needs_iptables = pytest.mark.skipif(not available(), reason="needs root and iptables")

N = 50_000


def _consumers(topic: str, n: int = 4, threads: int = 1) -> list:
    """`threads` 2: hold_io/release_io are taken while consume() runs."""
    actors = [ray.remote(num_cpus=0)(TopicConsumer).options(max_concurrency=threads).remote(topic)
              for _ in range(n)]
    ray.get([a.ready.remote() for a in actors])
    deadline = time.monotonic() + 60  # regular (netio/promotion): what follows waits for them
    while any(c["recovery"]["light"] for c in ray.get([a.counters.remote() for a in actors])):
        assert time.monotonic() < deadline, "a subscriber was never promoted"
        time.sleep(0.05)
    return actors


def _pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def _stream(cluster, topic: str, n: int, during=None, pad: int = 300) -> DeliveryDigest:
    """Publish n messages of up to `pad` bytes more than 9 (calling `during(i)` after each),
    flush, close; the expected digest."""
    expected = DeliveryDigest()
    with cluster.publisher(topic) as pub:
        for i in range(1, n + 1):
            payload = b"m%08d" % i + b"." * (i % pad)
            pub.publish(payload)
            expected.add(topic, i, payload)
            if during is not None:
                during(i)
        pub.flush(timeout=180)
    return expected


def _check_all(results: list[dict], n: int, expected: DeliveryDigest) -> None:
    for r in results:
        assert (r["count"], r["gaps"], r["out_of_order"]) == (n, 0, 0), r
        assert r["digest"] == expected.hexdigest()


@needs_iptables
def test_a_loss_rule_left_by_a_killed_process_is_swept_and_a_live_ones_kept():
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = loss._rule(0.0, pid=gone.pid)
    subprocess.run(["iptables", "-A", *stale], check=True)
    try:
        with udp_loss(0.0):
            rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True,
                                   check=True).stdout
            assert f"scopecast-loss-{gone.pid}" not in rules
            assert f"scopecast-loss-{os.getpid()}" in rules
    finally:
        subprocess.run(["iptables", "-D", *stale], capture_output=True)


@needs_iptables
@pytest.mark.parametrize("policy", ["lan_multicast", "chain"])
@pytest.mark.parametrize("loss", [0.01, 0.05, 0.20])
def test_every_subscriber_gets_every_message_once_in_order_under_random_loss(
        cluster, topic_name, policy, loss):
    cluster.create_topic(topic_name, policy=policy)
    actors = _consumers(topic_name)
    pending = [a.consume.remote(N, 300.0) for a in actors]
    with udp_loss(loss):
        # at 1%, 8 MB of messages are too few datagrams for a drop to be certain: 50 MB
        expected = _stream(cluster, topic_name, N, pad=2000 if loss < 0.05 else 300)
        results = ray.get(pending, timeout=300)
        assert dropped() > 0
    _check_all(results, N, expected)
    stats = [ray.get(a.counters.remote())["stats"] for a in actors]
    assert all(s["summaries_sent"] > 0 for s in stats)  # each talks to its agent
    ray.get([a.close.remote() for a in actors])


@needs_iptables
@pytest.mark.parametrize("policy", ["lan_multicast", "chain"])
def test_every_subscriber_sees_the_end_of_stream_marker_under_loss(cluster, topic_name, policy):
    """The marker is one datagram, lost like any other (on a `chain` it reaches the first hop
    only): the sender's record repeats it, which goes to every member of the domain."""
    cluster.create_topic(topic_name, policy=policy)
    actors = _consumers(topic_name)
    n = 500
    pending = [a.consume.remote(n, 300.0) for a in actors]
    with udp_loss(0.20):
        expected = _stream(cluster, topic_name, n)  # flushed and closed: the marker follows
        results = ray.get(pending, timeout=300)
        deadline = time.monotonic() + 60
        while True:
            ends = ray.get([a.ends.remote() for a in actors])
            if all(list(e.values()) == [n] for e in ends):
                break
            assert time.monotonic() < deadline, ends
            time.sleep(0.2)
    _check_all(results, n, expected)
    ray.get([a.close.remote() for a in actors])


@needs_iptables
def test_an_end_marker_lost_until_close_returns_is_still_repaired(cluster, topic_name):
    """Every datagram is dropped from before the close until after it returned (END_WAIT): the
    marker, its probes, the tokens. The member stays in the recovery domain while its marker is
    not stable, so the marker comes once the network does (were it gone, nobody could repair it)."""
    cluster.create_topic(topic_name, policy="chain")
    actors = _consumers(topic_name)
    n = 200
    pending = [a.consume.remote(n, 60.0) for a in actors]
    pub = cluster.publisher(topic_name)
    for i in range(1, n + 1):
        pub.publish(b"m%08d" % i)
    pub.flush(timeout=60)
    assert [r["count"] for r in ray.get(pending, timeout=90)] == [n] * len(actors)
    with udp_loss(1.0):
        closing = threading.Thread(target=pub.close)
        closing.start()
        closing.join(timeout=60)
        assert not closing.is_alive() and pub.closed
        assert not any(ray.get([a.ends.remote() for a in actors]))
    deadline = time.monotonic() + 60
    while (ends := ray.get([a.ends.remote() for a in actors])) != [ends[0]] * len(actors) \
            or list(ends[0].values()) != [n]:
        assert time.monotonic() < deadline, ends
        time.sleep(0.2)
    ray.get([a.close.remote() for a in actors])


@needs_iptables
def test_subscribers_of_the_same_topics_share_a_region_and_repair_each_other_under_loss(
        cluster, topic_name):
    """One sender, two topics, two subscribers each, in one host scope: one recovery domain (the
    sender's stream is one), two regions (QSM), each kept together in the ring; NAKs are served
    within a region, whose peers take the same topics."""
    topics = [f"{topic_name}/a", f"{topic_name}/b"]
    for t in topics:
        cluster.create_topic(t, policy="lan_multicast")
    actors = {t: _consumers(t, 2) for t in topics}
    pids = {t: {_pid(a) for a in xs} for t, xs in actors.items()}
    n = 10_000
    pending = [a.consume.remote(n, 300.0) for xs in actors.values() for a in xs]
    with udp_loss(0.05):
        with cluster.publisher(topics[0]) as pa, cluster.publisher(topics[1]) as pb:
            for i in range(1, n + 1):
                pa.publish(b"a%08d" % i)
                pb.publish(b"b%08d" % i)
            pa.flush(timeout=180)
            pb.flush(timeout=180)
            status = cluster.status()
        results = ray.get(pending, timeout=300)
        assert dropped() > 0
    for r in results:
        assert (r["count"], r["gaps"], r["out_of_order"]) == (n, 0, 0), r
    names = {m["pid"]: m["name"] for m in members(status)}
    mine = {names[p] for ps in pids.values() for p in ps}
    (domain,) = [d for s in walk(status) for d in s.get("recovery", {}).values()
                 if mine <= set(d["members"])]
    region = dict(zip(domain["members"], domain["regions"], strict=True))
    by_topic = [{region[names[p]] for p in pids[t]} for t in topics]
    assert all(len(r) == 1 for r in by_topic) and by_topic[0] != by_topic[1], domain
    # each region's members are together in the ring, regions numbered in ring order
    assert domain["regions"] == sorted(domain["regions"]), domain
    ray.get([a.close.remote() for xs in actors.values() for a in xs])


@needs_iptables
@pytest.mark.parametrize("policy", ["lan_multicast", "chain"])
def test_a_publisher_going_round_topics_reaches_every_subscriber_whole_under_loss(
        cluster, topic_name, policy):
    """A publisher going round 20 topics (which sends mixed runs, see `wire`, whenever the I/O
    thread finds several of its messages queued): with 5% of datagrams dropped every subscriber
    of all of them still gets each topic's messages once and in order."""
    topics = [f"{topic_name}/{i}" for i in range(20)]
    for t in topics:
        cluster.create_topic(t, policy=policy)
    actors = _consumers(f"{topic_name}/*")
    per_topic = 1500
    total = per_topic * len(topics)
    pending = [a.consume.remote(total, 300.0, None, False) for a in actors]
    with udp_loss(0.05):
        pubs = cluster.publishers(topics)
        try:
            for i in range(per_topic):
                for pub in pubs:
                    pub.publish(b"r%08d" % i + b"." * 200)
            for pub in pubs:
                pub.flush(timeout=180)
        finally:
            for pub in pubs:
                pub.close()
        results = ray.get(pending, timeout=300)
        assert dropped() > 0
    for r in results:
        assert (r["count"], r["gaps"], r["out_of_order"]) == (total, 0, 0), r
        assert sorted(r["last_seq"].values()) == [per_topic] * len(topics)
    ray.get([a.close.remote() for a in actors])


@needs_iptables
def test_a_subscriber_that_stops_for_two_seconds_catches_up(cluster, topic_name):
    cluster.create_topic(topic_name, policy="lan_multicast")
    actors = _consumers(topic_name, 2)
    sleeper = _pid(actors[0])
    pending = [a.consume.remote(N, 300.0) for a in actors]

    def pause(i: int) -> None:
        if i == N // 3:
            os.kill(sleeper, signal.SIGSTOP)
        elif i == N // 2:
            time.sleep(2.0)
            os.kill(sleeper, signal.SIGCONT)

    try:
        with udp_loss(0.05):
            expected = _stream(cluster, topic_name, N, pause)
            results = ray.get(pending, timeout=300)
    finally:
        os.kill(sleeper, signal.SIGCONT)
    _check_all(results, N, expected)
    ray.get([a.close.remote() for a in actors])


def test_flush_returns_only_when_every_member_holds_the_messages(cluster, topic_name):
    cluster.create_topic(topic_name, policy="lan_multicast")
    (actor,) = _consumers(topic_name, 1, threads=2)
    pending = actor.consume.remote(100, 120.0)
    pub = cluster.publisher(topic_name)
    ray.get(actor.hold_io.remote(120.0))  # (a stopped process would be dropped after a while)
    try:
        for i in range(100):
            pub.publish(b"%d" % i)
        # it says how far its stream is stable and what its agent last said of it
        with pytest.raises(FlushTimeout, match=r"stable up to stream seq \d+ of \d+ sent; "
                           r"token_ring agent at [\d.]+:\d+ answered [\d.]+s ago"):
            pub.flush(timeout=2.0)
    finally:
        ray.get(actor.release_io.remote())
    pub.flush(timeout=60.0)
    assert ray.get(pending)["count"] == 100
    pub.close()
    ray.get(actor.close.remote())


def test_a_publisher_block_that_fails_keeps_its_exception_when_the_close_cannot_flush(
        cluster, topic_name):
    """The close on leaving a `with` block times out too (a member's I/O thread is held, so it
    stays a member but holds nothing new): the exception that left the block is the one raised,
    not the close's FlushTimeout."""
    cluster.create_topic(topic_name, policy="lan_multicast")
    (actor,) = _consumers(topic_name, 1)
    with pytest.raises(FlushTimeout, match=r"within 1\.0s"):
        with cluster.publisher(topic_name) as pub:
            ray.get(actor.hold_io.remote(20.0))
            pub.publish(b"x")
            pub.flush(timeout=1.0)
    ray.get(actor.release_io.remote())
    ray.get(actor.close.remote())


class WindowProbe:
    """A publisher whose window of unstable messages is small and does not block."""

    def __init__(self, topic: str) -> None:
        import scopecast

        self.cluster = scopecast.connect(config=RuntimeConfig(stable_window_bytes=1 << 20,
                                                              block_when_full=False))
        self.pub = self.cluster.publisher(topic)

    def fill(self, batch: bool) -> tuple[int, str]:
        """Publish until the window is full: (the first message refused, the error)."""
        if batch:  # a batch stops where the window filled; the next one is refused
            payload = msgpack.packb(b"x" * 1000)
            queued = self.pub.publish_msgpack_batch([payload] * 100_000)
            try:
                self.pub.publish_msgpack_batch([payload])
            except Exception as exc:  # noqa: BLE001 - reported to the test
                return queued + 1, type(exc).__name__
            return 0, ""
        for i in range(1, 100_000):
            try:
                self.pub.publish(b"x" * 1000)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                return i, type(exc).__name__
        return 0, ""

    def finish(self) -> int:
        self.pub.flush(timeout=60.0)
        seq = self.pub.seq
        self.pub.close()
        self.cluster.shutdown()
        return seq


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests


@pytest.mark.parametrize("batch", [False, True])
def test_a_full_window_raises_window_full_when_not_blocking(cluster, topic_name, batch):
    cluster.create_topic(topic_name, policy="lan_multicast")
    (actor,) = _consumers(topic_name, 1, threads=2)
    probe = ray.remote(num_cpus=0)(WindowProbe).remote(topic_name)
    pending = actor.consume.remote(None, 120.0, 5.0)
    ray.get(probe.__ray_ready__.remote())
    ray.get(actor.hold_io.remote(120.0))
    try:
        at, error = ray.get(probe.fill.remote(batch), timeout=120)
    finally:
        ray.get(actor.release_io.remote())
    assert error == WindowFull.__name__
    assert 500 < at < 2000  # about a MiB of 1 KB messages
    published = ray.get(probe.finish.remote(), timeout=120)
    assert ray.get(pending)["count"] == published


def _agents(status: dict) -> dict[str, dict]:
    out = {}
    for s in walk(status):
        for domain in s.get("recovery", {}).values():
            for name, agent in domain["agents"].items():
                out[f"{s['path']}|{name}"] = agent
    return out


def test_a_killed_leader_agent_is_restarted_the_ring_rebuilt_and_nothing_lost(cluster, topic_name):
    cluster.create_topic(topic_name, policy="lan_multicast")
    actors = _consumers(topic_name, 3)
    pids = {_pid(a) for a in actors}
    pending = [a.consume.remote(N, 300.0) for a in actors]
    killed: dict = {}

    def leader(status: dict) -> tuple[str, dict] | None:
        """The leading agent of the peer group our subscribers are in."""
        path = next(m["scope"] for m in members(status) if m["pid"] in pids)
        return next(((k, a) for k, a in _agents(status).items() if k.startswith(path + "|")
                     and a.get("leader") and len(a.get("peers", ())) > 1), None)

    def kill_leader(i: int) -> None:
        if i == N // 3:
            deadline = time.monotonic() + 30
            while (found := leader(cluster.status())) is None:
                assert time.monotonic() < deadline, "no ring with a leader"
                time.sleep(0.2)
            killed.update(found[1])
            # (its status shows its protocol's state: it leads its partition's ring)
            assert found[1]["state"]["rings"]["p"]["members"][0] == found[1]["index"] == 0
            assert isinstance(found[1]["missing"], int)
            os.kill(found[1]["pid"], signal.SIGKILL)

    expected = _stream(cluster, topic_name, N, kill_leader)
    _check_all(ray.get(pending, timeout=300), N, expected)
    deadline = time.monotonic() + 30
    while (after := leader(cluster.status())) is None or after[1]["pid"] == killed["pid"] \
            or not after[1]["view"]:
        assert time.monotonic() < deadline, f"no leader back after the kill: {after}"
        time.sleep(0.5)
    # the cluster's token period setting (not the default: see conftest) reached every agent,
    # the recreated ones too
    period = cluster.status()["settings"]["token_period"]
    assert period != 0.05
    assert {a["options"]["active_period"] for a in _agents(cluster.status()).values()
            if "error" not in a} == {period}
    ray.get([a.close.remote() for a in actors])


def test_a_member_that_stays_behind_is_demoted_to_client_instead_of_stalling_the_publisher(
        cluster, topic_name):
    cluster.create_topic(topic_name, policy="lan_multicast")
    fast, slow = _consumers(topic_name, 2)
    slow_pid = _pid(slow)
    n = 40_000  # 1 KB each: well past the slow_lag_mb (16 MiB) the slow one never reads
    pending = fast.consume.remote(n, 300.0)
    expected = DeliveryDigest()
    with cluster.publisher(topic_name) as pub:
        for i in range(1, n + 1):
            payload = b"%08d" % i + b"." * 1016
            pub.publish(payload)
            expected.add(topic_name, i, payload)
        pub.flush(timeout=180)
    _check_all([ray.get(pending, timeout=300)], n, expected)
    deadline = time.monotonic() + 60
    while True:  # the scope demotes it, then tells it: its own counters say so a moment later
        (member,) = [m for m in members(cluster.status()) if m["pid"] == slow_pid]
        if member["demoted"] and member["role"] == member["counters"]["role"] == "client":
            break
        assert time.monotonic() < deadline, f"never demoted: {member}"
        time.sleep(0.5)
    ray.get([a.close.remote() for a in (fast, slow)])


PUBLISHER = """
import sys, time, scopecast
cluster = scopecast.connect(address=sys.argv[1], start=False)
pub = cluster.publisher(sys.argv[2])
print("publishing", flush=True)
i = 0
while True:
    i += 1
    pub.publish(b"m%08d" % i + b"." * (i % 300))
    if i % 100 == 0:  # paced: subscribers keep up, so none is demoted for lagging (another test)
        time.sleep(0.002)
"""


@needs_iptables
@pytest.mark.parametrize("policy", ["lan_multicast", "chain"])
def test_after_the_publisher_is_killed_the_survivors_agree_on_one_gap_free_prefix(
        cluster, ray_address, topic_name, policy):
    cluster.create_topic(topic_name, policy=policy)
    actors = _consumers(topic_name)
    pending = [a.consume.remote(None, 240.0, 30.0) for a in actors]  # idle: a liveness bound
    with udp_loss(0.05):
        publisher = subprocess.Popen([sys.executable, "-c", PUBLISHER, ray_address, topic_name],
                                     stdout=subprocess.PIPE, text=True)
        try:
            for line in publisher.stdout:  # (Ray's own log lines may come first)
                if line.strip() == "publishing":
                    break
            time.sleep(1.5)  # mid-stream, nothing flushed
        finally:
            publisher.send_signal(signal.SIGKILL)
            publisher.wait(30)
        results = ray.get(pending, timeout=300)
    assert results[0]["count"] > 0
    for r in results:
        assert not r["demoted"]  # (a client gets no guarantee)
        assert (r["gaps"], r["out_of_order"]) == (0, 0)
    assert len({(r["count"], r["digest"]) for r in results}) == 1, \
        [(r["count"], r["digest"][:8]) for r in results]
    ray.get([a.close.remote() for a in actors])


def test_a_killed_host_scope_manager_is_restarted_rebuilds_from_its_members_and_nothing_is_lost(
        cluster, topic_name):
    cluster.create_topic(topic_name, policy="lan_multicast")
    actors = _consumers(topic_name, 3)
    pids = {_pid(a) for a in actors}
    host = next(s for s in walk(cluster.status())
                if s["kind"] == "host" and pids <= {m["pid"] for m in s.get("members", [])})
    pending = [a.consume.remote(N, 300.0) for a in actors]

    def kill_host_scope(i: int) -> None:
        if i == N // 3:
            os.kill(host["pid"], signal.SIGKILL)

    expected = _stream(cluster, topic_name, N, kill_host_scope)
    _check_all(ray.get(pending, timeout=300), N, expected)
    deadline = time.monotonic() + 60
    while True:  # Ray restarted it empty; its members registered again with their old ids
        after = next((s for s in walk(cluster.status()) if s["path"] == host["path"]), {})
        if after.get("pid") not in (None, host["pid"]) and \
                pids <= {m["pid"] for m in after.get("members", [])}:
            break
        assert time.monotonic() < deadline, f"host scope not rebuilt: {after}"
        time.sleep(0.5)
    ray.get([a.close.remote() for a in actors])


def _member(cluster, pid: int, topic: str) -> dict:
    """The member process `pid` that publishes or subscribes to `topic` (a process may be a
    member of several scopes)."""
    tid = cluster.topic(topic).id
    (member,) = [m for m in members(cluster.status()) if m["pid"] == pid
                 and tid in m["publishes"] + m["subscribes"]]
    return member


@pytest.mark.parametrize("history", ["from_join", "cached"])
def test_a_late_joiner_starts_at_its_join_point_or_replays_what_is_cached_then_is_regular(
        cluster, topic_name, history):
    cluster.create_topic(topic_name, policy="lan_multicast", history=history)
    (early,) = _consumers(topic_name, 1, threads=2)
    early_pending = early.consume.remote(3000, 120.0)
    with cluster.publisher(topic_name) as pub:
        for i in range(1, 1001):
            pub.publish(b"%d" % i)
        pub.flush(timeout=60.0)  # 1..1000 stable: cached nowhere any more
        # (held, not stopped: a process stopped past member_timeout on a loaded machine would be
        # dropped, and 1001.. would become stable without it)
        ray.get(early.hold_io.remote(120.0))
        try:  # while it holds, nothing more becomes stable: 1001.. stay cached
            for i in range(1001, 2001):
                pub.publish(b"%d" % i)
            (late,) = _consumers(topic_name, 1)
            late_pid = _pid(late)
            late_pending = late.consume.remote(None, 120.0, 5.0)
            late_id = _member(cluster, late_pid, topic_name)["id"]
            deadline = time.monotonic() + 30
            while True:  # the publisher's scope has told it of the joiner: its join point is set
                me = _member(cluster, os.getpid(), topic_name)
                if me["installed"] >= me["view"] and any(
                        late_id in ids for ids in me["receivers"].values()):
                    break
                assert time.monotonic() < deadline, f"joiner never listed: {me}"
                time.sleep(0.1)
            for i in range(2001, 3001):
                pub.publish(b"%d" % i)
        finally:
            ray.get(early.release_io.remote())
        pub.flush(timeout=60.0)
    assert ray.get(early_pending, timeout=120)["count"] == 3000
    r = ray.get(late_pending, timeout=120)
    assert len(r["last_seq"]) == 1, r
    (last,) = r["last_seq"].values()
    assert (last, r["gaps"], r["out_of_order"]) == (3000, 0, 0), r
    first = last - r["count"] + 1
    late_member = _member(cluster, late_pid, topic_name)
    if history == "cached":
        assert first == 1001, late_member["counters"]  # everything not yet stable when it joined
    else:
        assert 1001 < first <= 2001, late_member["counters"]  # from where it joined: no history
    assert late_member["counters"]["role"] == "regular"
    assert late_member["counters"]["stats"].get("joins_caught_up", 0) >= 1
    ray.get([a.close.remote() for a in (early, late)])


@needs_iptables
def test_status_counts_per_member_drops_naks_repairs_window_token_period_and_role(cluster, topic_name):
    import socket

    cluster.create_topic(topic_name, policy="lan_multicast")
    actors = _consumers(topic_name, 2)
    pids = {_pid(a) for a in actors}
    n = N // 5
    pending = [a.consume.remote(n, 300.0) for a in actors]
    with udp_loss(0.05):
        # ~10 MB: some 160 datagrams of 64 KB, so that 5% loss is sure to hit data (at 300 bytes
        # of padding, 25 datagrams went through unharmed about one run in four)
        expected = _stream(cluster, topic_name, n, pad=2000)
        results = ray.get(pending, timeout=300)
    _check_all(results, n, expected)
    subs = [m for m in members(cluster.status()) if m["pid"] in pids]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # forged: no valid MAC
        for m in subs:
            host, port = m["address"].rsplit(":", 1)
            s.sendto(b"SC" + os.urandom(62), (host, int(port)))

    def shown() -> list[dict] | None:
        """The subscribers' counters in status, once they show the forged datagram."""
        got = [m["counters"] for m in members(cluster.status()) if m["pid"] in pids]
        return got if len(got) == 2 and all(c.get("drops", {}).get("bad_mac") for c in got) \
            else None

    deadline = time.monotonic() + 30
    while (counters := shown()) is None:
        assert time.monotonic() < deadline, "status never showed the dropped datagram"
        time.sleep(0.5)
    # holes go to the agent with each summary and, a period later, to the sender directly; a
    # datagram both subscribers lost (loopback multicast loss is shared) is often filled by the
    # repair the other one asked for first, so one of them may never have asked
    naks = [c["stats"].get("naks_reported", 0) + c["stats"].get("naks_sent", 0) for c in counters]
    assert sum(naks) > 0, counters
    for c, asked in zip(counters, naks, strict=True):
        assert c["role"] == "regular"
        assert asked > 0 or c["stats"].get("repair_datagrams_in", 0) > 0, c
        assert c["stats"]["token_period_ms"] in (TOKEN_PERIOD * 1000, 1000)  # active, or idle
        assert c["recovery"]["window_limit"] == RuntimeConfig().stable_window_bytes
    # each repair's time, for percentiles over several members (the bench pools them)
    times = ray.get([a.__ray_call__.remote(lambda self: self._cluster.repair_times())
                     for a in actors])
    assert sum(map(len, times)) >= sum(c["recovery"]["repair_ms"]["count"] for c in counters) > 0
    assert all(ms >= 0 for t in times for ms in t)
    # the sender (this process) answered NAKs with repairs, and holds nothing once flushed
    senders = [c for c in cluster.counters().values() if c["stats"].get("naks_received")]
    assert senders and all(c["stats"]["repairs_sent"] > 0 for c in senders)
    assert all(c["recovery"]["window_bytes"] == 0 for c in senders)
    ray.get([a.close.remote() for a in actors])
