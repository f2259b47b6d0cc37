"""Limits every member of a cluster applies: the largest message is a cluster setting, so a
publisher never sends what its subscribers would refuse (each would drop the fragments as
`oversized`, and the publisher would wait on them in vain)."""

from __future__ import annotations

import pytest

import scopecast
from scopecast.netio.runtime import DEFAULT_MAX_MESSAGE, RuntimeConfig
from scopecast.scopes.controlled_element import cluster_config


def test_a_member_takes_the_clusters_message_limit_and_may_not_ask_for_another():
    hello = {"max_message_bytes": 1 << 20}
    assert cluster_config(None, hello).max_message_bytes == 1 << 20
    assert cluster_config(RuntimeConfig(window_bytes=1 << 22), hello).window_bytes == 1 << 22
    assert cluster_config(RuntimeConfig(max_message_bytes=1 << 20), hello).max_message_bytes \
        == 1 << 20
    with pytest.raises(scopecast.InvalidConfig, match="cluster setting"):
        cluster_config(RuntimeConfig(max_message_bytes=2 << 20), hello)
    # a root from before the setting says nothing: the default
    assert cluster_config(None, {}).max_message_bytes == DEFAULT_MAX_MESSAGE


@pytest.mark.ray
def test_connect_refuses_a_limit_other_than_the_clusters(cluster, topic_name):
    with pytest.raises(scopecast.InvalidConfig, match="max_message_bytes is a cluster setting"):
        scopecast.connect(config=RuntimeConfig(max_message_bytes=1 << 20))
    assert cluster.max_message_bytes == DEFAULT_MAX_MESSAGE  # the session cluster's default
    cluster.create_topic(topic_name)
    with cluster.publisher(topic_name) as pub, pytest.raises(scopecast.MessageTooLarge):
        pub.publish(bytes(cluster.max_message_bytes + 1))
