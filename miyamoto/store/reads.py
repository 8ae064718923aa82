"""The journal's reads: a part of ``Journal`` (its base class), apart so that the
journal's class holds the writer and this the queries a node makes of what is stored.

Every read runs on the journal's database thread (``Journal._run``). Reads of one task
see the writes not committed yet first (pending, or in the group being committed), then
the last RECENT_MAX records committed: a sibling's ASK for a copy that just ended (the
healthy path of every replicated task) is answered without a query, which would cost a
thread hand-off and stall the receive loop.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from miyamoto.errors import Unavailable
from miyamoto.store.rows import ROW, decode_row
from miyamoto.tasks.task import State, Task

if TYPE_CHECKING:
    from miyamoto.store.file import JournalFile

T = TypeVar("T")
_LIVE = (State.SCHEDULED.value, State.RUNNING.value)
# spelled out, not bound: SQLite uses a partial index only when it can see the query's
# condition implies the index's, which it cannot for parameters
LIVE_SQL = "('scheduled', 'running')"
RECENT_MAX = 2048  # committed records kept for reads of one task (None: deleted)


class JournalReads:
    # what Journal provides
    _file: "JournalFile"
    _tasks: dict[str, Task | None]
    _committing: dict[str, Task | None]
    _recent: "collections.OrderedDict[str, Task | None]"
    _names: dict[tuple[str, str], tuple[str, float] | None]

    def _run(self, fn: Callable[..., T], *args: Any) -> T:  # Journal's
        raise NotImplementedError

    def flush(self) -> None:  # Journal's
        raise NotImplementedError

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

    def _committed(self, records: dict[str, Task | None]) -> None:
        """A group is in the file: keep its records as the most recent ones."""
        recent = self._recent
        for task_id, t in records.items():
            recent[task_id] = t
            recent.move_to_end(task_id)
        while len(recent) > RECENT_MAX:
            recent.popitem(last=False)

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
