"""The benchmark harness runs end to end and writes its results; numbers are not checked. `--quick`
runs the throughput, peer, scale and latency suites reduced; the suites that start something of
their own (the loss suite's iptables rule, the Spark pipeline suite's Spark) share one more reduced
run, and two netns hosts a third."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import latency_suite, loss, peer_suite, scale_suite

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 270  # a quick run takes ~1 min; stays inside pytest's 300 s per test


def _harness(out: Path, *args: str, latest: str = "latest.json") -> dict:
    """Run `python -m benchmarks.harness --quick ARGS` on its own embedded Ray (or its own hosts);
    its `latest` results."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.harness", "--quick",
                             "--out", str(out), *args],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        text, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the harness kills its processes and stops Ray
        try:
            text, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        pytest.fail(f"harness did not finish within {TIMEOUT}s:\n{text[-3000:]}")
    assert proc.returncode == 0, text[-3000:]
    path = out / latest
    assert path.exists(), text[-3000:]
    results = json.loads(path.read_text())
    assert (out / f"{results['timestamp']}.json").exists()
    return results


def test_quick_bench_writes_json_and_plot(tmp_path):
    results = _harness(tmp_path, "--topic-pairs", "2")
    for key in ("timestamp", "config", "machine", "cases", "targets", "table_markdown", "plot"):
        assert key in results, key
    assert results["plot"] and (tmp_path / results["plot"]).stat().st_size > 0
    assert (tmp_path / "latest.png").exists()
    for key in ("cpu_model", "cores_logical", "python", "ray", "kernel"):
        assert key in results["machine"], key
    assert {c["system"] for c in results["cases"]} == {"baseline", "scopecast"}
    for case in results["cases"]:
        assert case.get("error") is None, case.get("error")
        for key in ("min_rate", "mean_rate", "min_mb_s", "cpu_us_per_msg", "lost", "published",
                    "receivers"):
            assert key in case, key
    assert "| size | subs | system |" in results["table_markdown"]

    peers = results["peers"]
    assert not peers["skipped"], peers["skipped"]  # .ci/run installs every peer
    assert {r["system"] for r in peers["rows"]} == set(peer_suite.SYSTEMS)
    for row in peers["rows"]:
        assert row["tries"] and not row["failed"], row["error"]
        assert all("delivered_share" in t for t in row["tries"]), row["tries"]
        assert all(p["error"] is None for p in row["latency"]), row["latency"]
    assert results["peers_plot"] and (tmp_path / "latest-peers.png").stat().st_size > 0
    assert "| system | size | subs | saturation msgs/s" in results["table_markdown"]
    topics = peers["topic_rows"]  # every system at 1 and 20 topics, round-robin
    assert {(r["system"], r["topics"]) for r in topics} == {
        (s, n) for s in peer_suite.SYSTEMS for n in (1, 20)}
    for row in topics:
        assert row["error"] is None and row["rate"], row["error"]
    ours = [r for r in topics if r["system"] == "scopecast"]
    assert all(r["loss"] == 0 and r["subscriber_rss_bytes"] for r in ours), ours
    assert sorted((r["pair"], r["topics"]) for r in ours) == [(0, 1), (0, 20), (1, 1), (1, 20)]
    assert "drop" in peers["topic_targets"]
    assert len(peers["topic_targets"]["pair_ratios"]) == 2  # the drop is their median
    (ready,) = peers["ready_rows"]  # --quick: one readiness case, at 20 topics
    assert ready["topics"] == 20 and ready["error"] is None, ready
    # every subscriber, subscribing while the publisher published, had a message of every topic
    assert len(ready["subscriber_ready_seconds"]) == 1 and ready["ready_seconds"] is not None
    assert "ready_status" in peers["topic_targets"]
    assert "Scale in topics" in results["table_markdown"]
    scale = results["scale_members"]  # scopecast to 1 and 2 subscribers, control read meanwhile
    assert [r["subscribers"] for r in scale] == [1, 2]
    for row in scale:
        assert row["error"] is None and row["rate"] and row["loss"] == 0, row["error"]
        assert row["control"]["members"] >= row["subscribers"] + 1, row["control"]
    assert "Scale in members and topics" in results["table_markdown"]
    latency = results["latency"]  # --quick: 5,000 msgs/s to one subscriber, scopecast and peers
    assert {(r["system"], r["rate"], r["subscribers"]) for r in latency["rows"]} == {
        (s, 5000, 1) for s in latency_suite.SYSTEMS}
    for row in latency["rows"]:
        assert not row["failed"] and row["p99_ms"] is not None, row["tries"]
        assert row["samples"] >= 1000, row  # timed after the warm-up, every subscriber
    assert [t["status"] for t in latency["targets"]] != ["not run"]
    assert latency["cpu_target"] == {"status": "not run"}  # (5,000 msgs/s to 8 subscribers)
    assert "Latency at fixed rates" in results["table_markdown"]
    assert (tmp_path / "latest-latency.png").stat().st_size > 0


@pytest.mark.skipif(not loss.available(), reason="the loss suite needs root and iptables")
def test_quick_loss_steady_and_spark_suites_write_their_rows(tmp_path):
    """One harness run for the suites that start something of their own: the loss suite (its
    iptables rule) with the recovery curves, the steady-throughput repeats, the Spark pipeline
    suite (its Spark session) and the encryption suite (an encrypting cluster of its own)."""
    results = _harness(tmp_path, "--systems", "scopecast", "--loss", "0.05", "--peers", "",
                       "--members", "", "--latency-rates", "", "--spark-rows", "2000", "--spark-rounds", "1",
                       "--steady-runs", "2", "--encrypt-pairs", "1")
    (row,) = results["loss_suite"]
    assert row["error"] is None and row["loss"] == 0.05 and row["lost"] == 0, row
    assert row["dropped_datagrams"] and row["lossless_rate"], row  # the rule dropped; a clean case ran
    # --quick: one pair, its lossless case run right before it; then the paced lossy case
    lossy, paced = results["loss_cases"]
    assert paced["paced"] == 20_000 and paced.get("error") is None, paced.get("error")
    assert row["paced"]["lost"] == 0 and row["paced"]["target"] in ("met", "missed"), row["paced"]
    assert "| loss | offered msgs/s |" in results["table_markdown"]
    assert lossy["reference"]["min_rate"] == row["lossless_rate"] and lossy["reference"]["error"] is None
    assert len(row["pair_ratios"]) == 1 and "vs lossless right before" in results["table_markdown"]
    assert row["repairs"] and row["repair_p99_ms"] is not None, row  # every subscriber's, pooled
    assert row["repair_p999_ms"] >= row["repair_p99_ms"], row
    # measured by the subscribers (gaps in their channels' datagram numbers), beside the rule's
    assert 0 < row["datagram_loss"] < 0.5 and row["datagrams_per_send_call"] >= 1, row
    curves = results["recovery_curves"]
    assert [r["members"] for r in curves["token_rounds"]] == [3]
    assert [r["in_flight_mb"] for r in curves["memory_in_flight"]] == [4]
    for heading in ("| loss | size | subs |", "| members | token round", "| in flight MiB |"):
        assert heading in results["table_markdown"], heading
    assert loss.sweep_stale() == 0, "the harness left its loss rule behind"
    steady = results["steady"]  # scopecast's 1 KB case twice back to back, and their spread
    assert len(steady["scopecast"]["rates"]) == 2 and steady["scopecast"]["spread"] > 0, steady
    assert steady["status"] in ("met", "missed") and "Steady throughput" in \
        results["table_markdown"]
    pipeline = results["spark_pipeline"]
    assert pipeline["rows"] == 2000
    ceiling, *cases = pipeline["cases"]
    assert ceiling["rows"] == 2000 and ceiling["rows_per_s"] > 0, ceiling
    assert [(c["mode"], c["parallelism"]) for c in cases] == [
        ("rows", 1), ("rows", 2), ("arrow", 1), ("arrow", 2)]
    assert all(c["complete"] and c["delivered"] == 2000 for c in cases), cases
    assert "Spark pipeline suite" in results["table_markdown"]
    encrypted = results["encryption"]  # 1 KB 1 -> 1 on an encrypting cluster of its own, beside
    (row,) = encrypted["rows"]         # the harness's, one pair
    assert "error" not in encrypted and row["lost"] == 0 and len(row["ratios"]) == 1, encrypted
    assert encrypted["status"] in ("met", "missed") and "Encryption (1000 B" in \
        results["table_markdown"]


@pytest.mark.skipif(not loss.available() or shutil.which("ip") is None,
                    reason="several hosts need root, iproute2 and iptables")
def test_quick_throughput_and_loss_suites_on_two_hosts(tmp_path):
    """Issue 8 item 4: the harness makes its own hosts, runs the throughput and loss suites with
    the sender on one host and the receivers on another, and removes the hosts."""
    results = _harness(tmp_path, "--hosts", "2", "--hosts-prefix", "sctb", "--subscribers", "2",
                       "--loss", "0.05", "--datagram-bytes", "9000", "--latency-rates", "",
                       latest="latest-hosts.json")
    assert [h["netns"] for h in results["hosts"]["hosts"]] == ["sctb-h1", "sctb-h2"]
    assert {c["system"] for c in results["cases"]} == {"baseline", "scopecast"}
    for case in results["cases"] + results["loss_cases"]:
        assert case.get("error") is None, case.get("error")
        sender = case["sender"]["netns"]
        receivers = {r["netns"] for r in case["receivers"]}
        # each process reported its own network namespace: the receivers' is not the sender's
        assert len(receivers) == 1 and sender not in receivers, (sender, receivers)
        assert case["published"] and (case["system"] == "baseline" or case["lost_total"] == 0)
        if case["system"] == "scopecast" and not case.get("paced"):  # (flat out: batched)
            # the cluster's datagram size reached every member:
            # 1 KB messages travel several to a datagram, not one per 1500-byte frame
            assert all(r["stats"]["delivered"] > 2 * r["stats"]["datagrams_in"]
                       for r in case["receivers"]), [r["stats"] for r in case["receivers"]]
    (row,) = results["loss_suite"]
    assert row["lost"] == 0 and row["dropped_datagrams"], row  # rules inside the hosts dropped
    assert "On 2 hosts" in results["table_markdown"]
    assert not (tmp_path / "latest.json").exists()  # a one-host run's results stay apart
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "sctb-" not in netns, netns  # the run removed its hosts


def test_peer_sizes_too_small_for_the_latency_stamp_are_refused_before_anything_starts():
    from benchmarks.harness import parse_args

    with pytest.raises(SystemExit, match="at least 8 bytes"):
        parse_args(["--peer-sizes", "4"])
    assert parse_args(["--peer-sizes", "4", "--peers", ""]).peer_sizes == [4]  # no peer suite


def test_several_hosts_run_only_the_throughput_and_loss_suites():
    from benchmarks.harness import parse_args

    with pytest.raises(SystemExit, match="at least 2"):
        parse_args(["--hosts", "1"])
    with pytest.raises(SystemExit, match="drop --peers"):
        parse_args(["--hosts", "3", "--peers", "redis"])
    args = parse_args(["--hosts", "3"])
    assert (args.peers, args.members, args.spark_rows, args.steady_runs) == ([], [], 0, 0)
    assert args.loss == [0.01, 0.05] and args.subscribers == [1, 2, 4]
    assert args.latency_subscribers == [4]  # the latency cases at 1 -> 4, across the hosts


@pytest.mark.parametrize("topics", [1, 300])
def test_the_io_thread_benchmarks_run_and_the_receiver_takes_every_message(topics):
    """The isolated I/O-thread benchmarks (no Ray): the sender's, and the receiver's, which
    raises unless it took every message the sender's datagrams carry."""
    from benchmarks import receiver_io, sender_io

    assert receiver_io.us_per_message(topics, 20_000, 100) > 0
    assert sender_io.us_per_message(topics, 20_000, 100) > 0


def test_topic_drop_is_the_median_over_pairs():
    def row(pair, topics, rate, rss=100e6):
        return {"system": "scopecast", "pair": pair, "topics": topics, "rate": rate,
                "subscriber_rss_bytes": rss, "publisher_rss_bytes": rss}
    rows = [row(0, 1, 100.0), row(0, 10, 90.0), row(0, 100, 50.0, 100e6 + 99 * 1000),
            row(1, 1, 100.0), row(1, 100, 95.0), row(2, 1, 80.0), row(2, 100, 96.0),
            {"system": "nats", "topics": 1, "rate": 1.0}]
    t = peer_suite.topic_targets(rows)
    assert t["pair_ratios"] == [0.5, 0.95, 1.2] and t["drop"] == pytest.approx(0.05)
    assert t["drop_status"] == "met" and t["bytes_per_topic"] == pytest.approx(1000)


def test_readiness_is_the_median_of_the_runs_and_a_run_never_ready_counts_as_never():
    def row(*times):
        return peer_suite.ready_row({"topics": 100, "subscribers": len(times),
                                     "receivers": [{"ready_seconds": t} for t in times]})
    assert row(2.0, 3.5)["ready_seconds"] == 3.5  # the slowest subscriber
    assert row(2.0, None)["ready_seconds"] is None
    t = peer_suite.ready_target([row(2.0, 3.5), row(1.0), row(None)])
    assert t["ready_seconds"] == 3.5 and t["ready_status"] == "met"
    t = peer_suite.ready_target([row(2.0), row(None), row(None)])
    assert t["ready_seconds"] is None and t["ready_status"] == "missed"
    assert peer_suite.ready_target([]) == {}


def test_the_caching_target_compares_the_most_subscribers_run_both_ways():
    def row(n, caching, held):
        return {"subscribers": n, "caching": caching,
                "control": {"cached_messages_per_member": held}}
    rows = [row(4, "all", 900.0), row(8, "all", 1000.0), row(16, "all", 1200.0),
            row(4, "1/5", 300.0), row(8, "1/5", 250.0)]  # (16 with cachers failed: no reading)
    t = scale_suite.caching_target(rows)
    assert (t["subscribers"], t["ratio"], t["status"]) == (8, 0.25, "met")
    assert scale_suite.caching_target(rows[:3]) is None
    assert scale_suite.caching_target([row(4, "all", 100.0), row(4, "1/5", 40.0)])["status"] \
        == "missed"
