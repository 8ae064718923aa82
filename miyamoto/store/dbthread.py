"""One OS thread for a journal's SQLite calls, with a lean hand-off to and from the hub.

Why not ``gevent.threadpool.ThreadPool(1)``: each ``apply`` there crosses a Python-level
queue guarded by a Condition (``notify_one``, ``acquire_with_timeout``), runs in a worker
greenlet of the thread's own hub, and makes a fresh async watcher for its result. A
profile of a busy node put that hand-off at 8-15 % of its CPU, more in a cluster, where
commits are smaller and more frequent. Here a call is one tuple put on a C
``SimpleQueue`` (the thread blocks in C with the GIL released); the thread appends the
outcome to a deque and wakes the hub through one long-lived async watcher, whose callback
resumes each waiting greenlet. Calls run one at a time, in the order they were made.
"""

from __future__ import annotations

import collections
from _queue import SimpleQueue  # the C queue: monkey patching swaps queue.SimpleQueue only
from typing import Any, Callable, Protocol, TypeVar

from gevent import monkey
from gevent.hub import Waiter, get_hub

T = TypeVar("T")

_start_new_thread = monkey.get_original("_thread", "start_new_thread")
_STOP = None


class DbThreadClosed(RuntimeError):
    """A call after ``close``."""


class DbRunner(Protocol):
    """What the journal needs of its database thread: run a call, then close. A
    simulation on virtual time, which allows no second OS thread, hands in one that
    runs each call at once."""

    def apply(self, fn: Callable[..., T], *args: Any) -> T: ...

    def apply_here(self, fn: Callable[..., T], *args: Any) -> T: ...

    def close(self) -> None: ...


class DbThread:
    def __init__(self) -> None:
        self._jobs: SimpleQueue = SimpleQueue()
        self._done: collections.deque[tuple[Waiter, bool, Any]] = collections.deque()
        self._hub = get_hub()
        self._async = self._hub.loop.async_()
        self._async.start(self._deliver)
        self._async.ref = False  # referenced only while a call is outstanding
        self._outstanding = 0
        self._closed = False
        _start_new_thread(self._work, ())

    def apply(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its value, or its exception raised here."""
        if self._closed:
            raise DbThreadClosed("the database thread is closed")
        waiter = Waiter(self._hub)
        self._outstanding += 1
        if self._outstanding == 1:
            self._async.ref = True
        self._jobs.put((fn, args, waiter))
        return waiter.get()

    def apply_here(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the calling thread, the hub, when no call is outstanding: the
        thread is idle in its queue, so the connection is free, and the hand-off (a wake of
        the thread, the GIL passed to it and back at each of SQLite's steps, a wake of the
        hub) is not paid. Behind an outstanding call it runs on the thread after it, in
        order, like ``apply``. For calls that do not wait on the disk (no fsync)."""
        if self._outstanding or self._closed:
            return self.apply(fn, *args)
        return fn(*args)

    def close(self) -> None:
        """Let the thread end once the calls made so far have run. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._jobs.put(_STOP)
        if self._outstanding == 0:
            self._async.close()

    # ------------------------------------------------------------ the thread
    def _work(self) -> None:
        jobs, done, wake = self._jobs, self._done, self._async.send
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            fn, args, waiter = job
            try:
                outcome = (waiter, True, fn(*args))
            except BaseException as e:  # carried back to the caller, never raised here
                outcome = (waiter, False, e)
            done.append(outcome)
            wake()

    # ------------------------------------------------------------ the hub
    def _deliver(self) -> None:
        done, run = self._done, self._hub.loop.run_callback
        while done:
            waiter, ok, value = done.popleft()
            self._outstanding -= 1
            run(waiter.switch if ok else waiter.throw, value)
        if self._outstanding == 0:
            self._async.ref = False
            if self._closed:
                self._async.close()
