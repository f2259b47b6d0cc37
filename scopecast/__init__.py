"""scopecast: reliable publish-subscribe for Ray clusters (Ostrowski's scopes, channels and recovery
agents; QuickSilver's fast multicast), data over UDP, control through Ray actors.

    import scopecast
    cluster = scopecast.connect()
    cluster.create_topic("prices")
    with cluster.subscriber("prices") as sub, cluster.publisher("prices") as pub:
        pub.publish(b"hello")
        print(sub.receive(timeout=5.0))
"""

from typing import TYPE_CHECKING

from scopecast.actors.errors import (
    CollectIncomplete,
    ControlTimeout,
    DataFrameRejected,
    FlushTimeout,
    IncompatibleVersion,
    InvalidConfig,
    MemberExpired,
    MessageTooLarge,
    MissingExtra,
    NotConnected,
    PermissionDenied,
    PipelineError,
    PipelineNotFound,
    PluginRejected,
    PublisherClosed,
    ScopecastError,
    SparkUnavailable,
    TopicExists,
    TopicNotFound,
    WindowFull,
)

# The rest of the public API loads on first use (PEP 562), so that importing one layer (the data
# plane in a member process, say) does not load the others, Ray's driver API among them.
_LAZY = {
    "Message": "scopecast.netio.message",
    "Publisher": "scopecast.netio.pubsub",
    "Subscriber": "scopecast.netio.pubsub",
    "RuntimeConfig": "scopecast.netio.runtime",
    "TransportConfig": "scopecast.netio.transport",
    "Connect": "scopecast.policies.api",
    "Disconnect": "scopecast.policies.api",
    "ForwardingPolicy": "scopecast.policies.api",
    "PolicyContext": "scopecast.policies.api",
    "PluginRef": "scopecast.policies.registry",
    "Cluster": "scopecast.ray_cluster.cluster",
    "connect": "scopecast.ray_cluster.cluster",
    "TopicInfo": "scopecast.scopes.topics",
    "publish_dataframe": "scopecast.ray_cluster.dataframes",
    "TopicCollector": "scopecast.ray_cluster.dataframes",
    "PublishReport": "scopecast.ray_cluster.dataframes",
    "foreach_batch": "scopecast.ray_cluster.streaming",
    "read_topic": "scopecast.ray_cluster.dataset_read",
    "TopicDatasink": "scopecast.ray_cluster.dataset_write",
}

if TYPE_CHECKING:
    from scopecast.netio.message import Message
    from scopecast.netio.pubsub import Publisher, Subscriber
    from scopecast.netio.runtime import RuntimeConfig
    from scopecast.netio.transport import TransportConfig
    from scopecast.policies.api import Connect, Disconnect, ForwardingPolicy, PolicyContext
    from scopecast.policies.registry import PluginRef
    from scopecast.ray_cluster.cluster import Cluster, connect
    from scopecast.ray_cluster.dataframes import PublishReport, TopicCollector, publish_dataframe
    from scopecast.ray_cluster.dataset_read import read_topic
    from scopecast.ray_cluster.dataset_write import TopicDatasink
    from scopecast.ray_cluster.streaming import foreach_batch
    from scopecast.scopes.topics import TopicInfo


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scopecast' has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Cluster", "CollectIncomplete", "Connect", "ControlTimeout", "DataFrameRejected", "Disconnect",
    "FlushTimeout", "ForwardingPolicy", "IncompatibleVersion", "InvalidConfig", "MemberExpired", "Message",
    "MessageTooLarge", "MissingExtra", "NotConnected", "PermissionDenied", "PipelineError",
    "PipelineNotFound",
    "PluginRef", "PluginRejected", "PolicyContext", "PublishReport", "Publisher", "PublisherClosed",
    "RuntimeConfig", "ScopecastError", "SparkUnavailable", "Subscriber", "TopicCollector",
    "TopicDatasink", "TopicExists", "TopicInfo", "TopicNotFound", "TransportConfig", "WindowFull",
    "connect", "foreach_batch", "publish_dataframe", "read_topic",
]
