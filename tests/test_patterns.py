"""Pattern subscriptions (`flights/*`) take in existing and future topics, losing nothing."""

from __future__ import annotations

import time

import pytest
import ray

from scopecast.netio.topic_names import check_subscription, topic_matcher
from scopecast.ray_cluster.consumers import TopicConsumer
from scopecast.scopes.status import members

pytestmark = pytest.mark.ray


def test_pattern_matches_one_level():
    m = topic_matcher("flights/*")
    assert m.match("flights/JFK") and m.match("flights/x.y-z")
    assert not m.match("flights/JFK/late") and not m.match("flightsX/JFK")
    assert not m.match("flights")
    assert topic_matcher("a/?b").match("a/xb") and not topic_matcher("a/?b").match("a/xyb")


@pytest.mark.parametrize("bad", ["flights/*[abc]", "real/[", "/real", "real/", "real//x",
                                 "real/**", "a b", ""])
def test_bad_names_and_patterns_are_a_typed_error_that_shows_the_grammar(cluster, bad):
    import scopecast

    with pytest.raises(scopecast.InvalidConfig, match="'/'-separated parts"):
        cluster.subscriber(bad)


def test_names_and_patterns_of_the_grammar_pass():
    assert [check_subscription(n) for n in ("a", "a/b-c.d_e", "a/*", "*", "a/?b/*")] == \
        ["a", "a/b-c.d_e", "a/*", "*", "a/?b/*"]


def test_pattern_subscriber_gets_existing_and_new_topics_from_the_first_message(cluster,
                                                                               topic_name):
    base = topic_name + "/flights"
    cluster.create_topic(f"{base}/JFK")
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(f"{base}/*")
    ray.get(consumer.ready.remote())
    pending = consumer.consume.remote(3 * 200, 60.0)
    for origin in ("JFK", "LGA", "EWR"):  # LGA and EWR are created after the subscription
        cluster.create_topic(f"{base}/{origin}")
        with cluster.publisher(f"{base}/{origin}") as pub:
            for i in range(200):
                pub.publish({"origin": origin, "n": i})
            pub.flush()
    got = ray.get(pending, timeout=120)
    assert got["count"] == 600 and got["gaps"] == 0
    assert got["sources"] == 3
    assert {k.split("|")[0] for k in got["last_seq"]} == {f"{base}/{o}" for o in
                                                          ("JFK", "LGA", "EWR")}
    assert all(seq == 200 for seq in got["last_seq"].values())  # each from seq 1, nothing missing
    other = cluster.create_topic(f"{base}/JFK/late")  # one level deeper: not matched
    status = cluster.status()
    member = next(m for m in members(status) if f"{base}/*" in m["subscriptions"])
    assert other.id not in member["subscribes"]
    ray.get(consumer.close.remote())


def test_publishers_of_many_topics_set_up_together_deliver_every_message(cluster, topic_name):
    """`publishers()` advertises a batch of topics at once; round-robin publishing over them
    reaches a pattern subscriber whole, in order per topic; closing them leaves every topic."""
    base = topic_name + "/many"
    names = [f"{base}/{i}" for i in range(40)]
    for name in names:
        cluster.create_topic(name, policy="lan_multicast")
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(f"{base}/*")
    ray.get(consumer.ready.remote())
    pending = consumer.consume.remote(len(names) * 25, 60.0)
    pubs = cluster.publishers(names)
    assert [p.topic for p in pubs] == names
    for i in range(25):
        for pub in pubs:
            pub.publish(b"%d" % i)
    pubs[-1].flush()
    got = ray.get(pending, timeout=120)
    assert got["count"] == len(names) * 25 and got["gaps"] == 0
    assert {k.split("|")[0] for k in got["last_seq"]} == set(names)
    assert all(seq == 25 for seq in got["last_seq"].values())
    ids = {p._topic_id for p in pubs}
    me = next(m for m in members(cluster.status()) if ids <= set(m["publishes"]))
    for pub in pubs:
        pub.close()  # leaves without waiting for the scope: it re-lays once for all of them
    deadline = time.monotonic() + 30
    while ids & set(next(m for m in members(cluster.status())
                         if m["id"] == me["id"])["publishes"]):
        assert time.monotonic() < deadline, "the scope still lists the closed publishers"
        time.sleep(0.1)
    ray.get(consumer.close.remote())
    with pytest.raises(TypeError):
        cluster.publishers(names[0])


def test_pattern_subscribers_in_other_scopes_get_a_new_topic_from_its_first_message(cluster,
                                                                                   topic_name):
    """A topic created after the subscription and published to at once: subscribers in two LAN
    scopes (not the publisher's host scope) learn of it only through the scope tree, and the
    publisher's first message must still wait for them."""
    base = topic_name + "/flights"
    lans = [f"patlan{i}" for i in range(2)]
    consumers = [ray.remote(num_cpus=0)(TopicConsumer).remote(f"{base}/*", scope=lan)
                 for lan in lans]
    ray.get([c.ready.remote() for c in consumers])
    origins = [f"O{i}" for i in range(4)]
    pending = [c.consume.remote(len(origins) * 100, 120.0) for c in consumers]
    for origin in origins:
        cluster.create_topic(f"{base}/{origin}")
        with cluster.publisher(f"{base}/{origin}") as pub:
            for i in range(100):
                pub.publish({"origin": origin, "n": i})
            pub.flush()
    for got in ray.get(pending, timeout=180):
        assert got["count"] == len(origins) * 100 and got["gaps"] == 0
        assert all(seq == 100 for seq in got["last_seq"].values())
    ray.get([c.close.remote() for c in consumers])
