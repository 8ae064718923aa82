"""A task's row in the journal, both ways.

The ``data`` column holds the task's record (``Task.encode``) as JSON, less what the
row's own columns already say: ``id``, ``queue`` and ``state`` always, and ``fire_at``
while the copy is live (``at`` is then its fire time; once ended, ``at`` is its end).
Reading puts them back. Storing them once is about a quarter of a pending task's bytes
on disk. A row written before (with the whole record in ``data``) reads the same.
"""

from __future__ import annotations

import logging

import ujson

from miyamoto.tasks.task import Task
from miyamoto.wire.verbs import DecodeError

log = logging.getLogger(__name__)

INSERT_TASK = ("INSERT OR REPLACE INTO tasks (id, queue, state, finished, replica, at, data) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)")
ROW = "rowid, id, queue, state, at, data"  # what ``decode_row`` reads
_IN_COLUMNS = ("id", "queue", "state")


def task_row(t: Task) -> tuple:
    """The tasks row of ``t`` (``INSERT_TASK``'s parameters)."""
    d = t.encode()
    for k in _IN_COLUMNS:
        del d[k]
    if t.state.ended:
        at = t.finished
    else:
        at = d.pop("fire_at")
    # ensure_ascii: any str (even a lone surrogate) round-trips as an escape
    data = ujson.dumps(d, escape_forward_slashes=False)
    return (t.id, t.queue, t.state._value_, t.finished, t.replica, at, data)


def decode_row(row: tuple) -> Task | None:
    """The task of a row selected as ``ROW``; None (logged) if it does not decode."""
    _, task_id, queue, state, at, data = row
    try:
        d = ujson.loads(data)
        if not isinstance(d, dict):
            raise DecodeError("task is not an object")
        d["id"], d["queue"], d["state"] = task_id, queue, state
        if "fire_at" not in d:
            d["fire_at"] = at
        return Task.decode(d)
    except (DecodeError, ValueError) as e:
        log.error("journal: skipping an unreadable task row: %s", e)
        return None

