"""The journal's database thread (miyamoto.store.dbthread): order, values, errors, kills, close."""

from __future__ import annotations

import threading

import gevent
import pytest

from dispatchkit import wait_for
from miyamoto.store.dbthread import DbThread, DbThreadClosed

pytestmark = pytest.mark.timeout(30)


def test_calls_run_on_one_other_thread_in_order_and_return_their_values():
    db = DbThread()
    seen: list[tuple[int, int]] = []

    def job(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return i * 2

    results = [g.get() for g in [gevent.spawn(db.apply, job, i) for i in range(200)]]
    assert results == [i * 2 for i in range(200)]
    assert [i for i, _ in seen] == list(range(200))  # one thread, FIFO
    threads = {t for _, t in seen}
    assert len(threads) == 1 and threading.get_ident() not in threads
    db.close()


def test_an_exception_is_raised_in_the_caller_and_the_thread_goes_on():
    db = DbThread()

    def boom() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        db.apply(boom)
    assert db.apply(lambda: "still here") == "still here"
    db.close()


def test_the_hub_keeps_running_while_a_call_blocks_the_thread():
    db = DbThread()
    release = threading.Event()  # a real OS event: the thread blocks on it
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(5)])
    call = gevent.spawn(db.apply, release.wait, 10)
    ticker.join(timeout=5)
    assert len(ticks) == 5 and not call.ready()  # the hub was not blocked
    release.set()
    assert call.get(timeout=5) is True
    db.close()


def _blocking_call(release: threading.Event):
    """A call that blocks the thread until ``release``, and a wait (with a deadline)
    until the thread is running it."""
    started = threading.Event()

    def call() -> bool:
        started.set()
        return release.wait(10)

    def running() -> None:
        wait_for(started.is_set)  # the thread ran the call

    return call, running


def test_a_killed_caller_does_not_disturb_the_next_calls():
    db = DbThread()
    release = threading.Event()
    call, running = _blocking_call(release)
    slow = gevent.spawn(db.apply, call)
    running()
    slow.kill()  # its call still runs; its answer must go nowhere
    release.set()
    assert [db.apply(lambda i=i: i) for i in range(3)] == [0, 1, 2]
    db.close()


def test_after_close_calls_are_refused_but_calls_already_made_finish():
    db = DbThread()
    release = threading.Event()
    call, running = _blocking_call(release)
    pending = gevent.spawn(db.apply, call)
    running()
    db.close()
    db.close()  # idempotent
    with pytest.raises(DbThreadClosed):
        db.apply(lambda: 1)
    release.set()
    assert pending.get(timeout=5) is True


def _os_threads() -> set[str]:
    import os
    return set(os.listdir("/proc/self/task"))


def test_the_thread_ends_at_close():
    before = _os_threads()
    db = DbThread()
    assert db.apply(lambda: 1) == 1
    mine = _os_threads() - before
    assert len(mine) == 1
    db.close()
    wait_for(lambda: not mine & _os_threads())  # the database thread ended


def test_only_a_call_outstanding_keeps_the_hub_alive():
    """An idle database thread must not keep a process's hub running (gevent.wait()
    would never return, a node could not exit); a call waiting for its answer must.
    On a thread of its own, so its hub is new: whatever an earlier test of this worker
    left on the main hub (a timer, a greenlet) is not the database thread's."""
    out: dict[str, BaseException | bool] = {}

    def run() -> None:
        try:
            _only_a_call_keeps_the_hub_alive()
            out["ok"] = True
        except BaseException as e:  # handed to the test's own thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    assert out.get("ok"), "the check did not end within 30 s"


def _only_a_call_keeps_the_hub_alive() -> None:
    db = DbThread()
    assert gevent.wait(timeout=2) is True  # a new thread holds nothing
    assert db.apply(lambda: 1) == 1
    assert gevent.wait(timeout=2) is True  # nor does one whose calls all came back
    release = threading.Event()
    call, running = _blocking_call(release)
    pending = gevent.spawn(db.apply, call)
    running()
    assert gevent.wait(timeout=0.2) is False  # its answer is still to come
    release.set()
    assert pending.get(timeout=5) is True
    assert gevent.wait(timeout=2) is True
    db.close()


def test_a_call_made_here_while_the_thread_is_idle_runs_on_the_callers_thread():
    db = DbThread()
    assert db.apply(threading.get_ident) != threading.get_ident()  # (done: idle again)
    assert db.apply_here(threading.get_ident) == threading.get_ident()
    with pytest.raises(OSError, match="disk full"):  # its exception, raised as it is
        db.apply_here(lambda: (_ for _ in ()).throw(OSError("disk full")))
    db.close()


def test_a_call_made_here_behind_an_outstanding_one_runs_on_the_thread_after_it():
    """The connection is the thread's while a call of its runs: a call made here then
    waits its turn there, and the order of the calls is kept."""
    db = DbThread()
    release = threading.Event()
    call, running = _blocking_call(release)
    order: list[str] = []
    first = gevent.spawn(db.apply, lambda: (call(), order.append("first")))
    running()
    here = gevent.spawn(db.apply_here, lambda: (order.append("here"), threading.get_ident())[1])
    gevent.sleep(0.05)
    assert not here.ready() and order == []  # it waits behind the thread's call
    release.set()
    assert here.get(timeout=5) != threading.get_ident()
    first.join(timeout=5)
    assert order == ["first", "here"]
    db.close()


def test_a_call_made_here_after_close_is_refused():
    db = DbThread()
    db.close()
    with pytest.raises(DbThreadClosed):
        db.apply_here(lambda: None)
