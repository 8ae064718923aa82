"""What the in-process tests of the delivery path (dispatcher, scheduler) share: a run
held at a gate, a fake clock, and a wait on a condition with a deadline."""

from __future__ import annotations

import time

import gevent
import gevent.event

from miyamoto.delivery.dispatch import Dispatcher


def wait_for(cond, timeout: float = 5.0) -> None:
    """Until ``cond()`` holds, yielding to the hub; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        gevent.sleep(0.005)


class Gates:
    """A run that holds each delivery until the test lets it go."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._gates: dict[str, gevent.event.Event] = {}

    def __call__(self, task_id: str) -> None:
        self.started.append(task_id)
        self._gates.setdefault(task_id, gevent.event.Event()).wait()

    def finish(self, *task_ids: str) -> None:
        for t in task_ids:
            self._gates.setdefault(t, gevent.event.Event()).set()
        gevent.sleep(0)
        gevent.sleep(0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pump_once(d: Dispatcher) -> float | None:
    """One pump pass, then let the started deliveries run up to their gates."""
    wait = d.dispatch_ready()
    gevent.sleep(0)
    return wait
