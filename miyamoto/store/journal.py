"""The durable record of tasks: SQLite in WAL mode, written in groups, and read back.

SQLite's reads and fsyncs run on one dedicated thread (``dbthread.DbThread``), so the
hub never waits on the disk, and the connection is only ever touched by one thread at a
time. A group commit that does not fsync (``synchronous=NORMAL``, or ``:memory:``) runs
on the hub itself when that thread is idle: it only writes to the WAL in the page cache,
and a hand-off would cost more than the commit (on a busy cluster node, a sixth of its
CPU: the thread woken, the GIL passed back and forth at each SQLite step, the hub woken).
The WAL is then checkpointed on the thread, every CHECKPOINT_EVERY seconds of commits,
instead of by SQLite inside a commit (a checkpoint fsyncs).
Writers hand records to a writer greenlet, which commits everything that piled up
while the previous transaction ran in one transaction: a burst of 50 enqueues costs
one commit, not 50. ``put(..., wait=True)`` returns only after the record's group is
committed; that is what lets the API answer 200 (and a replica answer STORED) only
for a task that survives ``kill -9``.

WAL with ``synchronous=NORMAL`` survives a process crash; ``synchronous=FULL`` (option
``fsync``) also survives a power cut, at the price of an fsync per group.

Reads of one task see the writes not committed yet first (pending, or in the group
being committed), then the last RECENT_MAX records committed: a sibling's ASK for a
copy that just ended (the healthy path of every replicated task) is answered without
a query, which would cost a thread hand-off and stall the receive loop.

Ownership and health: ``open`` locks the data dir (``datadir.py``: a second node on it
is refused, naming the holder's pid). A watcher greenlet looks every WATCH_INTERVAL
(and at once after a failed commit) whether the file is still the one opened, and
rebuilds it in place when it is not (``file.py`` says why and how); each commit
checks too. While a commit cannot succeed (file gone, disk full, read-only, I/O error,
lock lost), ``health`` says why, which makes /readyz answer 503, and enqueues hear the
commit's failure as 503; the watcher probes with a small write, and the first that
succeeds ends it, with no restart. Records handed in meanwhile stay queued in memory
and are committed then.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import time
from typing import Any, Callable, Iterable, TypeVar

import gevent
import gevent.event

from miyamoto.store.datadir import DataDirLocked
from miyamoto.errors import Unavailable
from miyamoto.store.dbthread import DbRunner, DbThread
from miyamoto.store.file import Health, JournalFile, JournalMoved, JournalUnavailable, rollback
from miyamoto.store.rows import INSERT_TASK, ROW, decode_row, task_row
from miyamoto.tasks.task import State, Task

log = logging.getLogger(__name__)
T = TypeVar("T")

BUSY_WINDOW = 0.002  # a group that follows the last one this closely means load
LINGER = 0.0005  # under load a group waits in steps this long ...
MAX_LINGER = 0.003  # ... while each step brought a waited record, up to this in all
# a write nobody waits for (a copy's end, a sibling's news) is committed at most this
# long after it was handed in, or with the next group someone waits for: in a cluster
# such writes come one at a time, and a group each cost a thread hand-off and a commit
# per record; a later write of the same copy within it replaces the earlier one
LAZY_COMMIT = 0.005
WATCH_INTERVAL = 1.0  # how often the watcher checks the file and, while unhealthy, probes
MOVED = "its file was deleted or replaced"
CANNOT_WRITE = "cannot write"
LOCK_LOST = "another node holds the data dir"
_LIVE = (State.SCHEDULED.value, State.RUNNING.value)
# spelled out, not bound: SQLite uses a partial index only when it can see the query's
# condition implies the index's, which it cannot for parameters
LIVE_SQL = "('scheduled', 'running')"
CHECKPOINT_EVERY = 1.0  # seconds between checkpoints of a WAL the hub commits to
RECENT_MAX = 2048  # committed records kept for reads of one task (None: deleted)


def _storable(*texts: str) -> bool:
    try:
        for s in texts:
            s.encode("utf-8")
    except (UnicodeEncodeError, AttributeError):
        return False
    return True


class JournalClosed(RuntimeError):
    pass


def _problem(e: BaseException) -> str:
    if isinstance(e, JournalMoved):
        return MOVED
    if isinstance(e, DataDirLocked):
        return LOCK_LOST
    return CANNOT_WRITE


class Journal:
    """A node's journal: the group writer, the watcher of its file, and the reads,
    which look at what is still pending before they ask the file."""

    def __init__(self, data_dir: str, *, sync_full: bool = False,
                 on_commit: Callable[[float], None] | None = None,
                 db: DbRunner | None = None, monotonic: Callable[[], float] = time.monotonic):
        self.data_dir = data_dir
        # the group commit's load window reads ``monotonic``: on virtual time it must be
        # the simulation's clock, or the real CPU speed would decide when a group lingers
        self._monotonic = monotonic
        self._on_commit = on_commit  # seconds each group commit took (metrics)
        self.memory = data_dir == ":memory:"
        self.path = ":memory:" if self.memory else os.path.join(data_dir, "journal.sqlite3")
        self._sync_full = sync_full
        self._pool = db if db is not None else DbThread()
        # a commit that does not fsync runs on the hub (``DbThread.apply_here``)
        self._commit_here = self.memory or not sync_full
        self._checkpointed = 0.0  # monotonic time of the last checkpoint of the WAL
        self._checkpointing = False
        self._file = JournalFile(data_dir, self.path, sync_full)
        self._tasks: dict[str, Task | None] = {}  # pending writes; None = delete
        self._committing: dict[str, Task | None] = {}  # the group being committed
        self._recent: collections.OrderedDict[str, Task | None] = collections.OrderedDict()
        self._names: dict[tuple[str, str], tuple[str, float] | None] = {}
        self._queues: dict[str, bool] = {}
        self._waiters: list[gevent.event.AsyncResult] = []
        self._wake = gevent.event.Event()
        self._lazy = gevent.get_hub().loop.timer(LAZY_COMMIT)
        self._writer: gevent.Greenlet | None = None
        self._closed = False
        self.commits = 0
        self.existed = False  # set by open(): did this node run here before?
        self.health = Health()
        self._watcher: gevent.Greenlet | None = None
        self._watch_now = gevent.event.Event()

    # ------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Lock the data dir (DataDirLocked if another node holds it), open the file."""
        if not self.memory:
            self.existed = os.path.exists(self.path)
        self._run(self._file.open)
        self._writer = gevent.spawn(self._write_loop)
        if not self.memory:
            self._watcher = gevent.spawn(self._watch_loop)

    def close(self) -> None:
        """Commit what is pending, then close the database."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._watcher is not None:
            self._watcher.kill()
        if self._writer is not None:
            self._writer.join(timeout=30)
            self._writer.kill()
        if self._tasks or self._names or self._queues:
            self._flush_once()
        self._lazy.close()
        try:
            self._run(self._file.close)
        finally:
            self._pool.close()
            self._file.release()

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the database thread. Its exception is carried back and
        raised here, not raised in the thread, where gevent would print it with a
        traceback each time: a full disk would flood the log with one per retry."""
        return self._pool.apply(fn, *args)

    # ------------------------------------------------------------ writes
    def put(self, task: Task, *, wait: bool = False, name_expires: float | None = None) -> None:
        """Record the task (and, with name_expires, reserve its name); wait=True blocks
        until the group holding it is committed."""
        self._check_open()
        self._tasks[task.id] = task
        if name_expires is not None and task.name:
            self._names[(task.queue, task.name)] = (task.id, name_expires)
        self._kick(wait)

    def put_many(self, tasks: Iterable[Task], *, wait: bool = False) -> None:
        self._check_open()
        for t in tasks:
            self._tasks[t.id] = t
        self._kick(wait)

    def withdraw(self, task: Task) -> None:
        """Take back a record whose writer was told it failed, so that the retry of a
        failed group does not commit it after all (with its name reservation)."""
        if self._tasks.get(task.id) is task:
            del self._tasks[task.id]
        if task.name is not None:
            held = self._names.get((task.queue, task.name))
            if held is not None and held[0] == task.id:
                del self._names[(task.queue, task.name)]

    def delete(self, task_id: str) -> None:
        self._check_open()
        self._tasks[task_id] = None
        self._kick(False)

    def release_name(self, queue: str, name: str) -> None:
        self._check_open()
        self._names[(queue, name)] = None
        self._kick(False)

    def set_paused(self, queue: str, paused: bool, *, wait: bool = True) -> None:
        self._check_open()
        self._queues[queue] = paused
        self._kick(wait)

    def flush(self) -> None:
        """Block until everything handed in so far is committed."""
        self._kick(True)

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosed("journal is closed")

    def _kick(self, wait: bool) -> None:
        if not wait:
            if not self._lazy.active:
                self._lazy.start(self._wake.set)
            return
        result = gevent.event.AsyncResult()
        self._waiters.append(result)
        self._wake.set()
        result.get()

    def _write_loop(self) -> None:
        last_done = 0.0
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                break
            if self._monotonic() - last_done < BUSY_WINDOW:
                self._linger()
            self._flush_once()
            last_done = self._monotonic()

    def _linger(self) -> None:
        """Under load, let the records of the other ready greenlets join this group
        instead of paying a thread hand-off and a commit each: wait a step, and another
        while the last one brought a waited record (on a cluster node the STOREs of a
        receive drain arrive one greenlet at a time), at most MAX_LINGER in all. A
        lone waiter waits one step only: an idle node's latency is not spent."""
        waited, start = len(self._waiters), self._monotonic()
        while True:
            gevent.sleep(LINGER)
            now_waited = len(self._waiters)
            if (now_waited == waited or self._closed
                    or self._monotonic() - start + LINGER > MAX_LINGER):
                return
            waited = now_waited

    def _flush_once(self) -> None:
        """Commit everything pending as one group and answer the group's waiters.

        A failed commit keeps its records for the next group (newer writes win) and
        tells its waiters. Only ``Exception`` is handled: a GreenletExit (``close``
        or a stop killing the writer), KeyboardInterrupt or SystemExit goes through,
        after the waiters are told, so that nobody waits forever on a dead writer."""
        self._lazy.stop()  # whatever was pending goes with this group
        tasks, names, queues, waiters = self._tasks, self._names, self._queues, self._waiters
        self._tasks, self._names, self._queues, self._waiters = {}, {}, {}, []
        if not (tasks or names or queues):
            _answer(waiters, None)
            return
        started = time.monotonic()
        self._committing = tasks  # readable until it is (a read may run before the commit)
        try:
            if self._commit_here:
                self._pool.apply_here(self._commit, *_rows(tasks, names, queues))
            else:
                self._run(self._commit, *_rows(tasks, names, queues))
        except Exception as e:
            self._committing = {}  # not committed: back among the pending (or withdrawn)
            log.debug("journal: commit of %d records failed", len(tasks), exc_info=True)
            self.health.failed(_problem(e), e)
            self._watch_now.set()
            self._requeue(tasks, names, queues)
            # typed for the API: a failed commit is a 503 to whoever waited on it
            failure = JournalUnavailable(f"the journal {self.health.problem}")
            failure.__cause__ = e
            _answer(waiters, failure)
            gevent.sleep(0.1)
            return
        except BaseException:
            # whether the group reached SQLite is unknown: keep it for close()'s last
            # flush (rewriting a record is harmless), and let the exit through
            self._requeue(tasks, names, queues)
            _answer(waiters, JournalClosed("journal writer stopped before the commit"))
            raise
        finally:
            self._committing = {}
        self._committed(tasks)  # (no yield since the commit: reads see it there at once)
        self.commits += 1
        if self._commit_here and not self.memory:
            self._checkpoint_soon()
        if self._on_commit is not None:
            self._on_commit(time.monotonic() - started)
        self.health.recovered()
        _answer(waiters, None)

    def _checkpoint_soon(self) -> None:
        """Checkpoint the WAL on the thread once CHECKPOINT_EVERY has passed since the last
        one (SQLite's own, inside a commit on the hub, is off: ``file.connect``)."""
        if self._checkpointing or self._monotonic() - self._checkpointed < CHECKPOINT_EVERY:
            return
        self._checkpointing = True
        gevent.spawn(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            self._run(self._file.checkpoint)
        except Exception:  # the next commit fails too, and says why; this one retries
            log.debug("journal: checkpoint failed", exc_info=True)
        finally:
            self._checkpointing = False
            self._checkpointed = self._monotonic()

    def _requeue(self, tasks: dict, names: dict, queues: dict) -> None:
        """Put back a group that did not commit, under any newer write of the same key."""
        for k, v in tasks.items():
            self._tasks.setdefault(k, v)
        for k2, v2 in names.items():
            self._names.setdefault(k2, v2)
        for k3, v3 in queues.items():
            self._queues.setdefault(k3, v3)

    def _committed(self, records: dict[str, Task | None]) -> None:
        """A group is in the file: keep its records as the most recent ones."""
        recent = self._recent
        for task_id, t in records.items():
            recent[task_id] = t
            recent.move_to_end(task_id)
        while len(recent) > RECENT_MAX:
            recent.popitem(last=False)

    def _commit(self, rows: list, deletes: list, name_rows: list, name_dels: list,
                queue_rows: list) -> None:
        db = self._file.writable()
        db.execute("BEGIN")
        try:
            if rows:
                db.executemany(INSERT_TASK, rows)
            if deletes:
                db.executemany("DELETE FROM tasks WHERE id = ?", deletes)
            if name_rows:
                db.executemany("INSERT OR REPLACE INTO names (queue, name, id, expires) "
                               "VALUES (?, ?, ?, ?)", name_rows)
            if name_dels:
                db.executemany("DELETE FROM names WHERE queue = ? AND name = ?", name_dels)
            if queue_rows:
                db.executemany("INSERT OR REPLACE INTO queues (name, paused) VALUES (?, ?)",
                               queue_rows)
            db.execute("COMMIT")
        except BaseException:
            rollback(db)
            raise

    # ------------------------------------------------------------ health
    def _watch_loop(self) -> None:
        while not self._closed:
            self._watch_now.wait(WATCH_INTERVAL)
            self._watch_now.clear()
            if self._closed:
                break
            try:
                self._watch_once()
            except Exception as e:
                log.debug("journal: check failed", exc_info=True)
                self.health.failed(_problem(e), e)
                gevent.sleep(0.1)  # a burst of failing commits does not spin the watcher

    def _watch_once(self) -> None:
        """Keep the lock and the file ours; while unhealthy, probe until a write works."""
        f = self._file
        f.keep_lock()
        if self._run(f.moved):
            self.health.failed(MOVED)
            try:
                self._run(f.rebuild)
            except Exception as e:  # still MOVED, whatever stopped the rebuild (disk full)
                raise JournalMoved(f"cannot rebuild {self.path} yet: {e}") from e
        if not self.health.ok:
            self._run(f.probe, time.time())
            self.flush()  # what piled up while it could not write
            self.health.recovered()

    # ------------------------------------------------------------ upkeep
    def sweep(self, now: float, retention: float) -> int:
        """Delete ended tasks past retention and expired names; returns rows removed."""
        cutoff = now - retention

        def run() -> int:
            db = self._file.writable()
            db.execute("BEGIN")
            try:
                n = db.execute(f"DELETE FROM tasks WHERE state NOT IN {LIVE_SQL} AND at < ?",
                               (cutoff,)).rowcount
                n += db.execute("DELETE FROM names WHERE expires < ?", (now,)).rowcount
                db.execute("COMMIT")
            except BaseException:
                rollback(db)
                raise
            return n
        removed = self._run(run)
        self._recent.clear()  # it may hold records the sweep just removed
        return removed

    def size_bytes(self) -> int:
        if self.memory:
            return 0
        total = 0
        for suffix in ("", "-wal", "-shm"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total

    # ------------------------------------------------------------ reads
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        def run() -> list[tuple]:
            return self._file.conn().execute(sql, args).fetchall()
        return self._run(run)

    def load_running(self) -> tuple[list[Task], dict[str, bool]]:
        """What a restarting node needs before the pager loads its window: the copies
        that were running (whatever their fire time) and the paused queues. Names are
        looked up (``name_holder``), counts kept by the journal (``counts``)."""
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE state = 'running'")  # its index
        tasks = [t for t in map(decode_row, rows) if t is not None]
        queues = {q: bool(p) for q, p in self._query("SELECT name, paused FROM queues")}
        return tasks, queues

    def load_ordered(self) -> list[Task]:
        """The copies with an ordering key that are live or failed (a failed one may
        block its key): a restarting node's lines (``engine.ordering``), from their
        index, whatever their fire time."""
        # (instr, not json_extract: a write must never parse JSON; a row that only
        # mentions the name, in its params, is read and passed over by the lines)
        rows = self._query(f"SELECT {ROW} FROM tasks INDEXED BY tasks_ordered WHERE "
                           "instr(data, '\"ordering_key\":') > 0 AND "
                           "state IN ('scheduled', 'running', 'failed')")
        return [t for t in map(decode_row, rows) if t is not None]

    def load(self) -> tuple[list[Task], dict[tuple[str, str], tuple[str, float]], dict[str, bool]]:
        """Everything the journal holds, read whole (tools and tests; a node reads its
        window only): live tasks, reserved names, paused queues."""
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE state IN (?, ?)", _LIVE)
        names = {(q, n): (i, e) for q, n, i, e in
                 self._query("SELECT queue, name, id, expires FROM names")}
        return [t for t in map(decode_row, rows) if t is not None], names, \
            self.load_running()[1]

    def _pending(self, task_id: str) -> tuple[bool, Task | None]:
        """(True, record) if a write of ``task_id`` is not committed yet, or was one of
        the last RECENT_MAX committed."""
        for group in (self._tasks, self._committing, self._recent):
            if task_id in group:
                return True, group[task_id]
        return False, None

    def get(self, task_id: str) -> Task | None:
        pending, t = self._pending(task_id)
        if pending:
            return t
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE id = ?", (task_id,))
        return decode_row(rows[0]) if rows else None

    def live_copy(self, task_id: str) -> Task | None:
        """The scheduled or running copy ``task_id``, pending writes first; else None."""
        pending, t = self._pending(task_id)
        if pending:
            return t if t is not None and not t.state.ended else None
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE id = ? AND state IN (?, ?)",
                           (task_id, *_LIVE))
        return decode_row(rows[0]) if rows else None

    def name_holder(self, queue: str, name: str) -> tuple[str, float] | None:
        """(task id, expiry) of the reservation of ``name`` in ``queue``, if any."""
        key = (queue, name)
        if key in self._names:
            return self._names[key]
        rows = self._query("SELECT id, expires FROM names WHERE queue = ? AND name = ?", key)
        return (rows[0][0], rows[0][1]) if rows else None

    def page(self, after: tuple[float, int], until: float, limit: int) -> list[tuple[int, Task]]:
        """(rowid, copy) of the live copies firing after ``after`` (fire time, rowid) and
        at or before ``until``, in that order, at most ``limit``: the pager's slice.
        Everything handed in before is committed first, so the slice misses no write;
        Unavailable if that cannot be done (the pager tries again)."""
        self.flush()
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE state IN {LIVE_SQL} AND "
                           "at <= ? AND (at > ? OR (at = ? AND rowid > ?)) ORDER BY at, rowid "
                           "LIMIT ?", (until, after[0], after[0], after[1], limit))
        return [(r[0], t) for r, t in ((r, decode_row(r)) for r in rows) if t is not None]

    def live_rows(self, after: int, limit: int) -> list[tuple[int, Task]]:
        """(rowid, copy) of live copies with a rowid above ``after``, at most ``limit``:
        a walk over every copy, one bounded step at a time (restoring lost copies)."""
        self._flush_for_read()
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE rowid > ? AND state IN (?, ?) "
                           "ORDER BY rowid LIMIT ?", (after, *_LIVE, limit))
        return [(r[0], t) for r, t in ((r, decode_row(r)) for r in rows) if t is not None]

    def rows(self, after: int, upto: int, limit: int) -> list[tuple[int, Task]]:
        """(rowid, copy) of every copy, live or ended, with a rowid above ``after`` and
        at most ``upto``, at most ``limit``: a walk over what was written before a mark
        (``last_rowid``), one bounded step at a time (a rejoin's reconciling)."""
        self._flush_for_read()
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE rowid > ? AND rowid <= ? "
                           "ORDER BY rowid LIMIT ?", (after, upto, limit))
        return [(r[0], t) for r, t in ((r, decode_row(r)) for r in rows) if t is not None]

    def last_rowid(self) -> int:
        """The newest row's rowid: every row written later has a higher one (REPLACE
        writes a new row), so it marks what was written before now."""
        self._flush_for_read()
        return self._query("SELECT COALESCE(MAX(rowid), 0) FROM tasks")[0][0]

    def _flush_for_read(self) -> None:
        """Commit what is pending so that a read sees it; while the journal cannot
        write, read what is committed rather than fail the read."""
        try:
            self.flush()
        except Unavailable:
            pass

    def list(self, queue: str, state: str, limit: int) -> list[Task]:
        self._flush_for_read()  # a record still waiting for its group would be missed or stale
        order = "ASC" if state in _LIVE else "DESC"  # next to fire first / last ended first
        rows = self._query(f"SELECT {ROW} FROM tasks WHERE queue = ? AND state = ? "
                           f"ORDER BY at {order} LIMIT ?", (queue, state, limit))
        return [t for t in map(decode_row, rows) if t is not None]

    def browse(self, state: str, queue: str | None, after: tuple[float, str] | None,
               scan: int, keep: Callable[[int, str], bool] | None = None, want: int = 0,
               label: tuple[str, str] | None = None, since: float | None = None,
               until: float | None = None
               ) -> tuple[list[tuple[float, Task]], tuple[float, str] | None, int]:
        """The copies of up to ``scan`` rows in ``state`` (of ``queue``, if given) that
        come after the key ``after`` (time, id) in a list's order: live ones next to
        fire first, ended ones last ended first; as ([(key time, copy)], the last key
        read, rows read). Each shape rides an index (``queue, state, at``; the live or
        the ended partial one; with ``label``, the labels table's key, which holds the
        first copies' labels by state and ``at``) from the cursor on, so a page costs
        ``scan`` rows however many the journal holds; ``since``/``until`` bound ``at``
        in the same index. Every other filter is the caller's, on these rows, for the
        same reason (with ``label``, ``queue`` is too). ``keep(replica, data)`` sees a
        row's raw record first: only the rows it keeps are decoded (the decoding, on the
        hub, is what a page costs), and with ``want`` no more than that many (the rows
        read then end at the last)."""
        self._flush_for_read()
        sql, args = _browse_sql(state, queue, after, label, since, until)
        rows = self._query(sql, (*args, scan))
        out = []
        for n, r in enumerate(rows, 1):
            if keep is None or keep(r[6], r[5]):
                t = decode_row(r[:6])
                if t is not None:
                    out.append((r[4], t))
                    if len(out) == want:
                        return out, (r[4], r[1]), n
        return out, ((rows[-1][4], rows[-1][1]) if rows else None), len(rows)

    def counts(self, primary_only: bool = False) -> dict[str, dict[str, int]]:
        """Rows per queue and state, as the journal records them (a running copy's row
        may still say scheduled: the engine corrects that); with primary_only, only first
        copies (replica 0), so a cluster can add up nodes. Read from the ``counts``
        table the journal's triggers keep, not counted per request."""
        self._flush_for_read()  # a task that just ended is in neither memory nor SQLite until then
        out: dict[str, dict[str, int]] = {}
        extra = " AND first = 1" if primary_only else ""
        for q, s, n in self._query("SELECT queue, state, SUM(n) FROM counts WHERE n > 0"
                                   f"{extra} GROUP BY queue, state"):
            if n > 0:
                out.setdefault(q, {})[s] = n
        return out

    def states(self, limit: int) -> list[tuple[str, str, str]] | None:
        """(queue, state, id) of every copy, as the journal records them; None if there
        are more than ``limit`` (one scan of the table: a cluster de-duplicates its copies
        by id with it, so ``GET /queues`` counts tasks, not copies)."""
        self._flush_for_read()
        total = self._query("SELECT COALESCE(SUM(n), 0) FROM counts WHERE n > 0")[0][0]
        if total > limit:
            return None
        rows = self._query("SELECT queue, state, id FROM tasks LIMIT ?", (limit + 1,))
        return None if len(rows) > limit else [(q, s, i) for q, s, i in rows]


def _browse_sql(state: str, queue: str | None, after: tuple[float, str] | None,
                label: tuple[str, str] | None, since: float | None,
                until: float | None) -> tuple[str, list[Any]]:
    """``Journal.browse``'s query (less its LIMIT's value) and arguments."""
    live = state in _LIVE
    op, order = (">", "ASC") if live else ("<", "DESC")
    col = "l.at" if label is not None else "at"
    where = [f"{'l.' if label is not None else ''}state = ?"]
    args: list[Any] = [state]
    if label is not None:
        where[:0] = ["l.key = ?", "l.value = ?"]
        args[:0] = list(label)
    elif queue is not None:
        where.insert(0, "queue = ?")
        args.insert(0, queue)
    else:  # the partial index's own condition, spelled out (see LIVE_SQL)
        where.insert(0, f"state {'' if live else 'NOT '}IN {LIVE_SQL}")
    if since is not None:
        where.append(f"{col} >= ?")
        args.append(since)
    if until is not None:
        where.append(f"{col} < ?")
        args.append(until)
    if after is not None:
        # the bound alone first: it is what lets the index start at the cursor
        idc = "l.id" if label is not None else "id"
        where.append(f"{col} {op}= ? AND ({col} {op} ? OR {idc} {op} ?)")
        args += [after[0], after[0], after[1]]
    if label is None:
        return (f"SELECT {ROW}, replica FROM tasks WHERE {' AND '.join(where)} "
                f"ORDER BY at {order}, id {order} LIMIT ?"), args
    cols = ", ".join(f"t.{c.strip()}" for c in ROW.split(","))
    return (f"SELECT {cols}, t.replica FROM labels l JOIN tasks t ON t.id = l.id "
            f"WHERE {' AND '.join(where)} ORDER BY l.at {order}, l.id {order} LIMIT ?"), args


def _rows(tasks: dict[str, Task | None], names: dict, queues: dict[str, bool]) -> tuple:
    """The SQL parameters of one group: (rows, deletes, name_rows, name_dels, queue_rows)."""
    rows = []
    deletes = []
    for task_id, t in tasks.items():
        # A record SQLite cannot bind (text with no UTF-8 form, e.g. from a peer) would
        # fail its group and, retried, every group after it: drop it alone, loudly.
        if not _storable(task_id, t.queue if t is not None else ""):
            log.error("journal: dropping record %r: its id or queue is not valid text",
                      task_id)
            continue
        if t is None:
            deletes.append((task_id,))
        else:
            rows.append(task_row(t))
    name_rows = [(q, n, v[0], v[1]) for (q, n), v in names.items()
                 if v is not None and _storable(q, n, v[0])]
    name_dels = [(q, n) for (q, n), v in names.items() if v is None and _storable(q, n)]
    queue_rows = [(q, int(p)) for q, p in queues.items()]
    return rows, deletes, name_rows, name_dels, queue_rows


def write_tasks(db: sqlite3.Connection, tasks: Iterable[Task]) -> int:
    """Insert ``tasks`` in one transaction on ``db`` (a ``JournalFile`` connection), as
    a group commit does: how ``scripts/harness/prefill.py`` fills a journal."""
    rows = [task_row(t) for t in tasks]
    db.execute("BEGIN")
    try:
        db.executemany(INSERT_TASK, rows)
        db.execute("COMMIT")
    except BaseException:
        rollback(db)
        raise
    return len(rows)


def _answer(waiters: list[gevent.event.AsyncResult], error: Exception | None) -> None:
    for w in waiters:
        if error is None:
            w.set(None)
        else:
            w.set_exception(error)
