"""The journal's file in process, on real SQLite files: noticed when it is deleted or
replaced under the journal and rebuilt from the open copy (a file moved over ours is
kept aside), a removed data dir made again with its lock, a lock taken by a rival
stopping the writes until it is ours again, and the health the watcher reports. The
same on real node processes: tests/nodes/test_journal_health.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from dispatchkit import wait_for
from miyamoto.errors import Unavailable
from miyamoto.store import journal as journal_mod
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task

JOURNAL = "journal.sqlite3"


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _jtask(i: int) -> Task:
    return Task(id=f"t{i}", queue="q", url="http://127.0.0.1:9/", eta=1e12, fire_at=1e12,
                created=1.0)


@pytest.fixture
def fast_watch(monkeypatch):
    monkeypatch.setattr(journal_mod, "WATCH_INTERVAL", 0.05)


def _reopened_ids(data_dir: Path) -> list[str]:
    again = Journal(str(data_dir))
    again.open()
    try:
        return sorted(t.id for t in again.load()[0])
    finally:
        again.close()


@pytest.mark.timeout(30)
def test_a_replaced_journal_is_kept_aside_and_ours_put_back(tmp_path, fast_watch):
    journal = Journal(str(tmp_path))
    journal.open()
    for i in range(5):
        journal.put(_jtask(i), wait=True)
    path = tmp_path / JOURNAL
    other = tmp_path / "other.sqlite3"
    sqlite3.connect(other).executescript("CREATE TABLE mine (x); INSERT INTO mine VALUES (7);")
    os.replace(other, path)
    replaced_inode = _inode(path)
    wait_for(lambda: _inode(path) != replaced_inode and journal.health.ok)
    journal.put(_jtask(5), wait=True)
    journal.close()
    (aside,) = tmp_path.glob(JOURNAL + ".replaced-*")
    assert sqlite3.connect(aside).execute("SELECT x FROM mine").fetchall() == [(7,)]
    assert _reopened_ids(tmp_path) == [f"t{i}" for i in range(6)]


@pytest.mark.timeout(30)
def test_a_removed_data_dir_is_made_again_with_its_lock(tmp_path, fast_watch):
    data = tmp_path / "data"
    journal = Journal(str(data))
    journal.open()
    journal.put(_jtask(1), wait=True)
    shutil.rmtree(data)
    wait_for(lambda: (data / JOURNAL).exists() and journal.health.ok)
    assert (data / "lock").read_text().strip() == str(os.getpid())
    journal.put(_jtask(2), wait=True)
    journal.close()
    assert _reopened_ids(data) == ["t1", "t2"]


@pytest.mark.timeout(30)
def test_a_lock_taken_by_another_process_stops_the_writes(tmp_path, fast_watch):
    """The lock file is replaced and someone else locks the new one (a second node
    started while ours ran): writing on would mix two nodes in one journal."""
    journal = Journal(str(tmp_path))
    journal.open()
    journal.put(_jtask(1), wait=True)
    lock = tmp_path / "lock"
    os.remove(lock)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # another open file description: a rival
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"4242\n")
        wait_for(lambda: journal.health.problem == journal_mod.LOCK_LOST)
        with pytest.raises(Unavailable):
            journal.put(_jtask(2), wait=True)
    finally:
        os.close(fd)  # the rival exits
    wait_for(lambda: journal.health.ok)
    assert lock.read_text().strip() == str(os.getpid())
    journal.put(_jtask(3), wait=True)
    journal.close()
    assert _reopened_ids(tmp_path) == ["t1", "t2", "t3"]  # t2 was kept queued, then written


# ================================================================ the file alone

from miyamoto.store import file as jfile  # noqa: E402
from miyamoto.store.datadir import DataDirLock, DataDirLocked  # noqa: E402
from miyamoto.store.file import JournalFile, JournalMoved, JournalUnavailable  # noqa: E402


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def opened(tmp_path: Path) -> JournalFile:
    f = JournalFile(str(tmp_path), str(tmp_path / JOURNAL), sync_full=False)
    f.open()
    return f


def test_a_file_that_is_not_sqlite_fails_the_open_and_frees_the_lock(tmp_path: Path) -> None:
    (tmp_path / JOURNAL).write_bytes(b"this is not a database" * 100)
    f = JournalFile(str(tmp_path), str(tmp_path / JOURNAL), sync_full=False)
    before = open_fds()
    with pytest.raises(sqlite3.DatabaseError):
        f.open()
    assert f.db is None and open_fds() == before  # neither the lock nor the file held
    other = DataDirLock(str(tmp_path))
    other.acquire()  # the failed open let go of the data dir
    other.release()


def test_a_second_file_on_the_data_dir_is_refused(tmp_path: Path) -> None:
    f = opened(tmp_path)
    with pytest.raises(DataDirLocked):
        opened(tmp_path)
    f.close()
    f.release()


def test_writes_are_refused_while_the_file_is_not_ours(tmp_path: Path) -> None:
    f = opened(tmp_path)
    assert f.writable() is f.db and not f.moved()
    os.remove(tmp_path / JOURNAL)
    assert f.moved()
    with pytest.raises(JournalMoved):
        f.writable()
    before = open_fds()
    f.rebuild()
    assert not f.moved() and f.writable() is f.db
    assert open_fds() == before  # the copy's connection closed, the lost file's too
    f.lock_lost = True
    with pytest.raises(DataDirLocked):
        f.writable()
    f.close()
    with pytest.raises(JournalUnavailable):
        f.conn()
    f.release()


def test_sync_full_and_wal(tmp_path: Path) -> None:
    f = JournalFile(str(tmp_path), str(tmp_path / JOURNAL), sync_full=True)
    f.open()
    assert f.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert f.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    f.close()
    f.release()
    g = opened(tmp_path)
    assert g.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    g.close()
    g.release()


def test_close_checkpoints_the_wal_into_the_file(tmp_path: Path) -> None:
    """After close the main file alone holds every commit, even while another process
    (a backup, an operator's sqlite3 shell) keeps the WAL open."""
    f = opened(tmp_path)
    f.probe(5.0)
    reader = sqlite3.connect(tmp_path / JOURNAL)
    reader.execute("SELECT 1 FROM meta").fetchall()
    assert (tmp_path / (JOURNAL + "-wal")).stat().st_size > 0
    f.close()
    f.release()
    try:
        assert (tmp_path / (JOURNAL + "-wal")).stat().st_size == 0
        shutil.copy(tmp_path / JOURNAL, tmp_path / "copy.sqlite3")
        copy = sqlite3.connect(tmp_path / "copy.sqlite3")
        assert copy.execute("SELECT value FROM meta WHERE key = 'probe'").fetchone() == ("5.0",)
        copy.close()
    finally:
        reader.close()


class FailingDb:
    """A connection whose INSERT fails (a full disk); the rest is the real one's."""

    def __init__(self, db: sqlite3.Connection, rollback_fails: bool = False):
        self.db = db
        self.rollback_fails = rollback_fails
        self.executescript = db.executescript

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def execute(self, sql: str, *args: object) -> object:
        if sql.startswith("INSERT"):
            raise sqlite3.OperationalError("database or disk is full")
        if sql == "ROLLBACK" and self.rollback_fails:
            raise sqlite3.OperationalError("cannot rollback")
        return self.db.execute(sql, *args)


def test_a_failed_probe_rolls_back(tmp_path: Path) -> None:
    f = opened(tmp_path)
    real = f.db
    f.db = FailingDb(real)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        f.probe(1.0)
    assert not real.in_transaction
    f.db = FailingDb(real, rollback_fails=True)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):  # not the rollback's
        f.probe(1.0)
    real.execute("ROLLBACK")
    f.db = real
    f.probe(2.0)
    assert real.execute("SELECT value FROM meta WHERE key = 'probe'").fetchone() == ("2.0",)
    jfile.rollback(real)  # no transaction: nothing to do
    f.close()
    f.release()


def test_a_journal_of_an_earlier_version_is_migrated_once(tmp_path: Path) -> None:
    """Before the ``replica`` and ``at`` columns and the ``counts`` table: the rows get
    their ``at`` (a live copy's fire time, an ended one's end) and are counted."""
    old = sqlite3.connect(tmp_path / JOURNAL)
    old.executescript("""
        CREATE TABLE tasks (id TEXT PRIMARY KEY, queue TEXT NOT NULL, state TEXT NOT NULL,
                            finished REAL, data TEXT NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
        INSERT INTO tasks VALUES ('a', 'q', 'scheduled', NULL,
            '{"url": "http://x/", "method": "POST", "eta": 1.0, "fire_at": 7.5}');
        INSERT INTO tasks VALUES ('b', 'q', 'succeeded', 9.0,
            '{"url": "http://x/", "method": "POST", "eta": 1.0, "fire_at": 2.0}');
    """)
    old.close()
    f = opened(tmp_path)
    assert dict(f.db.execute("SELECT id, at FROM tasks").fetchall()) == {"a": 7.5, "b": 9.0}
    assert sorted(f.db.execute("SELECT queue, state, first, n FROM counts").fetchall()) == [
        ("q", "scheduled", 1, 1), ("q", "succeeded", 1, 1)]
    assert f.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (
        jfile.SCHEMA_VERSION,)
    columns = {row[1] for row in f.db.execute("PRAGMA table_info(tasks)")}
    assert {"replica", "at"} <= columns
    f.db.execute("UPDATE counts SET n = 5")  # a migrated journal is not counted again
    f.close()
    f.release()
    g = opened(tmp_path)
    assert {n for (n,) in g.db.execute("SELECT n FROM counts")} == {5}
    g.close()
    g.release()


def test_health_reports_a_problem_once_and_its_end(caplog: pytest.LogCaptureFixture) -> None:
    h = jfile.Health()
    assert h.ok and h.failures == 0
    h.failed("cannot write", OSError(28, "No space left"))
    since = h.since
    h.failed("cannot write")
    assert not h.ok and h.problem == "cannot write" and h.failures == 2 and h.since == since
    assert caplog.text.count("enqueues get 503") == 1
    assert "OSError: [Errno 28] No space left" in caplog.text
    h.failed("its file was deleted or replaced")
    assert caplog.text.count("enqueues get 503") == 2 and h.since == since
    h.recovered()
    assert h.ok and h.failures == 0 and "3 failed attempts" in caplog.text
    h.recovered()
    assert caplog.text.count("writing again") == 1


def test_a_migration_that_fails_is_done_again_at_the_next_open(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / JOURNAL, isolation_level=None)
    old.executescript("CREATE TABLE tasks (id TEXT PRIMARY KEY, queue TEXT NOT NULL, "
                      "state TEXT NOT NULL, finished REAL, data TEXT NOT NULL);"
                      "INSERT INTO tasks VALUES ('a', 'q', 'scheduled', NULL, '{}');")
    old.executescript(jfile.SCHEMA)
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        jfile.migrate(FailingDb(old))  # type: ignore[arg-type]
    assert not old.in_transaction
    assert old.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() is None
    old.close()
    f = opened(tmp_path)
    assert f.db.execute("SELECT n FROM counts").fetchall() == [(1,)]
    f.close()
    f.release()


def test_install_removes_a_stale_wal_so_sqlite_cannot_replay_it(tmp_path: Path) -> None:
    """A -wal left at the path (another file's, moved in with it) would be replayed into
    the rebuilt file at its first open: SQLite checks only that the WAL is well formed."""
    path = str(tmp_path / JOURNAL)
    ours = sqlite3.connect(path + ".rebuild")
    ours.execute("CREATE TABLE mine (x)")
    ours.execute("INSERT INTO mine VALUES (1)")
    ours.commit()
    ours.close()
    other = sqlite3.connect(tmp_path / "other.sqlite3", isolation_level=None)
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("PRAGMA wal_autocheckpoint=0")
    other.execute("CREATE TABLE theirs (y)")
    other.executemany("INSERT INTO theirs VALUES (?)", [(i,) for i in range(100)])
    for suffix in ("-wal", "-shm"):
        shutil.copy(str(tmp_path / "other.sqlite3") + suffix, path + suffix)
    other.close()
    (tmp_path / JOURNAL).write_bytes(b"an operator's file")
    jfile.install(path + ".rebuild", path)
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("mine",)]
        assert db.execute("SELECT x FROM mine").fetchall() == [(1,)]
    finally:
        db.close()
    (aside,) = tmp_path.glob(JOURNAL + ".replaced-*")
    assert aside.read_bytes() == b"an operator's file"
    assert not os.path.exists(path + ".rebuild")


def test_install_syncs_the_directory_after_the_rename(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / "sub" / JOURNAL)
    os.makedirs(tmp_path / "sub")
    sqlite3.connect(path + ".rebuild").close()
    opened: dict[int, str] = {}
    synced: list[str] = []
    real_open, real_fsync = os.open, os.fsync

    def track_open(p: str, flags: int, *a: object) -> int:
        fd = real_open(p, flags, *a)
        opened[fd] = str(p)
        return fd

    def track_fsync(fd: int) -> None:
        synced.append(opened.get(fd, "?"))
        real_fsync(fd)
    monkeypatch.setattr(jfile.os, "open", track_open)
    monkeypatch.setattr(jfile.os, "fsync", track_fsync)
    jfile.install(path + ".rebuild", path)
    assert synced == [str(tmp_path / "sub")]
    assert os.path.exists(path)


def test_a_leftover_copy_from_a_failed_rebuild_is_replaced(tmp_path: Path) -> None:
    f = opened(tmp_path)
    f.probe(7.0)
    (tmp_path / (JOURNAL + ".rebuild")).write_bytes(b"half a copy" * 100)
    (tmp_path / (JOURNAL + ".rebuild-journal")).write_bytes(b"junk")
    os.remove(tmp_path / JOURNAL)
    f.rebuild()
    assert f.db.execute("SELECT value FROM meta WHERE key = 'probe'").fetchone() == ("7.0",)
    assert f.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert not (tmp_path / (JOURNAL + ".rebuild-journal")).exists()
    f.close()
    f.release()


def test_a_file_open_and_closed_leaves_no_descriptor(tmp_path: Path) -> None:
    before = open_fds()
    f = opened(tmp_path)
    f.probe(1.0)
    f.close()
    f.release()
    assert open_fds() == before


def test_a_counted_journal_whose_version_is_old_is_counted_afresh(tmp_path: Path) -> None:
    f = opened(tmp_path)
    f.db.execute("INSERT INTO tasks (id, queue, state, replica, at, data) "
                 "VALUES ('a', 'q', 'scheduled', 0, 1.0, '{}')")
    f.db.execute("UPDATE counts SET n = 9")  # stale, as a crash mid-migration may leave
    f.db.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    f.close()
    f.release()
    g = opened(tmp_path)
    assert g.db.execute("SELECT queue, state, first, n FROM counts").fetchall() == [
        ("q", "scheduled", 1, 1)]
    g.close()
    g.release()
