"""The journal's SQLite file: opening it under the data dir's lock, knowing it is
still the one we opened, and putting it back when it is not; plus the journal's health.

``JournalFile`` runs on the journal's one database thread (see ``journal.py``), except
``open`` and ``close``, which the journal calls before its writer starts and after it
stopped.

Why the identity check: SQLite keeps writing to the inode it opened. If the file is
deleted (or another file is moved over it) under a running node, every commit still
succeeds, into an inode that no path names and that is gone at the next restart: the
node acknowledges tasks it will lose. So the journal compares the ``(st_dev, st_ino)``
of the file it opened with what the path names now, before each commit and on a timer,
and refuses to commit (503s) while they differ.

Why it rebuilds rather than stops: the lost inode is still open, so everything
committed to it is still readable. ``rebuild`` copies it with SQLite's online backup
(the WAL's contents included) into a new file next to it and moves that into place;
a file that was moved over ours is first renamed aside (``journal.sqlite3.replaced-<t>``),
never overwritten, since an operator may have meant something by it. Records that were
pending in memory were never committed, so they are still queued and go into the first
group written to the new file. Nothing acknowledged is lost, and no restart is needed.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time

from miyamoto.errors import Unavailable
from miyamoto.store.datadir import DataDirLock, DataDirLocked

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    finished REAL,
    replica INTEGER NOT NULL DEFAULT 0,
    data TEXT NOT NULL,
    at REAL
);
CREATE TABLE IF NOT EXISTS names (
    queue TEXT NOT NULL,
    name TEXT NOT NULL,
    id TEXT NOT NULL,
    expires REAL NOT NULL,
    PRIMARY KEY (queue, name)
);
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    paused INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
"""

# ``at`` is a live copy's fire time and an ended one's end time: one index serves a
# queue's lists in both orders, a partial one the pager (live copies by fire time, none
# of the ended), another the sweep (ended ones only), a last one a restart's look for
# the copies that were running; so a pending task pays for two.
# ``counts`` is kept by triggers in the same transaction as the rows it counts, so it
# cannot drift from them (REPLACE fires the delete trigger: recursive_triggers).
# ``labels`` is a first copy's labels with its state and ``at``, kept the same way (a
# row without labels pays one instr() per write), so a page of one label's tasks in one
# state is a range of its primary key in the page's order, as the tasks indexes give.
INDEXES = """
DROP INDEX IF EXISTS tasks_queue_state;
DROP INDEX IF EXISTS tasks_state_finished;
CREATE INDEX IF NOT EXISTS tasks_queue_state_at ON tasks (queue, state, at);
CREATE INDEX IF NOT EXISTS tasks_live_at ON tasks (at)
    WHERE state IN ('scheduled', 'running');
CREATE INDEX IF NOT EXISTS tasks_ended_at ON tasks (state, at)
    WHERE state NOT IN ('scheduled', 'running');
CREATE INDEX IF NOT EXISTS tasks_running ON tasks (state) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS tasks_ordered ON tasks (queue)
    WHERE instr(data, '"ordering_key":') > 0 AND state IN ('scheduled', 'running', 'failed');
CREATE TABLE IF NOT EXISTS counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    first INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, state, first)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS tasks_counted AFTER INSERT ON tasks BEGIN
    INSERT INTO counts (queue, state, first, n) VALUES (NEW.queue, NEW.state, NEW.replica = 0, 1)
    ON CONFLICT (queue, state, first) DO UPDATE SET n = n + 1;
END;
CREATE TABLE IF NOT EXISTS labels (
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    state TEXT NOT NULL,
    at REAL,
    id TEXT NOT NULL,
    PRIMARY KEY (key, value, state, at, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS labels_id ON labels (id);
CREATE TRIGGER IF NOT EXISTS tasks_labelled AFTER INSERT ON tasks
WHEN NEW.replica = 0 AND instr(NEW.data, '"labels":{') > 0 BEGIN
    INSERT OR IGNORE INTO labels (key, value, state, at, id)
    SELECT j.key, j.value, NEW.state, NEW.at, NEW.id FROM json_each(NEW.data, '$.labels') j;
END;
CREATE TRIGGER IF NOT EXISTS tasks_unlabelled AFTER DELETE ON tasks
WHEN OLD.replica = 0 AND instr(OLD.data, '"labels":{') > 0 BEGIN
    DELETE FROM labels WHERE id = OLD.id;
END;
CREATE TRIGGER IF NOT EXISTS tasks_uncounted AFTER DELETE ON tasks BEGIN
    UPDATE counts SET n = n - 1
    WHERE queue = OLD.queue AND state = OLD.state AND first = (OLD.replica = 0);
END;
"""
SCHEMA_VERSION = "4"  # meta 'schema': 3 = the ``at`` column, its indexes and ``counts``; 4 = tasks_ordered

Identity = tuple[int, int]


class JournalMoved(OSError):
    """The journal's file was deleted or replaced: committing would write to a lost inode."""


class JournalUnavailable(Unavailable):
    """The journal has no usable file right now (it is being rebuilt): 503."""


class JournalFile:
    """The one connection, the file behind it and the data dir's lock."""

    def __init__(self, data_dir: str, path: str, sync_full: bool):
        self.data_dir = data_dir
        self.path = path
        self.sync_full = sync_full
        self.lock = None if path == ":memory:" else DataDirLock(data_dir)
        self.lock_lost = False
        self.db: sqlite3.Connection | None = None
        self.identity: Identity | None = None  # of the file opened; None for :memory:

    def open(self) -> None:
        """Lock the data dir (DataDirLocked if another node holds it), open the file."""
        if self.lock is not None:
            os.makedirs(self.data_dir, exist_ok=True)
            self.lock.acquire()
        try:
            self.db, self.identity = connect(self.path, self.sync_full)
        except BaseException:
            self.release()
            raise

    def close(self) -> None:
        if self.db is not None:
            if self.identity is not None:
                try:
                    self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error:
                    log.exception("journal: checkpoint on close failed")
            self.db.close()
            self.db = None

    def checkpoint(self) -> None:
        """Copy the WAL's frames into the file (PASSIVE: writers are not waited for)."""
        if self.identity is not None:
            self.conn().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def conn(self) -> sqlite3.Connection:
        """The open connection; refused while it is being rebuilt."""
        if self.db is None:
            raise JournalUnavailable("the journal is being rebuilt")
        return self.db

    def writable(self) -> sqlite3.Connection:
        """The connection for a write: refused, too, while the file is not the one
        opened or the data dir is another node's."""
        db = self.conn()
        if self.lock_lost:
            raise DataDirLocked(self.data_dir, None)
        if self.moved():
            raise JournalMoved(f"{self.path} was deleted or replaced")
        return db

    def moved(self) -> bool:
        return self.identity is not None and identity(self.path) != self.identity

    def keep_lock(self) -> None:
        """Lock the lock path again if it no longer names our locked file; while
        another node holds it, every write is refused."""
        if self.lock is None or self.lock.intact():
            return
        try:
            self.lock.retake()
        except DataDirLocked:
            self.lock_lost = True
            raise
        self.lock_lost = False

    def rebuild(self) -> None:
        """Put a copy of what the lost file holds at the path, and write there from now.
        Resumable: a failure leaves either the old connection (copy again) or a
        finished copy (install it again)."""
        if self.db is not None:
            copy_out(self.db, self.path)
            self.db.close()
            self.db = None
        install(self.path + ".rebuild", self.path)
        self.db, self.identity = connect(self.path, self.sync_full)
        log.warning("journal: rebuilt %s from the open copy of the lost file", self.path)

    def probe(self, now: float) -> None:
        """A small write: does committing work again?"""
        db = self.writable()
        db.execute("BEGIN")
        try:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', ?)", (str(now),))
            db.execute("COMMIT")
        except BaseException:
            rollback(db)
            raise


def rollback(db: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: after a failed write (disk full, I/O
    error) SQLite may have rolled back already, and a second error would hide the first."""
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            log.debug("journal: rollback failed", exc_info=True)


def identity(path: str) -> Identity | None:
    """(st_dev, st_ino) of what ``path`` names now; None if nothing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def connect(path: str, sync_full: bool) -> tuple[sqlite3.Connection, Identity | None]:
    """Open (creating) the journal at ``path``; ``:memory:`` has no file, so no identity."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        if path != ":memory:":
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if sync_full else 'NORMAL'}")
            if not sync_full:  # its commits run on the hub: the fsyncs of a checkpoint
                db.execute("PRAGMA wal_autocheckpoint=0")  # do not (Journal checkpoints)
        db.execute("PRAGMA recursive_triggers = ON")
        db.executescript(SCHEMA)
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db, (None if path == ":memory:" else identity(path))


def migrate(db: sqlite3.Connection) -> None:
    """Bring a journal written by an earlier version up to SCHEMA_VERSION, once: add
    the columns, fill ``at`` from each row's record and count the rows."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
    if "replica" not in columns:  # journals written before copies kept their index
        db.execute("ALTER TABLE tasks ADD COLUMN replica INTEGER NOT NULL DEFAULT 0")
    if "at" not in columns:
        db.execute("ALTER TABLE tasks ADD COLUMN at REAL")
    version = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if version is not None and version[0] == SCHEMA_VERSION:
        return
    # each step may be repeated: a crash in between runs them all again at the next open
    db.execute("UPDATE tasks SET at = CASE WHEN state IN ('scheduled', 'running') "
               "THEN json_extract(data, '$.fire_at') ELSE finished END WHERE at IS NULL")
    db.executescript(INDEXES)
    db.execute("BEGIN")
    try:
        db.execute("DELETE FROM counts")
        db.execute("INSERT INTO counts (queue, state, first, n) SELECT queue, state, "
                   "replica = 0, COUNT(*) FROM tasks GROUP BY 1, 2, 3")
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)",
                   (SCHEMA_VERSION,))
        db.execute("COMMIT")
    except BaseException:
        rollback(db)
        raise


def copy_out(db: sqlite3.Connection, path: str) -> str:
    """Copy everything ``db`` can read (the lost inode and its WAL) into a new file
    beside ``path``; returns that file's name. ``db`` is left open and unchanged, so a
    failure here (disk full, say) can be retried."""
    tmp = path + ".rebuild"
    for name in (tmp, tmp + "-journal"):
        _remove(name)
    out = sqlite3.connect(tmp)
    try:
        db.backup(out)
    finally:
        out.close()
    return tmp


def install(tmp: str, path: str) -> None:
    """Move the rebuilt ``tmp`` into ``path``: what is there now is renamed aside, and
    stale ``-wal``/``-shm`` files are removed first (SQLite would replay an old WAL into
    the new file)."""
    if os.path.lexists(path):
        aside = f"{path}.replaced-{time.time():.0f}"
        os.rename(path, aside)
        log.error("journal: the file at %s was not ours; kept it as %s", path, aside)
    for suffix in ("-wal", "-shm"):
        _remove(path + suffix)
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(name: str) -> None:
    try:
        os.remove(name)
    except FileNotFoundError:
        pass


class Health:
    """Can the journal commit? The API answers 503 (/readyz and enqueues) while not.

    A problem is logged once, when it starts, and once more when it ends; the failed
    retries in between are only counted, so a full disk does not flood the log."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.since = 0.0
        self.failures = 0

    @property
    def ok(self) -> bool:
        return self.problem is None

    def failed(self, problem: str, error: BaseException | None = None) -> None:
        self.failures += 1
        if self.problem is None:
            self.since = time.monotonic()
        if self.problem != problem:
            log.error("journal: %s%s; enqueues get 503 until it can write again", problem,
                      f" ({type(error).__name__}: {error})" if error is not None else "")
        self.problem = problem

    def recovered(self) -> None:
        if self.problem is not None:
            log.warning("journal: writing again after %.1f s (%s; %d failed attempts)",
                        time.monotonic() - self.since, self.problem, self.failures)
        self.problem = None
        self.failures = 0
