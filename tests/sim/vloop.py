"""A gevent event loop on virtual time, for deterministic simulations of real code.

gevent's hub runs whatever loop it is handed (``Hub(loop=...)``). This one keeps no file
descriptors and no OS clock: callbacks run first-in first-out, and when none is left the
clock jumps to the earliest timer. So ``gevent.sleep``, ``gevent.Timeout``,
``Event.wait(timeout)`` and greenlet scheduling in the code under test all run on
simulated seconds, in an order fixed by the program alone: the same seed gives the same
run, and a minute of cluster time costs only the CPU its events take.

Run code on it with ``run_virtual(main, start=...)``: a fresh OS thread gets a hub on a
new ``VirtualLoop`` (gevent keeps one hub per thread), so the process's own hub and the
loops of other tests are untouched. Sockets, signals and child watchers are refused
(``io`` raises): a simulated world reaches nothing real.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import sys
import threading
from collections import deque
from typing import Any, Callable

import gevent
import gevent.hub


class RealIOError(RuntimeError):
    """The code under simulation asked for a real file descriptor, signal or child."""


class _Callback:
    __slots__ = ("callback", "args")

    def __init__(self, callback: Callable[..., Any], args: tuple):
        self.callback: Callable[..., Any] | None = callback
        self.args = args

    @property
    def pending(self) -> bool:
        return self.callback is not None

    def stop(self) -> None:
        self.callback = None
        self.args = ()

    close = stop


class _Watcher:
    """What gevent expects of a watcher: start, stop, close, active, pending, ref."""

    def __init__(self, loop: VirtualLoop, ref: bool = True):
        self.loop = loop
        self.ref = ref
        self.callback: Callable[..., Any] | None = None
        self.args: tuple = ()
        self.active = False
        self.pending = False

    def start(self, callback: Callable[..., Any], *args: Any, **_: Any) -> None:
        self.callback, self.args, self.active = callback, args, True

    def stop(self) -> None:
        self.active = self.pending = False
        self.callback, self.args = None, ()

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> _Watcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _fire(self) -> None:
        cb, args = self.callback, self.args
        if cb is not None:
            cb(*args)


class _Timer(_Watcher):
    # a run makes tens of thousands of timers: the base class's steps are written out here
    def __init__(self, loop: VirtualLoop, after: float, repeat: float, ref: bool):
        self.loop, self.ref = loop, ref
        self.callback: Callable[..., Any] | None = None
        self.args: tuple = ()
        self.active = self.pending = False
        self.after = max(0.0, float(after))
        self.repeat = float(repeat)
        self._seq = -1

    def start(self, callback: Callable[..., Any], *args: Any, **_: Any) -> None:
        self.callback, self.args, self.active = callback, args, True
        loop = self.loop
        self._seq = loop._add_timer(self, loop._now + self.after)

    def again(self, callback: Callable[..., Any], *args: Any, **kw: Any) -> None:
        self.stop()
        self.start(callback, *args, **kw)

    def stop(self) -> None:
        self.active = self.pending = False
        self.callback, self.args = None, ()
        self._seq = -1  # its heap entry is now stale


class _Async(_Watcher):
    def send(self) -> None:
        if self.active:
            self.loop.run_callback(self._fire)

    send_ignoring_arg = send


class _Refused(_Watcher):
    def start(self, *_: Any, **__: Any) -> None:
        raise RealIOError("a simulated node asked for a real file descriptor or signal")


class VirtualLoop:
    """gevent's loop interface over a virtual clock."""

    default = False
    approx_timer_resolution = 0.00001
    MINPRI, MAXPRI = -2, 2
    starting_timer_may_update_loop_time = False

    def __init__(self, start: float = 0.0):
        self._now = float(start)
        self._callbacks: deque[_Callback] = deque()
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self.error_handler: Any = None
        self.events = 0  # callbacks and timers run: a measure of the work simulated

    # -------------------------------------------------------------- time
    def now(self) -> float:
        return self._now

    def update_now(self) -> None:
        """Virtual time moves only between events."""

    def _add_timer(self, t: _Timer, when: float) -> int:
        seq = next(self._seq)
        heapq.heappush(self._timers, (when, seq, t))
        return seq

    # -------------------------------------------------------------- watchers
    def timer(self, after: float, repeat: float = 0.0, ref: bool = True,
              priority: int | None = None) -> _Timer:
        return _Timer(self, after, repeat, ref)

    def async_(self, ref: bool = True, priority: int | None = None) -> _Async:
        return _Async(self, ref)

    def idle(self, ref: bool = True, priority: int | None = None) -> _Watcher:
        return _Idle(self, ref)

    prepare = check = idle

    def io(self, *args: Any, **kw: Any) -> _Watcher:
        raise RealIOError("a simulated node asked for a real file descriptor")

    def signal(self, *args: Any, **kw: Any) -> _Watcher:
        return _Refused(self)

    def child(self, *args: Any, **kw: Any) -> _Watcher:
        return _Refused(self)

    stat = fork = child

    def run_callback(self, func: Callable[..., Any], *args: Any) -> _Callback:
        cb = _Callback(func, args)
        self._callbacks.append(cb)
        return cb

    def run_callback_threadsafe(self, func: Callable[..., Any], *args: Any) -> _Callback:
        raise RealIOError("a simulated node handed work to another OS thread")

    # -------------------------------------------------------------- running
    def run(self, nowait: bool = False, once: bool = False) -> None:
        """Run callbacks, then the earliest timers, until nothing that holds a ref is left
        (the hub then raises LoopExit into whoever waits forever)."""
        while True:
            self._run_callbacks()
            if not self._next_timers():
                return
            if once or nowait:
                return

    def _run_callbacks(self) -> None:
        calls = self._callbacks
        popleft = calls.popleft
        while calls:
            cb = popleft()
            func = cb.callback
            if func is None:
                continue
            args = cb.args
            cb.callback, cb.args = None, ()  # cb.stop()
            self.events += 1
            try:  # self._guarded(func, args), written out: this runs for every callback
                func(*args)
            except BaseException:
                handler = self.error_handler
                if handler is None:
                    raise
                handler.handle_error(func, *sys.exc_info())

    def _next_timers(self) -> bool:
        """Move the clock to the earliest live timer and fire every timer due then."""
        heap = self._timers
        pop = heapq.heappop
        while heap:
            _, seq, t = heap[0]
            if t.active and t._seq == seq:  # self._live(heap[0])
                break
            pop(heap)
        if not heap:
            return False
        # the earliest live timer holds a ref (the common case), or a later live one does
        if not heap[0][2].ref and not any(t.ref for when, seq, t in heap
                                          if self._live((when, seq, t))):
            return False
        when = heap[0][0]
        self._now = max(self._now, when)
        while heap and heap[0][0] <= self._now:
            _, seq, t = pop(heap)
            if not (t.active and t._seq == seq):
                continue
            t.active = False
            t._seq = -1
            self.events += 1
            cb, args = t.callback, t.args
            if t.repeat > 0:
                t.active = True
                t._seq = self._add_timer(t, self._now + t.repeat)
            if cb is not None:
                self._guarded(cb, args)
            self._run_callbacks()
        return True

    @staticmethod
    def _live(entry: tuple[float, int, _Timer]) -> bool:
        _, seq, t = entry
        return t.active and t._seq == seq

    def _guarded(self, func: Callable[..., Any], args: tuple) -> None:
        try:
            func(*args)
        except BaseException:  # as libev does: the hub decides what an error means
            handler = self.error_handler
            if handler is None:
                raise
            handler.handle_error(func, *sys.exc_info())

    def handle_error(self, context: Any, *exc_info: Any) -> None:
        if self.error_handler is not None:
            self.error_handler.handle_error(context, *exc_info)

    # -------------------------------------------------------------- the rest of the interface
    def destroy(self) -> None:
        self._callbacks.clear()
        self._timers.clear()

    def reinit(self) -> None:
        """Nothing to reinitialise: no OS resources."""

    def break_(self, how: Any = None) -> None:
        """Unused by gevent's hub for a Python loop."""

    def closing_fd(self, fd: int) -> bool:
        return False

    def fileno(self) -> None:
        return None

    def ref(self) -> None:
        """Refs are per watcher here."""

    unref = ref

    @property
    def activecnt(self) -> int:
        return sum(1 for e in self._timers if self._live(e))

    @property
    def pendingcnt(self) -> int:
        return len(self._callbacks)

    def install_sigchld(self) -> None:
        """No child processes in a simulation."""

    reset_sigchld = install_sigchld


class _Idle(_Watcher):
    """Runs once the callbacks ahead of it have run (gevent.idle)."""

    def start(self, callback: Callable[..., Any], *args: Any, **_: Any) -> None:
        super().start(callback, *args)
        self.loop.run_callback(self._once)

    def _once(self) -> None:
        if self.active:
            self.active = False
            self._fire()


_collected = {"frozen": 0}  # how many objects the last full collection left
# A run's objects become garbage once its caller drops what it returned, after the thaw:
# the next run would freeze them, and a file of runs would hoard every run's. So when the
# frozen objects have grown by this many since the last full collection, one is made
# (the garbage of a few runs at most: some tens of MB).
_FULL_AFTER = 50_000


def _freeze() -> None:
    gc.freeze()
    if gc.get_freeze_count() > _collected["frozen"] + _FULL_AFTER:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _collected["frozen"] = gc.get_freeze_count()


def run_virtual(main: Callable[[], Any], start: float = 1_800_000_000.0) -> Any:
    """Run ``main()`` in a greenlet of a new OS thread whose hub runs on a VirtualLoop
    starting at ``start``; return what it returned (or raise what it raised)."""
    out: dict[str, Any] = {}

    def thread() -> None:
        loop = VirtualLoop(start)
        hub = gevent.hub.Hub(loop=loop)
        gevent.hub.set_hub(hub)
        try:
            out["value"] = gevent.spawn(main).get()
        except BaseException as e:  # carried to the caller's thread
            out["error"] = e
        finally:
            out["events"] = loop.events
            out["now"] = loop.now()
            hub.destroy(destroy_loop=True)

    th = threading.Thread(target=thread, name="virtual-loop", daemon=True)
    # what lived before the run is frozen out of the collector's sight until it ends: its
    # collections, and the cluster simulator's search for a crashed node's greenlets
    # (gc.get_referrers), then walk the run's own objects, not the whole test process's
    _freeze()
    try:
        th.start()
        th.join()
    finally:
        gc.unfreeze()
    if "error" in out:
        raise out["error"]
    return out["value"]
