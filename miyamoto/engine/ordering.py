"""Ordering keys: the tasks of one key in a queue go one at a time, in enqueue order.

A task's ``ordering_key`` puts it in its key's line (per queue); its place is its
``ordering_seq``, which the key's owner gives it as it takes the first copy
(``next_seq``: above every seq the line has held, and above the clock in microseconds,
so a line that empties and fills again still counts up, and a new owner that holds
copies of the old owner's tasks numbers after them). Only the head of a line may
start, and only while no other copy of the line runs: a retry keeps its task at the
head (the next waits for the end of every retry), and a task run again (a retry of a
failed one) goes next, after the one running now.

A copy leaves its line when it ends: succeeded, cancelled, expired, deleted, or
failed in a queue whose ``ordering_on_failure`` is ``continue``. Failed in a queue
that says ``block``, it stays at the head as the line's blocker until it is run again
(back in the line, live) or deleted (or the queue says ``continue`` from then on:
the queue's mode is read when it matters, ``blocks``, so a restarted node keeps its
failed copies in their lines until the queue settings it loads say what they mean).

Every node keeps the lines of its own copies. Ordered tasks are placed by their key
(``replicas.placement``), so every member that holds a copy of a key's task holds a
copy of each of them, and their lines agree but for news in flight; a sibling answers
an ASK for a copy that is not at the head of its own line with ``wait``
(``replicas.siblings``), so a member whose line lacks a task (a copy being restored)
cannot run ahead of it. Pure: no clock (``now`` is passed in), no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable

from miyamoto.tasks.task import State, Task

Key = tuple[str, str]  # (queue, ordering_key)


@dataclass
class Line:
    queue: str
    entries: list[tuple[int, str]] = field(default_factory=list)  # (seq, id), in order
    running: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)  # blockers (failed, kept by ``block``)
    high: int = 0  # the highest seq given or held


class Lines:
    def __init__(self, blocks: Callable[[str], bool] = lambda queue: False) -> None:
        self.blocks = blocks  # does a failed task hold its key in this queue (``block``)?
        self._lines: dict[Key, Line] = {}
        self._at: dict[str, tuple[Key, int]] = {}  # task id -> (its line, its seq)

    def __len__(self) -> int:
        return len(self._at)

    def next_seq(self, queue: str, key: str, now: float) -> int:
        """The seq of a new task of the key (this node is its owner)."""
        line = self._lines.setdefault((queue, key), Line(queue))
        line.high = max(line.high + 1, int(now * 1e6))
        return line.high

    def note(self, t: Task, keep_failed: bool = False) -> list[str]:
        """Copy ``t`` was stored or changed. Returns the ids that may start now and were
        held (the new head). A failed copy stays if its queue blocks (or if
        ``keep_failed``: read back at a start, before the queue settings are known)."""
        if t.ordering_key is None:
            return []
        if t.state.ended and not (t.state is State.FAILED
                                  and (keep_failed or self.blocks(t.queue))):
            return self.remove(t.id)
        key = (t.queue, t.ordering_key)
        line = self._lines.setdefault(key, Line(t.queue))
        was = self._startable(line)
        old = self._at.get(t.id)
        if old is not None and old != (key, t.ordering_seq):
            self.remove(t.id)
            line = self._lines.setdefault(key, Line(t.queue))
        if t.id not in self._at:
            bisect.insort(line.entries, (t.ordering_seq, t.id))
            self._at[t.id] = (key, t.ordering_seq)
            line.high = max(line.high, t.ordering_seq)
        (line.running.add if t.state is State.RUNNING else line.running.discard)(t.id)
        (line.failed.add if t.state is State.FAILED else line.failed.discard)(t.id)
        return self._woken(line, was)

    def remove(self, task_id: str) -> list[str]:
        """Copy ``task_id`` left its line (ended, deleted, dropped): the next may go."""
        at = self._at.pop(task_id, None)
        if at is None:
            return []
        key, seq = at
        line = self._lines[key]
        was = self._startable(line)
        i = bisect.bisect_left(line.entries, (seq, task_id))
        if i < len(line.entries) and line.entries[i] == (seq, task_id):
            del line.entries[i]
        line.running.discard(task_id)
        line.failed.discard(task_id)
        if not line.entries:
            del self._lines[key]
            return []
        return self._woken(line, was)

    def may_start(self, t: Task) -> bool:
        """Whether copy ``t`` may start now: it heads its line and nothing else of the
        line runs (a copy without a key always may)."""
        if t.ordering_key is None:
            return True
        line = self._lines.get((t.queue, t.ordering_key))
        if line is None or t.id not in self._at:
            return True  # not in a line (not stored here yet): nothing to wait for
        return self._head(line) == t.id and not (line.running - {t.id})

    def ahead(self, t: Task) -> str | None:
        """The copy that ``t`` waits for on this node (the head, a running one, the
        blocker), or None if it may start: what a sibling's ASK hears as ``wait``."""
        if self.may_start(t):
            return None
        line = self._lines[(t.queue, t.ordering_key)]  # type: ignore[index]
        others = sorted(line.running - {t.id})
        return others[0] if others else self._head(line)

    def ahead_of(self, queue: str, key: str, seq: int, task_id: str) -> str | None:
        """What a task of the key numbered ``seq`` waits for in this node's line,
        whether the line holds it or not (a sibling's ASK: its copy may not be here
        yet): a running copy of another task, or the head, if it comes first."""
        line = self._lines.get((queue, key))
        if line is None:
            return None
        others = sorted(line.running - {task_id})
        if others:
            return others[0]
        head = self._head(line)
        if head is None or head == task_id or self._at[head][1] > seq:
            return None
        return head

    def blocker(self, queue: str, key: str) -> str | None:
        """The failed task that holds the key (``block``), or None."""
        line = self._lines.get((queue, key))
        head = None if line is None else self._head(line)
        return head if line is not None and head in line.failed else None

    def blocked(self, queue: str) -> list[tuple[str, str]]:
        """(key, blocking task id) of the queue's blocked keys, by key."""
        out = []
        for (q, key), line in self._lines.items():
            held = self.blocker(q, key) if q == queue else None
            if held is not None:
                out.append((key, held))
        return sorted(out)

    def queues(self) -> list[str]:
        """The queues with a line here."""
        return sorted({q for q, _ in self._lines})

    def keys(self, queue: str) -> int:
        """How many keys of the queue have a line here (a task waiting or running)."""
        return sum(1 for q, _ in self._lines if q == queue)

    def waiting(self, queue: str, key: str) -> int:
        """Copies in the key's line here (running, waiting, and a blocker)."""
        line = self._lines.get((queue, key))
        return len(line.entries) if line is not None else 0

    def release_failed(self, queue: str) -> list[str]:
        """The queue no longer blocks: its lines' blockers leave them. Returns every
        head of the queue's lines that may start (held until now, or not)."""
        ids = [i for (q, _), line in self._lines.items() if q == queue for i in line.failed]
        for task_id in ids:
            self.remove(task_id)
        return [h for (q, _), line in self._lines.items()
                if q == queue and (h := self._startable(line)) is not None]

    def _head(self, line: Line) -> str | None:
        """The first copy of the line, past the failed ones that do not block."""
        if line.failed and not self.blocks(line.queue):
            return next((i for _, i in line.entries if i not in line.failed), None)
        return line.entries[0][1] if line.entries else None

    def _startable(self, line: Line) -> str | None:
        """The copy of the line that may start and is not running, if any."""
        head = self._head(line)
        if head is None or head in line.failed or line.running:
            return None
        return head

    def _woken(self, line: Line, was: str | None) -> list[str]:
        now = self._startable(line)
        return [now] if now is not None and now != was else []
