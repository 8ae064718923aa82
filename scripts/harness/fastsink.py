"""A webhook sink for benchmarks and smoke tests: counts what Miyamoto delivers.

The sink is a gevent.pywsgi server on 127.0.0.1 that answers every request with an
empty 200 and records, per task, when the first delivery arrived and how many
deliveries arrived -- keyed both by the ``X-Task-Id`` header and by the ``seq``
param in the body (or the query string, for GET/DELETE tasks).

Every accepted socket gets ``TCP_NODELAY``: gevent.pywsgi writes the headers and
the body in two sends, and without it every keep-alive response after the first
waits ~40 ms for a delayed ACK (gevent issue #1233), which would make the sink,
not the server under test, the bottleneck.

The module does not monkey-patch; the program that imports it does that once.
``scripts/sink.py`` runs it alone, to watch deliveries by hand.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl

from gevent.pywsgi import WSGIHandler, WSGIServer

__all__ = ["NoDelayHandler", "Sink", "SinkStats"]

MAX_BODY = 1 << 20  # bytes read from one delivery; the rest is ignored
BACKLOG = 1024  # gevent's default 128 lets a burst of new connections wait in SYN retries
EMPTY_200 = [("Content-Length", "0"), ("Content-Type", "text/plain")]


class NoDelayHandler(WSGIHandler):
    """A pywsgi handler that sets TCP_NODELAY on its accepted socket (gevent #1233)."""

    def handle(self) -> None:
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer may already be gone; pywsgi handles that
            pass
        super().handle()


class SinkStats:
    """What the sink saw. Keys are strings exactly as delivered."""

    def __init__(self) -> None:
        self.first_at: dict[str, float] = {}  # seq -> clock() at the first delivery
        self.by_seq: dict[str, int] = {}  # seq -> deliveries
        self.by_id: dict[str, int] = {}  # X-Task-Id -> deliveries
        self.id_of_seq: dict[str, str] = {}  # seq -> X-Task-Id of its first delivery
        self.requests = 0  # every request the sink answered
        self.foreign = 0  # deliveries without a seq, or of another run
        self.last_at = 0.0  # clock() at the latest first delivery

    def record(self, seq: str | None, task_id: str | None, now: float) -> None:
        """Count one delivery (``seq`` None = not one of ours)."""
        self.requests += 1
        if task_id:
            self.by_id[task_id] = self.by_id.get(task_id, 0) + 1
        if seq is None:
            self.foreign += 1
            return
        count = self.by_seq.get(seq, 0)
        self.by_seq[seq] = count + 1
        if count == 0:
            self.first_at[seq] = now
            self.last_at = now
            if task_id:
                self.id_of_seq[seq] = task_id

    @property
    def delivered(self) -> int:
        """Distinct seqs delivered at least once."""
        return len(self.first_at)

    def duplicated_seqs(self) -> list[str]:
        """Seqs delivered more than once."""
        return [seq for seq, n in self.by_seq.items() if n > 1]

    def duplicated_ids(self) -> list[str]:
        """Task ids delivered more than once."""
        return [tid for tid, n in self.by_id.items() if n > 1]


def _params(environ: dict[str, Any]) -> list[tuple[str, str]]:
    """The delivery's params: the form body, else the query string."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    stream = environ["wsgi.input"]
    if length > 0:
        body = stream.read(min(length, MAX_BODY))
    elif "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        body = stream.read(MAX_BODY)
    else:
        body = b""
    raw = body.decode("latin-1") if body else environ.get("QUERY_STRING", "")
    return parse_qsl(raw, keep_blank_values=True)


class Sink:
    """An in-process delivery counter on 127.0.0.1.

    ``run`` (optional) is a per-run nonce: a delivery whose ``run`` param differs is
    counted as foreign, so stale tasks of an earlier run cannot pollute the numbers.
    """

    def __init__(
        self,
        port: int = 0,
        run: str | None = None,
        status: int = 200,
        clock: Callable[[], float] = time.perf_counter,
        error_log: Any = None,
        backlog: int = BACKLOG,
    ) -> None:
        self.stats = SinkStats()
        self.run = run
        self.clock = clock
        self._status_line = f"{status} {'OK' if status == 200 else 'Sink'}"
        self._server = WSGIServer(
            ("127.0.0.1", port),
            self._app,
            handler_class=NoDelayHandler,
            backlog=backlog,
            log=None,
            error_log=error_log if error_log is not None else sys.stderr,
        )

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        now = self.clock()
        params = dict(_params(environ))
        seq = params.get("seq")
        if self.run is not None and params.get("run") != self.run:
            seq = None
        self.stats.record(seq, environ.get("HTTP_X_TASK_ID"), now)
        start_response(self._status_line, EMPTY_200)
        return [b""]

    def start(self) -> Sink:
        """Bind and serve in the background (needs a running gevent hub)."""
        self._server.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop serving; open keep-alive connections are closed after ``timeout``."""
        self._server.stop(timeout=timeout)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._server.server_port)

    def url(self, path: str = "/hook") -> str:
        """The URL tasks should target."""
        return f"http://127.0.0.1:{self.port}{path}"
