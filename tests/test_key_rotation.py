"""Issue 45 item 6, key rotation without loss (scopes/key_rotation): in an encrypting cluster, the
cluster key is rotated while a reliable stream runs between two member processes (token_ring
recovery agents included), through all three steps of the rotation (announced, sealing,
retired). Every message arrives, in order; no process refused a datagram sealed
with the old key while the rotation was under way (`bad_mac` stays 0); once the old key is
retired, every datagram of the cluster on the wire (data, acknowledgements, tokens: a packet
socket on loopback watches) opens under the new key and none under the old one. A second rotation
while the first is under way is refused; `scopecast key rotate --wait` rotates again, to its
end. The ring's wire form is checked as untrusted input."""

from __future__ import annotations

import json

import pytest

from scopecast.netio.auth import KEY_SIZE, ClusterKeys, GcmSealer, KeyRing, sealed
from tests.conftest import is_root
from tests.loopback_script import SNIFFER, run_script

ROTATE = SNIFFER + r"""
import contextlib, io, json, threading, time
import ray, scopecast
from scopecast import cli
from scopecast.actors import declare
from scopecast.actors.errors import InvalidConfig
from scopecast.netio.auth import GcmSealer
from scopecast.ray_cluster.consumers import TopicConsumer

M = 1500

cluster = scopecast.connect(encrypt=True)
root = declare.find(declare.CLUSTER_SCOPE_MANAGER)
old = bytes(ray.get(root.hello.remote())["key"])
cluster.create_topic("rot/T")
consumer = ray.remote(num_cpus=0)(TopicConsumer).remote("rot/T")
ray.get(consumer.ready.remote(), timeout=120)
pending = consumer.consume.remote(None, 300.0, None, True, b"STOP")
out, steps, sent = {}, [], 0
with cluster.publisher("rot/T") as pub:
    def burst(n):
        global sent
        for _ in range(n):
            pub.publish(b"%06d" % sent + bytes(300))
            sent += 1
    burst(2000)
    out["during"] = cluster.rotate_key()
    try:
        cluster.rotate_key()
    except InvalidConfig as exc:
        out["again"] = str(exc)
    # the stream goes on through every step of the rotation
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        keys = cluster.status()["manager"]["keys"]
        if not steps or steps[-1] != keys["step"]:
            steps.append(keys["step"])
        if keys["step"] == "retired":
            break
        for _ in range(10):
            burst(20)
            time.sleep(0.01)
    pub.flush(timeout=60)
    out["after"] = cluster.status()["manager"]["keys"]
    new = bytes(ray.get(root.hello.remote())["key"])
    sniffer = threading.Thread(target=sniff, daemon=True)
    sniffer.start()
    time.sleep(0.5)
    burst(M)
    pub.publish(b"STOP")
    sent += 1
    pub.flush(timeout=60)
    time.sleep(1.0)  # (tokens and acknowledgements keep going)
    stop.set()
    sniffer.join()
    out["publisher_bad_mac"] = pub._runtime.drops.get("bad_mac", 0)
out.update(sent=sent, steps=steps)
got = ray.get(pending, timeout=300)
# this cluster's datagrams are those one of its keys opens (other clusters on the machine, e.g. a
# test session's, use other keys)
sc = [f for f in frames if f[:2] == b"SC" and len(f) > 56]
as_new = [o for f in sc if (o := GcmSealer(new, encrypt=True).open(f, len(f) - 28)) is not None]
out.update(count=got["count"], gaps=got["gaps"], out_of_order=got["out_of_order"],
           subscriber_bad_mac=ray.get(consumer.counters.remote())["drops"].get("bad_mac", 0),
           as_new=len(as_new), types=sorted({o[3] for o in as_new}), changed=new != old,
           as_old=sum(GcmSealer(old, encrypt=True).open(f, len(f) - 28) is not None
                      for f in sc))
# the command line rotates again, and waits for the end
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = cli.main(["key", "rotate", "--wait", "120", "--json"])
out["cli"] = {"rc": rc, **json.loads(buf.getvalue())}
print(json.dumps(out))
ray.get(consumer.close.remote(), timeout=60)
cluster.shutdown()
"""


def _run(script: str) -> str:
    return run_script(script, 500)


@pytest.mark.skipif(not is_root(), reason="a packet socket needs root")
@pytest.mark.timeout(540)
def test_a_key_rotated_under_traffic_loses_nothing_and_retires_the_old_key():
    r = json.loads(_run(ROTATE).strip().splitlines()[-1])
    assert r["during"] == {"generation": 2, "accepted": 2, "step": "announced"}
    assert "still being rolled out" in r["again"]
    assert r["after"] == {"generation": 2, "accepted": 1, "step": "retired"} and r["changed"]
    assert r["steps"] == ["announced", "sealing", "retired"]  # (the stream went on throughout)
    assert (r["count"], r["gaps"], r["out_of_order"]) == (r["sent"], 0, 0) and r["sent"] > 3500
    assert r["publisher_bad_mac"] == 0 and r["subscriber_bad_mac"] == 0
    assert r["as_new"] > 0 and r["as_old"] == 0
    assert len(r["types"]) > 1, r["types"]  # data and control alike
    assert r["cli"] == {"rc": 0, "generation": 3, "accepted": 1, "step": "retired"}


def test_a_rotations_steps_seal_with_the_old_key_then_the_new_and_accept_both_until_retired():
    old, new = bytes(range(KEY_SIZE)), bytes(range(1, KEY_SIZE + 1))
    steps = [ClusterKeys.first(old)]
    steps.append(steps[-1].rotated(new))
    steps += [steps[-1].advanced(), steps[-1].advanced().advanced()]
    ring = KeyRing("aes-256-gcm", steps[0].raw(), 1)
    by_old = sealed(ring, bytes(100))
    by_new = sealed(KeyRing("aes-256-gcm", [new]), bytes(100))
    opens = []
    for keys in steps:
        ring.set(keys.raw(), keys.generation)
        mine = sealed(ring, bytes(100))
        opens.append((ring.open(by_old, len(by_old) - 28) is not None,
                      ring.open(by_new, len(by_new) - 28) is not None,
                      GcmSealer(new, encrypt=True).open(mine, len(mine) - 28) is not None))
    # (accepts old, accepts new, seals with new) at each step
    assert opens == [(True, False, False), (True, True, False), (True, True, True),
                     (False, True, True)]
    assert [k.describe()["step"] for k in steps] == ["retired", "announced", "sealing", "retired"]
    assert [k.describe()["accepted"] for k in steps] == [1, 2, 2, 1]  # (and no key in it)


def test_rings_move_forward_only():
    first = ClusterKeys.first(bytes(KEY_SIZE))
    announced = first.rotated(bytes([1]) * KEY_SIZE)
    sealing = announced.advanced()
    retired = sealing.advanced()
    assert announced.supersedes(first) and sealing.supersedes(announced)
    assert retired.supersedes(sealing)
    assert not sealing.supersedes(retired) and not first.supersedes(announced)
    assert not ClusterKeys().supersedes(first)  # (a scope before its first delegation)
    for keys in (first, announced, sealing, retired, ClusterKeys()):
        assert ClusterKeys.from_wire(keys.to_wire()) == keys


@pytest.mark.parametrize("body", [
    [2, ["00" * KEY_SIZE] * 3, 0],         # more keys than a ring holds
    [1, ["00" * (KEY_SIZE - 1)], 2],       # a short key
    [1, ["zz" * KEY_SIZE], 2],             # not hex
    [1, [], 2],                            # a generation without keys
    [2, ["00" * KEY_SIZE] * 2, 2],         # two keys, yet retired
    [2, ["00" * KEY_SIZE], 0],             # one key, yet announced
    [2, ["00" * KEY_SIZE] * 2, 3],         # no such step
    [-1, [], 2], ["2", ["00" * KEY_SIZE], 2], [1, ["00" * KEY_SIZE]], None,
])
def test_a_malformed_ring_is_refused(body):
    with pytest.raises((ValueError, TypeError)):
        ClusterKeys.from_wire(body)
