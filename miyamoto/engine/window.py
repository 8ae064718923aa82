"""The memory window: which of a node's live copies are held in memory, and the pager.

A node may hold millions of copies due hours or days ahead. Only those due within
``memory_window`` seconds (and every running or held one) are kept in memory and in
the scheduler's heap; the rest live only in the journal, indexed by fire time, and the
pager loads each slice before it is due. So memory and restart time follow the window,
not the backlog.

``Window`` is the engine's ``live``: a mapping of every live copy by id. Reads of a copy
not in memory go to the journal (a bounded cache keeps the recent ones); iterating it,
and ``len``, see only the copies in memory, the ones the timing-sensitive parts of the
cluster act on; ``pages`` walks every copy, a bounded step at a time.

The invariant: every live copy whose fire time is at or before ``horizon`` is in
memory. The pager moves the horizon forward; a write decides where its copy goes by it.
While a slice is being read, writes whose copy falls before the slice's end stay in
memory and are noted, so that the slice read (from before the write) cannot bring back
an older record of them.
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Callable, Iterator, Mapping

import gevent

from miyamoto.engine.scheduler import Scheduler
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import State, Task

log = logging.getLogger(__name__)

PAGE = 2000          # copies read from the journal in one step
MEMORY_MAX = 200_000  # scheduled copies in memory at most: a due backlog pages in as it drains
CACHE_MAX = 4096     # recently read copies outside the window
_NOTHING = object()


class Window(Mapping[str, Task]):
    def __init__(self, journal: Journal, scheduler: Scheduler, span: float,
                 clock: Callable[[], float], memory_max: int = MEMORY_MAX, page: int = PAGE,
                 on_paged: Callable[[list[str]], None] | None = None):
        self.journal = journal
        self.scheduler = scheduler
        self.span = span
        self.clock = clock
        self.memory_max = memory_max
        self.page_size = page
        self.mem: dict[str, Task] = {}
        self.pinned: set[str] = set()  # stored, but not timed until released
        # being stored (their journal write pending): not live yet, whatever the journal
        # says, so that news about them waits for the store as it did before the window
        self.storing: set[str] = set()
        self.horizon = -math.inf  # every live copy firing at or before it is in memory
        self._loading_to = -math.inf  # end of the slice being read
        self._after: tuple[float, int] = (-math.inf, 0)  # (fire time, rowid) read through
        self._touched: set[str] | None = None  # written while a slice is read
        self._cache: collections.OrderedDict[str, Task] = collections.OrderedDict()
        self.running: collections.Counter[tuple[str, bool]] = collections.Counter()
        # copies written at or before this rowid ask their siblings first when paged in
        self.ask_mark = 0
        self.on_paged = on_paged  # told of the copies it loads that were written by then
        self.paged = 0  # copies loaded from the journal (metrics, tests)

    # ------------------------------------------------------------ the mapping
    def get(self, task_id: str, default: Task | None = None) -> Task | None:  # type: ignore[override]
        t = self.mem.get(task_id)
        if t is not None:
            return t
        if task_id in self.storing:
            return default
        t = self._cache.get(task_id)
        if t is None:
            t = self.journal.live_copy(task_id)
            if t is None:
                return default
            if task_id in self.mem:  # written while the journal was read: that is newer
                return self.mem[task_id]
            if task_id in self.storing:
                return default
            self._remember(t)
        return t

    def __getitem__(self, task_id: str) -> Task:
        t = self.get(task_id)
        if t is None:
            raise KeyError(task_id)
        return t

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and self.get(task_id) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.mem)

    def __len__(self) -> int:
        return len(self.mem)

    def values(self):  # type: ignore[override]
        return self.mem.values()

    def items(self):  # type: ignore[override]
        return self.mem.items()

    def keys(self):  # type: ignore[override]
        return self.mem.keys()

    # ------------------------------------------------------------ writes
    def holds(self, t: Task) -> bool:
        """Is ``t`` a copy memory keeps: running, held, due within what is loaded, or
        due within the window (a backlog behind MEMORY_MAX still lets new tasks in)."""
        return (t.state != State.SCHEDULED or t.id in self.pinned
                or t.fire_at <= max(self.horizon, self._loading_to, self.clock() + self.span))

    def __setitem__(self, task_id: str, t: Task) -> None:
        """The engine changed copy ``t`` (and hands the journal its record): keep it in
        memory and timed, or, due beyond the window, only in the journal."""
        if self._touched is not None:
            self._touched.add(task_id)
        old = self.mem.get(task_id)
        self._count(old, -1)
        if self.holds(t):
            self.mem[task_id] = t
            self._cache.pop(task_id, None)
            self._count(t, 1)
            if (t.state == State.SCHEDULED or t.accepted) and task_id not in self.pinned:
                self.scheduler.schedule(task_id, t.fire_at)  # a fire time, or a lease's end
            elif t.state != State.SCHEDULED:
                self.scheduler.cancel(task_id)
        else:
            self.mem.pop(task_id, None)
            self.scheduler.cancel(task_id)
            self._remember(t)

    def pin(self, t: Task) -> None:
        """Keep a stored copy in memory, untimed, until ``release``."""
        self.pinned.add(t.id)
        self[t.id] = t

    def release(self, task_id: str) -> None:
        self.pinned.discard(task_id)
        t = self.mem.get(task_id)
        if t is not None:
            self[task_id] = t

    def pop(self, task_id: str, default: object = _NOTHING) -> Task | None:  # type: ignore[override]
        """Forget a copy that ended (or is dropped); its record is the engine's to write.
        Returns the copy, read from the journal when it was not in memory."""
        if self._touched is not None:
            self._touched.add(task_id)
        self.pinned.discard(task_id)
        t = self.mem.pop(task_id, None)
        self.scheduler.cancel(task_id)
        cached = self._cache.pop(task_id, None)
        if t is not None:
            self._count(t, -1)
            return t
        t = cached or self.journal.live_copy(task_id)
        if t is None and default is _NOTHING:
            raise KeyError(task_id)
        return t if t is not None else default  # type: ignore[return-value]

    def forget(self, task_id: str) -> None:
        """``pop`` without reading the journal: the caller has the record."""
        if self._touched is not None:
            self._touched.add(task_id)
        self.pinned.discard(task_id)
        self._cache.pop(task_id, None)
        self.scheduler.cancel(task_id)
        self._count(self.mem.pop(task_id, None), -1)

    def _remember(self, t: Task) -> None:
        self._cache[t.id] = t
        self._cache.move_to_end(t.id)
        while len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)

    def _count(self, t: Task | None, n: int) -> None:
        if t is not None and t.state == State.RUNNING:
            self.running[(t.queue, t.replica == 0)] += n

    def running_in(self, queue: str, primary_only: bool) -> int:
        n = self.running[(queue, True)]
        return n if primary_only else n + self.running[(queue, False)]

    # ------------------------------------------------------------ the pager
    def page_once(self) -> bool:
        """Read the next slice of copies due within the window; True if there is more
        to read now (the page was full)."""
        target = self.clock() + self.span
        room = self.memory_max - len(self.mem)
        if target <= self.horizon or room <= 0:
            return False
        limit = min(self.page_size, room)
        self._loading_to = target
        self._touched = set()
        try:
            rows = self.journal.page(self._after, target, limit)
        except Exception as e:  # the journal cannot commit: what is pending is unseen
            log.warning("window: cannot read the next slice yet: %s", e)
            rows = None
        finally:
            touched, self._touched = self._touched, None
            self._loading_to = -math.inf
        if rows is None:
            return False
        loaded = []
        for rowid, t in rows:
            if t.id in self.mem or t.id in touched:
                continue  # memory's record is newer than the one read
            if t.state == State.RUNNING and not t.accepted:  # its attempt died: again
                t = t.evolve(state=State.SCHEDULED, fire_at=min(t.fire_at, self.clock()))
            self._cache.pop(t.id, None)
            self.mem[t.id] = t
            self.scheduler.schedule(t.id, t.fire_at)
            if rowid <= self.ask_mark:
                loaded.append(t.id)
        self.paged += len(rows)
        if len(rows) < limit:
            self.horizon, self._after = target, (target, 1 << 62)
        else:
            last_at, last_rowid = rows[-1][1].fire_at, rows[-1][0]
            self._after = (last_at, last_rowid)
            # copies firing at last_at with a higher rowid may be unread yet
            self.horizon = max(self.horizon, math.nextafter(last_at, -math.inf))
        if loaded and self.on_paged is not None:
            self.on_paged(loaded)
        return len(rows) == limit

    def fill(self) -> None:
        """Read the whole window now (a start): until a page comes back short."""
        while self.page_once():
            pass

    def run(self) -> None:
        """The pager: keep the horizon a window ahead, reading a quarter window at a time."""
        while True:
            more = False
            if self.clock() + self.span - self.horizon >= self.span / 4:
                try:
                    more = self.page_once()
                except Exception:
                    log.exception("window: paging failed")
            gevent.sleep(0 if more else min(1.0, self.span / 8))

    def pages(self, size: int = 1000) -> Iterator[list[Task]]:
        """Every live copy, memory's first, then the journal's others, ``size`` at a time."""
        mem = list(self.mem.values())
        for i in range(0, len(mem), size):
            yield mem[i:i + size]
        seen = set(self.mem)
        after = 0
        while True:
            rows = self.journal.live_rows(after, size)
            if not rows:
                return
            after = rows[-1][0]
            page = [t for _, t in rows if t.id not in seen and t.id not in self.mem]
            if page:
                yield page
