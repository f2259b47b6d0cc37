"""`Subscriber.rows()`: the rows of one `publish_dataframe` run as a subscriber in your own process
or actor receives them: decoded with the schema recorded on each topic (timestamps as datetimes,
decimals as Decimals, structs as dicts: what Arrow's `to_pylist` gives for the DataFrame's types),
with the run's in-band end messages taken as the end of the stream rather than handed over.

The stream ends when every topic of the run that the subscriber's names and patterns take has
the end message of each of the run's publishers. Which topics those are is read from the cluster
when the first end message comes: `publish_dataframe` records the schema on every topic of a run
(routed ones included) before any row is published. Messages of a topic with no DataFrame schema
are skipped (counted in `RowStream.skipped`); a hole in a stream (possible only without recovery,
or for a client subscriber) raises CollectIncomplete, as does `timeout` seconds without a message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from scopecast.actors.errors import CollectIncomplete
from scopecast.extras import require
from scopecast.netio.topic_names import name_filter
from scopecast.ray_cluster.dataframe_codec import arrow_schema, decode_payloads, end_message

if TYPE_CHECKING:
    import pyarrow as pa

    from scopecast.netio.message import Message
    from scopecast.netio.pubsub import Subscriber
    from scopecast.scopes.topics import DataFrameSchema


class RowStream:
    """An iterator over the rows of one run (what `Subscriber.rows()` returns); its counters say
    what it read so far."""

    def __init__(self, cluster, sub: Subscriber, timeout: float) -> None:
        require("data", "Subscriber.rows()")
        self._cluster = cluster
        self._sub = sub
        self._timeout = timeout
        self._takes = name_filter(sub.topics)  # the subscription's names and patterns
        self._schemas: dict[str, tuple[DataFrameSchema, pa.Schema] | None] = {}
        self._last: dict[tuple[str, str, int], int] = {}  # (topic, source, session) -> seq
        self.run: str | None = None           # the run being read (known at its first end)
        self.topics: set[str] = set()         # the run's topics this subscriber takes
        self.ends: dict[str, set[int]] = {}   # topic -> the publishers whose end came
        self.publishers = 0                   # how many publishers the run had
        self.rows = 0
        self.skipped = 0                      # messages of topics that record no DataFrame
        self._tables = self._iterate()
        self._rows = (row for table in self._tables for row in table.to_pylist())

    def __iter__(self) -> RowStream:
        return self

    def __next__(self) -> dict:
        return next(self._rows)

    def tables(self) -> Iterator[pa.Table]:
        """The same stream as Arrow tables of the recorded schema, each the rows of one topic
        that arrived together (what `read_topic` makes blocks of). Iterate either this or the
        rows, not both."""
        return self._tables

    @property
    def done(self) -> bool:
        return self.run is not None and all(
            len(self.ends.get(t, ())) >= self.publishers for t in self.topics)

    def _schema(self, topic: str):
        if topic not in self._schemas:
            info = self._cluster.topic(topic)
            df = info.dataframe
            self._schemas[topic] = None if df is None else (
                df, arrow_schema(json.loads(df.spark)))
        return self._schemas[topic]

    def _iterate(self) -> Iterator[pa.Table]:
        while not self.done:
            batch = self._sub.receive_batch(self._timeout)
            if not batch:
                raise CollectIncomplete(self._missing(f"nothing arrived for {self._timeout:g} s"))
            topic, payloads, ctypes = None, [], []
            for m in batch:
                self._check_order(m)
                end = end_message(m)
                if end is not None or m.topic != topic:
                    yield from self._decoded(topic, payloads, ctypes)
                    topic, payloads, ctypes = m.topic, [], []
                if end is not None:
                    self._ended(m.topic, end)
                    continue
                payloads.append(m.payload)
                ctypes.append(m.content_type)
            yield from self._decoded(topic, payloads, ctypes)

    def _decoded(self, topic: str | None, payloads: list, ctypes: list) -> Iterator[pa.Table]:
        if not payloads:
            return
        schema = self._schema(topic)
        if schema is None:
            self.skipped += len(payloads)
            return
        table = decode_payloads(payloads, ctypes, schema[1])
        self.rows += table.num_rows
        yield table

    def _check_order(self, m: Message) -> None:
        key = (m.topic, m.source, m.session)
        prev = self._last.get(key)
        if prev is not None and m.seq != prev + 1 and not (
                m.seq == prev + 2 and self._sub.ended(*key, prev)):
            raise CollectIncomplete(self._missing(
                f"{m.topic} from {m.source} went from message {prev} to {m.seq}"))
        self._last[key] = m.seq

    def _ended(self, topic: str, end: list) -> None:
        _tag, run, publisher, publishers, *_rest = end
        if self.run is None:
            self.run, self.publishers = run, publishers
            self.topics = {t.name for t in self._cluster.topics()
                           if self._takes(t.name) and t.dataframe is not None
                           and t.dataframe.run == run}
            self.topics.add(topic)
        if run == self.run:
            self.ends.setdefault(topic, set()).add(publisher)

    def _missing(self, why: str) -> str:
        if self.run is None:
            return f"rows(): {why}, before any end message of a run"
        waiting = sorted(t for t in self.topics if len(self.ends.get(t, ())) < self.publishers)
        return (f"rows(): {why}; run {self.run} has not ended on {', '.join(waiting)} "
                f"({self.rows:,} rows so far)")
