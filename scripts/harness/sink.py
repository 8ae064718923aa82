"""A scriptable HTTP worker endpoint in a thread: records every request, answers by script.

For tests and fault scripts, which need every request (headers, body, times) and
scripted answers; a ``ThreadingHTTPServer`` in a daemon thread, so it runs with or
without gevent's monkey-patching. For throughput use ``harness.fastsink`` instead.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs, urlsplit

from requests.structures import CaseInsensitiveDict

from .waits import HarnessError

@dataclass
class Reply:
    """What the sink answers: status, headers, body, after ``delay`` seconds."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | str = b""
    delay: float = 0.0


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: CaseInsensitiveDict
    body: bytes
    time: float  # time.time() when the request (headers and body) was read
    done: float | None = None  # time.time() when its answer began to be written
    client: str = ""  # the sender's address (which node, for nodes in harness.netns hosts)

    @property
    def args(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)

    @property
    def form(self) -> dict[str, list[str]]:
        return parse_qs(self.body.decode("utf-8"), keep_blank_values=True)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def task_id(self) -> str | None:
        return self.headers.get("X-Task-Id")


class Sink:
    """A real HTTP worker endpoint in a thread of the test process.

    It records every request and answers by script: ``reply(path, *replies)`` sets
    what ``path`` answers (ints are statuses, or ``Reply`` objects); each request
    takes the next reply and the last one repeats. Unscripted paths answer 200.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host = host  # a harness.netns root address, for nodes in namespaces
        self._cond = threading.Condition()
        self._requests: list[Request] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._stopping = threading.Event()
        self.inflight = 0
        self.max_inflight = 0
        self.max_inflight_by_path: dict[str, int] = {}
        self._inflight_by_path: dict[str, int] = {}
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 60

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                sink._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False
            allow_reuse_address = True
            request_queue_size = 1024  # hundreds of deliveries may connect at once

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a node that hangs up on us (timeouts, kill -9) is expected

        self._server = Server((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, path: str) -> str:
        return self.url + path

    def start(self) -> "Sink":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in a delay
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "Sink":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ scripting
    def reply(self, path: str, *replies: int | Reply) -> None:
        if not replies:
            raise ValueError("give at least one reply")
        with self._cond:
            self._scripts[path] = [r if isinstance(r, Reply) else Reply(r) for r in replies]

    def _next_reply(self, path: str) -> Reply:
        with self._cond:
            script = self._scripts.get(path)
            if not script:
                return Reply(200)
            return script.pop(0) if len(script) > 1 else script[0]

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    h.rfile.readline()
                    break
                chunks.append(h.rfile.read(size))
                h.rfile.readline()
            body = b"".join(chunks)
        else:
            body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        req = Request(method=h.command, path=parts.path, query=parts.query,
                      headers=CaseInsensitiveDict(h.headers.items()), body=body, time=time.time(),
                      client=str(h.client_address[0]))
        with self._cond:
            self._requests.append(req)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            n = self._inflight_by_path.get(req.path, 0) + 1
            self._inflight_by_path[req.path] = n
            self.max_inflight_by_path[req.path] = max(self.max_inflight_by_path.get(req.path, 0), n)
            self._cond.notify_all()
        reply = self._next_reply(req.path)
        try:
            if reply.delay:
                self._stopping.wait(reply.delay)
            data = reply.body.encode() if isinstance(reply.body, str) else reply.body
            h.send_response(reply.status)
            for k, v in reply.headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            # ended before its bytes go: once they are out the node may start its next
            # delivery at once, and a thread stamping it before this one went on would
            # show two deliveries of one key (or path) at the same time that never were
            self._ended(req)
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
            h.wfile.flush()
        except OSError:  # the node gave up on us (a timeout); that is what some tests want
            h.close_connection = True
        finally:
            self._ended(req)

    def _ended(self, req: Request) -> None:
        """The request's answer is (being) written: ``done`` and the in-flight counts."""
        with self._cond:
            if req.done is not None:
                return
            req.done = time.time()
            self.inflight -= 1
            self._inflight_by_path[req.path] -= 1
            self._cond.notify_all()

    # ------------------------------------------------------------ what arrived
    def requests(self, path: str | None = None) -> list[Request]:
        with self._cond:
            return [r for r in self._requests if path is None or r.path == path]

    def count(self, path: str | None = None) -> int:
        return len(self.requests(path))

    def by_task_id(self, path: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.requests(path):
            if r.task_id:
                out[r.task_id] = out.get(r.task_id, 0) + 1
        return out

    def wait_for(self, predicate: Callable[[list[Request]], Any] | None = None, *,
                 count: int | None = None, path: str | None = None,
                 timeout: float = 10.0) -> list[Request]:
        """Wait until ``predicate(requests)`` is truthy or ``count`` requests (to ``path``)
        arrived; returns those requests. Fails with what did arrive at the deadline."""
        if predicate is None and count is None:
            raise ValueError("give a predicate or a count")

        def ok(reqs: list[Request]) -> bool:
            if count is not None and len(reqs) < count:
                return False
            return predicate is None or bool(predicate(reqs))

        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                reqs = [r for r in self._requests if path is None or r.path == path]
                if ok(reqs):
                    return reqs
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.method, r.path, r.task_id) for r in reqs][:20]
                    raise HarnessError(f"sink: timed out after {timeout:g}s waiting for "
                                         f"{'count=%s ' % count if count is not None else ''}"
                                         f"{'a condition ' if predicate else ''}on "
                                         f"{path or 'any path'}; got {len(reqs)}: {seen}")
                self._cond.wait(left)

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no request is being answered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HarnessError(f"sink: {self.inflight} requests still in flight")
                self._cond.wait(left)
