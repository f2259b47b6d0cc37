"""scopecast: reliable publish-subscribe for Ray clusters (Ostrowski's scopes, channels and recovery
agents; QuickSilver's fast multicast), data over UDP, control through Ray actors.

    import scopecast
    cluster = scopecast.connect()
    cluster.create_topic("prices")
    with cluster.subscriber("prices") as sub, cluster.publisher("prices") as pub:
        pub.publish(b"hello")
        print(sub.receive(timeout=5.0))
"""

from scopecast.actors.errors import (
    CollectIncomplete,
    ControlTimeout,
    DataFrameRejected,
    FlushTimeout,
    InvalidConfig,
    MemberExpired,
    MessageTooLarge,
    NotConnected,
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
from scopecast.netio.message import Message
from scopecast.netio.pubsub import Publisher, Subscriber
from scopecast.netio.runtime import RuntimeConfig
from scopecast.netio.transport import TransportConfig
from scopecast.policies.api import Connect, Disconnect, ForwardingPolicy, PolicyContext
from scopecast.policies.registry import PluginRef
from scopecast.ray_cluster.cluster import Cluster, connect
from scopecast.scopes.topics import TopicInfo

__version__ = "0.1.0"

__all__ = [
    "Cluster", "CollectIncomplete", "Connect", "ControlTimeout", "DataFrameRejected", "Disconnect",
    "FlushTimeout", "ForwardingPolicy", "InvalidConfig", "MemberExpired", "Message",
    "MessageTooLarge", "NotConnected", "PipelineError", "PipelineNotFound", "PluginRef",
    "PluginRejected", "PolicyContext", "Publisher", "PublisherClosed", "RuntimeConfig",
    "ScopecastError", "SparkUnavailable", "Subscriber", "TopicExists", "TopicInfo", "TopicNotFound",
    "TransportConfig", "WindowFull", "connect",
]
