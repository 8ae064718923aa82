"""Engine.oldest_due (/metrics' miyamoto_queue_oldest_due_seconds): per queue, how long
its oldest due copy that has not started has been due; copies not due yet, running or
in other queues do not count (a real SQLite file, a fake clock)."""

from __future__ import annotations

import pytest

from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


def _task(i: int, queue: str, fire_at: float) -> Task:
    return Task(id=f"t{i}", queue=queue, url="http://127.0.0.1:9/", eta=fire_at,
                fire_at=fire_at, created=1.0)


def test_the_oldest_due_copy_per_queue(tmp_path):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    journal = Journal(str(tmp_path))
    journal.open()
    try:
        engine = Engine(cfg, journal, clock=lambda: NOW)
        for t in (_task(1, "a", NOW - 30), _task(2, "a", NOW - 5), _task(3, "b", NOW - 2),
                  _task(4, "b", NOW + 10), _task(5, "c", NOW + 1)):
            engine.add(t)
        assert engine.oldest_due() == {"a": 30.0, "b": 2.0}
        engine.live["t1"] = engine.live["t1"].evolve(state=State.RUNNING)  # started
        assert engine.oldest_due() == {"a": 5.0, "b": 2.0}
    finally:
        journal.close()
