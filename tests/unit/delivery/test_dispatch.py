"""The dispatcher's limits and wake-ups (miyamoto.delivery.dispatch), with real greenlets."""

from __future__ import annotations

import gevent
import pytest

from miyamoto.config.settings import QueueConfig
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
