"""A journal commit that fails: the enqueue hears 503-worthy Unavailable, and the refused
task is not committed later by the retry of its group; a writer that is killed stops,
and its waiter hears it (a real SQLite file)."""

from __future__ import annotations

import sqlite3
import threading
import time

import gevent
import pytest

from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.errors import Unavailable
from miyamoto.store.journal import Journal, JournalClosed
from miyamoto.tasks.task import Task

pytestmark = pytest.mark.timeout(30)


def _task(i: int, name: str | None = None) -> Task:
    return Task(id=f"t{i}", queue="q", url="http://127.0.0.1:9/", name=name, eta=1e12,
                fire_at=1e12, created=1.0)


def test_a_refused_task_is_not_committed_by_a_later_group(tmp_path, monkeypatch):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path)})
    journal = Journal(str(tmp_path))
    journal.open()
    engine = Engine(cfg, journal)
    real_commit = journal._commit
    calls = {"n": 0}

    def failing_once(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return real_commit(*args)

    monkeypatch.setattr(journal, "_commit", failing_once)
    with pytest.raises(Unavailable):
        engine.add(_task(1, name="n1"))
    assert "t1" not in engine.live
    engine.add(_task(2))  # the next group commits, without t1 or its name
    journal.close()

    again = Journal(str(tmp_path))
    again.open()
    tasks, names, _ = again.load()
    again.close()
    assert [t.id for t in tasks] == ["t2"]
    assert names == {}


def _wait_for(condition, timeout: float = 5.0) -> None:
    """Yield to the hub until ``condition()`` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        gevent.sleep(0.005)


def test_a_killed_writer_stops_and_its_waiter_hears_it(tmp_path, monkeypatch):
    """GreenletExit (close() killing a stuck writer) is not a failed commit to retry:
    the writer stops, the waiter gets an error instead of hanging, and the group is
    kept for close()'s last flush. (With fsync on, so that the commit runs on the
    database thread: one on the hub cannot be killed mid-way, it never yields.)"""
    journal = Journal(str(tmp_path), sync_full=True)
    journal.open()
    started, release = threading.Event(), threading.Event()

    def stuck(*args):  # a commit that hangs on the disk, then never happened
        started.set()
        release.wait(10)

    monkeypatch.setattr(journal, "_commit", stuck)
    waiter = gevent.spawn(journal.put, _task(1), wait=True)
    _wait_for(started.is_set)
    journal.put(_task(2))  # a write that waits for nobody, in the next group
    journal._writer.kill(block=True, timeout=5)
    assert journal._writer.dead, "the writer swallowed its GreenletExit"
    waiter.join(timeout=5)
    assert waiter.ready(), "the waiter hangs on a dead writer"
    assert isinstance(waiter.exception, JournalClosed)

    release.set()
    monkeypatch.undo()
    journal.close()
    again = Journal(str(tmp_path))
    again.open()
    tasks, _, _ = again.load()
    again.close()
    assert sorted(t.id for t in tasks) == ["t1", "t2"]


def test_a_pause_whose_group_failed_is_committed_by_a_later_group(tmp_path, monkeypatch):
    journal = Journal(str(tmp_path))
    journal.open()
    real_commit = journal._commit
    calls = {"n": 0}

    def failing_once(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return real_commit(*args)

    monkeypatch.setattr(journal, "_commit", failing_once)
    with pytest.raises(Unavailable):  # a 503 for the API, not a 500
        journal.set_paused("q", True)  # the dispatcher is paused already: keep the record
    journal.put(_task(1), wait=True)
    journal.close()
    again = Journal(str(tmp_path))
    again.open()
    _, _, paused = again.load()
    again.close()
    assert paused == {"q": True}
