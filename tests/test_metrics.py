"""scopecast's counters reach a real Prometheus the Ray way: a Ray head with its dashboard (`scopecast
up`, which writes Ray's Prometheus service-discovery file), a driver that publishes and subscribes
under real iptables loss (so that repairs are timed), and Prometheus (the Debian package) scraping
the targets the file names. Its HTTP API must show scopecast's series, the repair-time and
delivery-latency histograms included, with the values the driver's own counters show."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from benchmarks.loss import available

needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None or not available(),
                                      reason="needs the prometheus package, root and iptables")

REPO = Path(__file__).resolve().parents[1]
N = 10_000

DRIVER = r'''
import json, sys, time
import ray
import scopecast
from benchmarks.loss import udp_loss
from scopecast.actors.ray_private import session_dir
from scopecast.ray_cluster.consumers import TopicConsumer

N = int(sys.argv[2])
cluster = scopecast.connect(address=sys.argv[1], start=False)
cluster.create_topic("metrics/t")
consumer = ray.remote(num_cpus=0)(TopicConsumer).remote("metrics/t")  # a member of its own
ray.get(consumer.ready.remote())
pending = consumer.consume.remote(N, 120.0)
with udp_loss(0.05), cluster.publisher("metrics/t") as pub:
    for i in range(N):
        pub.publish(b"m%06d" % i + b"." * 500)
        if i % 25 == 24:  # small bursts: the sender's GSO would else carry all N in ~80 packets
            time.sleep(0.0005)  # (and 5% loss can miss all of them)
    pub.flush(timeout=120)
    assert ray.get(pending)["count"] == N
time.sleep(2.5)  # the exporters' next copies (every second) take in the last counts
print(json.dumps({"session_dir": session_dir(), "scope": next(iter(cluster.counters())),
                  "stats": ray.get(consumer.counters.remote())["stats"]}), flush=True)
sys.stdin.readline()  # alive while Prometheus scrapes
cluster.shutdown()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def _names(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/label/__name__/values",
                                timeout=10) as r:
        return [n for n in json.loads(r.read())["data"] if n.startswith("ray_scopecast_")]


def _total(port: int, expr: str) -> float:
    return sum(float(s["value"][1]) for s in _query(port, expr))


@needs_prometheus
def test_prometheus_scrapes_scopecast_series_that_match_the_counters(tmp_path):
    ray_port, prom_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(SCOPECAST_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO),
               RAY_metrics_report_interval_ms="1000")  # (Ray's agents export every 10 s else)
    address = f"127.0.0.1:{ray_port}"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "scopecast.cli", *args], env=env,
                              capture_output=True, text=True, timeout=180)

    up = cli("up", "--port", str(ray_port))
    assert up.returncode == 0, up.stderr
    driver = prom = None
    try:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, address, str(N)], env=env, cwd=REPO,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = driver.stdout.readline()
        assert line, driver.stderr.read()[-3000:]
        report = json.loads(line)
        discovery = Path(report["session_dir"]) / "prom_metrics_service_discovery.json"
        deadline = time.monotonic() + 60
        while not discovery.exists():  # (the dashboard writes it every few seconds)
            assert time.monotonic() < deadline, f"Ray wrote no {discovery}"
            time.sleep(0.5)
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "ray",
                                "file_sd_configs": [{"files": [str(discovery)]}]}]}))
        prom = subprocess.Popen(["prometheus", f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stats, scope = report["stats"], report["scope"]
        want = {"delivered": stats["delivered"], "repairs": stats.get("repairs_timed", 0),
                "latency": stats.get("latency_timed", 0)}
        assert want["delivered"] >= N and want["repairs"] > 0, json.dumps(stats)  # (loss was real)
        assert want["latency"] > 0, json.dumps(stats)
        got: dict = {}
        deadline = time.monotonic() + 120
        while True:  # liveness bound: scrapes every second, agents export every second
            try:
                names = _names(prom_port)
                by = {n.removeprefix("ray_scopecast_").removesuffix("_total"): n for n in names}
                if {"messages_delivered", "messages_published", "repair_time_ms_count",
                        "delivery_latency_ms_count"} <= by.keys():
                    sel = f'{{scope="{scope}"}}'
                    got = {"delivered": _total(prom_port, by["messages_delivered"] + sel),
                           "published": _total(prom_port, by["messages_published"] + sel),
                           "repairs": _total(prom_port, by["repair_time_ms_count"] + sel),
                           "latency": _total(prom_port, by["delivery_latency_ms_count"] + sel),
                           "names": sorted(by)}
                    # (latency is observed as a sample of at most LATENCY_SAMPLES a second)
                    if (got["delivered"], got["repairs"], got["published"]) == (
                            want["delivered"], want["repairs"], N) and got["latency"] > 0:
                        break
            except OSError:
                pass  # Prometheus still starting
            assert time.monotonic() < deadline, (got, want)
            time.sleep(1.0)
        assert got["latency"] <= want["latency"], (got, want)
        for name in ("naks", "repairs", "lag_bytes", "repair_time_ms_bucket",
                     "delivery_latency_ms_bucket"):
            assert name in got["names"], got["names"]
        # Ray's naming, which the dashboard assumes: ray_ first, _total on counters
        assert by["messages_delivered"] == "ray_scopecast_messages_delivered_total"
        # the published counter is tagged with the topic (one of the process's busiest)
        (series,) = _query(prom_port, by["messages_published"] + sel)
        assert series["metric"]["topic"] == "metrics/t"
    finally:
        if driver is not None:
            driver.kill()
        if prom is not None:
            prom.kill()
        cli("down", "--ray", "--address", address)


def test_the_grafana_dashboard_queries_only_series_scopecast_exports():
    from scopecast.ray_cluster import metrics

    counters = [*metrics.COUNTERS, "scopecast_messages_published", "scopecast_messages_dropped"]
    exported = {f"ray_{n}_total" for n in counters} | {"ray_scopecast_lag_bytes"} | {
        f"ray_scopecast_{h}_{part}" for part in ("bucket", "count", "sum")
        for h in ("repair_time_ms", "delivery_latency_ms")}
    dashboard = (REPO / "docs" / "grafana-scopecast.json").read_text()
    used = set(re.findall(r"ray_scopecast_\w+", dashboard))
    assert used and used <= exported, used - exported
    assert len(json.loads(dashboard)["panels"]) >= 8


def test_published_counts_go_by_tag_the_busiest_topics_tagged_for_good_the_rest_as_one():
    from scopecast.ray_cluster.metrics import OTHER, TOP_TOPICS, by_tag

    tagged: set[str] = set()
    first = {("s", f"t{i}"): i for i in range(1, 1001)}  # t1000 the busiest
    out = by_tag(first, tagged)
    assert len(out) == TOP_TOPICS + 1  # one count a tag, whatever the number of topics
    assert tagged == {f"t{i}" for i in range(1001 - TOP_TOPICS, 1001)}
    assert out[("s", "t1000")] == 1000 and sum(out.values()) == sum(first.values())
    out = by_tag({("s", "t1"): 10**6, ("s", "t1000"): 1, ("u", "t1000"): 2}, tagged)
    assert out == {("s", OTHER): 10**6, ("s", "t1000"): 1, ("u", "t1000"): 2}  # tags kept
