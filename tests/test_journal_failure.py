"""A journal commit that fails: the enqueue hears 503-worthy Unavailable, and the refused
task is not committed later by the retry of its group (a real SQLite file)."""

from __future__ import annotations

import sqlite3

import pytest

from miyamoto import config as config_mod
from miyamoto.engine import Engine
from miyamoto.errors import Unavailable
from miyamoto.journal import Journal
from miyamoto.task import Task

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
