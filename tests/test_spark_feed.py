"""The feed from Spark's executors to a publisher (`spark_feed`), over real TCP sockets: the
partitions come out in partition order whatever order they arrive in, a retried task attempt's
rows are not handed out twice, and a connection that is not the run's is refused and counted.
(publish_dataframe(transfer="stream") end to end, with Spark: test_dataframes.py.)"""

from __future__ import annotations

import socket
import threading

import pyarrow as pa
import pytest

from scopecast.ray_cluster.spark_feed import HEADER, MAGIC, FeedAborted, FeedIntake

SECRET = b"s" * 32


def _send(endpoint, partition: int, attempt: int, ids: list[int], *, secret: bytes = SECRET,
          complete: bool = True, batch_rows: int = 10) -> None:
    """What a task's PartitionSender sends: the header, then an Arrow IPC stream of `ids`
    (cut off before its end when not `complete`, as when the task dies)."""
    with socket.create_connection(endpoint) as sock:
        sock.sendall(HEADER.pack(MAGIC, secret, partition, attempt))
        out = sock.makefile("wb")
        table = pa.table({"id": pa.array(ids, pa.int64())})
        writer = pa.ipc.new_stream(out, table.schema)
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
        if complete:
            writer.close()
        out.flush()


def _ids(intake: FeedIntake) -> list[int]:
    return [i for b in intake.tables() for i in b.column("id").to_pylist()]


def test_partitions_come_out_in_order_and_a_retry_is_not_handed_out_twice():
    intake = FeedIntake("127.0.0.1", SECRET, [0, 2, 4])
    try:
        _send(intake.endpoint, 4, 0, list(range(400, 430)))
        _send(intake.endpoint, 0, 0, list(range(0, 25)))
        _send(intake.endpoint, 2, 0, list(range(200, 230)), complete=False)  # the task dies
        batches = intake.tables()
        got: list[int] = []
        while len(got) < 25 + 10:  # partition 0, and the first batch of partition 2's attempt
            got += next(batches).column("id").to_pylist()
        _send(intake.endpoint, 2, 1, list(range(200, 230)), batch_rows=7)  # Spark's retry
        got += [i for b in batches for i in b.column("id").to_pylist()]
        assert got == list(range(0, 25)) + list(range(200, 230)) + list(range(400, 430))
    finally:
        intake.close()


def test_a_connection_not_of_this_run_is_refused_and_a_closed_feed_aborts():
    intake = FeedIntake("127.0.0.1", SECRET, [0])
    try:
        _send(intake.endpoint, 0, 0, [1, 2, 3], secret=b"x" * 32)  # another run's secret
        with socket.create_connection(intake.endpoint) as sock:
            sock.sendall(b"SCF9" + b"\0" * (HEADER.size - 4))  # another version
        _send(intake.endpoint, 7, 0, [1])  # not this publisher's partition
        for _ in range(200):
            if intake.rejected == 3:
                break
            threading.Event().wait(0.05)
        assert intake.rejected == 3
        threading.Timer(0.5, intake.close, args=("the run stopped",)).start()
        with pytest.raises(FeedAborted, match="the run stopped"):
            _ids(intake)
    finally:
        intake.close()
