"""The HTTP server's connection bookkeeping (``miyamoto.http.connections``) on a fake clock:
deadlines for waiting connections only, the idle timeout, the cap that evicts the
longest waiter and refuses only when all are busy, and the stop. On a real node:
tests/nodes/test_http_hardening.py."""

from __future__ import annotations

import logging
import socket

import pytest

from miyamoto.http.connections import INF, Connections

pytestmark = pytest.mark.timeout(10)


class FakeSock:
    def __init__(self, fails: bool = False) -> None:
        self.shut: int | None = None
        self.fails = fails

    def shutdown(self, how: int) -> None:
        if self.fails:
            raise OSError("already reset")
        self.shut = how


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def conns(cap: int = 3, clock: Clock | None = None) -> Connections:
    return Connections(cap=cap, header_timeout=10, idle_timeout=30, clock=clock or Clock())


def test_connections_deadlines_and_eviction() -> None:
    clock = Clock()
    c3 = conns(clock=clock)
    a, b, c = (c3.admit(FakeSock()) for _ in range(3))
    assert a and b and c and len(c3) == 3 and c3.waiting == 3
    assert a.deadline == 110.0  # header_timeout from the accept
    c3.busy(b)  # b's head arrived: the application has it
    assert c3.waiting == 2
    clock.now += 1
    c3.busy(a)
    assert c3.idle(a) and a.deadline == 131.0  # a answered and waits 30 s for its next
    d = c3.admit(FakeSock())  # at the cap: the longest waiter (c, since 100) goes
    assert d is not None and c.sock.shut == socket.SHUT_RDWR and not c.open and len(c3) == 3
    assert c3.evicted == 1 and c.deadline == INF
    clock.now = 111  # d's first request is late (10 s from 101), a idles until 131
    assert c3.sweep() == 1 and d.sock.shut and not a.sock.shut and c3.expired == 1
    clock.now = 131  # a deadline is due at its own instant
    assert c3.sweep() == 1 and a.sock.shut
    assert not b.sock.shut and b.deadline == INF and c3.sweep() == 0


def test_connections_refuse_when_all_busy_and_when_stopping() -> None:
    c2 = conns(cap=2)
    for _ in range(2):
        conn = c2.admit(FakeSock())
        assert conn is not None
        c2.busy(conn)
    assert c2.admit(FakeSock()) is None and c2.refused == 1 and c2.evicted == 0
    c5 = conns(cap=5)
    waiting, busy = c5.admit(FakeSock()), c5.admit(FakeSock())
    assert waiting and busy
    c5.busy(busy)
    c5.close_waiting()
    assert c5.closing and waiting.sock.shut and not busy.sock.shut
    assert not c5.idle(busy) and c5.admit(FakeSock()) is None


def test_a_request_or_a_linger_waits_again_at_the_back() -> None:
    clock = Clock()
    c3 = conns(clock=clock)
    a, b, c = (c3.admit(FakeSock()) for _ in range(3))
    clock.now = 105
    c3.request(a)  # a's first byte: its request is due 10 s from now, and it is newest
    assert a.deadline == a.request_deadline == 115.0
    c3.linger(b, 2.0)
    assert b.deadline == 107.0
    c3.admit(FakeSock())  # evicts c, now the longest waiter
    assert c.sock.shut and not a.sock.shut and not b.sock.shut


def test_an_ended_connection_is_neither_waited_on_nor_evicted() -> None:
    c2 = conns(cap=2)
    a, b = c2.admit(FakeSock()), c2.admit(FakeSock())
    c2.remove(a)
    assert len(c2) == 1 and c2.waiting == 1 and not a.open
    assert not c2.idle(a)
    c2.request(a)  # a late byte of a closed connection: not waiting again
    assert c2.waiting == 1
    assert c2.admit(FakeSock()) is not None and not b.sock.shut  # room: nobody evicted


def test_a_socket_already_reset_is_closed_quietly() -> None:
    c1 = conns(cap=1)
    c1.admit(FakeSock(fails=True))
    assert c1.admit(FakeSock()) is not None and c1.evicted == 1


def test_the_sweep_period_follows_the_shorter_timeout() -> None:
    assert Connections(1, 2.0, 8.0).sweep_interval == 0.5
    assert Connections(1, 8.0, 2.0).sweep_interval == 0.5
    assert Connections(1, 100.0, 60.0).sweep_interval == 1.0
    assert Connections(1, 0.1, 60.0).sweep_interval == 0.05


def test_a_full_node_warns_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    c1 = conns(cap=1, clock=clock)
    with caplog.at_level(logging.WARNING):
        for t in (100.0, 130.0, 189.9, 190.0):  # full from the second on
            clock.now = t
            c1.admit(FakeSock())
    assert caplog.text.count("connections open (max_connections)") == 2
