"""A node's recent history for the console: tasks enqueued, delivered and failed per
second over the last hour, and each queue's delivery latency over the last minutes.

``Rates`` is a ring of SECONDS per-second counts, indexed by the second's number
modulo the ring, with the second each slot holds: fixed memory (3 x 3,600 counters),
O(1) per event, and a reload of the dashboard shows the last hour instead of starting
empty. ``Latency`` keeps, per queue, a histogram of log-spaced buckets for each of the
last WINDOW_SLOTS minutes: histograms add up, so the cluster's p50/p99 come from the
sum of every node's buckets (quantiles themselves cannot be averaged), within the
bucket's width (each bucket spans a factor of 2^(1/4), about 19 %).
"""

from __future__ import annotations

import math
from array import array
from typing import Any

KINDS = ("enqueued", "delivered", "failed")
SECONDS = 3600
WINDOW_SLOTS = 5  # minutes of latency kept
SLOT_SECONDS = 60
BUCKETS = 96  # bucket b holds latencies up to FIRST * 2^(b/4): 1 ms to ~5 days
FIRST = 0.001
_PER_OCTAVE = 4


class Rates:
    """Per-second counts of each kind over the last SECONDS seconds."""

    def __init__(self, seconds: int = SECONDS):
        self.size = seconds
        self.second = array("q", [-1] * seconds)  # the second each slot counts
        self.counts = {k: array("L", [0] * seconds) for k in KINDS}

    def add(self, kind: str, now: float) -> None:
        s = int(now)
        i = s % self.size
        if self.second[i] != s:
            self.second[i] = s
            for c in self.counts.values():
                c[i] = 0
        self.counts[kind][i] += 1

    def series(self, now: float, seconds: int, step: int) -> dict[str, Any]:
        """The counts of the ``seconds`` seconds before ``now``, summed ``step`` seconds a
        point, oldest first; ``end`` is the second after the last point."""
        end = int(now)
        points = seconds // step
        out: dict[str, Any] = {"end": end, "step": step}
        for k in KINDS:
            out[k] = [0] * points
        for back in range(points * step):
            s = end - 1 - back
            i = s % self.size
            if self.second[i] != s:
                continue
            p = points - 1 - back // step
            for k in KINDS:
                out[k][p] += self.counts[k][i]
        return out


def add_series(into: dict[str, Any], other: Any) -> bool:
    """Add a peer's ``series`` answer into ours (same length and step); False if it does
    not fit (a peer's bytes are untrusted)."""
    if not isinstance(other, dict) or other.get("step") != into["step"]:
        return False
    lists = [other.get(k) for k in KINDS]
    if not all(isinstance(v, list) and len(v) == len(into[k]) and
               all(type(n) is int and n >= 0 for n in v) for k, v in zip(KINDS, lists)):
        return False
    for k, v in zip(KINDS, lists):
        into[k] = [a + b for a, b in zip(into[k], v)]
    return True


def bucket(seconds: float) -> int:
    if seconds <= FIRST:
        return 0
    return min(BUCKETS - 1, math.ceil(math.log2(seconds / FIRST) * _PER_OCTAVE))


def upper(b: int) -> float:
    """The largest latency bucket ``b`` holds."""
    return FIRST * 2 ** (b / _PER_OCTAVE)


class Latency:
    """Per queue, the delivery latencies of the last WINDOW_SLOTS minutes by bucket."""

    def __init__(self) -> None:
        # queue -> [(minute, {bucket: n})] newest last, at most WINDOW_SLOTS
        self.slots: dict[str, list[tuple[int, dict[int, int]]]] = {}

    def add(self, queue: str, seconds: float, now: float) -> None:
        minute = int(now // SLOT_SECONDS)
        slots = self.slots.setdefault(queue, [])
        if not slots or slots[-1][0] != minute:
            slots.append((minute, {}))
            del slots[:-WINDOW_SLOTS]
        b = bucket(max(0.0, seconds))
        slots[-1][1][b] = slots[-1][1].get(b, 0) + 1

    def buckets(self, now: float) -> dict[str, dict[int, int]]:
        """queue -> bucket -> deliveries in the window that ends now."""
        oldest = int(now // SLOT_SECONDS) - WINDOW_SLOTS + 1
        out: dict[str, dict[int, int]] = {}
        for q, slots in self.slots.items():
            for minute, counts in slots:
                if minute >= oldest:
                    mine = out.setdefault(q, {})
                    for b, n in counts.items():
                        mine[b] = mine.get(b, 0) + n
        return out

    def forget(self, queue: str) -> None:
        self.slots.pop(queue, None)


def quantiles(counts: dict[int, int]) -> dict[str, Any]:
    """p50 and p99 (seconds, a bucket's upper edge) and the count of ``counts``."""
    total = sum(counts.values())
    out: dict[str, Any] = {"count": total, "p50": None, "p99": None,
                           "window": WINDOW_SLOTS * SLOT_SECONDS}
    if not total:
        return out
    seen = 0
    for b in sorted(counts):
        seen += counts[b]
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            if out[name] is None and seen >= q * total:
                out[name] = round(upper(b), 6)
    return out
