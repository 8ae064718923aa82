"""miyamoto.store.journal on a real SQLite file under gevent: writes and reopening, reads
that see pending writes, group commit, lazy writes, sweeps, rows it cannot read or encode,
and its lifecycle (what close waits for and ends)."""

from __future__ import annotations

import os
import re
import sqlite3
import time

import gevent
import pytest

from miyamoto.errors import Unavailable
from miyamoto.store import journal as journal_mod
from miyamoto.store.journal import Journal, JournalClosed
from miyamoto.tasks.task import State, Task


def jtask(i: int, **kw) -> Task:
    base = dict(id=f"t{i:05d}", queue=kw.pop("queue", "q"), url="http://w/x", eta=100.0 + i,
                fire_at=100.0 + i, params={"i": str(i), "u": "ü"}, created=1.0)
    base.update(kw)
    return Task(**base)


@pytest.fixture
def journal_factory(tmp_path):
    opened: list[Journal] = []

    def make(data_dir: str | None = None) -> Journal:
        j = Journal(data_dir or str(tmp_path / "data"))
        j.open()
        opened.append(j)
        return j

    yield make
    for j in opened:
        j.close()


def test_journal_put_get_and_reopen(journal_factory, tmp_path):
    j = journal_factory()
    t = jtask(1, name="n1", headers={"X-A": "1"}, max_attempts=3, timeout=2.5,
              last={"status": 500, "headers": {"A": "b"}, "body": "x", "error": None, "at": 3.0})
    j.put(t, wait=True, name_expires=5000.0)
    assert j.get(t.id) == t
    assert j.get("missing") is None
    j.close()
    assert os.path.exists(os.path.join(tmp_path, "data", "journal.sqlite3"))
    with pytest.raises(JournalClosed):
        j.put(jtask(2))
    j2 = journal_factory()
    assert j2.get(t.id) == t
    tasks, names, paused = j2.load()
    assert tasks == [t]
    assert names == {("q", "n1"): (t.id, 5000.0)}
    assert paused == {}


def test_journal_load_returns_only_live_tasks(journal_factory):
    j = journal_factory()
    live = [jtask(1), jtask(2, state=State.RUNNING)]
    ended = [jtask(3, state=State.SUCCEEDED, finished=10.0), jtask(4, state=State.FAILED, finished=11.0),
             jtask(5, state=State.CANCELLED, finished=12.0)]
    j.put_many(live + ended, wait=True)
    tasks, _, _ = j.load()
    assert sorted(t.id for t in tasks) == ["t00001", "t00002"]
    assert {t.id: t.state for t in tasks}["t00002"] == State.RUNNING


def test_journal_newer_write_wins(journal_factory):
    j = journal_factory()
    t = jtask(1)
    j.put(t)
    j.put(t.evolve(attempts=1, fire_at=500.0))
    j.put(t.evolve(attempts=2, fire_at=900.0), wait=True)
    assert j.get(t.id).attempts == 2
    j.put(t.evolve(state=State.SUCCEEDED, attempts=3, finished=50.0), wait=True)
    assert j.load()[0] == []
    assert j.get(t.id).state == State.SUCCEEDED


def test_journal_reads_see_pending_writes(journal_factory):
    j = journal_factory()
    t = jtask(1, state=State.FAILED, finished=5.0)
    j.put(t)  # not waited for: still pending in memory
    assert j.get(t.id) == t
    assert [x.id for x in j.list("q", "failed", 10)] == [t.id]
    j.flush()
    assert j.get(t.id) == t
    assert [x.id for x in j.list("q", "failed", 10)] == [t.id]


def test_journal_counts_and_list(journal_factory):
    j = journal_factory()
    j.put_many([jtask(i, state=State.SUCCEEDED, finished=float(i)) for i in range(5)]
               + [jtask(10 + i, state=State.FAILED, finished=float(i), queue="other") for i in range(2)]
               + [jtask(20)], wait=True)
    # every row is counted, live ones too (the engine splits them into running/scheduled)
    assert j.counts() == {"q": {"succeeded": 5, "scheduled": 1}, "other": {"failed": 2}}
    assert j.counts(primary_only=True) == j.counts()
    newest_first = [t.id for t in j.list("q", "succeeded", 3)]
    assert newest_first == ["t00004", "t00003", "t00002"]
    assert j.list("q", "failed", 10) == []
    assert len(j.list("other", "failed", 10)) == 2


def test_journal_states_lists_every_copy_up_to_a_limit(journal_factory):
    j = journal_factory()
    j.put_many([jtask(i, state=State.SUCCEEDED, finished=float(i)) for i in range(3)]
               + [jtask(10, queue="other")], wait=True)
    assert sorted(j.states(4)) == [("other", "scheduled", "t00010"), ("q", "succeeded", "t00000"),
                                   ("q", "succeeded", "t00001"), ("q", "succeeded", "t00002")]
    assert j.states(3) is None  # more copies than asked for: none listed


def test_journal_delete(journal_factory):
    j = journal_factory()
    j.put(jtask(1), wait=True)
    j.delete("t00001")
    j.flush()
    assert j.get("t00001") is None
    assert j.load()[0] == []


def test_journal_sweep(journal_factory):
    j = journal_factory()
    now = 10_000.0
    j.put_many([jtask(1, state=State.SUCCEEDED, finished=now - 100),
                jtask(2, state=State.FAILED, finished=now - 5),
                jtask(3, state=State.CANCELLED, finished=now - 200),
                jtask(4)], wait=True)
    j.put(jtask(5, name="old"), name_expires=now - 1)
    j.put(jtask(6, name="fresh"), name_expires=now + 100, wait=True)
    removed = j.sweep(now, retention=50)
    assert removed == 3  # two expired tasks, one expired name
    assert j.get("t00001") is None and j.get("t00003") is None
    assert j.get("t00002") is not None and j.get("t00004") is not None
    assert j.get("t00005") is not None  # a live task is never swept
    _, names, _ = j.load()
    assert set(names) == {("q", "fresh")}


def test_journal_paused_queues_and_names(journal_factory):
    j = journal_factory()
    j.set_paused("a", True)
    j.set_paused("b", True)
    j.set_paused("b", False)
    j.put(jtask(1, name="n"), name_expires=99.0)
    j.release_name("q", "n")
    j.flush()
    _, names, paused = j.load()
    assert paused == {"a": True, "b": False}
    assert names == {}


def test_journal_group_commit(journal_factory):
    j = journal_factory()
    before = j.commits
    greenlets = [gevent.spawn(j.put, jtask(i), wait=True) for i in range(200)]
    gevent.joinall(greenlets, raise_error=True, timeout=30)
    assert all(g.successful() for g in greenlets)
    commits = j.commits - before
    assert 1 <= commits <= 20, commits  # many tasks per transaction, not one each
    assert len(j.load()[0]) == 200


def test_under_load_a_group_lingers_while_each_wait_brings_a_record(journal_factory,
                                                                     monkeypatch):
    """A cluster node's waited STOREs come one greenlet at a time: under load a group
    waits while each short wait brought another (up to MAX_LINGER), so records that come
    a step apart share a few groups instead of taking one group each. (The steps are
    scaled up 10x here: gevent's timers cannot wait less than a millisecond.)"""
    monkeypatch.setattr(journal_mod, "BUSY_WINDOW", 0.02)
    monkeypatch.setattr(journal_mod, "LINGER", 0.005)
    monkeypatch.setattr(journal_mod, "MAX_LINGER", 0.03)
    j = journal_factory()
    j.put(jtask(0), wait=True)  # a group just ended: the next one is under load
    before, writers = j.commits, []
    for i in range(1, 41):
        writers.append(gevent.spawn(j.put, jtask(i), wait=True))
        gevent.sleep(0.002)
    gevent.joinall(writers, raise_error=True, timeout=30)
    assert all(w.successful() for w in writers)
    assert len(j.load()[0]) == 41
    # ~80 ms of arrivals in groups of up to 30 ms: 3-4; one step per group gives ~16
    assert j.commits - before <= 8, j.commits - before


def test_journal_wait_means_committed(journal_factory, tmp_path):
    """After put(wait=True) returns, another connection sees the row (it is committed)."""
    j = journal_factory()
    j.put(jtask(7), wait=True)
    db = sqlite3.connect(os.path.join(tmp_path, "data", "journal.sqlite3"))
    try:
        rows = db.execute("SELECT id, state FROM tasks").fetchall()
    finally:
        db.close()
    assert rows == [("t00007", "scheduled")]


def test_journal_close_flushes_pending(journal_factory):
    j = journal_factory()
    j.put_many([jtask(i) for i in range(50)])  # not waited for
    j.close()
    j2 = journal_factory()
    assert len(j2.load()[0]) == 50


def test_journal_skips_unreadable_rows(journal_factory, tmp_path):
    j = journal_factory()
    j.put(jtask(1), wait=True)
    j.close()
    db = sqlite3.connect(os.path.join(tmp_path, "data", "journal.sqlite3"))
    db.execute("INSERT INTO tasks (id, queue, state, data) VALUES ('bad', 'q', 'scheduled', '{not json')")
    db.execute("INSERT INTO tasks (id, queue, state, data) VALUES ('bad2', 'q', 'scheduled', '{\"id\": 5}')")
    db.commit()
    db.close()
    j2 = journal_factory()
    tasks, _, _ = j2.load()
    assert [t.id for t in tasks] == ["t00001"]


def test_journal_survives_a_record_it_cannot_encode(journal_factory):
    """One bad record (text with no UTF-8 form, e.g. from a peer) must not kill the writer:
    later writes still commit."""
    j = journal_factory()
    for bad in (jtask(1, params={"k": "\ud800"}), jtask(3, id="bad-\udc00"),
                jtask(4, name="\ud800"), jtask(5, queue="q\ud800")):
        try:
            j.put(bad, wait=True, name_expires=99.0)
        except Exception:
            pass
    good = jtask(2)
    g = gevent.spawn(j.put, good, wait=True)
    g.join(timeout=5)
    assert g.successful(), "the journal writer died on an unencodable record"
    j.close()
    j2 = journal_factory()
    ids = [t.id for t in j2.load()[0]]
    assert "t00002" in ids
    if "t00001" in ids:  # kept: then it must round-trip exactly
        assert j2.get("t00001").params == {"k": "\ud800"}


def test_journal_memory(journal_factory):
    j = journal_factory(":memory:")
    j.put(jtask(1), wait=True)
    assert j.get("t00001") is not None
    assert len(j.load()[0]) == 1
    assert j.size_bytes() == 0


def test_journal_reports_each_commits_time(tmp_path):
    took: list[float] = []
    j = Journal(str(tmp_path / "data"), on_commit=took.append)
    j.open()
    try:
        j.put(jtask(1), wait=True)
        j.put(jtask(2), wait=True)
        assert len(took) == 2 == j.commits and all(0 <= t < 5 for t in took)
    finally:
        j.close()


def test_journal_reads_past_the_recent_records_ask_the_file(journal_factory, monkeypatch):
    from miyamoto.store import journal as jmod
    monkeypatch.setattr(jmod, "RECENT_MAX", 3)
    j = journal_factory()
    for i in range(6):
        j.put(jtask(i), wait=True)
    assert len(j._recent) == 3
    assert [j.get(f"t{i:05d}").id for i in range(6)] == [f"t{i:05d}" for i in range(6)]
    assert j.live_copy("t00000") == jtask(0) and j.live_copy("nope") is None
    j.put(jtask(0, state=State.SUCCEEDED, finished=5.0), wait=True)
    assert j.live_copy("t00000") is None  # ended: pending or committed, not live
    for i in range(1, 5):
        j.put(jtask(i).evolve(attempts=1), wait=True)  # t00000 leaves the recent ones
    assert "t00000" not in j._recent and j.live_copy("t00000") is None
    assert j.get("t00000").state == State.SUCCEEDED


def test_journal_size_counts_the_file_and_its_wal(journal_factory, tmp_path):
    j = journal_factory()
    j.put_many([jtask(i) for i in range(50)], wait=True)
    # the first commit starts a checkpoint on the journal's thread: measured during it,
    # the files grow between our look and the journal's
    deadline = time.monotonic() + 10
    while j._checkpointing:
        assert time.monotonic() < deadline, "the journal's checkpoint never ended"
        gevent.sleep(0.01)
    base = tmp_path / "data" / "journal.sqlite3"
    parts = sum(os.path.getsize(str(base) + s) for s in ("", "-wal", "-shm")
                if os.path.exists(str(base) + s))
    assert j.size_bytes() == parts > os.path.getsize(base)


def test_journal_a_pending_name_is_read_before_the_file(journal_factory):
    j = journal_factory()
    j.put(jtask(1, name="n"), name_expires=50.0, wait=True)
    assert j.name_holder("q", "n") == ("t00001", 50.0)
    j.release_name("q", "n")  # pending: the file still holds it
    assert j.name_holder("q", "n") is None
    j.flush()
    assert j.name_holder("q", "n") is None and j.name_holder("q", "other") is None


def test_journal_reads_what_is_committed_while_it_cannot_write(journal_factory, monkeypatch):
    import sqlite3 as sql
    j = journal_factory()
    j.put(jtask(1, state=State.FAILED, finished=1.0), wait=True)

    def broken(*args):
        raise sql.OperationalError("disk I/O error")
    monkeypatch.setattr(j, "_commit", broken)
    j.put(jtask(2, state=State.FAILED, finished=2.0))  # cannot be committed
    # the list answers from the file (and what it holds), not with an error
    assert [t.id for t in j.list("q", "failed", 10)] == ["t00001"]
    assert j.counts() == {"q": {"failed": 1}}
    assert not j.health.ok and j.health.problem == "cannot write"
    monkeypatch.undo()
    j.flush()
    assert [t.id for t in j.list("q", "failed", 10)] == ["t00002", "t00001"]
    assert j.health.ok


def test_write_tasks_fills_a_journal_in_one_transaction(tmp_path):
    from miyamoto.store.file import JournalFile
    from miyamoto.store.journal import write_tasks
    f = JournalFile(str(tmp_path), str(tmp_path / "journal.sqlite3"), sync_full=False)
    f.open()
    try:
        assert write_tasks(f.db, [jtask(i) for i in range(3)]) == 3
        with pytest.raises(sqlite3.IntegrityError):
            write_tasks(f.db, [jtask(9), jtask(10, queue=None)])  # NOT NULL: all or none
        assert not f.db.in_transaction
    finally:
        f.close()
        f.release()
    j = Journal(str(tmp_path))
    j.open()
    try:
        assert sorted(t.id for t in j.load()[0]) == ["t00000", "t00001", "t00002"]
    finally:
        j.close()


def test_a_row_whose_record_is_not_an_object_is_skipped(caplog):
    from miyamoto.store.rows import decode_row, task_row
    t = jtask(1)
    row = task_row(t)
    assert decode_row((1, row[0], row[1], row[2], row[5], row[6])) == t
    assert decode_row((1, "t", "q", "scheduled", 5.0, "[1, 2]")) is None
    assert "task is not an object" in caplog.text
    ended = jtask(2, state=State.SUCCEEDED, finished=9.0)
    r = task_row(ended)
    assert r[5] == 9.0 and decode_row((1, r[0], r[1], r[2], r[5], r[6])) == ended


def test_journal_syncs_normally_unless_asked_for_full(tmp_path):
    """sync_full (fsync on every commit) is the option; the default is WAL's NORMAL."""
    for kw, level in (({}, 1), ({"sync_full": True}, 2)):
        j = Journal(str(tmp_path / str(level)), **kw)
        j.open()
        try:
            assert j._run(lambda: j._file.conn().execute("PRAGMA synchronous").fetchone()[0]) \
                == level
        finally:
            j.close()


def test_journal_counts_a_rewritten_task_once(journal_factory):
    """A copy's row is replaced at every change of state: the counts follow the row."""
    j = journal_factory()
    t = jtask(1)
    j.put(t, wait=True)
    j.put(t.evolve(state=State.RUNNING), wait=True)
    j.put(t.evolve(state=State.SUCCEEDED, finished=5.0), wait=True)
    assert j.counts() == {"q": {"succeeded": 1}}
    j.delete(t.id)
    assert j.counts() == {}


def test_journal_knows_whether_it_ran_here_before(tmp_path):
    fresh = Journal(str(tmp_path / "d"))
    assert fresh.existed is False
    fresh.open()
    assert fresh.existed is False
    fresh.close()
    again = Journal(str(tmp_path / "d"))
    again.open()
    assert again.existed is True
    again.close()
    memory = Journal(":memory:")
    memory.open()
    assert memory.existed is False and memory._watcher is None
    memory.close()


def test_journal_close_ends_its_greenlets_thread_and_files(tmp_path):
    before_fds = len(os.listdir("/proc/self/fd"))
    before_threads = set(os.listdir("/proc/self/task"))
    j = Journal(str(tmp_path / "d"))
    j.open()
    j.put(jtask(1), wait=True)
    mine = set(os.listdir("/proc/self/task")) - before_threads  # its database thread
    assert len(mine) == 1
    writer, watcher = j._writer, j._watcher
    j.close()
    assert writer.dead and watcher.dead
    assert len(os.listdir("/proc/self/fd")) == before_fds  # the file and the lock closed
    deadline = time.monotonic() + 5
    while mine & set(os.listdir("/proc/self/task")):
        assert time.monotonic() < deadline, "the database thread did not end"
        gevent.sleep(0.005)
    j.close()  # twice is harmless
    for late in (lambda: j.put(jtask(2)), lambda: j.put_many([jtask(2)]),
                 lambda: j.delete("t00001"), lambda: j.release_name("q", "n"),
                 lambda: j.set_paused("q", True)):
        with pytest.raises(JournalClosed):
            late()


def test_journal_close_waits_for_the_commit_in_flight(tmp_path, monkeypatch):
    """The writer finishes the group it is committing: its waiter hears success. (With
    fsync on: the commit runs on the database thread, where a close can find it.)"""
    import threading
    j = Journal(str(tmp_path / "d"), sync_full=True)
    j.open()
    started, release = threading.Event(), threading.Event()
    real = j._commit

    def slow(*args):
        started.set()
        release.wait(10)
        return real(*args)
    monkeypatch.setattr(j, "_commit", slow)
    waiter = gevent.spawn(j.put, jtask(1), wait=True)
    deadline = time.monotonic() + 5
    while not started.is_set():
        assert time.monotonic() < deadline
        gevent.sleep(0.005)
    closer = gevent.spawn(j.close)
    gevent.sleep(0.02)
    release.set()
    closer.join(10)
    waiter.join(10)
    assert waiter.successful(), waiter.exception
    monkeypatch.undo()
    again = Journal(str(tmp_path / "d"))
    again.open()
    assert [t.id for t in again.load()[0]] == ["t00001"]
    again.close()


def test_writes_nobody_waits_for_are_committed_soon_without_blocking(journal_factory):
    j = journal_factory()
    j.put(jtask(1, name="n"), name_expires=99.0, wait=True)
    before = j.commits
    j.put_many([jtask(2), jtask(3)])
    j.delete("t00001")
    j.release_name("q", "n")
    assert j.commits == before  # none of them waited for its group
    deadline = time.monotonic() + 5
    while j.commits == before:
        assert time.monotonic() < deadline, "the lazy group was never committed"
        gevent.sleep(0.002)
    assert j.commits == before + 1  # one group for all of them
    assert sorted(t.id for t in j.load()[0]) == ["t00002", "t00003"]
    assert j.load()[1] == {}
    for lazy in (lambda: j.delete("t00002"), lambda: j.release_name("q", "m")):
        before = j.commits
        lazy()  # alone: it starts the lazy group itself
        assert j.commits == before
        while j.commits == before:
            assert time.monotonic() < deadline + 5, "the lazy group was never committed"
            gevent.sleep(0.002)


def test_a_name_is_reserved_only_with_its_expiry(journal_factory):
    j = journal_factory()
    j.put(jtask(1, name="n"), wait=True)  # a copy's update: no reservation
    assert j.name_holder("q", "n") is None and j.health.ok
    j.put(jtask(2), name_expires=50.0, wait=True)  # no name: nothing to reserve
    assert j.load()[1] == {}


def test_withdraw_takes_back_only_its_own_record_and_name(journal_factory):
    j = journal_factory()
    mine, theirs = jtask(1, name="n"), jtask(2, name="n")
    j.put(theirs, name_expires=50.0)
    j.put(mine)  # pending, not the name's holder
    j.withdraw(mine)
    j.withdraw(jtask(3, name="other"))  # nothing of it is pending
    j.flush()
    assert j.get("t00001") is None and j.name_holder("q", "n") == ("t00002", 50.0)
    newer = jtask(2, name="n").evolve(attempts=1)
    j.put(newer)
    j.withdraw(theirs)  # a newer record of the same task is not the one withdrawn
    j.flush()
    assert j.get("t00002") == newer


def test_a_deleted_file_makes_the_next_commit_fail_as_moved(tmp_path):
    j = Journal(str(tmp_path / "d"))  # the watcher looks once a second: the commit is first
    j.open()
    try:
        j.put(jtask(1), wait=True)
        os.remove(tmp_path / "d" / "journal.sqlite3")
        with pytest.raises(Unavailable, match="its file was deleted or replaced"):
            j.put(jtask(2), wait=True)
        assert j.health.problem == "its file was deleted or replaced"
    finally:
        j.close()


def _plans(j: Journal, run, monkeypatch) -> list[str]:
    """What SQLite's planner does for each SELECT ``run()`` makes the journal send, with
    its parameters bound as the journal binds them (literals can plan better)."""
    sent: list[tuple[str, tuple]] = []
    real = j._query

    def query(sql: str, args: tuple = ()) -> list[tuple]:
        sent.append((sql, args))
        return real(sql, args)
    monkeypatch.setattr(j, "_query", query)
    run()
    monkeypatch.undo()
    return [" / ".join(r[3] for r in j._query("EXPLAIN QUERY PLAN " + sql, args))
            for sql, args in sent if sql.lstrip().upper().startswith("SELECT")]


def test_journal_browse_pages_by_key_in_a_lists_order(journal_factory):
    j = journal_factory()
    tasks = [jtask(i, queue="a" if i % 2 else "b") for i in range(10)]
    tasks += [jtask(i, state=State.FAILED, finished=500.0 - i) for i in range(10, 14)]
    j.put_many(tasks, wait=True)
    rows, last, read = j.browse("scheduled", None, None, 4)
    assert [t.id for _, t in rows] == ["t00000", "t00001", "t00002", "t00003"]
    assert (last, read) == ((103.0, "t00003"), 4)
    assert [at for at, _ in rows] == [100.0, 101.0, 102.0, 103.0]
    after = (rows[-1][0], rows[-1][1].id)
    assert [t.id for _, t in j.browse("scheduled", None, after, 3)[0]] == \
        ["t00004", "t00005", "t00006"]
    assert [t.id for _, t in j.browse("scheduled", "a", after, 10)[0]] == \
        ["t00005", "t00007", "t00009"]
    ended, _, _ = j.browse("failed", None, None, 10)  # the last ended first
    assert [t.id for _, t in ended] == ["t00010", "t00011", "t00012", "t00013"]
    assert [t.id for _, t in j.browse("failed", "q", (489.0, "t00011"), 10)[0]] == \
        ["t00012", "t00013"]
    # keep sees each row's replica and raw record; only what it keeps is decoded
    seen: list[tuple[int, str]] = []
    rows, last, read = j.browse("scheduled", "a", None, 10,
                                lambda replica, data: seen.append((replica, data)) or False)
    assert rows == [] and read == len(seen) == 5 and last == (109.0, "t00009")
    assert all(r == 0 and '"url":"http://w/x"' in d for r, d in seen)
    # with want, it stops decoding there: the rows read end at the last one it kept
    rows, last, read = j.browse("scheduled", "a", None, 10, None, 2)
    assert [t.id for _, t in rows] == ["t00001", "t00003"] and (last, read) == ((103.0, "t00003"), 2)
    # a tie on the time is broken by the id, in the list's direction
    j.put_many([jtask(20, fire_at=103.0), jtask(21, fire_at=103.0)], wait=True)
    assert [t.id for _, t in j.browse("scheduled", None, (103.0, "t00003"), 2)[0]] == \
        ["t00020", "t00021"]


def test_journal_browse_reads_from_the_cursor_through_an_index(journal_factory, monkeypatch):
    """A page must cost its rows, not the journal's: every shape of the query searches
    an index from the cursor on and never scans the table."""
    j = journal_factory()
    j.put_many([jtask(i) for i in range(5)], wait=True)
    for state in ("scheduled", "failed"):
        for queue in (None, "q"):
            plans = _plans(j, lambda: j.browse(state, queue, (101.0, "t00001"), 10),
                           monkeypatch)
            assert plans, "no SELECT seen"
            for plan in plans:
                assert "USING INDEX" in plan and re.search(r"\bat[<>]\?", plan), plan
                assert "SCAN tasks" not in plan, plan


def test_journal_browse_by_label_and_time_range(journal_factory, monkeypatch):
    """A label's first copies, in a list's order, from the labels table's key: kept by
    the triggers as a task changes state and is deleted; since/until bound ``at``."""
    j = journal_factory()
    j.put_many([jtask(i, labels={"team": "a" if i % 2 else "b", "env": "prod"})
                for i in range(8)] + [jtask(8), jtask(9, replica=1, replicas=("x", "y"),
                                                     labels={"team": "a"})], wait=True)
    rows, last, read = j.browse("scheduled", None, None, 10, label=("team", "a"))
    assert [t.id for _, t in rows] == ["t00001", "t00003", "t00005", "t00007"]  # no replica 1
    after = (103.0, "t00003")
    assert [t.id for _, t in j.browse("scheduled", None, after, 10, label=("team", "a"))[0]] \
        == ["t00005", "t00007"]
    assert [t.id for _, t in j.browse("scheduled", None, None, 10, label=("team", "a"),
                                      since=102.0, until=106.0)[0]] == ["t00003", "t00005"]
    assert [t.id for _, t in j.browse("scheduled", "q", None, 10, since=107.5)[0]] == \
        ["t00008", "t00009"]
    # an ended task moves to its state's range; a deleted one leaves the table
    j.put(jtask(1, labels={"team": "a"}, state=State.FAILED, finished=300.0))
    j.delete("t00003")
    j.flush()
    assert [t.id for _, t in j.browse("scheduled", None, None, 10, label=("team", "a"))[0]] \
        == ["t00005", "t00007"]
    assert [t.id for _, t in j.browse("failed", None, None, 10, label=("team", "a"))[0]] == \
        ["t00001"]
    assert j._query("SELECT COUNT(*) FROM labels WHERE id = 't00003'") == [(0,)]
    for state in ("scheduled", "failed"):
        plans = _plans(j, lambda: j.browse(state, None, (101.0, "t00001"), 10,
                                           label=("env", "prod"), since=50.0), monkeypatch)
        assert plans
        for plan in plans:
            assert "SEARCH l USING PRIMARY KEY" in plan and "SCAN" not in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # in the page's order already


def test_journal_rows_walks_every_copy_written_up_to_a_mark(journal_factory):
    j = journal_factory()
    j.put(jtask(1), wait=True)
    j.put(jtask(2, state=State.SUCCEEDED), wait=True)
    mark = j.last_rowid()
    j.put(jtask(3), wait=True)  # written after the mark: not in the walk
    first = j.rows(0, mark, 1)
    assert [t.id for _, t in first] == [jtask(1).id]
    rest = j.rows(first[-1][0], mark, 10)
    assert [(t.id, t.state) for _, t in rest] == [(jtask(2).id, State.SUCCEEDED)]
    assert j.rows(rest[-1][0], mark, 10) == []


def test_journal_a_rewritten_record_stays_among_the_recent_ones(journal_factory, monkeypatch):
    """The recent records are kept newest last: a copy written again moves to the end,
    so the ones the next writes push out are those not written for longest."""
    monkeypatch.setattr(journal_mod, "RECENT_MAX", 3)
    j = journal_factory()
    for i in range(3):
        j.put(jtask(i), wait=True)
    j.put(jtask(0).evolve(attempts=1), wait=True)  # t00000 written again: now the newest
    j.put(jtask(3), wait=True)
    assert list(j._recent) == ["t00002", "t00000", "t00003"]


def test_journal_load_running_gives_the_running_copies_and_the_paused_queues(journal_factory):
    j = journal_factory()
    j.put(jtask(1, state=State.RUNNING, accepted=1), wait=True)
    j.put(jtask(2), wait=True)
    j.set_paused("q", True)
    tasks, queues = j.load_running()
    assert [t.id for t in tasks] == ["t00001"] and tasks[0].state == State.RUNNING
    assert queues == {"q": True}


def test_journal_walks_include_the_writes_still_waiting_for_their_group(journal_factory):
    """live_rows and rows read the file, so they commit what was handed in first: a
    copy put a moment ago (not waited for) is in the walk."""
    j = journal_factory()
    j.put(jtask(1), wait=True)
    mark = j.last_rowid()
    j.put(jtask(2))  # no wait: still in the journal's group
    assert [t.id for _, t in j.live_rows(0, 10)] == ["t00001", "t00002"]
    j.put(jtask(3))
    assert [t.id for _, t in j.rows(mark, 10**9, 10)] == ["t00002", "t00003"]


def test_a_commit_without_fsync_runs_on_the_hub_and_one_with_fsync_on_the_thread(tmp_path):
    """No fsync: the group commit only writes the WAL, cheaper than a hand-off to the
    database thread, so the hub runs it (when the thread is idle); with fsync the
    thread does, and the hub goes on meanwhile."""
    import threading
    for sync_full, on_hub in ((False, True), (True, False)):
        j = Journal(str(tmp_path / f"d{sync_full}"), sync_full=sync_full)
        j.open()
        real, threads = j._commit, []

        def commit(*args, real=real, threads=threads):
            threads.append(threading.get_ident())
            return real(*args)
        j._commit = commit
        j.put(jtask(1), wait=True)
        assert (threads == [threading.get_ident()]) is on_hub, (sync_full, threads)
        j.close()


def test_the_wal_is_checkpointed_by_the_journal_not_inside_a_commit(tmp_path, monkeypatch):
    """SQLite's own checkpoint (an fsync, inside the commit that crosses its mark) is off
    where commits run on the hub; the journal checkpoints on the thread, at most every
    CHECKPOINT_EVERY, and only after commits."""
    monkeypatch.setattr(journal_mod, "CHECKPOINT_EVERY", 0.05)
    j = Journal(str(tmp_path / "d"))
    j.open()
    assert j._file.conn().execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    real, done = j._file.checkpoint, []
    monkeypatch.setattr(j._file, "checkpoint", lambda: (real(), done.append(1)))
    j.put(jtask(1), wait=True)  # the first commit: the first checkpoint
    deadline = time.monotonic() + 5
    while not done:
        assert time.monotonic() < deadline, "no checkpoint after a commit"
        gevent.sleep(0.005)
    gevent.sleep(0.1)
    assert len(done) == 1  # none without commits
    j.put(jtask(2), wait=True)
    while len(done) < 2:
        assert time.monotonic() < deadline, "no checkpoint after a later commit"
        gevent.sleep(0.005)
    busy, wal, moved = j._file.conn().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert busy == 0 and wal == moved  # every frame is in the file
    j.close()
    full = Journal(str(tmp_path / "f"), sync_full=True)
    full.open()  # commits on the thread, which may fsync: SQLite's checkpoint stays on
    assert full._file.conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] > 0
    full.close()
