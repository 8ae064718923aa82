"""The memory window and its pager (miyamoto/engine/window.py), with a fake clock.

A real journal (SQLite on disk, in the test's tmp dir) and a real scheduler object (its
timer greenlet not started: the tests read its heap), driven by a clock the test moves.
"""

from __future__ import annotations

import time

import gevent
import pytest

from miyamoto.store.journal import Journal
from miyamoto.engine.scheduler import Scheduler
from miyamoto.tasks.task import State, Task
from miyamoto.engine.window import Window

SPAN = 10.0


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def task(i: int, fire_at: float, **kw) -> Task:
    return Task(id=f"t{i:05d}", queue=kw.pop("queue", "q"), url="http://127.0.0.1:9/x",
                eta=fire_at, created=0.0, fire_at=fire_at, replicas=("n1",), **kw)


@pytest.fixture
def parts(tmp_path):
    journal = Journal(str(tmp_path / "data"))
    journal.open()
    clock = Clock()
    sched = Scheduler(lambda key: None, clock)
    made = []

    def make(**kw) -> Window:
        w = Window(journal, sched, SPAN, clock, **kw)
        made.append(w)
        return w
    yield journal, clock, sched, make
    journal.close()


def store(journal: Journal, w: Window, t: Task) -> None:
    """What the engine does with a new or changed copy: journal it, then place it."""
    journal.put(t, wait=True)
    w[t.id] = t


def scheduled(sched: Scheduler) -> list[str]:
    return sorted(k for k in sched._live)


@pytest.mark.timeout(30)
def test_copies_beyond_the_window_live_only_in_the_journal(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()  # horizon = now + SPAN
    store(journal, w, task(1, clock.now + 5))        # inside
    store(journal, w, task(2, clock.now + SPAN + 1))  # just outside
    store(journal, w, task(3, clock.now + 3600))      # far
    assert set(w.mem) == {"t00001"} and scheduled(sched) == ["t00001"]
    # reads still find them, from the journal
    assert w.get("t00003").fire_at == clock.now + 3600
    assert "t00002" in w and "t00009" not in w
    assert len(w) == 1 and list(w) == ["t00001"]


@pytest.mark.timeout(30)
def test_the_pager_loads_each_slice_before_it_is_due(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t0 = clock.now
    for i in range(20):  # one every 5 s over 100 s
        store(journal, w, task(i, t0 + 5 * i))
    assert set(w.mem) == {"t00000", "t00001", "t00002"}  # up to t0 + SPAN
    for step in range(1, 25):
        clock.now = t0 + 5 * step
        w.page_once()
        due_within = {f"t{i:05d}" for i in range(20) if t0 + 5 * i <= clock.now + SPAN}
        assert due_within <= set(w.mem), step  # everything due within the window is in
        assert set(w.mem) <= {f"t{i:05d}" for i in range(20)}
        assert scheduled(sched) == sorted(w.mem)
    assert w.paged == 17  # each copy read once


@pytest.mark.timeout(30)
def test_full_pages_and_equal_fire_times_load_every_copy_once(parts):
    journal, clock, sched, make = parts
    w = make(page=3)
    at = clock.now + 50
    journal.put_many([task(i, at) for i in range(10)] + [task(10, at + 1)], wait=True)
    w.fill()
    assert w.mem == {}
    clock.now += 45
    pages = 0
    while w.page_once():
        pages += 1
    assert pages >= 3
    assert set(w.mem) == {f"t{i:05d}" for i in range(11)}
    assert w.paged == 11


@pytest.mark.timeout(30)
def test_memory_is_capped_and_a_backlog_pages_in_as_it_drains(parts):
    journal, clock, sched, make = parts
    w = make(memory_max=4, page=10)
    journal.put_many([task(i, clock.now - 100 + i) for i in range(10)], wait=True)  # all due
    w.fill()
    assert len(w.mem) == 4 and set(w.mem) == {f"t{i:05d}" for i in range(4)}  # oldest first
    new = task(99, clock.now)  # due now: in, however far behind the backlog is
    store(journal, w, new)
    far = task(98, clock.now + SPAN + 1)
    store(journal, w, far)
    assert "t00099" in w.mem and "t00098" not in w.mem
    for i in range(4):  # delivered
        done = w.mem[f"t{i:05d}"].evolve(state=State.SUCCEEDED, finished=clock.now)
        w.forget(done.id)
        journal.put(done, wait=True)
    w.page_once()
    assert set(w.mem) == {f"t{i:05d}" for i in range(4, 7)} | {"t00099"}


@pytest.mark.timeout(30)
def test_a_write_while_a_slice_is_read_is_not_undone_by_it(parts):
    """The slice was read before the write: its older record must not come back."""
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + SPAN + 5)
    store(journal, w, t)
    assert w.mem == {}
    clock.now += 6
    real_page = journal.page

    def page_then_cancel(*a, **kw):
        rows = real_page(*a, **kw)
        assert [r[1].id for r in rows] == ["t00001"]
        w.forget(t.id)  # a client's cancel lands while the rows are on their way
        journal.put(t.evolve(state=State.CANCELLED, finished=clock.now))
        return rows
    journal.page = page_then_cancel
    w.page_once()
    journal.page = real_page
    assert w.mem == {} and scheduled(sched) == []
    assert w.get(t.id) is None and journal.get(t.id).state == State.CANCELLED


@pytest.mark.timeout(30)
def test_a_retry_or_push_beyond_the_window_leaves_memory(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + 1)
    store(journal, w, t)
    running = t.evolve(state=State.RUNNING)
    w[t.id] = running
    assert w.running_in("q", True) == 1 and scheduled(sched) == []
    retry = running.evolve(state=State.SCHEDULED, attempts=1, fire_at=clock.now + 600)
    store(journal, w, retry)
    assert w.mem == {} and scheduled(sched) == [] and w.running_in("q", False) == 0
    assert w.get(t.id).attempts == 1
    clock.now += 595
    w.page_once()
    assert set(w.mem) == {t.id} and scheduled(sched) == [t.id]


@pytest.mark.timeout(30)
def test_pinned_copies_stay_in_memory_untimed_until_released(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + 3600)
    journal.put(t, wait=True)
    w.pin(t)
    assert t.id in w.mem and scheduled(sched) == []
    w.release(t.id)
    assert w.mem == {} and scheduled(sched) == []  # due later: the journal keeps it
    near = task(2, clock.now + 1)
    journal.put(near, wait=True)
    w.pin(near)
    w.release(near.id)
    assert scheduled(sched) == [near.id]


@pytest.mark.timeout(30)
def test_a_pinned_copy_that_ends_is_timed_again_when_it_comes_back(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + 1)
    journal.put(t, wait=True)
    w.pin(t)
    w.forget(t.id)  # it ended while held (a refused enqueue's copy, cancelled)
    store(journal, w, t.evolve(fire_at=clock.now + 2))  # run again: a copy of its own
    assert scheduled(sched) == [t.id]


@pytest.mark.timeout(30)
def test_a_running_copy_is_in_memory_but_untimed_until_it_is_scheduled_again(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + 1)
    store(journal, w, t)
    assert scheduled(sched) == [t.id]
    w[t.id] = t.evolve(state=State.RUNNING)  # its attempt started: no timer fires it again
    assert t.id in w.mem and scheduled(sched) == []
    w[t.id] = t.evolve(fire_at=clock.now + 5)  # a retry: timed again
    assert scheduled(sched) == [t.id]
    w[t.id] = t.evolve(fire_at=clock.now + 600)  # pushed beyond the window: untimed
    assert w.mem == {} and scheduled(sched) == []


@pytest.mark.timeout(30)
def test_popping_an_unknown_copy_raises_unless_a_default_is_given(parts):
    journal, clock, sched, make = parts
    w = make()
    with pytest.raises(KeyError):
        w.pop("t09999")
    assert w.pop("t09999", None) is None
    store(journal, w, task(1, clock.now + 3600))  # only in the journal
    assert w.pop("t00001").id == "t00001"


@pytest.mark.timeout(30)
def test_the_pager_greenlet_keeps_paging_in_as_time_passes(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    t = task(1, clock.now + 15)
    store(journal, w, t)
    assert w.mem == {}
    pager = gevent.spawn(w.run)
    try:
        clock.now += 10  # its slice is now within the window
        deadline = time.monotonic() + 10
        while t.id not in w.mem and time.monotonic() < deadline:
            gevent.sleep(0.05)
        assert t.id in w.mem and scheduled(sched) == [t.id]
    finally:
        pager.kill()


@pytest.mark.timeout(30)
def test_pages_walks_every_live_copy_once(parts):
    journal, clock, sched, make = parts
    w = make()
    w.fill()
    for i in range(25):
        store(journal, w, task(i, clock.now + (1 if i % 5 == 0 else 3600 + i)))
    ended = task(100, clock.now + 3600).evolve(state=State.SUCCEEDED, finished=clock.now)
    journal.put(ended, wait=True)
    seen = [t.id for page in w.pages(size=4) for t in page]
    assert sorted(seen) == sorted(f"t{i:05d}" for i in range(25))
    assert all(len(page) <= 4 for page in w.pages(size=4))


@pytest.mark.timeout(30)
def test_copies_written_before_a_mark_ask_when_paged_in(parts):
    journal, clock, sched, make = parts
    w = make()
    asked: list[str] = []
    w.on_paged = asked.extend
    journal.put_many([task(1, clock.now + 100), task(2, clock.now + 100)], wait=True)
    w.ask_mark = journal.last_rowid()  # e.g. a restart: the last run wrote these
    w.fill()
    journal.put(task(3, clock.now + 100), wait=True)  # written after: no need to ask
    clock.now += 95
    w.page_once()
    assert sorted(asked) == ["t00001", "t00002"] and set(w.mem) == {"t00001", "t00002", "t00003"}
