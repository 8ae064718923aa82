"""Reusable test fixtures: real node processes, a real HTTP sink, deadline waits.

Nothing here monkey-patches. The sink is a ``ThreadingHTTPServer`` in a daemon
thread of the test process; nodes are ``python -m miyamoto serve`` subprocesses
whose output goes to a log file in the test's tmp dir (and into the failure
report, through ``conftest.py``). Every wait is a condition with a deadline.

For cluster tests::

    a = NodeProcess(tmp_path, "a", registry=reg).start().wait_ready()
    b = NodeProcess(tmp_path, "b", seeds=[a.cluster_addr], registry=reg).start().wait_ready()
    b.kill(); b.restart().wait_ready()
    sink = Sink().start()
    sink.reply("/w", 500, 500, 200)          # a script; the last reply repeats
    reqs = sink.wait_for(count=3, path="/w")
"""

from __future__ import annotations

import atexit
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit

import requests
from requests.structures import CaseInsensitiveDict

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- waiting

def wait_until(fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str | None = None) -> Any:
    """Poll ``fn`` until it returns something truthy; return that, or fail at the deadline.

    Exceptions from ``fn`` count as "not yet" (the last one is reported on timeout).
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:  # e.g. connection refused while a node starts
            last_exc = e
        if time.monotonic() >= deadline:
            desc = what or getattr(fn, "__name__", "condition")
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {desc}{extra}")
        time.sleep(interval)


# ---------------------------------------------------------------- ports

def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS just handed out on 127.0.0.1 (held until all are known)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_refuses(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on ``port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return False
    except OSError:
        return True


# ---------------------------------------------------------------- node processes

_ALL_PROCS: "weakref.WeakSet[NodeProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:  # a safety net; the fixtures kill their processes themselves
    for p in list(_ALL_PROCS):
        try:
            p.kill()
        except Exception:
            pass


class ProcessRegistry:
    """Every process a test started; ``kill_all`` runs in the fixture finalizer."""

    def __init__(self) -> None:
        self.procs: list[NodeProcess] = []

    def add(self, proc: "NodeProcess") -> None:
        if proc not in self.procs:
            self.procs.append(proc)

    def kill_all(self) -> None:
        for p in self.procs:
            try:
                p.kill()
            except Exception:
                pass

    def logs(self, tail: int = 200) -> list[tuple[str, str]]:
        return [(f"node {p.node_id} log ({p.log_path})", p.log_text(tail)) for p in self.procs]


class NodeProcess:
    """A ``miyamoto serve`` subprocess on OS-assigned ports.

    ``env`` maps option names or ``MIYAMOTO_*`` names to values (e.g.
    ``{"replica_offset": 1}`` or ``{"MIYAMOTO_REPLICA_OFFSET": "1"}``); the test
    process's own ``MIYAMOTO_*`` variables are never inherited. ``extra_args`` are
    appended to the command line. ``data_dir`` defaults to ``<base_dir>/data-<id>``;
    ``restart()`` reuses the same ports and data dir.
    """

    def __init__(self, base_dir: os.PathLike | str, node_id: str | None = None, *,
                 http_port: int | None = None, cluster_port: int | None = None,
                 data_dir: str | None = None, seeds: Iterable[str] = (),
                 config: str | os.PathLike | None = None, extra_args: Sequence[str] = (),
                 env: Mapping[str, Any] | None = None, registry: ProcessRegistry | None = None,
                 with_cluster_flags: bool = True):
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if http_port is None or cluster_port is None:
            p1, p2 = free_ports(2)
            http_port = http_port or p1
            cluster_port = cluster_port or p2
        self.http_port = http_port
        self.cluster_port = cluster_port
        self.node_id = node_id or f"n{http_port}"
        self.data_dir = data_dir if data_dir is not None else str(self.base_dir / f"data-{self.node_id}")
        self.seeds = list(seeds)
        self.config = str(config) if config is not None else None
        self.extra_args = list(extra_args)
        self.env_overrides = dict(env or {})
        self.with_cluster_flags = with_cluster_flags
        self.log_path = self.base_dir / f"node-{self.node_id}.log"
        self.proc: subprocess.Popen | None = None
        self._log_file: Any = None
        self.starts = 0
        self.session = requests.Session()
        if registry is not None:
            registry.add(self)
        _ALL_PROCS.add(self)

    # ------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def http_addr(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def cluster_addr(self) -> str:
        return f"tcp://127.0.0.1:{self.cluster_port}"

    # ------------------------------------------------------------ lifecycle
    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "miyamoto", "serve", "--node", self.node_id,
               "--http", self.http_addr, "--data-dir", self.data_dir]
        if self.with_cluster_flags:
            cmd += ["--cluster", self.cluster_addr]
            if self.seeds:
                cmd += ["--seeds", ",".join(self.seeds)]
        if self.config:
            cmd += ["--config", self.config]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIYAMOTO_")}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for k, v in self.env_overrides.items():
            name = k if k.startswith("MIYAMOTO_") else "MIYAMOTO_" + k.upper()
            env[name] = str(v)
        return env

    def start(self) -> "NodeProcess":
        if self.running:
            raise RuntimeError(f"node {self.node_id} is already running")
        self._close_log()
        self._log_file = open(self.log_path, "ab")
        self.starts += 1
        self._log_file.write(f"===== start #{self.starts}: {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        self.proc = subprocess.Popen(self.command(), stdout=self._log_file,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.environment(), cwd=str(self.base_dir))
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def wait_ready(self, timeout: float = 15.0, ready: bool = True) -> "NodeProcess":
        """Wait until GET /healthz (and, with ``ready``, GET /readyz) answers 200."""
        paths = ["/healthz"] + (["/readyz"] if ready else [])

        def up() -> bool:
            if not self.running:
                raise NodeDied(f"node {self.node_id} exited with {self.returncode} while "
                               f"starting:\n{self.log_text(60)}")
            return all(requests.get(self.url + p, timeout=1.0).status_code == 200 for p in paths)

        deadline = time.monotonic() + timeout
        while True:
            try:
                if up():
                    return self
            except NodeDied:
                raise
            except requests.RequestException:
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(f"node {self.node_id} not ready after {timeout:g}s:\n"
                                     f"{self.log_text(60)}")
            time.sleep(0.03)

    def wait_exit(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.node_id} still running after {timeout:g}s:\n"
                                 f"{self.log_text(60)}") from None

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap; a no-op when not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._close_log()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait for the exit (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            raise RuntimeError("never started")
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"node {self.node_id} ignored SIGTERM for {timeout:g}s:\n"
                                     f"{self.log_text(60)}") from None
        self._close_log()
        return self.proc.returncode

    def restart(self) -> "NodeProcess":
        """Kill (if running) and start again on the same ports and data dir."""
        self.kill()
        return self.start()

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
            self._log_file = None

    def log_text(self, tail: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    # ------------------------------------------------------------ HTTP helpers
    def request(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 10)
        return self.session.request(method, self.url + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> requests.Response:
        return self.request("DELETE", path, **kw)

    def enqueue(self, queue: str | None = None, **fields: Any) -> dict[str, Any]:
        """POST a JSON task; assert 200 and return the answer."""
        r = self.post("/queue" + (f"/{queue}" if queue else ""), json=fields)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.get(f"/tasks/{task_id}")
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def wait_task_state(self, task_id: str, state: str, timeout: float = 10.0) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            last.clear()
            last.update(self.task(task_id))
            return dict(last) if last.get("state") == state else None

        try:
            return wait_until(check, timeout, what=f"task {task_id} to be {state}")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {last}") from None

    def counts(self, queue: str = "default") -> dict[str, int]:
        r = self.get(f"/queues/{queue}")
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()["counts"]

    def close(self) -> None:
        self.session.close()


class NodeDied(AssertionError):
    pass


# ---------------------------------------------------------------- the sink

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
    done: float | None = None  # time.time() when the answer was written

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
        return f"http://127.0.0.1:{self.port}"

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
                      headers=CaseInsensitiveDict(h.headers.items()), body=body, time=time.time())
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
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
            h.wfile.flush()
        except OSError:  # the node gave up on us (a timeout); that is what some tests want
            h.close_connection = True
        finally:
            with self._cond:
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
                    raise AssertionError(f"sink: timed out after {timeout:g}s waiting for "
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
                    raise AssertionError(f"sink: {self.inflight} requests still in flight")
                self._cond.wait(left)


# ---------------------------------------------------------------- CLI

def run_cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = 30.0,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m miyamoto ARGS`` to completion; returns the CompletedProcess (text)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("MIYAMOTO_")}
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "miyamoto", *args], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd)


def write_ini(path: os.PathLike | str, sections: Mapping[str, Mapping[str, Any]]) -> str:
    """Write ``{"miyamoto": {...}, "queue:default": {...}}`` as an INI file; returns the path."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {v}" for k, v in values.items())
        lines.append("")
    Path(path).write_text("\n".join(lines))
    return str(path)


# ---------------------------------------------------------------- clusters

def cluster_view(node: NodeProcess, timeout: float = 2.0) -> dict[str, Any]:
    """GET /cluster on ``node`` (asserting 200)."""
    r = node.get("/cluster", timeout=timeout)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def member_ids(view: Mapping[str, Any]) -> list[str]:
    return sorted(m["id"] for m in view.get("members", []))


def wait_converged(nodes: Sequence[NodeProcess], timeout: float = 15.0,
                   expect: Iterable[str] | None = None) -> dict[str, Any]:
    """Wait until every node's GET /cluster names the same leader (one of them), the same
    term and the same members: the ids of ``nodes`` (or ``expect``). Returns one view."""
    want = sorted(expect) if expect is not None else sorted(n.node_id for n in nodes)
    last: dict[str, Any] = {}

    def agreed() -> dict[str, Any] | None:
        views = {}
        for n in nodes:
            if not n.running:
                raise NodeDied(f"node {n.node_id} exited with {n.returncode}:\n{n.log_text(60)}")
            views[n.node_id] = cluster_view(n)
        last.clear()
        last.update({k: (v.get("leader"), v.get("term"), v.get("version"), member_ids(v))
                     for k, v in views.items()})
        first = next(iter(views.values()))
        if first.get("leader") not in want:
            return None
        for v in views.values():
            if (v.get("leader"), v.get("term"), member_ids(v)) != \
                    (first.get("leader"), first.get("term"), want):
                return None
        return first

    try:
        return wait_until(agreed, timeout, interval=0.05, what=f"cluster {want} to agree")
    except NodeDied:
        raise
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen (leader, term, version, members): {last}") from None
