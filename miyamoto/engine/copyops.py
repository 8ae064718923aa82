"""What clients do to a node's copies: cancel, delete, rerun, purge, pause, and read
counts and lists. A part of ``Engine`` (its base class), apart so the engine's class
holds the delivery path and this holds the operations on stored copies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from miyamoto.errors import Conflict
from miyamoto.tasks.task import State, Task

if TYPE_CHECKING:
    from miyamoto.delivery.dispatch import Dispatcher
    from miyamoto.engine.scheduler import Scheduler
    from miyamoto.engine.window import Window
    from miyamoto.store.journal import Journal

PURGE_PAGE = 1000  # copies cancelled per journal read of a purge


class CopyOps:
    # what Engine provides
    live: "Window"
    journal: "Journal"
    clock: Callable[[], float]
    stats: Any
    scheduler: "Scheduler"
    dispatcher: "Dispatcher"
    names: dict[tuple[str, str], tuple[str, float]]

    def _end(self, t: Task) -> None:  # Engine's
        raise NotImplementedError

    def name_holder(self, queue: str, name: str) -> tuple[str, float] | None:  # Engine's
        raise NotImplementedError

    def cancel(self, task_id: str) -> Task | None:
        """Cancel this copy; None if unknown. Conflict if it already ended."""
        t = self.live.get(task_id)
        if t is None:
            ended = self.journal.get(task_id)
            if ended is None:
                return None
            if ended.state == State.CANCELLED:
                return ended
            raise Conflict(f"task is already {ended.state.value}")
        now = self.clock()
        was = t.state
        t = t.evolve(state=State.CANCELLED, finished=now)
        self.stats.cancelled += 1
        if was == State.RUNNING:
            self.live[task_id] = t  # finish() ends it when the attempt returns
            self.journal.put(t)
        else:
            self._end(t)
        return t

    def delete(self, task_id: str) -> Task | None:
        """DELETE /tasks/<id> on this copy: a failed one's record is removed (the dead
        letter is dealt with) and returned; a live one is cancelled, a cancelled one
        returned as is. None if unknown; Conflict if it succeeded (``cancel``)."""
        if task_id not in self.live.mem:
            t = self.journal.get(task_id)
            if t is not None and t.state == State.FAILED:
                self.journal.delete(task_id)
                return t
        return self.cancel(task_id)

    def abort(self, task_id: str) -> None:
        """Undo a copy whose enqueue was refused: cancel it and free its name."""
        t = self.live.get(task_id)
        if t is None:
            return
        if t.name is not None and (self.name_holder(t.queue, t.name) or ("",))[0] == task_id:
            self.names.pop((t.queue, t.name), None)
            self.journal.release_name(t.queue, t.name)
        try:
            self.cancel(task_id)
        except Conflict:
            pass

    def rerun(self, task_id: str, *, wait: bool = True, delay: float = 0.0) -> Task | None:
        """Run a task again now: a failed or cancelled one with a fresh set of attempts,
        a scheduled one at once. None if unknown; Conflict if running or succeeded."""
        now = self.clock() + delay
        t = self.live.get(task_id)
        if t is not None:
            if t.state != State.SCHEDULED:
                raise Conflict(f"task is {t.state.value}")
            t = t.evolve(fire_at=now)
            self.journal.put(t)
            self.live[task_id] = t
            return t
        t = self.journal.get(task_id)
        if t is None:
            return None
        if t.state == State.SUCCEEDED:
            raise Conflict("task already succeeded")
        t = t.evolve(state=State.SCHEDULED, fire_at=now, attempts=0, first_attempt=None,
                     finished=None, reruns=t.reruns + 1)
        self.live.storing.add(task_id)  # news meanwhile waits (replayed by the caller)
        try:
            self.journal.put(t, wait=wait)
        finally:
            self.live.storing.discard(task_id)
        self.live[task_id] = t
        return t

    def purge(self, queue: str) -> int:
        """Cancel every scheduled copy of the queue on this node; returns how many
        of them were first copies (replica 0), i.e. distinct tasks cluster-wide."""
        first = 0
        done: set[str] = set()
        while True:  # a page at a time from the journal: most copies may be only there
            page = self.journal.list(queue, State.SCHEDULED.value, PURGE_PAGE)
            ended = 0
            for t in page:
                t = self.live.mem.get(t.id, t)  # memory's record is the newer
                if t.state != State.SCHEDULED or t.id in done:
                    continue
                done.add(t.id)
                self._end(t.evolve(state=State.CANCELLED, finished=self.clock()))
                self.stats.cancelled += 1
                ended += 1
                first += t.replica == 0
            if not ended:  # done (or the journal cannot write: the rest stay)
                return first

    def pause(self, queue: str, paused: bool) -> None:
        self.dispatcher.pause(queue, paused)
        self.journal.set_paused(queue, paused)

    def queue_counts(self, primary_only: bool = False) -> dict[str, dict[str, int]]:
        """The journal's counters, with its live rows split by memory into running (an
        attempt's start is not journaled) and scheduled."""
        counts = self.journal.counts(primary_only)
        for q, c in counts.items():
            pending = c.pop(State.SCHEDULED.value, 0) + c.pop(State.RUNNING.value, 0)
            running = min(pending, self.live.running_in(q, primary_only))
            if running:
                c[State.RUNNING.value] = running
            if pending > running:
                c[State.SCHEDULED.value] = pending - running
        for name in self.dispatcher.queues:
            counts.setdefault(name, {})
        return counts

    def live_depth(self) -> dict[tuple[str, str], int]:
        """(queue, state) -> this node's live copies, in memory or not (/metrics)."""
        return {(q, s): n for q, c in self.queue_counts().items() for s, n in c.items()
                if s in (State.SCHEDULED.value, State.RUNNING.value)}

    def list(self, queue: str, state: State, limit: int) -> list[Task]:
        if state == State.RUNNING:  # running copies are all in memory
            out = [t for t in self.live.values() if t.queue == queue and t.state == state]
        elif state == State.SCHEDULED:  # memory's record of a copy is the newer
            running = self.live.running_in(queue, False)
            out = [self.live.mem.get(t.id, t) for t in
                   self.journal.list(queue, state.value, limit + running)]
            out = [t for t in out if t.state == state]
        else:
            return self.journal.list(queue, state.value, limit)
        out.sort(key=lambda t: t.fire_at)
        return out[:limit]
