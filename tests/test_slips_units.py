"""Unit tests written to kill what scripts/mutate.py showed no other test noticed
(issue 12): each pins a boundary or a branch of a pure or core module.

No sockets, no processes; the scheduler and dispatcher run their greenlets for real,
with waits on conditions under deadlines.
"""

from __future__ import annotations

import time

import gevent
import pytest

from miyamoto.config import QueueConfig
from miyamoto.dispatch import Dispatcher
from miyamoto.ratelimit import TokenBucket
from miyamoto.scheduler import Scheduler


def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        gevent.sleep(0.005)


# ================================================================ token bucket


def test_bucket_configure_to_a_burst_of_one_keeps_one_token():
    b = TokenBucket(rate=1, burst=10, now=0.0)
    b.configure(rate=1, burst=1)
    assert b.burst == 1
    assert [b.take(0.0) for _ in range(2)] == [True, False]


def test_bucket_refund_gives_a_token_back_up_to_the_burst():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    b.refund()
    assert [b.take(0.0) for _ in range(2)] == [True, False]
    b.refund()
    b.refund()
    b.refund()  # never more than the burst
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]


def test_bucket_refund_at_rate_zero_saves_nothing_for_later():
    b = TokenBucket(rate=1, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    b.configure(rate=0, burst=3)
    b.refund()  # unlimited: nothing to give back
    b.configure(rate=1, burst=3)
    assert not b.take(0.0)


def test_bucket_wait_time_refills_by_itself():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    assert b.take(0.0)
    assert b.wait_time(0.1) == pytest.approx(0.1)  # no take() in between
    assert b.wait_time(0.0) == pytest.approx(0.1)  # the clock going back adds nothing


def test_bucket_wait_time_is_zero_with_a_token_or_more():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)
    assert b.wait_time(0.5) == 0.0  # 1.5 tokens
    assert b.take(0.5)
    assert b.wait_time(0.5) == pytest.approx(0.5)


def test_bucket_wait_time_at_rate_zero_with_an_empty_bucket():
    b = TokenBucket(rate=1, burst=1, now=0.0)
    assert b.take(0.0)
    b.configure(rate=0, burst=1)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)


# ================================================================ scheduler: the timer greenlet


def test_scheduler_an_earlier_key_wakes_the_timer_waiting_for_a_later_one():
    fired: list[tuple[str, float]] = []
    s = Scheduler(lambda k: fired.append((k, time.time())))
    s.start()
    try:
        t0 = time.time()
        s.schedule("late", t0 + 3.0)
        gevent.sleep(0.05)  # the timer goes to sleep until "late"
        s.schedule("early", time.time() + 0.05)
        wait_for(lambda: fired, 2.0)
        assert fired[0][0] == "early" and fired[0][1] - t0 < 1.0, fired
    finally:
        s.stop()


def test_scheduler_a_cancelled_key_never_fires_while_a_later_one_does():
    fired: list[str] = []
    s = Scheduler(fired.append)
    s.start()
    try:
        now = time.time()
        s.schedule("gone", now + 0.05)
        s.schedule("kept", now + 0.1)
        s.cancel("gone")
        wait_for(lambda: fired)  # the positive control: "kept", due after "gone"
        assert fired == ["kept"]
        assert "gone" not in s and "kept" not in s and len(s) == 0
    finally:
        s.stop()


# ================================================================ dispatcher


class Runs:
    """A dispatcher's run(): records (task, start time); answers per task."""

    def __init__(self, answers: dict[str, object] | None = None, hold: float = 0.0):
        self.started: list[tuple[str, float]] = []
        self.answers = answers or {}
        self.hold = hold

    def __call__(self, task_id: str):
        self.started.append((task_id, time.monotonic()))
        if self.hold:
            gevent.sleep(self.hold)
        a = self.answers.get(task_id)
        if isinstance(a, Exception):
            raise a
        return a

    @property
    def ids(self) -> list[str]:
        return [t for t, _ in self.started]


def dispatcher(run, configs: dict[str, QueueConfig] | None = None, concurrency: int = 8):
    configs = configs or {}
    d = Dispatcher(run, lambda name: configs.get(name) or QueueConfig(name=name), concurrency)
    d.start()
    return d


def test_dispatch_a_rate_limited_queue_spaces_its_starts_and_keeps_order():
    runs = Runs()
    d = dispatcher(runs, {"r": QueueConfig(name="r", rate=20, burst=1)})
    try:
        for i in range(5):
            d.submit("r", str(i))
        wait_for(lambda: len(runs.started) == 5, 5)
        assert runs.ids == ["0", "1", "2", "3", "4"]
        times = [t for _, t in runs.started]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g > 0.04 for g in gaps), gaps  # 20/s: 0.05 s apart
        assert times[-1] - times[0] < 1.0, gaps
    finally:
        d.stop(1)


def test_dispatch_a_limited_queue_does_not_hold_up_another():
    runs = Runs()
    d = dispatcher(runs, {"slow": QueueConfig(name="slow", rate=0.5, burst=1)})
    try:
        d.submit("slow", "s1")
        d.submit("slow", "s2")  # waits 2 s for a token
        for i in range(3):
            d.submit("fast", f"f{i}")
        wait_for(lambda: {"s1", "f0", "f1", "f2"} <= set(runs.ids), 1.0)
        assert "s2" not in runs.ids
    finally:
        d.stop(1)


def test_dispatch_a_run_that_did_not_deliver_gives_its_token_back():
    runs = Runs({"held": False})
    d = dispatcher(runs, {"r": QueueConfig(name="r", rate=0.2, burst=1)})
    try:
        d.submit("r", "held")
        wait_for(lambda: runs.ids == ["held"], 2)
        d.submit("r", "next")  # without the refund it would wait 5 s for a token
        wait_for(lambda: runs.ids == ["held", "next"], 2)
        d.submit("r", "third")  # "next" delivered (None): its token stays spent
        gevent.sleep(0.3)
        assert runs.ids == ["held", "next"]
    finally:
        d.stop(1)


def test_dispatch_a_failing_run_frees_its_slot():
    runs = Runs({"boom": RuntimeError("bug")})
    d = dispatcher(runs, concurrency=1)
    try:
        d.submit("q", "boom")
        d.submit("q", "after")
        wait_for(lambda: runs.ids == ["boom", "after"], 2)
        wait_for(lambda: d.busy == 0 and d.queue("q").inflight == 0, 2)
    finally:
        d.stop(1)


def test_dispatch_concurrency_is_capped_across_queues_and_slots_are_reused():
    runs = Runs(hold=0.1)
    d = dispatcher(runs, concurrency=2)
    try:
        for i in range(3):
            d.submit("a", f"a{i}")
            d.submit("b", f"b{i}")
        wait_for(lambda: len(runs.started) == 2, 1)
        assert d.busy == 2
        gevent.sleep(0.05)
        assert len(runs.started) == 2  # both slots taken
        wait_for(lambda: len(runs.started) == 6, 3)
        wait_for(lambda: d.busy == 0, 2)
    finally:
        d.stop(1)


def test_dispatch_queue_max_concurrent_caps_only_that_queue():
    runs = Runs(hold=0.2)
    d = dispatcher(runs, {"narrow": QueueConfig(name="narrow", max_concurrent=1)})
    try:
        d.submit("narrow", "n1")
        d.submit("narrow", "n2")
        d.submit("wide", "w1")
        d.submit("wide", "w2")
        wait_for(lambda: {"n1", "w1", "w2"} <= set(runs.ids), 1)
        assert "n2" not in runs.ids
        wait_for(lambda: "n2" in runs.ids, 2)
    finally:
        d.stop(1)


def test_dispatch_pause_holds_one_queue_while_another_runs():
    runs = Runs()
    d = dispatcher(runs)
    try:
        d.pause("p", True)
        assert d.queue("p").paused
        d.submit("p", "held")
        d.submit("q", "free")
        wait_for(lambda: "free" in runs.ids, 2)  # the positive control
        gevent.sleep(0.05)
        assert runs.ids == ["free"]
        d.pause("p", False)
        wait_for(lambda: runs.ids == ["free", "held"], 2)
    finally:
        d.stop(1)


def test_dispatch_a_queue_created_paused_holds_its_tasks():
    runs = Runs()
    d = dispatcher(runs, {"p": QueueConfig(name="p", paused=True)})
    try:
        d.submit("p", "held")
        d.submit("q", "free")
        wait_for(lambda: "free" in runs.ids, 2)
        gevent.sleep(0.05)
        assert runs.ids == ["free"]
    finally:
        d.stop(1)


def test_dispatch_rate_is_shared_among_members():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=12, burst=3), 4)
    assert d.queue("a").bucket.rate == 12
    d.set_share(3)
    assert d.queue("a").bucket.rate == 4
    assert d.queue("b").bucket.rate == 4  # created after the share was set
    d.set_share(0)
    assert d.queue("a").bucket.rate == 12 and d.queue("b").bucket.rate == 12
    assert d.queue("a").bucket.burst == 3


def test_dispatch_view_reads_without_creating():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=2), 4)
    assert d.view("x").config.rate == 2 and "x" not in d.queues
    q = d.queue("x")
    q.paused = True
    assert d.view("x") is q


def test_dispatch_stop_starts_nothing_more_and_waits_for_what_runs():
    runs = Runs(hold=0.2)
    d = dispatcher(runs, concurrency=1)
    d.submit("q", "first")
    d.submit("q", "second")
    wait_for(lambda: runs.ids == ["first"], 1)
    t0 = time.monotonic()
    d.stop(2)
    assert time.monotonic() - t0 >= 0.1  # it waited for "first"
    gevent.sleep(0.3)
    assert runs.ids == ["first"]
