"""QSM regions (issue 44 item 3): 100 `lan_multicast` topics in one scope, two disjoint halves of
subscribers, one publisher flat out round-robin over all 100 topics, 1 KB messages.

- **both**: two subscribers on each half (a scope of its own per pair of cases): what each
  subscriber's socket received of topics it does not take (`not_taken` over what it took; one
  group per region: 0; one group for the scope: half), and the throughput to each half, msgs/s
  of its own topics at its slowest subscriber;
- **alone**: the same publisher and topics in a scope holding only one half's subscribers.

Target: each half's throughput in *both* at least TARGET x its throughput *alone*, median of
PAIRS pairs run back to back. Every subscriber is a process of its own (a Ray actor, one member).

    .venv/bin/python -m benchmarks.regions_suite [--pairs 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

import ray

from benchmarks.report import standalone

HALF = 50
SIZE = 1000
SECONDS = 4.0
PAIRS = 3
TARGET = 0.9
FOREIGN_MOST = 0.05  # of a subscriber's datagrams, from topics it does not take
RESULT = Path(__file__).resolve().parent / "results" / "latest-regions.json"


@ray.remote(num_cpus=0)
class HalfReceiver:
    """One member subscribed to one half's topics, counting what it takes."""

    def __init__(self, topics: list[str], scope: str, name: str) -> None:
        import scopecast
        self._cluster = scopecast.connect(name=name)
        self._sub = self._cluster.subscriber(topics, scope=scope)
        self._count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._take, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        while not self._stop.is_set():
            self._count += len(self._sub.receive_batch(timeout=0.2))

    def count(self) -> int:
        return self._count

    def not_taken(self) -> int:
        (counters,) = self._cluster.counters().values()
        return counters["stats"].get("not_taken", 0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._cluster.shutdown()


def _names(prefix: str) -> dict[str, list[str]]:
    return {h: [f"{prefix}/{h}{i}" for i in range(HALF)] for h in "ab"}


def _case(cluster, scope: str, halves: dict[str, list[str]], takers: str, seconds: float,
          progress) -> dict:
    """Subscribers of the halves in `takers` (two each) in `scope`, the publisher flat out over
    every topic for `seconds`: per half the msgs/s of its slowest subscriber, and each
    subscriber's share of messages of topics it does not take."""
    names = halves["a"] + halves["b"]
    receivers = {f"{scope}-{h}{k}": (h, HalfReceiver.remote(halves[h], scope, f"{h}{k}"))
                 for h in takers for k in (1, 2)}
    pubs = cluster.publishers(names, scope=scope)
    payload = b"x" * SIZE
    try:
        ray.get([r.count.remote() for _h, r in receivers.values()], timeout=300)
        deadline = time.monotonic() + 120
        while True:  # every subscriber takes its half (a round of every topic reaches it)
            before = ray.get([r.count.remote() for _h, r in receivers.values()])
            for p in pubs:
                p.publish(payload)
            for p in pubs:
                p.flush(timeout=60)
            after = ray.get([r.count.remote() for _h, r in receivers.values()])
            if all(b - a >= HALF for a, b in zip(before, after, strict=True)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{scope}: a subscriber never took its half")
        start = ray.get([r.count.remote() for _h, r in receivers.values()])
        foreign0 = ray.get([r.not_taken.remote() for _h, r in receivers.values()])
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for p in pubs:
                p.publish(payload)
        elapsed = time.monotonic() - t0
        for p in pubs:
            p.flush(timeout=120)
        end = ray.get([r.count.remote() for _h, r in receivers.values()])
        foreign = ray.get([r.not_taken.remote() for _h, r in receivers.values()])
    finally:
        for p in pubs:
            p.close()
        ray.get([r.close.remote() for _h, r in receivers.values()], timeout=120)
        for _h, r in receivers.values():
            ray.kill(r)
    rates: dict[str, list[float]] = {}
    shares = {}
    for (name, (h, _r)), s, e, f0, f1 in zip(receivers.items(), start, end, foreign0, foreign,
                                              strict=True):
        rates.setdefault(h, []).append((e - s) / elapsed)
        shares[name] = round((f1 - f0) / max(1, (f1 - f0) + (e - s)), 4)
    row = {"scope": scope, "halves": takers, "msgs_per_s": {h: round(min(v)) for h, v in
                                                            rates.items()},
           "foreign_share": shares}
    progress(f"regions: {scope}: " + ", ".join(f"half {h} {v:,.0f} msgs/s"
                                                for h, v in row["msgs_per_s"].items())
             + f"; most foreign share {max(shares.values()):.2%}")
    return row


def run(cluster, pairs: int = PAIRS, seconds: float = SECONDS, progress=print) -> dict:
    """The suite on `cluster` (a driver's); {} for 0 pairs."""
    if pairs <= 0:
        return {}
    rows = []
    for k in range(pairs):
        for takers in ("ab", "a", "b"):
            scope = f"bench-regions-{takers}-{k}"
            halves = _names(scope)
            cluster.create_topics(halves["a"] + halves["b"], policy="lan_multicast")
            rows.append(_case(cluster, scope, halves, takers, seconds, progress))
    both = [r for r in rows if r["halves"] == "ab"]
    ratios = {h: statistics.median(
        b["msgs_per_s"][h] / a["msgs_per_s"][h]
        for b, a in zip(both, [r for r in rows if r["halves"] == h], strict=True))
        for h in "ab"}
    foreign = max(s for r in both for s in r["foreign_share"].values())
    return {"rows": rows, "ratios": {h: round(v, 2) for h, v in ratios.items()},
            "foreign_most": foreign, "target": TARGET, "foreign_target": FOREIGN_MOST,
            "met": all(v >= TARGET for v in ratios.values()) and foreign <= FOREIGN_MOST}


def table(result: dict) -> str:
    if not result:
        return ""
    lines = ["\n### Regions: two halves of subscribers in one LAN\n",
             f"{2 * HALF} `lan_multicast` topics, 1 KB messages, the publisher flat out "
             "round-robin over all of them; msgs/s of each half's own topics at its slowest "
             "subscriber, with both halves in the LAN and with one half alone; foreign: the "
             "largest share of a subscriber's messages from topics it does not take.\n",
             "| pair | both: half a / half b msgs/s | a alone | b alone | both / alone (a, b) "
             "| foreign |", "|---:|---:|---:|---:|---:|---:|"]
    rows = result["rows"]
    for k in range(0, len(rows), 3):
        both, a, b = rows[k:k + 3]
        ra = both["msgs_per_s"]["a"] / a["msgs_per_s"]["a"]
        rb = both["msgs_per_s"]["b"] / b["msgs_per_s"]["b"]
        lines.append(f"| {k // 3 + 1} | {both['msgs_per_s']['a']:,} / "
                     f"{both['msgs_per_s']['b']:,} | {a['msgs_per_s']['a']:,} | "
                     f"{b['msgs_per_s']['b']:,} | {ra:.2f}, {rb:.2f} | "
                     f"{max(both['foreign_share'].values()):.2%} |")
    verdict = "met" if result["met"] else "**missed**"
    lines.append(f"\nTarget: both / alone >= {result['target']} for each half (median: "
                 f"{result['ratios']['a']}, {result['ratios']['b']}) and foreign <= "
                 f"{result['foreign_target']:.0%} ({result['foreign_most']:.2%}): {verdict}.\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=PAIRS)
    p.add_argument("--seconds", type=float, default=SECONDS)
    args = p.parse_args(argv)
    return standalone(lambda c: run(c, args.pairs, args.seconds), table, RESULT)


if __name__ == "__main__":
    raise SystemExit(main())
