"""The HTTP server's open connections: read deadlines, the idle timeout and the cap.

A connection is *waiting* while the node waits for its client's bytes (a new connection's
first request, the next request on a keep-alive connection, a head still arriving, a body
the application is reading) and *busy* while the application works on a request. Only a
waiting connection has a deadline: ``header_timeout`` from the first byte of a request
(from the accept, for a connection's first request) to its last one, or
``idle_timeout`` between requests. A sweep (``sweep()``, run by the server every fraction
of the shorter timeout) shuts down every waiting connection past its deadline. One sweep
over all connections costs less than a timer started and cancelled per request, and it
keeps the hot path to a clock read and a dict update; the price is a deadline that is
late by up to one sweep period.

Closing is ``socket.shutdown``: the greenlet blocked on the socket wakes with an error
and ends its connection itself, whatever it was reading (nothing is thrown into
application code, and a busy connection is never touched).

The cap (``max_connections``). At the cap, a new connection closes the one that has been
waiting longest for its client (the oldest idle keep-alive connection or slow head);
only when every connection is busy in the application does the new one get 503 and
close. The alternative, refusing new connections while full (what a bounded accept
pool does: the earlier server stopped accepting at 4,096 and ``/healthz`` timed out
behind 4,200 idle sockets), hands the node to whoever opens connections fastest:
idle sockets cost an attacker nothing to hold, and every legitimate client would be
refused until their deadlines ran out. Evicting the longest waiter makes holding a slot
a race the attacker loses: a real client sends its request within a round trip of
connecting, so it is almost never the oldest waiter, and an idle keep-alive client that
is evicted simply reconnects (clients expect servers to close idle connections). nginx
does the same when it runs out of connections (``ngx_drain_connections`` closes
reusable, i.e. idle keep-alive, connections).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

INF = float("inf")


class Conn:
    """One accepted connection. ``deadline`` is INF while busy; ``request_deadline`` is the
    current request's, which a body read (``server._Input``) arms again."""

    __slots__ = ("sock", "deadline", "request_deadline", "open")

    def __init__(self, sock: Any, deadline: float):
        self.sock = sock
        self.deadline = deadline
        self.request_deadline = deadline
        self.open = True


class Connections:
    def __init__(self, cap: int, header_timeout: float, idle_timeout: float,
                 clock: Callable[[], float] = time.monotonic):
        self.cap = cap
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._all: dict[Conn, None] = {}
        self._waiting: dict[Conn, None] = {}  # insertion order = since when it waits
        self.closing = False
        self.expired = 0
        self.evicted = 0
        self.refused = 0
        self._warned_at = -INF

    def __len__(self) -> int:
        return len(self._all)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def sweep_interval(self) -> float:
        """A quarter of the shorter timeout, between 50 ms and 1 s."""
        return min(1.0, max(0.05, min(self.header_timeout, self.idle_timeout) / 4))

    def admit(self, sock: Any) -> Conn | None:
        """Track a new connection, evicting the longest waiter at the cap; None: refuse it
        (at the cap with every connection busy, or stopping)."""
        if self.closing:
            return None
        now = self._clock()
        if len(self._all) >= self.cap:
            self._warn_full(now)
            if not self._waiting:
                self.refused += 1
                return None
            self._close(next(iter(self._waiting)))
            self.evicted += 1
        conn = Conn(sock, now + self.header_timeout)
        self._all[conn] = None
        self._waiting[conn] = None
        return conn

    def idle(self, conn: Conn) -> bool:
        """Between two requests: wait for the next one at most ``idle_timeout``. False:
        the connection is closed or the server is stopping, so do not wait."""
        if self.closing or not conn.open:
            return False
        conn.deadline = self._clock() + self.idle_timeout
        self._waiting[conn] = None
        return True

    def request(self, conn: Conn) -> None:
        """A request's first byte came: its head and body are due within header_timeout."""
        conn.request_deadline = self._clock() + self.header_timeout
        self._wait_again(conn, conn.request_deadline)

    def busy(self, conn: Conn) -> None:
        """The head was read: the application has the request; no deadline while it works."""
        self._waiting.pop(conn, None)
        conn.deadline = INF

    def linger(self, conn: Conn, seconds: float) -> None:
        """An answered bad request: the client has ``seconds`` to stop sending (it can
        be evicted meanwhile, like any waiting connection)."""
        self._wait_again(conn, self._clock() + seconds)

    def remove(self, conn: Conn) -> None:
        """The connection ended (its handler is done)."""
        conn.open = False
        self._all.pop(conn, None)
        self._waiting.pop(conn, None)

    def sweep(self) -> int:
        """Close every connection past its deadline; how many were closed."""
        now = self._clock()
        expired = [c for c in self._all if c.deadline <= now]
        for conn in expired:
            self._close(conn)
        self.expired += len(expired)
        return len(expired)

    def close_waiting(self) -> None:
        """Stopping: close every waiting connection, and let busy ones finish their request
        and then close (``idle`` answers False from now on)."""
        self.closing = True
        for conn in list(self._waiting):
            self._close(conn)

    def _warn_full(self, now: float) -> None:
        """At the cap: say so, at most once a minute (an attack must not flood the log)."""
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning("http: %d connections open (max_connections): closing the longest "
                        "idle one for each new one; %d evicted, %d refused so far",
                        len(self._all), self.evicted, self.refused)

    def _wait_again(self, conn: Conn, deadline: float) -> None:
        """Waiting again, until ``deadline``: to the back of the eviction order."""
        conn.deadline = deadline
        waiting = self._waiting
        waiting.pop(conn, None)
        if conn.open:
            waiting[conn] = None

    def _close(self, conn: Conn) -> None:
        self.remove(conn)
        conn.deadline = INF
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed or reset: the handler is ending anyway
            pass
