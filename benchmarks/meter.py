"""The measured window and the CPU bookkeeping every measuring process shares.

A receiver's window opens at the first delivery `warmup` seconds after its first message (the
messages counted so far, that delivery included, are the warm-up "K") and closes at its last
delivery. Times are `time.monotonic()` (CLOCK_MONOTONIC, comparable across processes of one
machine); CPU is `getrusage(RUSAGE_SELF)`: user and system seconds of every thread of the process.

A sender cannot know the receivers' windows, so it samples (time, CPU) as it goes; the harness
interpolates its CPU over the union of the receivers' windows (`cpu_between`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import struct
import time

monotonic = time.monotonic
STAMP = struct.Struct("<d")


def rss() -> int:
    """This process's resident memory now, in bytes (Linux; 0 elsewhere), after a garbage
    collection and giving freed heap back to the system (`malloc_trim`): what the process holds,
    not what its busiest moment left in the allocator."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def runqueue_wait() -> float | None:
    """Seconds this process's threads spent ready to run but waiting for a CPU, so far (Linux
    schedstat; None elsewhere): delivery delays that no code of the process causes."""
    try:
        total = 0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        return total / 1e9
    except (OSError, IndexError, ValueError):
        return None


def cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


class DeliveryMeter:
    """Counts deliveries (per batch) and remembers where the measured window starts and ends."""

    __slots__ = ("warmup", "count", "bytes", "first_t", "first", "open_at", "k", "k_t", "k_cpu",
                 "k_bytes", "last_t")

    def __init__(self, warmup: float) -> None:
        self.warmup = warmup
        self.count = 0
        self.bytes = 0
        self.first_t: float | None = None
        self.first = (0, 0, (0.0, 0.0))  # (count, bytes, CPU) after the first delivery
        self.open_at = 0.0
        self.k: int | None = None
        self.k_t = 0.0
        self.k_cpu = (0.0, 0.0)
        self.k_bytes = 0
        self.last_t = 0.0

    def add(self, n: int, nbytes: int, now: float) -> None:
        """`n` messages of `nbytes` payload bytes were handed to the application at `now`."""
        self.count += n
        self.bytes += nbytes
        self.last_t = now
        if self.k is None:
            if self.first_t is None:
                self.first_t = now
                self.first = (self.count, self.bytes, cpu())
                self.open_at = now + self.warmup
            elif now >= self.open_at:
                self.k = self.count
                self.k_t = now
                self.k_bytes = self.bytes
                self.k_cpu = cpu()

    def summary(self, end_cpu: tuple[float, float]) -> dict:
        """Counts, window and CPU; `end_cpu` is `cpu()` taken when the last delivery was consumed.
        If the stream ended before the warm-up did, the window starts at the first delivery
        instead (and `warmup_done` says so)."""
        if self.k is None:
            k, k_bytes, k_cpu = self.first
            k_t, warm = self.first_t or 0.0, False
        else:
            k, k_t, k_bytes, k_cpu, warm = self.k, self.k_t, self.k_bytes, self.k_cpu, True
        return {
            "delivered": self.count, "bytes": self.bytes, "first_t": self.first_t,
            "warmup_done": warm, "k": k, "window_start": k_t, "window_end": self.last_t,
            "window_msgs": self.count - k, "window_bytes": self.bytes - k_bytes,
            "window_cpu_s": (end_cpu[0] - k_cpu[0]) + (end_cpu[1] - k_cpu[1]),
            "window_user_s": end_cpu[0] - k_cpu[0], "window_sys_s": end_cpu[1] - k_cpu[1],
            "rss_bytes": rss(),
            "runqueue_wait_s": runqueue_wait(),
        }


class CpuSampler:
    """(time, user CPU, system CPU, count) samples of a sending process, at most one per `period`
    seconds."""

    __slots__ = ("period", "samples", "_next")

    def __init__(self, period: float = 0.02) -> None:
        self.period = period
        self.samples: list[tuple[float, float, float, int]] = []
        self._next = 0.0

    def sample(self, count: int, now: float | None = None, force: bool = False) -> None:
        now = monotonic() if now is None else now
        if force or now >= self._next:
            user, system = cpu()
            self.samples.append((now, user, system, count))
            self._next = now + self.period


def cpu_between(samples: list, start: float, end: float) -> tuple[float, float]:
    """(user, system) CPU seconds a sampled process used between `start` and `end` (linear between
    samples, clamped to the sampled span)."""
    if not samples or end <= start:
        return 0.0, 0.0
    return (_at(samples, end, 1) - _at(samples, start, 1),
            _at(samples, end, 2) - _at(samples, start, 2))


def _at(samples: list, t: float, col: int) -> float:
    if t <= samples[0][0]:
        return samples[0][col]
    if t >= samples[-1][0]:
        return samples[-1][col]
    lo, hi = 0, len(samples) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    t0, c0 = samples[lo][0], samples[lo][col]
    t1, c1 = samples[hi][0], samples[hi][col]
    return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)


class LatencyLog:
    """Send-to-delivery times of stamped messages (the first 8 bytes of a payload: the sender's
    `monotonic()` as a double) delivered inside the measured window."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: list[float] = []

    def add(self, payloads, now: float) -> None:
        unpack, out = STAMP.unpack_from, self.samples.append
        for p in payloads:
            out(now - unpack(p)[0])

    def summary(self) -> dict:
        """p50 / p99 / p99.9 in milliseconds (None without samples) and the CDF at every
        percentile (`cdf_ms[i]`: the i-th percentile)."""
        xs = sorted(self.samples)
        if not xs:
            return {"count": 0, "p50_ms": None, "p99_ms": None, "p999_ms": None, "cdf_ms": []}
        at = lambda q: round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3, 3)  # noqa: E731
        tenth = max(1, len(xs) // 10)  # a lag that stands from the start, or one that grows?
        first, last = sorted(self.samples[:tenth]), sorted(self.samples[-tenth:])
        return {"count": len(xs), "p50_ms": at(0.5), "p99_ms": at(0.99), "p999_ms": at(0.999),
                "cdf_ms": [at(i / 100) for i in range(101)],
                "first_tenth_p50_ms": round(first[len(first) // 2] * 1e3, 3),
                "last_tenth_p50_ms": round(last[len(last) // 2] * 1e3, 3)}


def stamp(payload: bytearray) -> bytes:
    """`payload` with the time now in its first 8 bytes (what `LatencyLog` reads)."""
    STAMP.pack_into(payload, 0, monotonic())
    return bytes(payload)


def pace_step(rate: float, most: int) -> int:
    """How many messages a paced sender hands over at a time: a millisecond's worth of `rate`
    (at least 1, at most `most`), the same for every system (a sleep per message would cost a
    sender more than its sends at 20,000 msgs/s, and sleeps shorter than the kernel's timer
    slack come late anyway)."""
    return max(1, min(most, int(rate / 1000)))


def pace(count: int, start: float, rate: float, now: float, step: int = 1) -> None:
    """An offered rate: sleep while `count` messages sent since `start` are `step` or more ahead
    of `rate` msgs/s."""
    ahead = count - (now - start) * rate
    if ahead >= step:
        time.sleep(ahead / rate)
