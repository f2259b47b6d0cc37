"""Many datagrams per system call (GSO to send, GRO to receive) with MTU-sized datagrams: runs and
fragments keep working, streams arrive ordered and complete and are repaired under real loss, the
status says what is on and how many datagrams each call carried; the same with batch calls turned
off; the datagram size follows the interface's MTU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import ray
import ray.cloudpickle
from member_pair import TOPIC, member_pair, received, wait_for

from benchmarks.loss import available, dropped, udp_loss
from scopecast import RuntimeConfig
from scopecast.netio.transport import TransportConfig
from scopecast.netio.udp_batch import detect
from scopecast.ray_cluster.consumers import DeliveryDigest, TopicConsumer

needs_root = pytest.mark.skipif(not available(), reason="needs root, iptables and ip")
MTU_DATAGRAM = 1472  # a 1,500-byte Ethernet frame's UDP payload


def config(batch_calls: bool) -> RuntimeConfig:
    return RuntimeConfig(transport=TransportConfig(datagram_bytes=MTU_DATAGRAM, gso=batch_calls,
                                                   gro=batch_calls))


def payload(i: int) -> bytes:
    """Sizes from a few bytes (runs of many in a datagram) to twice the datagram (fragments)."""
    return b"%08d" % i + b"." * (i * 37 % 2900 if i % 10 == 0 else i * 37 % 1300)


def receive_all(b, inbox, n: int, quiet: float = 60.0) -> list:
    """What B's subscription gets, until `n` messages, a minute, or `quiet` seconds without a
    new one (B's receiver leading)."""
    got: list = []
    deadline = time.monotonic() + 60
    last = time.monotonic()
    while len(got) < n and time.monotonic() < min(deadline, last + quiet):
        if not inbox.queue:
            b.lead(lambda: bool(inbox.queue), 0.5)
        more = received(inbox)
        if more:
            got += more
            last = time.monotonic()
    return got


@pytest.mark.parametrize("batch_calls", [True, False], ids=["batched", "one-per-call"])
def test_mtu_sized_datagrams_carry_runs_and_fragments_ordered_and_complete(batch_calls):
    if batch_calls and not (detect("127.0.0.1").gso and detect("127.0.0.1").gro):
        pytest.skip("the kernel refuses UDP GSO or GRO on loopback")
    n = 20_000
    with member_pair(config(batch_calls), window=True) as (a, b, inbox):
        for i in range(1, n + 1):
            a.publish(TOPIC, 1, i, 0, payload(i))
        got = receive_all(b, inbox, n)
        assert [(m.seq, m.payload) for m in got] == [(i, payload(i)) for i in range(1, n + 1)]
        sent, took = a.call_wait(a._offload_status), b.call_wait(b._offload_status)
        stats = b.call_wait(lambda: dict(b.stats))
    assert stats["reassembled"] > 0                      # fragments
    assert a.stats["datagrams_out"] < n                  # runs: several messages a datagram
    assert (sent["gso"], took["gro"]) == (batch_calls, batch_calls)
    if batch_calls:
        assert sent["datagrams_per_send"] > 1 and took["datagrams_per_receive"] > 1
        # plain runs built and read in C, and the fragments of messages over a datagram built
        assert sent["datagrams_sealed"] > 0 and took["datagrams_scanned"] > 0
        assert a.stats["fragments_sealed"] > 0
        # messages that fill a datagram alone, queued without a chunk each (feed.LoneBatch)
        assert a.stats["datagrams_sealed_lone"] > 0
    else:
        assert sent["datagrams_per_send"] == took["datagrams_per_receive"] == 1
        assert sent["datagrams_sealed"] == took["datagrams_scanned"] == 0


@needs_root
def test_a_batch_the_firewall_drops_is_a_lost_send_and_batching_stays_on():
    """netfilter's OUTPUT drop fails a GSO send with EPERM: its datagrams are lost (recovery
    repairs them), the interface still takes batches."""
    if not detect("127.0.0.1").gso:
        pytest.skip("the kernel refuses UDP GSO on loopback")
    with member_pair(config(True)) as (a, b, _inbox):
        rule = ["OUTPUT", "-o", "lo", "-p", "udp", "--dport", str(b.address[1]), "-m", "comment",
                "--comment", f"scopecast-test-{os.getpid()}", "-j", "DROP"]
        subprocess.run(["iptables", "-A", *rule], check=True)
        try:
            for i in range(1, 2001):
                a.publish(TOPIC, 1, i, 0, payload(i))
            wait_for(lambda: a.call_wait(lambda: a.drops["send_error"]) > 0, "a lost send")
        finally:
            subprocess.run(["iptables", "-D", *rule], check=True)
        assert a.call_wait(a._offload_status)["gso"] is True
        assert a.call_wait(lambda: a.stats["gso_refused"]) == 0


class BatchPublisher:
    """A publisher with MTU-sized datagrams, batch calls on or off."""

    def __init__(self, topic: str, batch_calls: bool) -> None:
        import scopecast

        self.cluster = scopecast.connect(config=config(batch_calls))
        self.pub = self.cluster.publisher(topic)

    def stream(self, n: int) -> tuple[str, dict]:
        expected = DeliveryDigest()
        for i in range(1, n + 1):
            self.pub.publish(payload(i))
            expected.add(self.pub.topic, i, payload(i))
        self.pub.flush(timeout=180)
        (counters,) = self.cluster.counters().values()
        return expected.hexdigest(), counters

    def close(self) -> None:
        self.pub.close()
        self.cluster.shutdown()


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests


@pytest.mark.ray
@needs_root
@pytest.mark.parametrize("batch_calls", [True, False], ids=["batched", "one-per-call"])
def test_mtu_sized_datagrams_are_repaired_under_real_loss(cluster, topic_name, batch_calls):
    if batch_calls and not (detect("127.0.0.1").gso and detect("127.0.0.1").gro):
        pytest.skip("the kernel refuses UDP GSO or GRO on loopback")
    n = 10_000
    cluster.create_topic(topic_name, policy="lan_multicast")
    consumers = [ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name,
                                                              config=config(batch_calls))
                 for _ in range(2)]
    ray.get([c.ready.remote() for c in consumers])
    publisher = ray.remote(num_cpus=0)(BatchPublisher).remote(topic_name, batch_calls)
    pending = [c.consume.remote(n, 300.0) for c in consumers]
    with udp_loss(0.02):
        digest, sent = ray.get(publisher.stream.remote(n), timeout=300)
        results = ray.get(pending, timeout=300)
        assert dropped() > 0
    for r in results:
        assert (r["count"], r["gaps"], r["out_of_order"], r["digest"]) == (n, 0, 0, digest), r
    took = ray.get([c.counters.remote() for c in consumers])
    assert sum(c["stats"].get("naks_sent", 0) for c in took) > 0  # losses were repaired
    assert sent["offloads"]["gso"] == batch_calls, sent["offloads"]
    assert all(c["offloads"]["gro"] == batch_calls for c in took)
    if batch_calls:
        assert sent["offloads"]["datagrams_per_send"] > 1
        assert all(c["offloads"]["datagrams_per_receive"] > 1 for c in took)
    ray.get([c.close.remote() for c in consumers] + [publisher.close.remote()])


MTU_PROBE = "from scopecast.netio.transport import TransportConfig as T; import sys; " \
            "print(T(interface=sys.argv[1]).datagram_size())"


@needs_root
def test_the_datagram_size_follows_the_interface_mtu(tmp_path):
    """A namespace with an interface of MTU 1,400: a member on its address sends datagrams of
    the frame's UDP payload (1,372 bytes); on loopback, 64 KB ones."""
    ns = f"scmtu{tmp_path.name[-6:]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                    ["link", "set", "v0", "mtu", "1400"],
                    ["addr", "add", "10.201.7.1/24", "dev", "v0"], ["link", "set", "v0", "up"]):
            subprocess.run(["ip", "netns", "exec", ns, "ip", *cmd], check=True)
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", MTU_PROBE,
                              "10.201.7.1"], capture_output=True, text=True, check=True)
        assert int(out.stdout) == 1400 - 28
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert TransportConfig(interface="127.0.0.1").datagram_size() == 65_000
    assert TransportConfig(interface="127.0.0.1", datagram_bytes=1472).datagram_size() == 1472


@pytest.mark.parametrize("batch_calls", [True, False], ids=["batched", "one-per-call"])
def test_no_datagram_is_larger_than_the_datagram_size(batch_calls):
    """The datagram size is a UDP payload that fits the link's MTU: a datagram one byte over is
    cut into IP fragments on the wire, and a GSO batch of them is refused by the kernel. Full
    datagrams of small messages, and the fragments of a large one, stay within it."""
    sizes: list[int] = []
    with member_pair(config(batch_calls), window=True) as (a, b, inbox):
        send = a.sender._send

        def measured(address, parts, segment):
            if segment:
                sizes.append(segment)
            else:
                sizes.extend(len(d) + len(mac) for d, mac in zip(parts[::2], parts[1::2], strict=True))
            return send(address, parts, segment)
        a.sender._send = measured
        n = 400
        for i in range(1, n + 1):  # many small ones (full datagrams), every 50th of 5 KB
            a.publish(TOPIC, 1, i, 0, b"%08d" % i + b"." * (5000 if i % 50 == 0 else 90))
        got = receive_all(b, inbox, n, quiet=5.0)
    # (no recovery runs here: a datagram the kernel drops stays lost, which is not this test's
    # point, so it waits only until nothing more comes; what arrives is in order, and the large
    # messages whole)
    seqs = [m.seq for m in got]
    assert len(got) > n // 2 and seqs == sorted(set(seqs))
    assert any(len(m.payload) == 5008 for m in got)
    assert all(len(m.payload) == (5008 if m.seq % 50 == 0 else 98) for m in got)
    assert sizes and max(sizes) <= MTU_DATAGRAM, max(sizes)
    assert max(sizes) > MTU_DATAGRAM - 120  # (and they are full: the check saw full ones)


def test_a_batch_the_kernel_refuses_goes_a_datagram_a_call_and_gso_is_off_only_when_it_repeats():
    """A GSO send failing for no transient reason (here EINVAL: more segments than the kernel
    takes in one call) sends that batch one datagram per call; one such failure may be the
    moment's, so GSO stays on, and it goes off at the GSO_REFUSALS-th in a row."""
    from scopecast.netio.send_path import GSO_REFUSALS

    if not detect("127.0.0.1").gso:
        pytest.skip("the kernel refuses UDP GSO on loopback")
    with member_pair(config(True)) as (a, b, _inbox):
        too_many = [b"x" * (100 * 200)]  # 200 segments of 100 bytes: EINVAL on Linux

        def refused_once() -> dict:
            before = a.stats["send_calls"]
            assert a.sender._send(b.address, list(too_many), 100) is True
            return {**a._offload_status(), "calls": a.stats["send_calls"] - before}

        for i in range(1, GSO_REFUSALS):
            status = a.call_wait(refused_once)
            assert status["calls"] == 200, status  # the batch went, a datagram a call
            assert status["gso"] is True and status["gso_failed"] == i, status
            assert status["gso_error"].startswith("EINVAL"), status
        status = a.call_wait(refused_once)
        assert status["gso"] is False and status["gso_failed"] == GSO_REFUSALS, status
        assert a.call_wait(lambda: a.stats["gso_refused"]) == 1
        # datagrams that were never sealed are junk to B: dropped and counted, not delivered
        wait_for(lambda: b.call_wait(lambda: sum(b.drops.values())) > 0, "B's drops")
