"""Spark DataFrames to topics and back: `publish_dataframe` streams a DataFrame's rows to topics
through publisher actors (`warm_publishers` starts them ahead of a run); `TopicCollector` /
`collect_topic` / `to_dataset` turn what subscribers received back into a Spark DataFrame or a
Ray Dataset with the schema recorded on the topic.

The public names of `dataframe_source` (publishing), `dataframe_sink` (collecting) and
`dataframe_codec` (which schemas can travel, and the wire form of rows and end messages).
"""

from scopecast.ray_cluster.dataframe_codec import (
    MAX_NESTING,
    arrow_schema,
    check_schema,
    from_msgpack_rows,
    to_msgpack_rows,
    wire_schema,
)
from scopecast.ray_cluster.dataframe_sink import TopicCollector, collect_topic, to_dataset
from scopecast.ray_cluster.dataframe_source import (
    PublishReport,
    publish_dataframe,
    routed_topics,
    topic_part,
)
from scopecast.ray_cluster.run_publisher import warm_publishers

__all__ = ["MAX_NESTING", "PublishReport", "TopicCollector", "arrow_schema", "check_schema",
           "collect_topic", "from_msgpack_rows", "publish_dataframe", "routed_topics", "to_dataset",
           "to_msgpack_rows", "topic_part", "warm_publishers", "wire_schema"]
