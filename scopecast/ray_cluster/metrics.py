"""scopecast's counters as Ray metrics (`ray.util.metrics`), for Prometheus and Grafana.

The data path counts in plain integers on its I/O thread and makes no Ray call. Once a second a
thread of each member process copies what changed to Ray's metrics (exported by each node's
metrics agent; Ray's Prometheus service-discovery file lists the agents): the counters' increments
since the last copy, the backlog as a gauge, and the repair times and delivery latencies
measured since then into histograms. Tags are bounded: the member's scope path, a drop's reason
(a fixed set in the code), a NAK's or repair's kind, and for published messages TOP_TOPICS
topics of the process, the busiest when tags were free (the rest as "_other"). Ray prefixes every
name with `ray_` (and counters with `_total` in Prometheus). `SCOPECAST_METRICS=0` turns the
copying off in a process.
`docs/operations.md` lists the series; `docs/grafana-scopecast.json` is a dashboard over them.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

PERIOD = 1.0               # seconds between copies
TOP_TOPICS = 20            # published messages tagged with these many topics, per process
OTHER = "_other"
REPAIR_BOUNDS_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
LATENCY_BOUNDS_MS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
LATENCY_SAMPLES = 256      # delivery latencies observed a period, at most (an even sample)

# counter name -> (description, tag keys, (stat, tag values) pairs it sums)
COUNTERS = {
    "scopecast_messages_delivered": ("messages handed to subscribers", ("scope",),
                                     [("delivered", {})]),
    "scopecast_naks": ("NAKs a member sent: in summaries to its agents, straight to senders, "
                       "and again to senders", ("scope", "kind"),
                       [("naks_reported", {"kind": "to_agent"}),
                        ("naks_sent", {"kind": "to_sender"}),
                        ("nak_retries", {"kind": "retry"})]),
    "scopecast_repairs": ("repair datagrams a member sent (as sender or cache) and received",
                          ("scope", "kind"),
                          [("repairs_sent", {"kind": "sent"}),
                           ("repair_datagrams_in", {"kind": "received"})]),
    "scopecast_window_stalls": ("times publish() waited for the window of unstable bytes",
                                ("scope",), [("window_full_waits", {})]),
}


def start(sources) -> MetricsExporter | None:
    """A running exporter over `sources`; None where SCOPECAST_METRICS=0 or Ray's metrics cannot
    be made here (a member works the same without)."""
    if os.environ.get("SCOPECAST_METRICS", "1").strip().lower() in ("0", "false", "no"):
        return None
    try:
        return MetricsExporter(sources)
    except Exception as exc:
        log.warning("scopecast metrics are off in this process: %s", exc)
        return None


class MetricsExporter:
    """Copies one process's member counters to Ray metrics every PERIOD seconds. `sources()`
    gives the process's members now: (scope path, runtime, [publishers, closed ones included
    until the process forgets them: their last messages count too])."""

    def __init__(self, sources) -> None:
        from ray.util.metrics import Counter, Gauge, Histogram

        self._sources = sources
        self._counters = {name: Counter(name, description=desc, tag_keys=tags)
                          for name, (desc, tags, _stats) in COUNTERS.items()}
        self._published = Counter("scopecast_messages_published",
                                  description="messages published, by topic (the busiest "
                                              f"{TOP_TOPICS} of a process; the rest as {OTHER})",
                                  tag_keys=("scope", "topic"))
        self._dropped = Counter("scopecast_messages_dropped",
                                description="datagrams and messages a member dropped, by reason",
                                tag_keys=("scope", "reason"))
        self._lag = Gauge("scopecast_lag_bytes", description="bytes delivered to a member's "
                          "subscribers and not yet taken by them (the largest)",
                          tag_keys=("scope",))
        self._repair = Histogram("scopecast_repair_time_ms", description="gap seen to gap "
                                 "filled, per repaired hole", boundaries=REPAIR_BOUNDS_MS,
                                 tag_keys=("scope",))
        self._latency = Histogram("scopecast_delivery_latency_ms", description="a data "
                                  "datagram's stamp at its publisher to its messages' delivery to "
                                  "the member's subscribers, timed once a receive call (at most "
                                  f"{LATENCY_SAMPLES} a second of them observed)",
                                  boundaries=LATENCY_BOUNDS_MS, tag_keys=("scope",))
        self._seen: dict[tuple, int] = {}    # (scope, counter) -> value last copied
        self._tagged: set[str] = set()       # the topics published messages are tagged with
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scopecast-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD):
            try:
                self.copy()
            except Exception:  # metrics never take a member down
                log.debug("copying metrics failed", exc_info=True)

    def _delta(self, key: tuple, value: int) -> int:
        last = self._seen.get(key, 0)
        self._seen[key] = value
        return value - last if value >= last else value  # (a new member: counts from 0)

    def copy(self) -> None:
        """Copy what changed since the last call (the exporter thread calls it every PERIOD)."""
        published: dict[tuple[str, str], int] = {}
        sources = self._sources()
        for scope, runtime, pubs in sources:
            snap, repairs, latencies = runtime.call_wait(lambda rt=runtime: (
                rt.snapshot(), (list(rt.recovery.repair_ms), rt.stats["repairs_timed"]),
                (list(rt.receiver.latency_ms), rt.stats["latency_timed"])))
            stats, tags = snap["stats"], {"scope": scope}
            for name, (_desc, _keys, parts) in COUNTERS.items():
                for stat, extra in parts:
                    if (d := self._delta((scope, stat), stats.get(stat, 0))) > 0:
                        self._counters[name].inc(d, {**tags, **extra})
            for reason, n in snap["drops"].items():
                if (d := self._delta((scope, "drop", reason), n)) > 0:
                    self._dropped.inc(d, {**tags, "reason": str(reason)})
            self._lag.set(snap.get("backlog_bytes", 0), tags)
            for histogram, stat, (times, timed), most in (
                    (self._repair, "repairs_timed", repairs, None),
                    (self._latency, "latency_timed", latencies, LATENCY_SAMPLES)):
                new = min(self._delta((scope, stat), timed), len(times))
                # (an observation costs several us in Ray's API: latency, timed at every receive
                # call, goes as an even sample of at most `most` a period)
                stride = 1 if most is None else max(1, -(-new // most))
                for ms in times[len(times) - new::stride]:
                    histogram.observe(ms, tags)
            for pub in pubs:
                count = pub.published
                d, pub.exported = count - pub.exported, count
                if d > 0:
                    published[(scope, pub.topic)] = published.get((scope, pub.topic), 0) + d
        for (scope, topic), n in by_tag(published, self._tagged).items():
            self._published.inc(n, {"scope": scope, "topic": topic})


def by_tag(published: dict[tuple[str, str], int], tagged: set[str]) -> dict[tuple[str, str], int]:
    """Messages published by (scope, topic tag): a topic keeps the tag it got, and the busiest
    first get the TOP_TOPICS tags (added to `tagged`), for good; the rest are OTHER. One call
    into Ray's metrics a tag, not a topic: a process publishing to 100,000 topics spent 8% of its
    CPU in them."""
    if len(tagged) < TOP_TOPICS:
        for (_scope, topic), _n in sorted(published.items(), key=lambda kv: -kv[1]):
            if len(tagged) == TOP_TOPICS:
                break
            tagged.add(topic)
    out: dict[tuple[str, str], int] = {}
    for (scope, topic), n in published.items():
        tag = (scope, topic if topic in tagged else OTHER)
        out[tag] = out.get(tag, 0) + n
    return out
