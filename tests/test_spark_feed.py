"""The feed from Spark's executors to a publisher (`spark_feed`), over real TCP sockets: the
partitions come out in partition order whatever order they arrive in, a retried task attempt's
rows are not handed out twice, a connection that is not the run's is refused and counted, and
the Spark job's result settles which partitions there are (a partition missing or short aborts
the feed instead of leaving it waiting).
(publish_dataframe(transfer="stream") end to end, with Spark: test_dataframes.py.)"""

from __future__ import annotations

import socket
import threading

import pyarrow as pa
import pytest

from scopecast.ray_cluster.spark_feed import HEADER, MAGIC, TRAILER, FeedAborted, FeedIntake, FeedShare

SECRET = b"s" * 32


def _send(endpoint, partition: int, attempt: int, ids: list[int], *, secret: bytes = SECRET,
          complete: bool = True, batch_rows: int = 10) -> None:
    """What a task's PartitionSender sends: the header, then an Arrow IPC stream of `ids` and
    its row count (cut off before its end when not `complete`, as when the task dies)."""
    with socket.create_connection(endpoint) as sock:
        sock.sendall(HEADER.pack(MAGIC, secret, partition, attempt))
        out = sock.makefile("wb")
        table = pa.table({"id": pa.array(ids, pa.int64())})
        writer = pa.ipc.new_stream(out, table.schema)
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
        if complete:
            writer.close()
            out.write(TRAILER.pack(len(ids)))
        out.flush()


def _ids(intake: FeedIntake) -> list[int]:
    return [i for b in intake.tables() for i in b.column("id").to_pylist()]


def test_partitions_come_out_in_order_and_a_retry_is_not_handed_out_twice():
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(0, 2, False, 5))  # partitions 0, 2, 4
    try:
        _send(intake.endpoint, 4, 0, list(range(400, 430)))
        _send(intake.endpoint, 0, 0, list(range(0, 25)))
        _send(intake.endpoint, 2, 0, list(range(200, 230)), complete=False)  # the task dies
        batches = intake.tables()
        got: list[int] = []
        while len(got) < 25 + 10:  # partition 0, and the first batch of partition 2's attempt
            got += next(batches).column("id").to_pylist()
        _send(intake.endpoint, 2, 1, list(range(200, 230)), batch_rows=7)  # Spark's retry
        threading.Timer(0.5, intake.sent, args=({0: 25, 2: 30, 4: 30},)).start()  # the job ends
        got += [i for b in batches for i in b.column("id").to_pylist()]
        assert got == list(range(0, 25)) + list(range(200, 230)) + list(range(400, 430))
    finally:
        intake.close()


def test_a_connection_not_of_this_run_is_refused_and_a_closed_feed_aborts():
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(0, 2, False, 1))
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


def test_the_jobs_result_settles_the_partitions_and_a_lost_one_aborts():
    """Adaptive execution may give the job other partitions than the DataFrame had: the job's
    result says which were sent (none beyond it is waited for, one beyond the expected is handed
    out after them); a partition the job sent that does not arrive whole aborts the feed."""
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(1, 2, False, 4))  # expects 1 and 3
    try:
        _send(intake.endpoint, 5, 0, [50, 51])  # the job made 6 partitions, not 4
        _send(intake.endpoint, 1, 0, [10])
        _send(intake.endpoint, 3, 0, [])
        intake.sent({1: 1, 3: 0, 5: 2})
        assert _ids(intake) == [10, 50, 51]
    finally:
        intake.close()
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(0, 1, True, 3))  # a key column: all three
    try:
        _send(intake.endpoint, 0, 0, [1, 2])
        intake.sent({0: 2})  # the job made one partition: 1 and 2 are not waited for
        assert _ids(intake) == [1, 2]
    finally:
        intake.close()
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(0, 1, False, 2))
    intake.late = 0.5
    try:
        _send(intake.endpoint, 0, 0, [1, 2, 3])
        _send(intake.endpoint, 1, 0, [4, 5, 6], complete=False)  # broken off, yet Spark says sent
        intake.sent({0: 3, 1: 3})
        with pytest.raises(FeedAborted, match="partition 1: .* stopped after 3 rows"):
            _ids(intake)
    finally:
        intake.close()
    intake = FeedIntake("127.0.0.1", SECRET, FeedShare(0, 1, False, 1))
    try:
        _send(intake.endpoint, 0, 0, [1, 2])
        intake.sent({0: 5})  # more than arrived
        with pytest.raises(FeedAborted, match="partition 0: Spark sent 5 rows, 2 arrived"):
            _ids(intake)
    finally:
        intake.close()


def test_a_feed_opened_before_its_runs_join_starts_is_kept(monkeypatch):
    """A run's publisher is a threaded actor, and a new one gets `join` and `open_feed` at once
    when it starts: open_feed may run first. It waits for join (which starts a run afresh), so the
    feed it opens is the one `run_feed` reads (the CI saw join forget it: run_feed found None)."""
    import ray

    from scopecast.ray_cluster.run_publisher import RunPublisher

    publisher = RunPublisher(None)
    entered = threading.Event()

    def connect(**_kw):  # join's own work; it fails here, which join keeps for `begin`
        entered.set()
        raise ConnectionError("no cluster in this test")

    publisher._connect = connect
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    opening = threading.Thread(target=publisher.open_feed, args=(SECRET, FeedShare(0, 1, False, 1)))
    opening.start()
    opening.join(0.3)  # open_feed first ...
    publisher.join("run", 0, "topic")  # ... then join
    opening.join(10)
    assert entered.is_set() and not opening.is_alive()
    assert isinstance(publisher._feed, FeedIntake)
    publisher._feed.close()
