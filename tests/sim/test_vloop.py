"""tests/sim/vloop.py: gevent on virtual time runs sleeps, timeouts, waits and spawns in
simulated seconds, in a fixed order, and refuses real I/O."""

from __future__ import annotations

import os
import socket
import sys
import time

import gevent
import gevent.event
import gevent.pool
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from vloop import RealIOError, run_virtual  # noqa: E402


def _scenario() -> list:
    loop = gevent.get_hub().loop
    t0 = loop.now()
    out: list = []

    def worker(name: int, delay: float) -> None:
        gevent.sleep(delay)
        out.append((name, loop.now() - t0))

    group = gevent.pool.Group()
    for i in range(5):
        group.spawn(worker, i, 10 - i)
    ev = gevent.event.Event()
    gevent.spawn_later(3600, ev.set)
    out.append(("wait", ev.wait(timeout=60), loop.now() - t0))
    try:
        with gevent.Timeout(5):
            gevent.sleep(100)
    except gevent.Timeout:
        out.append(("timeout", loop.now() - t0))
    group.join()
    ev.wait()
    out.append(("set", loop.now() - t0))
    return out


def test_an_hour_of_sleeps_timeouts_and_waits_takes_no_real_time() -> None:
    began = time.monotonic()
    out = run_virtual(_scenario)
    assert out == [(4, 6.0), (3, 7.0), (2, 8.0), (1, 9.0), (0, 10.0), ("wait", False, 60.0),
                   ("timeout", 65.0), ("set", 3600.0)]
    assert time.monotonic() - began < 5  # an hour of virtual time, not of real time


def test_the_same_program_runs_in_the_same_order() -> None:
    def racing() -> list[int]:
        order: list[int] = []
        ev = gevent.event.Event()

        def w(i: int) -> None:
            ev.wait()
            gevent.sleep(0.001 * (i % 3))
            order.append(i)
        g = gevent.pool.Group()
        for i in range(50):
            g.spawn(w, i)
        gevent.sleep(1)
        ev.set()
        g.join()
        return order
    first = run_virtual(racing)
    assert sorted(first) == list(range(50))
    assert run_virtual(racing) == first


def test_an_error_in_a_greenlet_reaches_the_caller_and_real_sockets_are_refused() -> None:
    def bad() -> None:
        gevent.sleep(1)
        raise ValueError("boom")
    with pytest.raises(ValueError, match="boom"):
        run_virtual(bad)

    def dial() -> None:
        import gevent.socket
        s = gevent.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.recv(1)  # would wait on the fd: refused
    with pytest.raises(RealIOError):
        run_virtual(dial)


def test_waiting_forever_ends_the_run_instead_of_hanging() -> None:
    def forever() -> None:
        gevent.event.Event().wait()  # nothing can set it: the loop runs dry
    with pytest.raises(gevent.exceptions.LoopExit):
        run_virtual(forever)
