"""A webhook sink for benchmarks and smoke tests: counts what Miyamoto delivers.

The sink serves HTTP/1.1 on 127.0.0.1 (gevent's StreamServer, requests parsed by
``httptools``) and answers every request with an empty 200. It records, per task, when
the first delivery arrived and how many deliveries arrived. Deliveries are keyed by
the ``X-Task-Id`` header and by the ``seq`` param in the body (or in the query string,
for GET and DELETE tasks).

It is light on purpose, because it shares the box with the server it measures. It
was gevent.pywsgi, whose header parsing (the stdlib email parser) made the sink about
half of the bench process's CPU. That CPU was taken from the node, or from Celery's
workers, under test.

Every accepted socket gets ``TCP_NODELAY``. Keep-alive and pipelined requests are
answered in order, one send for the answers to each read. A request httptools cannot
parse is answered 400 and its connection closed.

The module does not monkey-patch; the program that imports it does that once.
``scripts/sink.py`` runs it alone, to watch deliveries by hand.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import httptools
from gevent.server import StreamServer

__all__ = ["Sink", "SinkStats"]

MAX_BODY = 1 << 20  # bytes kept of one delivery; the rest is read and ignored
BACKLOG = 1024  # gevent's default 128 lets a burst of new connections wait in SYN retries
READ = 65536
BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
               b"Connection: close\r\n\r\n")


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


class _Request:
    """httptools' callbacks for one connection: the requests completed by a feed."""

    __slots__ = ("body", "close", "done", "parser", "task_id", "url")

    def __init__(self) -> None:
        self.url = b""
        self.task_id: str | None = None
        self.body = b""
        self.done: list[tuple[bytes, str | None, bytes]] = []
        self.close = False  # a completed request asked to close (read as it completes:
        # once the next one starts, the parser answers for that one)
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 9 and name.lower() == b"x-task-id":
            self.task_id = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if len(self.body) < MAX_BODY:
            self.body += body[:MAX_BODY - len(self.body)]

    def on_message_complete(self) -> None:
        self.done.append((self.url, self.task_id, self.body))
        self.url, self.task_id, self.body = b"", None, b""
        self.close = self.close or not self.parser.should_keep_alive()


def _params(url: bytes, body: bytes) -> dict[str, str]:
    """The delivery's params: the form body, else the query string."""
    raw = body if body else url.partition(b"?")[2]
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


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
        backlog: int = BACKLOG,
    ) -> None:
        self.stats = SinkStats()
        self.run = run
        self.clock = clock
        reason = "OK" if status == 200 else "Sink"
        self._answer = (f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n"
                        f"Content-Type: text/plain\r\n\r\n").encode()
        self._server = StreamServer(("127.0.0.1", port), self._handle, backlog=backlog)

    def _handle(self, sock: socket.socket, _address: Any) -> None:
        """Answer the requests of one connection until the client closes it."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer may already be gone
            return
        req = _Request()
        try:
            while True:
                data = sock.recv(READ)
                if not data:
                    return
                try:
                    req.parser.feed_data(data)
                except httptools.HttpParserError:
                    sock.sendall(BAD_REQUEST)
                    return
                if req.done:
                    self._count(req.done)
                    sock.sendall(self._answer * len(req.done))
                    req.done.clear()
                    if req.close:
                        return
        except OSError:  # the client went away
            return

    def _count(self, done: list[tuple[bytes, str | None, bytes]]) -> None:
        now = self.clock()
        for url, task_id, body in done:
            params = _params(url, body)
            seq = params.get("seq")
            if self.run is not None and params.get("run") != self.run:
                seq = None
            self.stats.record(seq, task_id, now)

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
