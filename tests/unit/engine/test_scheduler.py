"""miyamoto.engine.scheduler: the heap's order, reschedules, cancels and compaction as pure
methods, then the timer greenlet run for real, with waits on conditions under deadlines."""

from __future__ import annotations

import random
import time

import gevent
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchkit import wait_for
from miyamoto.engine.scheduler import Scheduler


def sched() -> Scheduler:
    return Scheduler(lambda key: None, clock=lambda: 0.0)


def test_scheduler_pops_due_in_time_order():
    s = sched()
    for key, when in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("late", 100.0)]:
        s.schedule(key, when)
    assert len(s) == 4
    assert s.pop_due(0.5) == []
    assert s.pop_due(2.5) == ["a", "b"]
    assert s.pop_due(3.0) == ["c"]  # due exactly at its time
    assert s.next_time() == 100.0
    assert len(s) == 1 and "late" in s and "a" not in s


def test_scheduler_ties_keep_insertion_order():
    s = sched()
    for k in ["x", "y", "z", "w"]:
        s.schedule(k, 5.0)
    assert s.pop_due(5.0) == ["x", "y", "z", "w"]


def test_scheduler_reschedule_replaces_the_old_time():
    s = sched()
    s.schedule("a", 1.0)
    s.schedule("b", 2.0)
    s.schedule("a", 10.0)  # pushed back
    assert s.pop_due(5.0) == ["b"]
    assert s.next_time() == 10.0
    s.schedule("a", 0.5)  # pulled forward
    assert s.pop_due(1.0) == ["a"]
    assert s.pop_due(100.0) == []  # the stale entries never fire


def test_scheduler_cancel():
    s = sched()
    s.schedule("a", 1.0)
    s.schedule("b", 1.0)
    s.cancel("a")
    s.cancel("never-scheduled")
    assert "a" not in s and len(s) == 1
    assert s.pop_due(2.0) == ["b"]
    assert s.next_time() is None
    s.schedule("a", 3.0)  # a cancelled key can come back
    assert s.pop_due(3.0) == ["a"]


def test_scheduler_pop_limit():
    s = sched()
    for i in range(10):
        s.schedule(f"k{i}", float(i))
    assert s.pop_due(100.0, limit=3) == ["k0", "k1", "k2"]
    assert s.pop_due(100.0) == [f"k{i}" for i in range(3, 10)]


def test_scheduler_stale_entries_are_compacted():
    s = sched()
    for i in range(20_000):
        s.schedule("same", float(i))
    assert len(s) == 1
    assert len(s._heap) < 3000  # not 20,000 entries for one key
    assert s.pop_due(1e9) == ["same"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 100),
                          st.booleans()), max_size=60), st.floats(0, 100))
def test_scheduler_matches_a_dict_model(ops, now):
    s = sched()
    model: dict[str, float] = {}
    for key, when, cancel in ops:
        if cancel:
            s.cancel(key)
            model.pop(key, None)
        else:
            s.schedule(key, when)
            model[key] = when
    due = s.pop_due(now)
    expected = sorted((w, k) for k, w in model.items() if w <= now)
    assert sorted(due) == sorted(k for _, k in expected)
    assert [model[k] for k in due] == sorted(model[k] for k in due)
    rest = {k: w for k, w in model.items() if w > now}
    assert len(s) == len(rest)
    assert s.next_time() == (min(rest.values()) if rest else None)


def test_scheduler_greenlet_fires_due_keys():
    fired: list[tuple[str, float]] = []
    s = Scheduler(lambda k: fired.append((k, time.time())))
    s.start()
    try:
        t0 = time.time()
        s.schedule("later", t0 + 0.15)
        s.schedule("soon", t0 + 0.05)
        s.schedule("gone", t0 + 0.05)
        s.cancel("gone")
        deadline = time.monotonic() + 5
        while len(fired) < 2 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        assert [k for k, _ in fired] == ["soon", "later"]
        assert fired[0][1] >= t0 + 0.05 - 0.005
        assert fired[1][1] >= t0 + 0.15 - 0.005
        # the positive control for "gone never fires": a key due after it does
        s.schedule("marker", time.time() + 0.02)
        deadline = time.monotonic() + 5
        while len(fired) < 3 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        assert [k for k, _ in fired] == ["soon", "later", "marker"]
    finally:
        s.stop()


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


def test_scheduler_order_and_live_keys_survive_a_compaction():
    rng = random.Random(7)
    s = Scheduler(lambda key: None, clock=lambda: 0.0)
    times = {f"k{i}": rng.uniform(0, 100) for i in range(300)}
    for k, w in times.items():
        s.schedule(k, w)
    for i in range(5000):  # stale entries of one key pile up (each one the new head,
        s.schedule("same", -float(i))  # so they are spread through the heap): rebuilt
    assert len(s._heap) < 2 * len(s) + 1100
    got = s.pop_due(150.0)
    assert got == ["same"] + sorted(times, key=times.get)


def test_scheduler_pops_at_most_1000_by_default():
    s = Scheduler(lambda key: None, clock=lambda: 0.0)
    for i in range(1001):
        s.schedule(str(i), 1.0)
    assert len(s.pop_due(1.0)) == 1000
    assert s.pop_due(1.0) == ["1000"]


def test_scheduler_fires_every_key_when_more_than_a_batch_is_due():
    fired: list[str] = []
    s = Scheduler(fired.append)
    now = time.time()
    for i in range(2500):
        s.schedule(str(i), now - 1.0)
    s.start()
    try:
        wait_for(lambda: len(fired) == 2500, 0.8)
    finally:
        s.stop()


def test_scheduler_keeps_working_after_its_heap_empties_and_after_a_handler_fails():
    fired: list[str] = []

    def on_due(key: str) -> None:
        if key == "bad":
            raise RuntimeError("handler bug")
        fired.append(key)

    s = Scheduler(on_due)
    s.start()
    try:
        s.schedule("bad", time.time())
        s.schedule("one", time.time() + 0.02)
        wait_for(lambda: fired == ["one"], 2)
        gevent.sleep(0.05)  # nothing left: the timer waits to be woken
        s.schedule("two", time.time() + 0.02)
        wait_for(lambda: fired == ["one", "two"], 2)
    finally:
        s.stop()


def test_scheduler_sleeps_while_nothing_is_due():
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        return time.time()

    fired: list[str] = []
    s = Scheduler(fired.append, clock=clock)
    s.start()
    try:
        s.schedule("later", time.time() + 0.4)
        gevent.sleep(0.2)
        assert calls[0] < 50, calls[0]  # no busy loop
        wait_for(lambda: fired == ["later"], 2)
    finally:
        s.stop()


def test_scheduler_stop_stops_firing():
    fired: list[str] = []
    s = Scheduler(fired.append)
    s.start()
    s.schedule("first", time.time())
    wait_for(lambda: fired == ["first"], 2)
    s.stop()
    s.stop()  # twice is fine
    s.schedule("after-stop", time.time())
    gevent.sleep(0.1)
    assert fired == ["first"]
