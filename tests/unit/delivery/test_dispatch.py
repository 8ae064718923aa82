"""The dispatcher's limits and wake-ups (miyamoto.delivery.dispatch), with real greenlets."""

from __future__ import annotations

import time

import gevent
import pytest

from miyamoto.config.settings import QueueConfig
from dispatchkit import wait_for
from miyamoto.delivery.dispatch import Dispatcher

pytestmark = pytest.mark.timeout(30)


def _run_all(concurrency: int, tasks: int, qc: QueueConfig | None = None):
    done: list[str] = []
    peak = {"busy": 0}

    def run(task_id: str) -> None:
        peak["busy"] = max(peak["busy"], d.busy)
        gevent.sleep(0.01)
        done.append(task_id)

    d = Dispatcher(run, lambda name: qc or QueueConfig(name=name), concurrency)
    d.start()
    try:
        for i in range(tasks):
            d.submit("q", str(i))
        with gevent.Timeout(10, False):
            while len(done) < tasks:
                gevent.sleep(0.01)
    finally:
        d.stop(1)
    return done, peak["busy"]


@pytest.mark.parametrize("concurrency", [1, 2, 7, 64])
def test_a_full_pool_keeps_dispatching_as_slots_free(concurrency):
    done, peak = _run_all(concurrency, concurrency * 5)
    assert sorted(done, key=int) == [str(i) for i in range(concurrency * 5)]
    assert peak <= concurrency


def test_queue_concurrency_limit_holds():
    done, peak = _run_all(64, 20, QueueConfig(name="q", max_concurrent=3))
    assert len(done) == 20 and peak <= 3


def test_a_paused_queue_holds_its_tasks_until_resumed():
    done: list[str] = []
    d = Dispatcher(done.append, lambda name: QueueConfig(name=name), 8)
    d.start()
    try:
        d.pause("q", True)
        d.submit("q", "a")
        gevent.sleep(0.1)
        assert done == []
        d.pause("q", False)
        with gevent.Timeout(5, False):
            while not done:
                gevent.sleep(0.01)
        assert done == ["a"]
    finally:
        d.stop(1)


def test_looking_at_a_queue_creates_no_state():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name), 8)
    assert d.view("nosuch").config.name == "nosuch"
    assert "nosuch" not in d.queues


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


def test_dispatch_a_viewed_queue_has_the_whole_rate():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=12), 4)
    assert d.view("new").bucket.rate == 12


def test_dispatch_stop_kills_deliveries_that_outlast_its_timeout():
    ended: list[str] = []

    def run(task_id: str) -> None:
        try:
            gevent.sleep(5)
        finally:
            ended.append(task_id)

    d = dispatcher(run)
    d.submit("q", "long")
    wait_for(lambda: d.busy == 1, 1)
    t0 = time.monotonic()
    d.stop(0.1)
    assert ended == ["long"] and time.monotonic() - t0 < 2


def test_dispatch_waits_for_the_nearest_token_of_several_queues():
    runs = Runs()
    d = dispatcher(runs, {"slow": QueueConfig(name="slow", rate=0.3, burst=1),
                          "quick": QueueConfig(name="quick", rate=10, burst=1)})
    try:
        for i in range(2):
            d.submit("slow", f"s{i}")
            d.submit("quick", f"q{i}")
        # q1's token comes 0.1 s after q0's, s1's only after 3.3 s
        wait_for(lambda: "q1" in runs.ids, 1.0)
        assert "s1" not in runs.ids
    finally:
        d.stop(1)


def cpu_while(seconds: float) -> float:
    t0 = time.process_time()
    gevent.sleep(seconds)
    return time.process_time() - t0


class PassClock:
    """A clock that counts the pump's passes (each reads it once): a spinning pump makes
    thousands in a fraction of a second, however little CPU a loaded box gives it."""

    def __init__(self, fixed: float | None = None):
        self.fixed, self.reads = fixed, 0

    def __call__(self) -> float:
        self.reads += 1
        return time.time() if self.fixed is None else self.fixed

    def passes_while(self, seconds: float) -> int:
        before = self.reads
        gevent.sleep(seconds)
        return self.reads - before


def test_dispatch_an_idle_or_waiting_pump_does_not_spin():
    runs, clock = Runs(), PassClock()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name, rate=1, burst=1), 8, clock=clock)
    d.start()
    try:
        assert cpu_while(0.3) < 0.1  # idle
        assert clock.passes_while(0.3) <= 3
        d.submit("r", "a")
        d.submit("r", "b")  # waits exactly 1.0 s for its token
        wait_for(lambda: runs.ids == ["a"], 1)
        assert cpu_while(0.3) < 0.1  # waiting for a token
        assert clock.passes_while(0.3) <= 3
        wait_for(lambda: runs.ids == ["a", "b"], 3)
    finally:
        d.stop(1)


def test_dispatch_waiting_exactly_one_second_for_a_token_does_not_spin():
    runs = Runs()
    clock = PassClock(fixed=1000.0)  # time stands still: the wait is exactly 1.0 s
    d = Dispatcher(runs, lambda name: QueueConfig(name=name, rate=1, burst=1), 4, clock=clock)
    d.start()
    try:
        d.submit("r", "a")
        d.submit("r", "b")
        wait_for(lambda: runs.ids == ["a"], 1)
        assert cpu_while(0.3) < 0.1
        assert clock.passes_while(0.3) <= 3
        assert runs.ids == ["a"]
    finally:
        d.stop(1)


def test_new_settings_reach_a_queue_with_state_at_once() -> None:
    configs = {"q": QueueConfig(name="q", rate=10, burst=5, max_concurrent=2)}
    d = Dispatcher(lambda t: None, lambda name: configs.get(name) or QueueConfig(name=name), 8)
    d.set_share(2)
    q = d.queue("q")
    assert (q.limit, q.bucket.rate, q.bucket.burst) == (2, 5.0, 5)
    q.paused = True
    configs["q"] = QueueConfig(name="q", rate=4, burst=1, max_concurrent=6, paused=False)
    d.reconfigure("q")
    assert (q.limit, q.bucket.rate, q.bucket.burst, q.bucket.tokens) == (6, 2.0, 1, 1.0)
    assert q.paused is True and d.queue_config("q").rate == 4  # a pause is not a setting
    d.reconfigure("nothing-yet")  # a queue without state gets its settings when made
    assert "nothing-yet" not in d.queues


# ================================================================ workers


def test_dispatch_a_targets_copies_follow_each_other_on_one_worker():
    """A worker whose delivery ends starts its target's next copy itself: a busy
    target's copies run on one greenlet, not on a greenlet each."""
    ran: list[tuple[str, object]] = []

    def run(task_id: str) -> None:
        ran.append((task_id, gevent.getcurrent()))
        gevent.sleep(0.001)

    d = dispatcher(run, concurrency=1)
    try:
        for i in range(20):
            d.submit("q", str(i), "http://h:80")
        wait_for(lambda: len(ran) == 20, 5)
        assert [t for t, _ in ran] == [str(i) for i in range(20)]
        assert len({id(g) for _, g in ran}) == 1
    finally:
        d.stop(1)


def test_dispatch_parked_workers_are_bounded_and_end_at_stop():
    """Each of many targets leaves a worker parked; at most ``concurrency`` stay (the
    oldest go first), a parked one is woken for its target's next copy, and stop ends
    them all."""
    ran: list[tuple[str, object]] = []

    def run(task_id: str) -> None:
        ran.append((task_id, gevent.getcurrent()))
        gevent.sleep(0.001)

    d = dispatcher(run, concurrency=3)
    for i in range(10):
        d.submit("q", f"t{i}", f"http://h{i}:80")
    wait_for(lambda: len(ran) == 10 and d.busy == 0, 5)
    wait_for(lambda: len(d.group) <= 3, 2)
    worker_of_h9 = ran[-1][1]
    d.submit("q", "again", "http://h9:80")  # h9's worker is parked: it runs this one
    wait_for(lambda: len(ran) == 11, 2)
    assert ran[-1] == ("again", worker_of_h9)
    d.stop(1)
    assert len(d.group) == 0
