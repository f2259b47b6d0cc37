"""Feedback a publisher handles as its receivers grow (issue 44 item 7).

Control datagrams (acknowledgements, NAKs, join asks, its recovery agent's instructions) received
per second by one publisher of 1 KB messages offered at RATE msgs/s on a `lan_multicast` topic,
at 4, 8, 16 and 32 receivers: with its multicast channel's acknowledgements gathered up a tree of
the receivers (`netio.ack_gathering`, the default) and, beside it in the same run, sent to it by
every receiver (`RuntimeConfig(gather_acks=False)`). Two publishers in the driver, one each way,
each on a topic of its own that every receiver takes, publish in turn, REPEATS times interleaved;
a row gives the median. Receivers are members of their own, PER_PROCESS to a Ray worker process
(one `connect(name=...)` each: each its own socket, I/O thread and place in the trees), so that
2 cores hold 32 of them. Target: at 32 receivers, gathered, at most TARGET x the rate at 4.

    .venv/bin/python -m benchmarks.feedback_suite [--receivers 4,8,16,32]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import ray

from benchmarks.report import standalone

RATE = 1000
SIZE = 1000
SECONDS = 4.0
REPEATS = 3
PER_PROCESS = 4
RECEIVERS = (4, 8, 16, 32)
TARGET = 1.2
TOPICS = {"gathered": "bench/feedback/gathered", "direct": "bench/feedback/direct"}
RESULT = Path(__file__).resolve().parent / "results" / "latest-feedback.json"


@ray.remote(num_cpus=0)
class ReceiverPack:
    """PER_PROCESS receiving members in one worker process, each counting what it takes."""

    def __init__(self, names: list[str], topics: list[str]) -> None:
        import scopecast
        self._clusters = [scopecast.connect(name=n) for n in names]
        self._subs = [c.subscriber(topics) for c in self._clusters]
        self._counts = [0] * len(names)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._take, args=(i,), daemon=True)
                         for i in range(len(names))]
        for t in self._threads:
            t.start()

    def _take(self, i: int) -> None:
        sub = self._subs[i]
        while not self._stop.is_set():
            self._counts[i] += len(sub.receive_batch(timeout=0.2))

    def counts(self) -> list[int]:
        return list(self._counts)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5.0)
        for c in self._clusters:
            c.shutdown()


def _control_in(cluster) -> int:
    return sum(s["stats"].get("control_in", 0) for s in cluster.counters().values())


def _waited_for(cluster, name: str) -> set[int]:
    """The members the publisher `name`'s view says its channels wait for."""
    from scopecast.scopes.status import members
    for m in members(cluster.status(topics=False)):
        if m.get("name") == name:
            return {i for ids in m.get("receivers", {}).values() for i in ids}
    return set()


def _offer(pub, seconds: float, rate: int) -> int:
    """Publish `rate` msgs/s for `seconds`, in 1 ms steps; how many."""
    payload = b"x" * SIZE
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate) + 1
        while sent < due:
            pub.publish(payload)
            sent += 1
        time.sleep(0.001)
    return sent


def run(cluster, receivers: list[int], seconds: float = SECONDS, repeats: int = REPEATS,
        rate: int = RATE, progress=print) -> dict:
    """The suite on `cluster` (a driver's); {} without receiver counts."""
    if not receivers:
        return {}
    import scopecast
    from scopecast.netio.runtime import RuntimeConfig
    for topic in TOPICS.values():  # (idempotent: there from an earlier run is as good)
        cluster.create_topic(topic, policy="lan_multicast")
    names = {"gathered": "feedback-gathered", "direct": "feedback-direct"}
    publishers = {"gathered": scopecast.connect(name=names["gathered"]),
                  "direct": scopecast.connect(name=names["direct"],
                                              config=RuntimeConfig(gather_acks=False))}
    pubs = {way: c.publisher(TOPICS[way]) for way, c in publishers.items()}
    packs: list = []
    rows = []
    try:
        for n in sorted(receivers):
            while len(packs) * PER_PROCESS < n:
                k = len(packs)
                packs.append(ReceiverPack.remote(
                    [f"feedback-r{k * PER_PROCESS + i}" for i in range(PER_PROCESS)],
                    list(TOPICS.values())))
            ray.get([p.counts.remote() for p in packs], timeout=300)
            deadline = time.monotonic() + 120
            while True:  # both publishers' views list every receiver
                for pub in pubs.values():
                    _offer(pub, 0.2, rate)
                if all(len(_waited_for(c, names[w])) >= len(packs) * PER_PROCESS
                       for w, c in publishers.items()):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the publishers' views never listed {n} receivers")
            for pub in pubs.values():
                _offer(pub, 1.0, rate)  # warm-up
                pub.flush(timeout=60)
            got = {way: [] for way in pubs}
            before = sum(sum(c) for c in ray.get([p.counts.remote() for p in packs]))
            offered = 0
            for _ in range(repeats):
                for way, pub in pubs.items():
                    start = _control_in(publishers[way])
                    t0 = time.monotonic()
                    offered += _offer(pub, seconds, rate)
                    got[way].append((_control_in(publishers[way]) - start)
                                    / (time.monotonic() - t0))
                    pub.flush(timeout=60)
            counts = ray.get([p.counts.remote() for p in packs])
            total = len(packs) * PER_PROCESS
            delivered = (sum(sum(c) for c in counts) - before) / (offered * total)
            row = {"receivers": total, "rate": rate, "seconds": seconds,
                   "gathered_per_s": [round(v, 1) for v in got["gathered"]],
                   "direct_per_s": [round(v, 1) for v in got["direct"]],
                   "gathered": round(statistics.median(got["gathered"]), 1),
                   "direct": round(statistics.median(got["direct"]), 1),
                   "delivered_share": round(delivered, 4)}
            rows.append(row)
            progress(f"feedback: {total} receivers: {row['gathered']:.0f}/s gathered, "
                     f"{row['direct']:.0f}/s direct (delivered {delivered:.2%})")
    finally:
        for pub in pubs.values():
            pub.close()
        ray.get([p.close.remote() for p in packs], timeout=120)
        for p in packs:
            ray.kill(p)
        for c in publishers.values():
            c.shutdown()
    low, high = rows[0], rows[-1]
    ratio = high["gathered"] / low["gathered"] if low["gathered"] else None
    return {"rows": rows, "target": TARGET, "per_process": PER_PROCESS,
            "ratio": None if ratio is None else round(ratio, 2),
            "from": low["receivers"], "to": high["receivers"],
            "met": ratio is not None and ratio <= TARGET}


def table(result: dict) -> str:
    if not result:
        return ""
    lines = ["\n### Feedback at the publisher\n",
             f"Control datagrams a publisher receives per second, {result['rows'][0]['rate']:,} "
             f"msgs/s of 1 KB on a `lan_multicast` topic, receivers {result['per_process']} to a "
             "process; median of the repetitions.\n",
             "| receivers | gathered (/s) | direct (/s) | gathered / direct | delivered |",
             "|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        share = r["gathered"] / r["direct"] if r["direct"] else float("nan")
        lines.append(f"| {r['receivers']} | {r['gathered']:,.0f} | {r['direct']:,.0f} | "
                     f"{share:.2f} | {r['delivered_share']:.2%} |")
    verdict = "met" if result["met"] else "**missed**"
    lines.append(f"\nTarget: gathered at {result['to']} receivers at most {result['target']}x the "
                 f"rate at {result['from']}: {result['ratio']}x, {verdict}.\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import _int_list
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--receivers", type=_int_list, default=list(RECEIVERS), metavar="N,N,...")
    p.add_argument("--seconds", type=float, default=SECONDS)
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument("--rate", type=int, default=RATE)
    args = p.parse_args(argv)
    return standalone(lambda c: run(c, args.receivers, args.seconds, args.repeats, args.rate), table, RESULT)


if __name__ == "__main__":
    raise SystemExit(main())
