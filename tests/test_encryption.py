"""Issue 45 item 6, confidentiality: `connect(encrypt=True)` deploys a cluster whose every datagram
(data, repairs, acks, NAKs, tokens) is AES-256-GCM-encrypted after its header under the cluster
key. A stream between two member processes is watched on the wire (a packet socket on loopback):
every scopecast datagram there opens only as an encrypted one, none shows a payload, and the
subscriber gets every message. Attaching with encrypt=True to a cluster that does not encrypt is
refused. (Forged datagrams of another key: test_bad_input's test_wrong_mac[aes-256-gcm].)"""

from __future__ import annotations

import json

import pytest

from tests.conftest import is_root
from tests.loopback_script import SNIFFER, run_script

pytestmark = pytest.mark.skipif(not is_root(), reason="a packet socket needs root")

STREAM = SNIFFER + r"""
import json, struct, threading, time
import ray, scopecast
from scopecast.actors import declare
from scopecast.netio.auth import GcmSealer
from scopecast.ray_cluster.consumers import TopicConsumer

N = 3000

cluster = scopecast.connect(encrypt=True)
hello = ray.get(declare.find(declare.CLUSTER_SCOPE_MANAGER).hello.remote())
cluster.create_topic("enc/T")
consumer = ray.remote(num_cpus=0)(TopicConsumer).remote("enc/T")
ray.get(consumer.ready.remote(), timeout=120)
sniffer = threading.Thread(target=sniff, daemon=True)
sniffer.start()
pending = consumer.consume.remote(N, 120.0)
with cluster.publisher("enc/T") as pub:
    for i in range(N):
        pub.publish(b"SECRET-%06d" % i + bytes(200))
    pub.flush(timeout=60)
got = ray.get(pending, timeout=180)
stop.set()
sniffer.join()
# this cluster's datagrams are those its key opens (other clusters on the machine, e.g. a test
# session's, use other keys): opened as encrypted ones, or as plain GMAC ones (there must be none)
key = bytes(hello["key"])
secret, gmac = GcmSealer(key, encrypt=True), GcmSealer(key)
sc = [f for f in frames if f[:2] == b"SC" and len(f) > 56]
opened = [o for f in sc if (o := secret.open(f, len(f) - 28)) is not None]
print(json.dumps({
    "mac": cluster.status()["manager"]["mac"], "count": got["count"], "gaps": got["gaps"],
    "out_of_order": got["out_of_order"], "encrypted": len(opened),
    "leaked": sum(b"SECRET" in f for f in frames),
    "as_gmac": sum(gmac.open(f, len(f) - 28) is not None for f in sc),
    "payloads_inside": sum(b"SECRET" in o for o in opened),
    "types": sorted({o[3] for o in opened})}))
ray.get(consumer.close.remote(), timeout=60)
cluster.shutdown()
"""

REFUSED = r"""
import scopecast
from scopecast.actors.errors import InvalidConfig
scopecast.connect()  # an embedded cluster: GMAC
try:
    scopecast.connect(encrypt=True)
except InvalidConfig as exc:
    print("refused:", exc)
"""


def _run(script: str) -> str:
    return run_script(script, 400)


@pytest.mark.timeout(420)
def test_an_encrypting_cluster_shows_no_payload_on_the_wire_and_delivers_everything():
    r = json.loads(_run(STREAM).strip().splitlines()[-1])
    assert r["mac"] == "aes-256-gcm"
    assert (r["count"], r["gaps"], r["out_of_order"]) == (3000, 0, 0)
    assert r["encrypted"] > 0 and r["leaked"] == 0
    assert r["as_gmac"] == 0  # none of the cluster's datagrams went unencrypted
    assert r["payloads_inside"] > 0  # and the payloads were in them, under the cluster key
    assert len(r["types"]) > 1, r["types"]  # data and control alike


@pytest.mark.timeout(300)
def test_encrypt_is_refused_by_a_cluster_that_does_not_encrypt():
    assert "does not encrypt" in _run(REFUSED)
