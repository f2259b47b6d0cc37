"""`read_topic`: the rows of one `publish_dataframe` run, read from its topics as a Ray Dataset
whose blocks stream out while the run is still being published.

The subscription is made when `read_topic` returns (a private actor, a scopecast member of its
own, subscribes then), so a run published after that call is read whole, although Ray Data runs
the read only when the Dataset is consumed. The Dataset has one read task: it takes the decoded
tables from the actor as they arrive (`Subscriber.rows().tables()`: each the rows of one topic
that arrived together, in the run's order per publisher) and yields each as a block, until every
publisher of the run has ended every topic the names and patterns take.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ray

from scopecast.actors.errors import InvalidConfig, TopicNotFound
from scopecast.extras import require
from scopecast.netio.topic_names import check_topic_name, is_pattern, topic_matcher

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.data import Dataset

    from scopecast.ray_cluster.cluster import Cluster


class _TopicFeed:
    """The subscriber `read_topic` reads through (a private Ray actor)."""

    def __init__(self, names: list[str], member: str, scope: str | None, timeout: float) -> None:
        import scopecast

        self._cluster = scopecast.connect(name=member)
        self._sub = self._cluster.subscriber(names, scope=scope)
        self._tables = self._sub.rows(timeout).tables()

    def ready(self) -> bool:
        return True

    def next_table(self) -> pa.Table | None:
        """The next decoded rows; None once the run has ended (CollectIncomplete on a hole or
        after the timeout without a message)."""
        return next(self._tables, None)

    def close(self) -> None:
        try:
            self._sub.close()
        finally:
            self._cluster.shutdown()


def _blocks(feed) -> Iterator[pa.Table]:
    """The read task: the feed's tables as they come (Ray Data cuts them into blocks of the
    Dataset's target size), then the feed goes."""
    try:
        while (table := ray.get(feed.next_table.remote())) is not None:
            yield table
        ray.get(feed.close.remote())
    finally:
        ray.kill(feed, no_restart=True)


BLOCK_BYTES = 1 << 20  # what read_topic's blocks hold (Ray Data's default, 128 MiB, is a run)


def read_topic(topics: str | list[str], *, timeout: float = 60.0, scope: str | None = None,
               block_bytes: int = BLOCK_BYTES, cluster: Cluster | None = None) -> Dataset:
    """The rows of the next `publish_dataframe` run on `topics` (names, which must exist, and/or
    patterns such as "flights/*") as a Ray Dataset with the schema recorded on the topics.

    Call it before publishing: the subscription exists when it returns, and every row of a run
    published after that is read, each publisher's rows in order. Blocks stream while the run is
    published: one is made each time `block_bytes` of rows are in (the rest at the run's end), and
    `ds.iter_batches(batch_size=None, prefetch_batches=0)` gets each as soon as it is made (with
    prefetching, Ray Data waits for the next one too). The Dataset ends when every publisher has
    ended. `block_bytes` is this Dataset's `DataContext.target_max_block_size`, which Datasets
    made from it inherit. Reading raises CollectIncomplete after `timeout` seconds without a
    message. Consume the Dataset once: it is a live subscription, not stored data.
    `scope` is the reading member's parent scope path (default: its host's scope)."""
    from scopecast.ray_cluster.cluster import connect

    require("data", "read_topic")
    from ray.data import read_datasource
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    names = [topics] if isinstance(topics, str) else list(topics)
    if not names:
        raise InvalidConfig("read_topic needs at least one topic or pattern")
    if not isinstance(block_bytes, int) or block_bytes < 1:
        raise InvalidConfig(f"block_bytes must be a positive integer, not {block_bytes!r}")
    for n in names:
        topic_matcher(n) if is_pattern(n) else check_topic_name(n)
    cluster = cluster or connect(start=False)
    exact = {n for n in names if not is_pattern(n)}
    missing = sorted(exact - {t.name for t in cluster.topics(names)})
    if missing:
        raise TopicNotFound(missing[0])
    remote = ray.remote(num_cpus=0, max_restarts=0)(_TopicFeed)
    feed = remote.remote(names, f"read-topic-{uuid.uuid4().hex[:12]}", scope, timeout)
    try:
        ray.get(feed.ready.remote(), timeout=max(timeout, 30.0))
    except BaseException:
        ray.kill(feed, no_restart=True)
        raise

    class TopicDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context=None) -> list[ReadTask]:
            # one task: a run is one ordered stream per publisher
            return [ReadTask(lambda: _blocks(feed),
                             BlockMetadata(num_rows=None, size_bytes=None, input_files=None,
                                           exec_stats=None))]

        def get_name(self) -> str:
            return f"ScopecastTopic({','.join(names)})"

    ds = read_datasource(TopicDatasource(), override_num_blocks=1)
    ds.context.target_max_block_size = block_bytes
    return ds
