"""Untrusted network input against real member runtimes over real UDP sockets (no Ray).

A publisher streams valid messages to a subscriber over a loopback IP multicast group while a raw UDP
socket throws junk at the subscriber's group and at its unicast address. Every kind of junk must be
counted under its drop reason, never kill the I/O loop, and never disturb the valid stream: the
subscriber delivers every valid message, once, in sequence order.
"""

from __future__ import annotations

import os
import random
import socket
import time
from dataclasses import dataclass, field

import pytest

from scopecast.netio import wire
from scopecast.netio.auth import authenticator
from scopecast.netio.channel import MulticastGroup, UnicastEndpoint
from scopecast.netio.control_messages import MAX_JOINS, Kind
from scopecast.netio.delivery import Subscription
from scopecast.netio.replay_guard import ControlNumbers
from scopecast.netio.routing import RoutingLabel
from scopecast.netio.runtime import MemberInfo, MemberRuntime, Route, RuntimeConfig

pytestmark = pytest.mark.timeout(60)

TOPIC = 7
SESSION = 1
PUB_ID, SUB_ID, JUNK_ID, STRANGER_ID = 1, 2, 3, 99
LIVENESS = 10.0  # seconds; a liveness bound, not a performance expectation
ROUNDS = 20
PER_ROUND = 25


def valid_payload(seq: int) -> bytes:
    return seq.to_bytes(8, "big") + b"v" * 120


@dataclass
class Env:
    key: bytes
    pub: MemberRuntime
    sub: MemberRuntime
    subscription: Subscription
    group: MulticastGroup
    junk: socket.socket
    seq: int = 0
    received: list = field(default_factory=list)
    numbers: ControlNumbers = field(default_factory=ControlNumbers)

    @property
    def targets(self) -> list[tuple[str, int]]:
        return [self.group.address, self.sub.address]

    def send(self, datagram: bytes) -> int:
        """Send one junk datagram to the subscriber's group and unicast address; how many sent."""
        for target in self.targets:
            self.junk.sendto(datagram, target)
        return len(self.targets)

    def send_control(self, body, sender: int = JUNK_ID, numbers=None, stamp: int | None = None,
                     ptype: int = wire.PacketType.CONTROL) -> list[bytes]:
        """A signed control datagram of `sender` to each of the subscriber's addresses, each
        numbered and stamped as a member's are (else the replay guard takes them first); the
        datagrams sent."""
        numbers = numbers or self.numbers
        sent = []
        for target in self.targets:
            d = self.signed(wire.encode_control(ptype, sender, body, 0, numbers.next(),
                                                wire.stamp_now() if stamp is None else stamp))
            self.junk.sendto(d, target)
            sent.append(d)
        return sent

    def signed(self, body: bytes, key: bytes | None = None) -> bytes:
        """`body` sealed as the runtimes' sealer does under `key` (encrypted, in an encrypting
        cluster), trailer and all."""
        return b"".join(bytes(p) for p in authenticator(self.sub.config.mac,
                                                        key or self.key).seal(body))

    @property
    def trailer(self) -> int:
        return authenticator(self.sub.config.mac, self.key).trailer_size

    def publish(self, n: int) -> None:
        for _ in range(n):
            self.seq += 1
            self.pub.publish(TOPIC, SESSION, self.seq, 0, valid_payload(self.seq))

    def drain(self) -> None:
        q = self.subscription.queue
        while q:
            batch, nbytes = q.popleft()
            self.subscription.consumed_bytes += nbytes
            self.received.extend(batch)

    def wait(self, predicate, what: str, timeout: float = LIVENESS) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.drain()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout}s; drops="
                                     f"{dict(self.sub.drops)} stats={dict(self.sub.stats)}")
            time.sleep(0.01)
        self.drain()

    def interleave(self, send_junk, rounds: int = ROUNDS, per_round: int = PER_ROUND,
                   between=None) -> None:
        """Publish valid messages in rounds with junk sent after each round."""
        for r in range(rounds):
            self.publish(per_round)
            send_junk(r)
            self.drain()
            if between is not None:
                between()

    def assert_valid_stream_intact(self) -> None:
        self.wait(lambda: len(self.received) >= self.seq, f"delivery of {self.seq} valid messages")
        got = [(m.source, m.session, m.seq) for m in self.received]
        assert got == [("A", SESSION, s) for s in range(1, self.seq + 1)]
        assert all(m.payload == valid_payload(m.seq) for m in self.received)
        assert self.sub.alive and self.pub.alive
        assert self.sub.drops["internal_error"] == 0
        assert self.sub.stats["gaps"] == 0 and self.sub.stats["duplicates"] == 0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_env():
    made: list = []

    def make(config: RuntimeConfig | None = None, install_junk_member: bool = True,
             junk_publishes: tuple[str, ...] | None = None) -> Env:
        key = os.urandom(32)
        junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(junk)
        junk.bind(("127.0.0.1", 0))
        junk.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        junk.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        pub = MemberRuntime(PUB_ID, "A", key, config)
        made.append(pub)
        sub = MemberRuntime(SUB_ID, "B", key, config)
        made.append(sub)
        group = MulticastGroup(f"239.255.{random.randint(1, 254)}.{random.randint(1, 254)}",
                               _free_udp_port())
        members = [MemberInfo(r.member_id, r.name, *r.address) for r in (pub, sub)]
        if install_junk_member:
            # a member the subscriber knows, whose address is the junk socket
            members.append(MemberInfo(JUNK_ID, "J", *junk.getsockname(), junk_publishes))
        for r in (pub, sub):
            r.call_wait(r.install_members, members)
            r.call_wait(r.install_topics, {TOPIC: "t"})
        sub.call_wait(sub.join_group, group.group, group.port)
        subscription = Subscription(frozenset([TOPIC]))
        sub.call_wait(sub.add_subscription, subscription)
        pub.call_wait(pub.install_routes,
                      {TOPIC: [Route(RoutingLabel(("A",), ("*",), "A"), group)]},
                      {group.address: {SUB_ID}})
        return Env(key, pub, sub, subscription, group, junk)

    yield make
    for thing in reversed(made):
        thing.close()


def data_body(messages: list[wire.WireMessage], sender: int = JUNK_ID, channel: int = 1,
              dseq: int = 1) -> bytes:
    return wire.encode_datagram(wire.PacketType.DATA, sender, channel, dseq, messages)


def junk_message(seq: int, source: int = JUNK_ID, topic: int = TOPIC,
                 payload: bytes = b"junk") -> wire.WireMessage:
    return wire.WireMessage(topic, source, SESSION, seq, source, seq, 0, (("J", "J"),), payload)


def fragment_body(total: int, index: int, count: int, chunk: int, payload: bytes, stream_seq: int,
                  sender: int = JUNK_ID, dseq: int = 1) -> bytes:
    piece = junk_message(stream_seq, source=sender, payload=payload)
    return wire.encode_fragment(wire.PacketType.DATA, sender, 1, dseq,
                                wire.Fragment(piece, total, index, count, chunk))


def counter_at_least(env: Env, reason: str, n: int):
    return lambda: env.sub.drops[reason] >= n


# ----------------------------------------------------------------------------------- the tests


def test_random_bytes(make_env):
    env = make_env()
    rng = random.Random(1)
    shortest = wire.HEADER.size + env.trailer  # anything shorter is "truncated"
    sent = {"bad_mac": 0, "truncated": 0}

    def junk(r: int) -> None:
        for _ in range(5):
            sent["bad_mac"] += env.send(rng.randbytes(rng.randint(shortest, 1400)))
        sent["truncated"] += env.send(rng.randbytes(rng.randint(0, shortest - 1)))
        # random bytes that start like a datagram of ours
        sent["bad_mac"] += env.send(wire.MAGIC + bytes([wire.VERSION, 1]) + rng.randbytes(200))

    env.interleave(junk)
    env.wait(counter_at_least(env, "bad_mac", sent["bad_mac"]), "bad_mac count")
    env.wait(counter_at_least(env, "truncated", sent["truncated"]), "truncated count")
    env.assert_valid_stream_intact()


def test_truncated_headers(make_env):
    env = make_env()
    good = env.signed(data_body([junk_message(1)]))
    header_only = wire.pack_header(wire.PacketType.DATA, 0, 1, JUNK_ID, 1, 1)
    entry_cut = data_body([junk_message(1, payload=b"p" * 100)])[:-50]
    variants = [
        good[:10],                                   # a header prefix, no MAC
        good[:wire.HEADER.size + env.trailer - 1],   # a header and trailer, one byte short
        env.signed(bytes(good[:12])),                # signed, but a body shorter than a header
        env.signed(bytes(header_only)),              # signed header promising a table and an entry
        env.signed(entry_cut),                       # signed, payload cut short
    ]
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        for v in variants:
            sent += env.send(v)

    env.interleave(junk)
    env.wait(counter_at_least(env, "truncated", sent), "truncated count")
    env.assert_valid_stream_intact()


def test_unknown_version(make_env):
    env = make_env()
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        for version in (0, wire.VERSION - 1, wire.VERSION + 1, 255):
            body = bytearray(data_body([junk_message(r + 1, source=PUB_ID)], sender=PUB_ID))
            body[2] = version
            sent += env.send(env.signed(bytes(body)))

    env.interleave(junk)
    env.wait(counter_at_least(env, "bad_version", sent), "bad_version count")
    env.assert_valid_stream_intact()


@pytest.mark.parametrize("mac", ["gmac", "hmac-sha256", "aes-256-gcm"])
def test_wrong_mac(make_env, mac):
    """Forged (another key) or damaged datagrams are counted and dropped, the valid stream
    intact; in an encrypting cluster too (aes-256-gcm: a wrong key cannot be read or believed)."""
    env = make_env(RuntimeConfig(mac=mac))
    other_key = os.urandom(32)
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        # well-formed, claiming to come from the publisher, with sequence numbers that would break
        # the valid stream's order if they were believed
        forged = data_body([junk_message(10_000 + r, source=PUB_ID)], sender=PUB_ID, dseq=10**6)
        sent += env.send(env.signed(forged, key=other_key))
        good = env.signed(forged)
        sent += env.send(good[:-1] + bytes([good[-1] ^ 1]))  # one trailer bit flipped
        sent += env.send(good[:30] + bytes([good[30] ^ 0x80]) + good[31:])  # one body bit flipped

    env.interleave(junk)
    env.wait(counter_at_least(env, "bad_mac", sent), "bad_mac count")
    env.assert_valid_stream_intact()


def test_oversized_fragment(make_env):
    limit = 1 << 20
    env = make_env(RuntimeConfig(max_message_bytes=limit))
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        total = limit + 1 + r
        chunk = 1000
        count = -(-total // chunk)
        sent += env.send(env.signed(fragment_body(total, 0, count, chunk, b"f" * chunk, r + 1)))
        # a total near the u32 limit: refused before any buffer is allocated
        sent += env.send(env.signed(fragment_body(4_000_000_000, 0, 4_000_000, 1000, b"g" * 1000,
                                                  r + 1000)))

    env.interleave(junk)
    env.wait(counter_at_least(env, "oversized", sent), "oversized count")
    assert env.sub.receiver._reassembler.bytes_held == 0
    env.assert_valid_stream_intact()


def test_a_fragment_whose_run_is_mixed(make_env):
    """A fragment's one run is of one topic: a mixed run there (read lazily, see wire.iter_runs)
    is a counted drop."""
    env = make_env()
    table = wire.encode_route_table([(("J", "J"),)])
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        parts = wire.mixed_run_parts(JUNK_ID, SESSION, JUNK_ID, r + 1, 0, 0,
                                     [(r + 1, TOPIC, SESSION, r + 1, 0, b"f" * 100)])
        sent += env.send(env.signed(wire.encode_data(wire.PacketType.DATA, JUNK_ID, 1, r + 1,
                                                     table, 1, parts, (200, 0, 2, 100))))

    env.interleave(junk)
    env.wait(counter_at_least(env, "bad_fragment", sent), "bad_fragment count")
    env.assert_valid_stream_intact()


def test_fragment_flood_never_completing(make_env):
    budget = 64_000
    total, chunk = 8_000, 1_000
    env = make_env(RuntimeConfig(reassembly_budget_bytes=budget, reassembly_timeout=0.5))
    held_samples: list[int] = []
    ids = iter(range(1, 10**6))

    def junk(r: int) -> None:
        for _ in range(10):  # 10 distinct message ids per round, first fragment of 8 only
            env.send(env.signed(fragment_body(total, 0, total // chunk, chunk, b"f" * chunk,
                                              next(ids))))
        held_samples.append(env.sub.receiver._reassembler.bytes_held)

    env.interleave(junk, between=lambda: held_samples.append(env.sub.receiver._reassembler.bytes_held))
    env.wait(lambda: env.sub.drops["reassembly_budget"] >= 1, "reassembly_budget count")

    def expired_and_empty() -> bool:
        held_samples.append(env.sub.receiver._reassembler.bytes_held)
        return env.sub.drops["reassembly_timeout"] >= 1 and env.sub.receiver._reassembler.bytes_held == 0

    env.wait(expired_and_empty, "expiry of the partial messages")
    assert max(held_samples) <= budget
    assert len(env.sub.receiver._reassembler) == 0
    assert env.sub.stats["reassembled"] == 0
    env.assert_valid_stream_intact()


def test_unknown_sender(make_env):
    grace = 0.3
    env = make_env(RuntimeConfig(unknown_sender_grace=grace))
    env.sub.unknown_sender.clear()
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        # correctly signed, well-formed, from a member id nobody installed
        body = data_body([junk_message(r + 1, source=STRANGER_ID)], sender=STRANGER_ID, dseq=r + 1)
        sent += env.send(env.signed(body))

    env.interleave(junk)
    assert env.sub.unknown_sender.wait(LIVENESS), "the control thread was not asked to refresh"
    env.wait(counter_at_least(env, "unknown_sender", sent), "unknown_sender count")
    assert len(env.sub.receiver._held) == 0
    env.assert_valid_stream_intact()  # and none of the stranger's messages was delivered


JOIN = int(Kind.JOIN_POINTS)
BAD_JOIN_POINTS = [
    [JOIN, SESSION, [TOPIC, wire.SEQ_LIMIT, 1]],      # a seq the per-topic tables cannot hold
    [JOIN, SESSION, [TOPIC, 1, -1]],                  # negative
    [JOIN, SESSION, [wire.MAX_TOPIC + 1, 1, 1]],      # no topic id
    [JOIN, SESSION, [TOPIC, 1.5, 1]],                 # not an int
    [JOIN, SESSION, [TOPIC, 1]],                      # one short
    [JOIN, SESSION, [TOPIC, 1, 1] * (MAX_JOINS + 1)],  # more than a datagram's worth
    [JOIN, SESSION, []],                              # none
    [JOIN, TOPIC, SESSION, 1, 1],                     # wire version 8's form
    ["from", TOPIC, SESSION, 1, 1],                   # wire version 3's encoding
    [int(Kind.SUMMARY), {}],                          # a kind members do not take
]


def test_join_points_out_of_range(make_env):
    """Signed join points (`control_messages.JoinPoints`: session, (topic, start, cached)...)
    from a known member with values out of range, or not join points, are each counted as
    bad_control, and change nothing."""
    env = make_env()
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        body = BAD_JOIN_POINTS[r % len(BAD_JOIN_POINTS)]
        sent += len(env.send_control(body))

    env.interleave(junk)
    env.wait(counter_at_least(env, "bad_control", sent), "bad_control count")
    env.assert_valid_stream_intact()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_malformed_routing_record_at_a_forwarder(make_env):
    import msgpack

    env = make_env()
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sink.bind(("127.0.0.1", 0))
        # the subscriber also forwards topic T (to a sink nobody reads)
        env.sub.call_wait(env.sub.install_routes, {TOPIC: [Route(
            RoutingLabel(("B",), ("C",), "B"), UnicastEndpoint(*sink.getsockname()))]})
        routes = msgpack.packb([[[["x"], "J"]]])
        body = bytearray(wire.pack_header(wire.PacketType.DATA, 0, 1, JUNK_ID, 1, 1))
        body += wire.ROUTE_LEN.pack(len(routes)) + routes
        body += wire.RUN.pack(TOPIC, JUNK_ID, SESSION, 1, JUNK_ID, 1, 0, 0, 1) + wire.LENGTH.pack(4)
        body += b"junk"
        sent = 0

        def junk(r: int) -> None:
            nonlocal sent
            sent += env.send(env.signed(bytes(body)))

        env.interleave(junk, rounds=5)
        env.wait(lambda: not env.sub.alive
                 or env.sub.drops["bad_routes"] + env.sub.drops["internal_error"] >= sent,
                 "a count for each junk datagram")
        assert env.sub.alive
        assert env.sub.drops["internal_error"] == 0
        assert env.sub.drops["bad_routes"] >= sent
        env.assert_valid_stream_intact()
    finally:
        sink.close()


def test_io_thread_survives_an_exception_while_idle(make_env):
    """A failure while handling a datagram that woke the idle loop is counted, not fatal."""
    env = make_env()
    original = env.sub.receiver._on_data
    calls: list = []

    def fails_once(*args) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        original(*args)

    env.sub.receiver._on_data = fails_once
    # one message at a time, so the subscriber handles each datagram from its idle wait
    env.publish(1)
    env.wait(lambda: env.sub.drops["internal_error"] == 1 or not env.sub.alive, "the failure")
    for n in range(2, 7):
        env.publish(1)
        env.wait(lambda n=n: len(env.received) >= n - 1 or not env.sub.alive,
                 "delivery of one message")
    assert env.sub.alive
    assert env.sub.drops["internal_error"] == 1
    assert [m.seq for m in env.received] == [2, 3, 4, 5, 6]


def test_replayed_stale_and_old_epoch_control_datagrams_are_refused_and_counted(make_env):
    """Issue 45 item 6, replay: authentic control datagrams (a join point the subscriber would
    otherwise count as bad_control) sent again as recorded, stamped over the age bound, or of an
    epoch older than the sender's newest, are each refused and counted, never taken; the valid
    stream is intact."""
    env = make_env()
    body = BAD_JOIN_POINTS[0]
    old = ControlNumbers(epoch=env.numbers.epoch - 1)
    counts = {"replayed": 0, "stale_control": 0, "stale_epoch": 0, "bad_control": 0}

    def junk(r: int) -> None:
        recorded = env.send_control(body)  # taken (and found bad_control), once per address
        counts["bad_control"] += len(recorded)
        for d, target in zip(recorded, env.targets, strict=True):
            env.junk.sendto(d, target)  # the same datagram again
            counts["replayed"] += 1
        counts["stale_control"] += len(env.send_control(
            body, stamp=(wire.stamp_now() - 31_000_000) % wire.STAMP_WRAP))
        counts["stale_epoch"] += len(env.send_control(body, numbers=old))

    env.interleave(junk)
    for reason, n in counts.items():
        env.wait(counter_at_least(env, reason, n), f"{reason} count")
    assert env.sub.drops["bad_control"] == counts["bad_control"]  # no replay was taken
    env.assert_valid_stream_intact()


def test_runs_a_member_may_not_publish_are_dropped_as_forbidden(make_env):
    """Issue 45 item 6, permissions on the wire: a member whose credential lets it publish only
    to other topics sends authentic data of this topic (as a process bypassing the API would):
    every run is dropped and counted as forbidden, none delivered, and the valid stream is
    intact."""
    env = make_env(junk_publishes=("other/*",))
    sent = 0

    def junk(r: int) -> None:
        nonlocal sent
        env.junk.sendto(env.signed(data_body([junk_message(r + 1)], dseq=r + 1)), env.sub.address)
        sent += 1

    env.interleave(junk)
    env.wait(counter_at_least(env, "forbidden", sent), "forbidden count")
    env.assert_valid_stream_intact()  # (no message of J's among those delivered)
