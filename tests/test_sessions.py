"""Sessions (thesis 3.2.7): changing a topic starts a new session; publishers end the old one and
continue in the new one once every member knows it, and subscribers lose nothing in between."""

from __future__ import annotations

import pytest
import ray
from member_pair import member_pair, received, wait_for
from session_stream import stream_across_a_session_change

from scopecast.ray_cluster.consumers import TopicConsumer

pytestmark = pytest.mark.ray


def test_update_topic_starts_a_new_session_without_loss(cluster, topic_name):
    cluster.create_topic(topic_name)
    consumer = ray.remote(num_cpus=0)(TopicConsumer).remote(topic_name)
    ray.get(consumer.ready.remote())
    with cluster.publisher(topic_name) as pub:
        updated = []
        total = stream_across_a_session_change(
            pub, lambda: updated.append(cluster.update_topic(topic_name, policy="chain")))
        assert updated[0].session == 2 and updated[0].policy == "chain"
        last_in_two = pub.seq
        pub.flush()
    got = ray.get(consumer.consume.remote(total, 60.0), timeout=120)
    sessions = {int(k.rsplit("|", 1)[1]): seq for k, seq in got["last_seq"].items()}
    assert set(sessions) == {1, 2}
    assert sessions[2] == last_in_two >= 1000 and sessions[1] + sessions[2] == total
    assert got["count"] == total and got["gaps"] == 0 and got["out_of_order"] == 0
    assert cluster.topic(topic_name).session == 2  # persisted by the root
    ray.get(consumer.close.remote())


def test_a_run_of_an_unannounced_session_is_refused_until_announced():
    """Subscribers accept a session only when their scope has told them about it."""
    with member_pair(session=1) as (pub, sub, inbox):
        for seq in (1, 2, 3):
            pub.publish(7, 2, seq, 0, b"early %d" % seq)  # session 2, not yet announced
        wait_for(lambda: sub.stats["unannounced_session"] == 3)
        assert received(inbox) == []
        sub.call_wait(sub.install_topics, {7: "T"}, {7: 2})
        for seq in (4, 5):
            pub.publish(7, 2, seq, 0, b"later %d" % seq)
        got: list = []
        wait_for(lambda: got.extend(received(inbox)) or len(got) >= 2)
        assert [(m.session, m.seq) for m in got] == [(2, 4), (2, 5)]
