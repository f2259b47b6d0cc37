"""The benchmark run: `python -m benchmarks.harness`, `scopecast bench`, `make bench`.

Starts one embedded scopecast cluster (`scopecast.connect()`, which starts Ray) and runs, for every
message size and subscriber count, the baseline (plain `sendto` per message on a multicast socket,
receivers counting with `recv_into`) and then scopecast (one publisher process, N subscriber
processes, a fresh topic per case); then the peer suite (`peer_suite`), the loss suite and the Spark
pipeline suite. Writes `<out>/<timestamp>.json`, `<out>/<timestamp>.png` (and `-peers.png`) and
`latest.json` / `latest.png` / `latest-peers.png` (`latest-hosts.*` for a run on several hosts,
`--hosts N`, see `hosts`), prints progress and a markdown summary (also
stored in the JSON as "table_markdown"). Exit status 0 when every case ran (targets are reported,
never asserted; a peer that keeps up at no offered rate is a result, not a failure).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import (
    analysis,
    demo_naks,
    encryption,
    feedback_suite,
    hosts,
    latency_suite,
    loss,
    machine,
    peer_suite,
    recovery_curves,
    regions_suite,
    report,
    scale_suite,
    spark_pipeline,
)
from benchmarks.cases import Case, Placement, Wiring, failed_result, run_case
from benchmarks.meter import STAMP
from benchmarks.procs import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"
SYSTEMS = ("baseline", "scopecast")
QUICK = dict(sizes=[1000], subscribers=[1], seconds=0.5, warmup=0.1, peer_sizes=[1000],
             peer_subscribers=[1], topic_counts=[1, 20], topic_subscribers=1, members=[1, 2],
             feedback_receivers=[], region_pairs=0, ring_subscribers=[2], memory_mb=[4], latency_rates=[5000],
             latency_subscribers=[1],
             latency_repeats=1, latency_messages=1000, steady_runs=0)
STEADY_RUNS = 5
STEADY_MIN = 0.8  # target: scopecast's slowest of the steady runs over its fastest


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, not {text!r}")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, not {text!r}") \
            from None
    if any(not 0 <= v < 1 for v in values):
        raise argparse.ArgumentTypeError("loss shares are within [0, 1)")
    return [v for v in values if v > 0]


def _int_list_or_none(text: str) -> list[int]:
    return _int_list(text) if text.strip() else []


def _names(known: tuple[str, ...], empty_ok: bool = False):
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in known]
        if (not values and not empty_ok) or bad:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(known)}; got {text!r}")
        return [s for s in known if s in values]
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.harness",
        description="scopecast throughput suite: one publisher process to N subscriber processes, "
                    "against a plain one-sendto-per-message multicast baseline measured in the same "
                    "run. Reports delivered msgs/s and MB/s per subscriber (min and mean), the ratio "
                    "to the baseline, CPU µs per delivered message (all sending and receiving "
                    "processes) and messages lost, and checks the issue's two 1 KB targets.",
        epilog="Results: <out>/<UTC timestamp>.json and .png, plus latest.json and latest.png "
               "(latest-hosts.* with --hosts).")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1000-byte messages, 1 subscriber, %.1f s per case, %.1f s warm-up "
                        "(explicit --sizes/--subscribers/--seconds/--warmup still win)"
                        % (QUICK["seconds"], QUICK["warmup"]))
    p.add_argument("--sizes", type=_int_list, default=None, metavar="B,B,...",
                   help="message payload sizes in bytes (default 100,1000,8000)")
    p.add_argument("--subscribers", type=_int_list, default=None, metavar="N,N,...",
                   help="subscriber (receiver) process counts per case (default 1,2,4)")
    p.add_argument("--seconds", type=float, default=None, metavar="D",
                   help="how long the publisher (and the baseline sender) sends in each case; "
                        "receivers then drain (default 3)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="a receiver's measured window opens at its first delivery S seconds after "
                        "its first message (default 0.5)")
    p.add_argument("--systems", type=_names(SYSTEMS), default=list(SYSTEMS), metavar="NAME,...",
                   help="which systems to run: baseline,scopecast (default both; ratios and targets "
                        "need both)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help=f"directory for the JSON and PNG results (default {DEFAULT_OUT})")
    p.add_argument("--case-timeout", type=float, default=None, metavar="S",
                   help="kill a case's processes and mark it failed after S seconds "
                        "(default 150 + 3 x --seconds)")
    p.add_argument("--mac", default=None, metavar="NAME",
                   help="packet authenticator of the cluster the harness deploys, passed to "
                        "scopecast.connect(mac=...) (default: scopecast's default)")
    p.add_argument("--policy", default="lan_multicast", metavar="NAME",
                   help="forwarding policy of the benchmark topics (default lan_multicast: one "
                        "IP multicast group per LAN scope, what the raw-UDP baseline does; "
                        "'tree' makes members forward to each other)")
    p.add_argument("--loss", type=_float_list, default=None, metavar="P,P,...",
                   help="loss suite: rerun the scopecast 1 KB case with the most subscribers while "
                        "iptables drops this share of loopback UDP datagrams (default 0.01,0.05; "
                        "needs root and iptables; 0 or --quick: none); then the recovery curves: "
                        "token round time for 3-17 members, publisher memory per byte in flight")
    p.add_argument("--loss-pairs", type=int, default=None, metavar="N",
                   help="loss suite: run each loss level N times, each right after a lossless "
                        "case of its own; the ratio is the median over the pairs (default 3, "
                        "--quick: 1)")
    p.add_argument("--loss-rate", type=float, default=20_000.0, metavar="R",
                   help="loss suite: after each loss level's pairs, one more lossy case with the "
                        "publisher paced at R msgs/s, for repair times below saturation (where the "
                        "subscribers are not waiting for a CPU); it sends for --loss-seconds "
                        "(0: not run)")
    p.add_argument("--loss-seconds", type=float, default=None, metavar="S",
                   help="how long the paced lossy case sends (default 30: ~500 repairs at 1%% "
                        "loss; --quick: --seconds)")
    p.add_argument("--ring-subscribers", type=_int_list, default=None, metavar="N,N,...",
                   help="recovery curves: token round time with this many subscribers and the "
                        "publisher in one peer group (default "
                        f"{','.join(map(str, recovery_curves.RING_SUBSCRIBERS))})")
    p.add_argument("--memory-mb", type=_int_list, default=None, metavar="MB,MB,...",
                   help="recovery curves: publisher RSS growth at these MiB held until stable "
                        f"(default {','.join(map(str, recovery_curves.MEMORY_LEVELS_MB))})")
    p.add_argument("--spark-rows", type=int, default=None, metavar="N",
                   help="Spark pipeline suite: N rows of ~1 KB from a DataFrame through "
                        "publish_dataframe (parallelism 1 and 2) to a subscriber, beside the "
                        "conversion ceiling (default 100000; 0 or --quick: none)")
    p.add_argument("--spark-rounds", type=int, default=spark_pipeline.ROUNDS, metavar="N",
                   help="Spark pipeline suite: runs of each case, interleaved; the fastest counts "
                        f"(default {spark_pipeline.ROUNDS}: the first is in effect a warm-up)")
    p.add_argument("--demo-rows", type=int, default=None, metavar="N",
                   help="repair without loss: `make demo`'s job on the run's cluster, its first "
                        "N flights, and the NAKs each LAN sent (default: every flight; --quick "
                        "and 0: not run)")
    p.add_argument("--peers", type=_names(peer_suite.SYSTEMS, empty_ok=True),
                   default=None, metavar="NAME,...",
                   help="peer suite: throughput at saturation of these systems side by side "
                        f"(default {','.join(peer_suite.SYSTEMS)}; '' for none; a peer whose "
                        "server or client is not installed is skipped and the results say why)")
    p.add_argument("--peer-sizes", type=_int_list_or_none, default=None, metavar="B,B,...",
                   help="message sizes of the peer suite (default 100,1000; '' for none: only "
                        "the topic cases run)")
    p.add_argument("--peer-subscribers", type=_int_list, default=None, metavar="N,N,...",
                   help="subscriber process counts of the peer suite (default 1,4,8)")
    p.add_argument("--topic-counts", type=_int_list_or_none,
                   default=None, metavar="N,N,...",
                   help="peer suite, scale in topics: the publisher round-robin over this many "
                        "topics, every subscriber on all of them, every system (default "
                        f"{','.join(map(str, peer_suite.TOPIC_COUNTS))}; 1 KB messages; '' for "
                        "none)")
    p.add_argument("--topic-subscribers", type=int, default=None, metavar="N",
                   help="subscriber processes of the topic cases (default 4)")
    p.add_argument("--topic-pairs", type=int, default=None, metavar="N",
                   help="scopecast's drop from the fewest to the most topics is the median "
                        "over N pairs of cases: the sweep's, then N - 1 more, each pair back to "
                        f"back (default {peer_suite.TOPIC_PAIRS}, --quick: 1)")
    p.add_argument("--ready-runs", type=int, default=None, metavar="N",
                   help="readiness at the most topics: N cases whose subscribers subscribe to "
                        "the pattern once the publisher publishes to every topic; the median "
                        "of their slowest subscriber's time to a message of every topic "
                        f"(default {peer_suite.READY_RUNS}, --quick: 1; 0: none)")
    p.add_argument("--ready-within", type=float, default=None, metavar="S",
                   help="a readiness case's publisher publishes S seconds, and its subscribers "
                        "not ready S seconds after subscribing give up (default "
                        f"{peer_suite.READY_PUBLISH:g}, --quick: {peer_suite.READY_TARGET:g})")
    p.add_argument("--latency-rates", type=_int_list_or_none, default=None, metavar="R,R,...",
                   help="latency suite: fixed offered rates, msgs/s (default "
                        f"{','.join(map(str, latency_suite.RATES))}; '' for none), 1 KB messages, "
                        "scopecast beside the peers zmq and nats of --peers")
    p.add_argument("--latency-subscribers", type=_int_list, default=None, metavar="N,N,...",
                   help="latency suite: subscriber process counts (default "
                        f"{','.join(map(str, latency_suite.SUBSCRIBERS))})")
    p.add_argument("--latency-repeats", type=int, default=None, metavar="N",
                   help="latency suite: interleaved repetitions of every case, the median "
                        f"reported (default {latency_suite.REPEATS}, --quick: 1)")
    p.add_argument("--latency-messages", type=int, default=None, metavar="N",
                   help="latency suite: messages each subscriber times after the warm-up "
                        f"(default {latency_suite.MESSAGES:,}, --quick: 1,000)")
    p.add_argument("--steady-runs", type=int, default=None, metavar="N",
                   help="steady throughput: scopecast's 1 KB case with the most --subscribers "
                        "N times back to back, then the baseline's; the spread of each (default "
                        f"{STEADY_RUNS}, --quick: 0)")
    p.add_argument("--members", type=lambda t: _int_list(t) if t.strip() else [], default=None,
                   metavar="N,N,...",
                   help="scale suite: scopecast from one publisher to this many subscriber "
                        "processes, with control traffic and token rounds (default "
                        f"{','.join(map(str, scale_suite.MEMBER_COUNTS))}; '' for none)")
    p.add_argument("--feedback-receivers", type=lambda t: _int_list(t) if t.strip() else [],
                   default=None, metavar="N,N,...",
                   help="feedback suite: control datagrams a publisher receives per second at "
                        "this many receivers, acknowledgements gathered up a tree and direct "
                        f"(default {','.join(map(str, feedback_suite.RECEIVERS))}; --quick: none)")
    p.add_argument("--region-pairs", type=int, default=None, metavar="N",
                   help="regions suite: 100 lan_multicast topics, two halves of subscribers in "
                        "one LAN against each half alone, this many pairs (default "
                        f"{regions_suite.PAIRS}; --quick: none)")
    p.add_argument("--datagram-bytes", type=int, default=0, metavar="B",
                   help="datagram size of the cluster the harness deploys, connect("
                        "datagram_bytes=B) (default: scopecast's own, each member's interface "
                        "MTU; 64 KB on loopback). On several hosts, 65000 lets the kernel "
                        "fragment datagrams, as JGroups does")
    p.add_argument("--hosts", type=int, default=0, metavar="N",
                   help="run the throughput and loss suites on N hosts (2 or more) of a local "
                        "multi-host cluster made for the run and removed after it: network "
                        "namespaces on one bridge, a Ray node each, the sender on the first host, "
                        "receivers round-robin on the others (root only; `make bench HOSTS=3`). "
                        "The peer, scale and Spark suites run on one host only")
    p.add_argument("--hosts-prefix", default=hosts.PREFIX, metavar="P",
                   help=f"name prefix of that cluster's namespaces and bridge (default "
                        f"{hosts.PREFIX}; a leftover one: scopecast cluster local --prefix P --down)")
    p.add_argument("--on-hosts", default="", help=argparse.SUPPRESS)  # the run inside the head
    p.add_argument("--encrypt-pairs", type=int, default=None, metavar="N",
                   help="encryption suite: the 1 KB cases (each of --subscribers) on an "
                        "encrypting cluster of its own beside the harness's, N pairs back to back "
                        "(default 3; 0 with --quick or --hosts: skipped)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep every process's stderr log (kept anyway when a case fails)")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.hosts:
        if args.hosts < 2:
            raise SystemExit("--hosts: at least 2 (a sender's host and a receivers' host)")
        asked = [opt for opt, name in (("--peers", "peers"), ("--members", "members"),
                                       ("--spark-rows", "spark_rows"),
                                       ("--demo-rows", "demo_rows"),
                                       ("--steady-runs", "steady_runs")) if getattr(args, name)]
        if asked:
            raise SystemExit(f"--hosts runs the throughput, latency and loss suites only; drop "
                             f"{', '.join(asked)}")
        args.peers, args.members, args.spark_rows, args.steady_runs = [], [], 0, 0
        args.feedback_receivers = []
        args.region_pairs = 0
        args.demo_rows = 0
        args.encrypt_pairs = 0
        if args.latency_subscribers is None:  # across hosts: the 1 -> 4 cases, beside loopback's
            args.latency_subscribers = [4]
    defaults = dict(latency_rates=list(latency_suite.RATES),
                    latency_subscribers=list(latency_suite.SUBSCRIBERS),
                    latency_repeats=latency_suite.REPEATS, latency_messages=latency_suite.MESSAGES,
                    steady_runs=STEADY_RUNS,
                    sizes=[100, 1000, 8000], subscribers=[1, 2, 4], seconds=3.0, warmup=0.5,
                    peers=list(peer_suite.SYSTEMS), peer_sizes=[100, 1000],
                    peer_subscribers=[1, 4, 8],
                    topic_counts=list(peer_suite.TOPIC_COUNTS), topic_subscribers=4,
                    members=list(scale_suite.MEMBER_COUNTS),
                    feedback_receivers=list(feedback_suite.RECEIVERS),
                    region_pairs=regions_suite.PAIRS,
                    ring_subscribers=list(recovery_curves.RING_SUBSCRIBERS),
                    memory_mb=list(recovery_curves.MEMORY_LEVELS_MB))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, QUICK[name] if args.quick and name in QUICK else value)
    if args.datagram_bytes and not 1200 <= args.datagram_bytes <= 65000:
        raise SystemExit("--datagram-bytes: 1200 to 65000")
    if args.seconds <= 0 or args.warmup < 0:
        raise SystemExit("--seconds must be positive and --warmup not negative")
    if args.peers and min(args.peer_sizes, default=STAMP.size) < STAMP.size:
        raise SystemExit(f"--peer-sizes are at least {STAMP.size} bytes (latency runs stamp the "
                         "send time into each payload)")
    if args.loss is None:
        args.loss = [] if args.quick else [0.01, 0.05]
    if args.loss_pairs is None:
        args.loss_pairs = 1 if args.quick else 3
    if args.loss_seconds is None:
        args.loss_seconds = args.seconds if args.quick else 30.0
    if args.topic_pairs is None:
        args.topic_pairs = 1 if args.quick else peer_suite.TOPIC_PAIRS
    if args.ready_runs is None:
        args.ready_runs = 1 if args.quick else peer_suite.READY_RUNS
    if args.ready_within is None:
        args.ready_within = peer_suite.READY_TARGET if args.quick else peer_suite.READY_PUBLISH
    if args.loss_pairs < 1 or args.topic_pairs < 1 or args.latency_repeats < 1:
        raise SystemExit("--loss-pairs, --topic-pairs and --latency-repeats must be at least 1")
    if args.latency_messages < 1 or args.steady_runs < 0:
        raise SystemExit("--latency-messages must be positive, --steady-runs not negative")
    if args.spark_rows is None:
        args.spark_rows = 0 if args.quick else 100_000
    if args.encrypt_pairs is None:
        args.encrypt_pairs = 0 if args.quick else 3
    if args.demo_rows is None:
        args.demo_rows = 0 if args.quick else -1  # -1: every flight
    elif args.demo_rows < 0:
        raise SystemExit("--demo-rows must not be negative")
    if args.case_timeout is None:
        args.case_timeout = 150.0 + 3 * args.seconds
    return args


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Terminated(BaseException):  # like KeyboardInterrupt: no case handler may swallow it
    pass


def _on_sigterm(signum, frame):
    raise _Terminated(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # `scopecast bench -- --quick` passes the separator through
        argv = argv[1:]
    args = parse_args(argv)
    if args.hosts and not args.on_hosts:
        return hosts.run(argv, args.hosts, args.hosts_prefix)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix=f"scopecast-bench-{stamp}-"))
    in_main = threading.current_thread() is threading.main_thread()
    old_handler = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        results, wiring_info = _run_all(args, stamp, log_dir, _where(args))
    except (KeyboardInterrupt, _Terminated) as exc:
        print(f"interrupted ({exc or 'Ctrl-C'}); every case process was killed; process logs in "
              f"{log_dir}", file=sys.stderr, flush=True)
        return 130
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, old_handler)
        if log_dir.exists() and not any(log_dir.iterdir()):
            log_dir.rmdir()  # nothing ran (e.g. scopecast failed to import): no empty dir left
    failed = [c for c in results["cases"] + results["peers"].get("rows", []) if c.get("error")
              and c.get("failed", True)]
    if failed or args.keep_logs:
        results["logs"] = str(log_dir)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    results["transport"] = wiring_info
    _write(results, out, stamp)
    print()
    print(results["table_markdown"])
    print(f"results: {out / (stamp + '.json')}  plot: {out / (stamp + '.png')}")
    if failed:
        print(f"{len(failed)} case(s) failed; process logs in {log_dir}", file=sys.stderr)
    return 1 if failed else 0


def _where(args) -> tuple[Placement, str | None, dict | None]:
    """Where case processes run, the Ray address to use (None: an embedded Ray) and, on several
    hosts, their description."""
    if not args.on_hosts:
        return Placement(), None, None
    return hosts.placement(args.on_hosts)


def _run_all(args, stamp: str, log_dir: Path, where) -> tuple[dict, dict]:
    import scopecast

    placement, ray_address, on_hosts = where

    print(f"scopecast bench {stamp}: sizes {args.sizes}, subscribers {args.subscribers}, "
          f"{args.seconds:g} s per case, warm-up {args.warmup:g} s, systems {args.systems}"
          + (f", on hosts {[h['netns'] for h in on_hosts['hosts']]}" if on_hosts else ""),
          flush=True)
    busy = machine.busy_elsewhere()
    if busy["cpu_percent"] > 25.0:
        names = ", ".join(f"{b['name']} ({b['cpu_percent']:.0f}%)" for b in busy["busy_processes"])
        print(f"warning: the machine is {busy['cpu_percent']:.0f}% busy before the run ({names}); "
              "other work skews the numbers", flush=True)
    t0 = time.monotonic()
    # a state directory of the run's own: its topics and members never mix with a user's cluster
    os.environ.setdefault("SCOPECAST_HOME", tempfile.mkdtemp(prefix="scopecast-bench-"))
    cluster = scopecast.connect(ray_address, datagram_bytes=args.datagram_bytes or None,
                                **({"mac": args.mac} if args.mac else {}))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)  # ray.init installed its own; ours unwinds
    cases: list[dict] = []
    try:
        address = cluster.address
        tc = scopecast.TransportConfig()
        datagram = args.datagram_bytes or scopecast.TransportConfig(
            interface=placement.sender.interface).datagram_size()
        wiring_info = {"interface": placement.sender.interface, "ttl": tc.ttl, "loop": tc.loopback,
                       "rcvbuf": tc.rcvbuf_bytes, "sndbuf": tc.sndbuf_bytes,
                       "ray_address": address,
                       "datagram_bytes": datagram,
                       "mac": cluster.status()["manager"]["mac"]}
        quiet = machine.settle(30.0)
        print(f"cluster up at {address} ({time.monotonic() - t0:.1f} s, machine {quiet:.0f}% busy)",
              flush=True)
        octet = random.randrange(1, 255)
        plan = [(size, n, system) for size in args.sizes for n in args.subscribers
                for system in args.systems]
        for i, (size, n, system) in enumerate(plan, 1):
            case = Case(system, size, n, args.seconds, args.warmup,
                        ready_timeout=min(120.0, args.case_timeout), timeout=args.case_timeout)
            quiet = machine.settle(5.0)
            print(f"[{i}/{len(plan)}] {case.label}: running", flush=True)
            if system == "scopecast":
                topic = f"bench/{stamp}/{size}B-1to{n}"
                try:
                    cluster.create_topic(topic, policy=args.policy)
                except Exception as exc:  # the control plane is in trouble: report, go on
                    result = failed_result(case, f"create_topic({topic!r}) failed: {exc!r}")
                    cases.append(result)
                    print(f"[{i}/{len(plan)}] {case.label}: {_progress(result)}", flush=True)
                    continue
                wiring = Wiring(address=address, topic=topic, placement=placement)
            else:
                wiring = Wiring(group=f"239.255.{octet}.{i}", port=_free_udp_port(),
                                placement=placement, ttl=tc.ttl, loop=tc.loopback,
                                rcvbuf=tc.rcvbuf_bytes, sndbuf=tc.sndbuf_bytes)
            result = run_case(case, wiring, log_dir / f"{i:02d}-{system}-{size}-{n}")
            result["busy_before_percent"] = quiet
            cases.append(result)
            print(f"[{i}/{len(plan)}] {case.label}: {_progress(result)}", flush=True)
        steady = _steady(args, cluster, address, placement, stamp, log_dir)
        peers = peer_suite.run(cluster, stamp, log_dir, systems=args.peers, sizes=args.peer_sizes,
                               subscribers=args.peer_subscribers, seconds=args.seconds,
                               warmup=args.warmup, case_timeout=args.case_timeout,
                               policy=args.policy,
                               latency_shares=(0.5,) if args.quick else peer_suite.LATENCY_SHARES,
                               topic_counts=tuple(args.topic_counts),
                               topic_subscribers=args.topic_subscribers,
                               topic_pairs=args.topic_pairs,
                               ready_runs=args.ready_runs,
                               ready_within=args.ready_within) if args.peers else {}
        latency = latency_suite.run(
            cluster, stamp, log_dir,
            systems=["scopecast"] + [p for p in args.peers
                                     if p in latency_suite.SYSTEMS and p != "scopecast"],
            rates=args.latency_rates, subscribers=args.latency_subscribers,
            repeats=args.latency_repeats, messages=args.latency_messages,
            case_timeout=args.case_timeout, policy=args.policy, placement=placement) \
            if args.latency_rates and "scopecast" in args.systems else {}
        scale = scale_suite.run(cluster, stamp, log_dir, counts=args.members,
                                seconds=args.seconds, warmup=args.warmup,
                                case_timeout=args.case_timeout, policy=args.policy) \
            if args.members and "scopecast" in args.systems else []
        feedback = feedback_suite.run(cluster, args.feedback_receivers) \
            if "scopecast" in args.systems else {}
        regions = regions_suite.run(cluster, args.region_pairs) \
            if "scopecast" in args.systems else {}
        lossy = _loss_cases(args, cluster, Wiring(address=address, placement=placement), stamp,
                            log_dir)
        curves = recovery_curves.run(cluster, stamp, args.seconds, args.ring_subscribers,
                                     args.memory_mb) if lossy else {}
        pipeline = spark_pipeline.run(cluster, stamp, args.spark_rows, rounds=args.spark_rounds) \
            if args.spark_rows else {}
        without_loss = demo_naks.run(None if args.demo_rows < 0 else args.demo_rows) \
            if args.demo_rows and "scopecast" in args.systems else {}
        encrypted = encryption.run(
            cluster, address, placement, stamp, log_dir / "encryption",
            args.subscribers, args.seconds, args.warmup, args.case_timeout,
            args.policy, args.encrypt_pairs) if "scopecast" in args.systems else {}
    finally:
        cluster.shutdown()
    analysis.attach_ratios(cases)
    targets = analysis.targets(cases)
    loss_rows = analysis.loss_suite(cases, lossy)
    return {
        "timestamp": stamp,
        "config": {"sizes": args.sizes, "subscribers": args.subscribers, "seconds": args.seconds,
                   "warmup": args.warmup, "systems": args.systems, "quick": args.quick,
                   "case_timeout": args.case_timeout, "mac": args.mac, "policy": args.policy,
                   "peers": args.peers, "peer_sizes": args.peer_sizes,
                   "peer_subscribers": args.peer_subscribers,
                   "topic_counts": args.topic_counts, "topic_subscribers": args.topic_subscribers,
                   "topic_pairs": args.topic_pairs, "ready_runs": args.ready_runs,
                   "ready_within": args.ready_within,
                   "members": args.members, "feedback_receivers": args.feedback_receivers,
                   "region_pairs": args.region_pairs,
                   "loss": args.loss, "loss_pairs": args.loss_pairs,
                   "ring_subscribers": args.ring_subscribers, "memory_mb": args.memory_mb,
                   "spark_rows": args.spark_rows, "demo_rows": args.demo_rows,
                   "encrypt_pairs": args.encrypt_pairs,
                   "hosts": args.hosts,
                   "datagram_bytes": args.datagram_bytes},
        "definitions": {
            "delivered_rate": "messages returned by receive_batch() (payload len() taken) per "
                              "second inside each subscriber's window: from its first delivery "
                              "`warmup` s after its first message to its last delivery",
            "min_rate": "minimum over subscribers; mean_rate: mean over subscribers",
            "cpu_us_per_msg": "user+system CPU of the publisher (over the union of the windows) "
                              "and of every subscriber (over its own window) / messages delivered "
                              "in the windows, summed over subscribers; Ray's processes excluded "
                              "(see background_cpu)",
            "lost": "published - delivered, per subscriber, whole stream",
            "ratio": "scopecast min_rate / baseline min_rate, same size and subscriber count",
        },
        "machine": {**machine.describe(), "before_run": busy},
        "hosts": on_hosts,
        "cases": cases,
        "targets": targets,
        "loss_suite": loss_rows,
        "loss_cases": lossy,
        "recovery_curves": curves,
        "spark_pipeline": pipeline,
        "demo_naks": without_loss,
        "encryption": encrypted,
        "peers": peers,
        "latency": latency,
        "steady": steady,
        "scale_members": scale,
        "caching_target": scale_suite.caching_target(scale),
        "feedback": feedback,
        "regions": regions,
        "table_markdown": _hosts_line(on_hosts, wiring_info["datagram_bytes"])
        + report.markdown_table(cases, targets) + steady_table(steady)
        + peer_suite.table(peers) + latency_suite.table(latency)
        + scale_suite.table(scale, peers.get("topic_rows", []) if peers else [])
        + feedback_suite.table(feedback) + regions_suite.table(regions)
        + report.loss_table(loss_rows, bool(on_hosts))
        + report.curves_table(curves) + spark_pipeline.table(pipeline)
        + demo_naks.table(without_loss) + encryption.table(encrypted),
        "wall_seconds": round(time.monotonic() - t0, 1),
    }, wiring_info


def _hosts_line(on_hosts: dict | None, datagram: int) -> str:
    if not on_hosts:
        return ""
    return (f"On {len(on_hosts['hosts'])} hosts ({on_hosts['network']}): the sender on "
            f"{on_hosts['sender']}, receivers round-robin on {', '.join(on_hosts['receivers'])}; "
            f"scopecast datagrams of up to {datagram:,} bytes.\n\n")


def _steady(args, cluster, address: str, placement: Placement, stamp: str,
            log_dir: Path) -> dict:
    """Steady throughput: scopecast's 1 KB case with the most subscribers `--steady-runs` times
    back to back, then the baseline's: each one's slowest run over its fastest (target for
    scopecast at least STEADY_MIN)."""
    if not args.steady_runs or "scopecast" not in args.systems:
        return {}
    n = max(args.subscribers)
    out: dict = {"subscribers": n, "size": 1000, "runs": args.steady_runs, "target": STEADY_MIN}
    for system in [s for s in SYSTEMS if s in args.systems]:
        rates = []
        for i in range(args.steady_runs):
            case = Case(system, 1000, n, args.seconds, args.warmup,
                        ready_timeout=min(120.0, args.case_timeout), timeout=args.case_timeout)
            if system == "scopecast":
                topic = f"bench/{stamp}/steady-{i}"
                cluster.create_topic(topic, policy=args.policy)
                wiring = Wiring(address=address, topic=topic, placement=placement)
            else:
                wiring = Wiring(group=f"239.255.254.{1 + i}", port=_free_udp_port(),
                                placement=placement)
            machine.settle(5.0)
            result = run_case(case, wiring, log_dir / f"steady-{system}-{i}")
            print(f"[steady {i + 1}/{args.steady_runs}] {case.label}: {_progress(result)}",
                  flush=True)
            rates.append(None if result.get("error") else result["min_rate"])
        kept = [r for r in rates if r]
        out[system] = {"rates": rates, "spread": min(kept) / max(kept) if kept else None}
    ours = out.get("scopecast", {}).get("spread")
    out["status"] = "not run" if ours is None or None in out["scopecast"]["rates"] else \
        "met" if ours >= STEADY_MIN else "missed"
    return out


def steady_table(steady: dict) -> str:
    if not steady:
        return ""
    lines = []
    for system in SYSTEMS:
        got = steady.get(system)
        if got:
            rates = ", ".join("failed" if r is None else f"{r:,.0f}" for r in got["rates"])
            spread = "-" if got["spread"] is None else f"{got['spread']:.2f}"
            lines.append(f"| {system} | {rates} | {spread} |")
    return (f"\nSteady throughput: {steady['size']} B, 1 -> {steady['subscribers']}, "
            f"{steady['runs']} runs back to back, msgs/s per subscriber (slowest): the slowest "
            f"run over the fastest (target for scopecast at least {steady['target']:g}: "
            f"{steady['status']}):\n\n| system | runs | slowest / fastest |\n|---|---|---:|\n"
            + "\n".join(lines) + "\n")


def _loss_cases(args, cluster, wiring: Wiring, stamp: str, log_dir: Path) -> list[dict]:
    """The loss suite's cases: scopecast, 1 KB (or the first size), the most subscribers; each
    lossy case right after a lossless one of its own (its `reference`), `--loss-pairs` times per
    loss level. A shared machine's speed drifts over a run: the lossless case of the throughput
    suite, minutes earlier, is a poorer yardstick than one taken a moment before."""
    if not args.loss or "scopecast" not in args.systems:
        return []
    if not loss.available():
        print("loss suite skipped: it needs root and iptables", flush=True)
        return []
    size = 1000 if 1000 in args.sizes else args.sizes[0]
    n = max(args.subscribers)
    case = Case("scopecast", size, n, args.seconds, args.warmup,
                ready_timeout=min(120.0, args.case_timeout), timeout=args.case_timeout)
    namespaces = wiring.placement.namespaces
    out = []
    for p in args.loss:
        for pair in range(args.loss_pairs):
            runs = {}
            for level in (0.0, p):
                label = f"[loss {level:.0%}, pair {pair + 1}/{args.loss_pairs}] {case.label}"
                topic = f"bench/{stamp}/{size}B-1to{n}-loss{p:g}-{pair}-{level:g}"
                cluster.create_topic(topic, policy=args.policy)
                machine.settle(5.0)
                print(f"{label}: running", flush=True)
                with loss.udp_loss(level, namespaces) if level else contextlib.nullcontext():
                    runs[level] = run_case(case, dataclasses.replace(wiring, topic=topic),
                                           log_dir / f"loss-{p:g}-{pair}-{level:g}-{size}-{n}")
                    if level:
                        runs[level]["dropped"] = loss.dropped(namespaces)
                print(f"{label}: {_progress(runs[level])}", flush=True)
            result, reference = runs[p], runs[0.0]
            result.update(loss=p, pair=pair, reference={
                k: reference.get(k) for k in ("min_rate", "mean_rate", "lost_total",
                                              "cpu_us_per_msg", "error")})
            out.append(result)
        if args.loss_rate:
            out.append(_paced_loss_case(args, cluster, wiring, case, p, stamp, log_dir))
    return out


def _paced_loss_case(args, cluster, wiring: Wiring, case: Case, p: float, stamp: str,
                     log_dir: Path) -> dict:
    """Loss level `p` with the publisher paced at --loss-rate: repair times where the processes
    are not queued for a CPU (at saturation on a small machine every subscriber waits for one
    about half the time, and a repair takes three scheduling hops)."""
    paced = dataclasses.replace(case, rate=args.loss_rate, latency=True,
                                seconds=args.loss_seconds)
    label = f"[loss {p:.0%}, paced] {paced.label}"
    topic = f"bench/{stamp}/{case.size}B-1to{case.subscribers}-loss{p:g}-paced"
    cluster.create_topic(topic, policy=args.policy)
    machine.settle(5.0)
    print(f"{label}: running", flush=True)
    namespaces = wiring.placement.namespaces
    with loss.udp_loss(p, namespaces):
        result = run_case(paced, dataclasses.replace(wiring, topic=topic),
                          log_dir / f"loss-{p:g}-paced-{case.size}-{case.subscribers}")
        result["dropped"] = loss.dropped(namespaces)
    print(f"{label}: {_progress(result)}", flush=True)
    result.update(loss=p, paced=args.loss_rate)
    return result


def _progress(c: dict) -> str:
    if c.get("error"):
        return f"FAILED after {c['case_seconds']} s: {c['error'].strip().splitlines()[0][:200]}"
    cpu = c["cpu_us_per_msg"]
    return (f"{c['min_rate']:,.0f} msgs/s min/sub ({c['min_mb_s']:.1f} MB/s), published "
            f"{c['published']:,}, lost {c['lost']}, "
            f"{'-' if cpu is None else f'{cpu:.2f}'} µs CPU/msg ({c['case_seconds']} s)")


def _write(results: dict, out: Path, stamp: str) -> None:
    png = out / f"{stamp}.png"
    m = results["machine"]
    title = (f"scopecast bench {stamp}\n{m['cpu_model']}, {m['cores_logical']} cores, "
             f"Python {m['python']}, Ray {m['ray']}")
    plots = [("plot", png, lambda: report.plot(results["cases"], png, title))]
    if results["peers"].get("rows"):
        peers_png = out / f"{stamp}-peers.png"
        plots.append(("peers_plot", peers_png,
                      lambda: peer_suite.plot(results["peers"], peers_png, title)))
    if results["latency"].get("rows"):
        latency_png = out / f"{stamp}-latency.png"
        plots.append(("latency_plot", latency_png,
                      lambda: latency_suite.plot(results["latency"], latency_png, title)))
    for key, path, draw in plots:
        try:
            draw()
            results[key] = path.name
        except Exception as exc:  # a plotting problem must not lose the measurements
            results[key] = None
            results[f"{key}_error"] = repr(exc)
            print(f"{key} failed: {exc!r}", file=sys.stderr)
    data = json.dumps(results, indent=2, default=str)
    path = out / f"{stamp}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(data)
    os.replace(tmp, path)
    name = "latest-hosts" if results["hosts"] else "latest"  # a run on one host stays latest.*
    latest = out / f"{name}.json"
    tmp = latest.with_suffix(".json.tmp")
    tmp.write_text(data)
    os.replace(tmp, latest)
    if results["plot"]:
        shutil.copyfile(png, out / f"{name}.png")
    if results.get("peers_plot"):
        shutil.copyfile(out / results["peers_plot"], out / "latest-peers.png")
    if results.get("latency_plot"):
        shutil.copyfile(out / results["latency_plot"], out / f"{name}-latency.png")


if __name__ == "__main__":
    sys.exit(main())
