"""When a waiting copy expires: a heap of (time, id) for the copies with an ``expires_at``.

A due copy may wait a long time before it starts (a paused queue, a rate limit, an open
breaker, a full flow key): nothing else times it then, so the engine notes its expiry
here when it is due (``Engine._due``) and ends it at that time if it is still waiting.
Copy i of a task expires ``i x replica_offset`` after copy 0, as it fires that much
later: copy 0 expires first and tells its siblings, whose copies end with its news,
and copy i speaks only if copy 0's node is gone. Entries of copies that ended or
started meanwhile stay until their time and are skipped then; the heap is rebuilt
from the live entries when they are fewer than half, so it stays bounded by the
copies with an expiry that are due and waiting (and as many stale entries).
"""

from __future__ import annotations

import heapq

from miyamoto.tasks.task import Task

COMPACT_MIN = 1024  # entries before a rebuild is worth it


def copy_expiry(t: Task, offset: float) -> float | None:
    """When copy ``t`` expires: the task's expires_at, later by its place among the copies."""
    return None if t.expires_at is None else t.expires_at + t.replica * offset


class Expiries:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._at)

    def add(self, task_id: str, at: float) -> bool:
        """Note that ``task_id`` expires at ``at``; True if it is now the earliest."""
        if self._at.get(task_id) == at:
            return False
        self._at[task_id] = at
        heapq.heappush(self._heap, (at, task_id))
        if len(self._heap) > COMPACT_MIN and len(self._heap) > 2 * len(self._at):
            self._heap = [(a, i) for i, a in self._at.items()]
            heapq.heapify(self._heap)
        return self._heap[0] == (at, task_id)

    def discard(self, task_id: str) -> None:
        self._at.pop(task_id, None)

    def next_at(self) -> float | None:
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # stale: discarded or moved
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[str]:
        """The ids whose expiry has come, each once, forgotten here."""
        out = []
        while True:
            at = self.next_at()
            if at is None or at > now:
                return out
            _, task_id = heapq.heappop(self._heap)
            del self._at[task_id]
            out.append(task_id)
