"""A node's recent history for the console (``miyamoto.engine.history``): the ring of
per-second counts (fixed memory, old seconds overwritten, summed into points), a peer's
series checked before it is added, and latency buckets whose sums give p50/p99."""

from __future__ import annotations

import pytest

from miyamoto.engine import history
from miyamoto.engine.history import Latency, Rates

pytestmark = pytest.mark.timeout(30)

T0 = 1_700_000_000.0


def test_the_ring_counts_each_second_and_forgets_the_seconds_it_overwrote() -> None:
    r = Rates(seconds=10)
    for dt, kind in ((0.1, "enqueued"), (0.9, "enqueued"), (1.5, "delivered"), (3.0, "failed")):
        r.add(kind, T0 + dt)
    s = r.series(T0 + 4.2, 5, 1)  # seconds T0-1 .. T0+3
    assert s["end"] == int(T0) + 4 and s["step"] == 1
    assert s["enqueued"] == [0, 2, 0, 0, 0] and s["delivered"] == [0, 0, 1, 0, 0]
    assert s["failed"] == [0, 0, 0, 0, 1]
    r.add("delivered", T0 + 10.5)  # the slot of T0 again: its old counts are gone
    s = r.series(T0 + 11.0, 10, 1)
    assert sum(s["enqueued"]) == 0 and s["delivered"][-1] == 1
    assert len(r.second) == 10  # fixed memory, whatever the traffic


def test_points_sum_their_seconds_and_an_hour_is_what_a_reload_sees() -> None:
    r = Rates()
    for i in range(3600):
        r.add("delivered", T0 + i)
    s = r.series(T0 + 3600, 3600, 10)
    assert len(s["delivered"]) == 360 and set(s["delivered"]) == {10}


def test_a_peer_s_series_is_added_only_when_it_fits() -> None:
    ours = Rates().series(T0, 60, 1)
    good = dict(ours, delivered=[1] * 60)
    assert history.add_series(ours, good) and sum(ours["delivered"]) == 60
    for bad in (None, dict(good, step=2), dict(good, delivered=[1] * 59),
                dict(good, failed=[-1] * 60), dict(good, enqueued=[True] * 60), "x"):
        assert not history.add_series(ours, bad)
    assert sum(ours["delivered"]) == 60


def test_latency_quantiles_come_from_summed_buckets_of_the_last_minutes() -> None:
    lat = Latency()
    for i in range(99):
        lat.add("q", 0.010, T0)
    lat.add("q", 2.0, T0)
    got = history.quantiles(lat.buckets(T0)["q"])
    assert got["count"] == 100 and got["window"] == 300
    assert 0.010 <= got["p50"] < 0.010 * 1.19
    assert 0.010 <= got["p99"] < 0.010 * 1.19  # the 99th of 100 is still a 10 ms one
    lat.add("q", 2.0, T0)
    got = history.quantiles(lat.buckets(T0)["q"])
    assert 2.0 <= got["p99"] < 2.0 * 1.19
    assert lat.buckets(T0 + 5 * 60) == {}  # older than the window
    assert history.quantiles({}) == {"count": 0, "p50": None, "p99": None, "window": 300}
    lat.forget("q")
    assert lat.slots == {}


def test_buckets_cover_a_millisecond_to_days_in_bounded_steps() -> None:
    assert history.bucket(0.0) == 0 and history.bucket(1e9) == history.BUCKETS - 1
    for s in (0.0015, 0.3, 7.0, 3600.0):
        b = history.bucket(s)
        assert history.upper(b - 1) < s <= history.upper(b) * 1.0000001
