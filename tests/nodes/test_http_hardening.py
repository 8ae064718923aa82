"""The node's HTTP server against hostile clients: raw sockets to a real node process.

What the issue found: 4,200 idle connections that each sent 9 bytes made ``/healthz``
time out; a 6.4 MiB header block was held; a short body or a bad chunk answered 500 with
a traceback; two Content-Lengths, or chunked plus Content-Length, were accepted. Here
every malformed request must get a 4xx JSON answer or a quiet close, the node's log must
show no traceback and no 500, and the node must go on serving. The parser
(``miyamoto.http.head``) and the connection bookkeeping (``miyamoto.http.connections``) are
checked in process too: tests/unit/http/test_head.py (with a fuzzer) and test_connections.py.

Timing: deadlines are checked as "closed after at least the timeout and within the
timeout plus slack", and every wait has a deadline; nothing sleeps to hope.
"""

from __future__ import annotations

import json
import re
import resource
import selectors
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import write_node_config
from helpers import NodeProcess, ProcessRegistry, wait_until
from httpcases import BODY, HEAD, MALFORMED, SMUGGLED, VALID, chunked, mutate

HEADER_TIMEOUT = 2.0  # the shared node's http_header_timeout and http_idle_timeout
IDLE_TIMEOUT = 2.0
SLACK = 1.5  # a sweep runs every quarter timeout; the box is shared and slow at times
STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")

# ================================================================ raw-socket helpers


def connect(node: NodeProcess, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.http_port), timeout=timeout)


def read_all(s: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the node sends until it closes; fails if it does not close in time."""
    out = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            raise AssertionError(f"not closed within {timeout:g}s; got {bytes(out[:300])!r}")
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


def exchange(node: NodeProcess, data: bytes, *, half_close: bool = True,
             timeout: float = 5.0) -> bytes:
    """Send ``data`` on a new connection (then, with ``half_close``, a FIN: the node sees
    the end of what we send) and return all the node answers before it closes."""
    with connect(node, timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):  # it answered and closed early
            pass
        return read_all(s, timeout)


def response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """The first response in ``raw``: status, headers (lower-case names), body."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete response head in {raw[:300]!r}"
    lines = head.decode("latin-1").split("\r\n")
    m = STATUS.match(lines[0].encode() + b" ")
    assert m, f"bad status line {lines[0]!r}"
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", len(rest)))
    return int(m.group(1)), headers, rest[:n]


def check_answer(raw: bytes, allowed: set[int | None], what: str) -> int | None:
    """One answer in ``allowed`` (None: closed without a byte), a JSON error body for a
    4xx, and nothing after it (a second response would be a smuggled request)."""
    if not raw:
        assert None in allowed, f"{what}: closed without an answer, expected {allowed}"
        return None
    assert raw.startswith(b"HTTP/1.1 "), f"{what}: not an HTTP answer: {raw[:200]!r}"
    codes = [int(c) for c in STATUS.findall(raw)]
    assert len(codes) == 1, f"{what}: {len(codes)} answers {codes} (a smuggled request?)"
    status, headers, body = response(raw)
    assert status in allowed, f"{what}: {status}, expected {allowed}: {raw[:400]!r}"
    if status >= 400:
        assert headers.get("content-type", "").startswith("application/json"), headers
        doc = json.loads(body)
        assert doc["status"] == "error" and doc["error"], doc
    return status


def assert_log_clean(node: NodeProcess, whole: bool = False) -> None:
    """No traceback and no 500 in the node's log (since this test began, for the shared
    node, so that one case's traceback does not fail the others)."""
    text = node.log_text()[0 if whole else getattr(node, "log_from", 0):]
    assert "Traceback" not in text, node.log_text(80)
    assert " 500 " not in text, node.log_text(80)


def assert_serves(node: NodeProcess) -> None:
    r = node.get("/healthz", timeout=5)
    assert r.status_code == 200, r.text


def is_open(s: socket.socket) -> bool:
    """The node has not closed this connection (nothing to read, no EOF)."""
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.setblocking(True)


def wait_closed(socks: list[socket.socket], timeout: float) -> float:
    """Wait until the node closed every socket in ``socks``; the seconds it took."""
    t0 = time.monotonic()
    sel = selectors.DefaultSelector()
    left = set(socks)
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    try:
        while left:
            remaining = t0 + timeout - time.monotonic()
            assert remaining > 0, f"{len(left)} of {len(socks)} still open after {timeout:g}s"
            for key, _ in sel.select(min(remaining, 0.5)):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    left.discard(s)
                    sel.unregister(s)
    finally:
        sel.close()
    return time.monotonic() - t0


def raise_own_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


# ================================================================ a node shared by the table


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, ProcessRegistry]]:
    base = tmp_path_factory.mktemp("http")
    reg = ProcessRegistry()
    config = write_node_config(base / "http.ini", {"http_header_timeout": HEADER_TIMEOUT,
                                                   "http_idle_timeout": IDLE_TIMEOUT})
    node = NodeProcess(base, "http", config=config, registry=reg)
    try:
        node.start().wait_ready()
        yield node, reg
    finally:
        reg.kill_all()


@pytest.fixture
def hnode(shared: tuple[NodeProcess, ProcessRegistry], request: pytest.FixtureRequest) -> NodeProcess:
    """The shared node, with its log in this test's failure report."""
    node, reg = shared
    node.log_from = len(node.log_text())  # type: ignore[attr-defined]
    request.node._miyamoto_registries = getattr(request.node, "_miyamoto_registries", []) + [reg]
    return node


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what,data,allowed", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_request_is_4xx_or_quiet_close(hnode: NodeProcess, what: str, data: bytes,
                                                   allowed: set[int | None]) -> None:
    check_answer(exchange(hnode, data), allowed, what)
    assert_serves(hnode)
    assert_log_clean(hnode)


@pytest.mark.timeout(30)
def test_valid_requests_still_work(hnode: NodeProcess) -> None:
    """The strict parser takes what real clients send: Content-Length, chunked, repeated
    equal Content-Lengths, keep-alive with pipelining, HTTP/1.0."""
    status, _, body = response(exchange(hnode, VALID))
    assert status == 200 and json.loads(body)["status"] == "scheduled", body
    status, _, body = response(exchange(hnode, HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
                                        + chunked(BODY)))
    assert status == 200, body
    status, _, body = response(exchange(
        hnode, HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(BODY), len(BODY))
        + BODY))
    assert status == 200, body
    raw = exchange(hnode, VALID + SMUGGLED + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert [int(c) for c in STATUS.findall(raw)] == [200, 200, 200], raw[:600]
    raw = exchange(hnode, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert response(raw)[0] == 200
    assert_log_clean(hnode)


@pytest.mark.timeout(30)
def test_header_block_cap_is_431(hnode: NodeProcess) -> None:
    def get(fields: int, size: int) -> bytes:
        return (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * size) for i in range(fields)) + b"\r\n")

    assert len(get(60, 1000)) < 64 * 1024 < len(get(70, 1000))
    assert check_answer(exchange(hnode, get(60, 1000)), {200}, "60 KB of fields") == 200
    check_answer(exchange(hnode, get(70, 1000)), {431}, "70 KB of fields")
    check_answer(exchange(hnode, get(1, 70 * 1024)), {431}, "one 70 KiB field")
    check_answer(exchange(hnode, get(101, 1)), {431}, "101 fields")
    # a client that never stops sending its head: answered 431 at 64 KiB and, after a
    # short linger that lets it read the answer, cut off (the node reads and drops, it
    # does not keep the head); before, the node read 100 lines of 64 KiB
    with connect(hnode) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 10:
            try:
                s.sendall(b"X-Flood: " + b"a" * 1000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        took = time.monotonic() - t0
    assert closed and took < 1 + SLACK, f"still reading an endless head after {took:.1f}s"
    assert_serves(hnode)
    assert_log_clean(hnode)


@pytest.mark.timeout(60)
def test_clients_that_vanish_mid_request(hnode: NodeProcess) -> None:
    """300 connections that close (half with a FIN, half with a reset) at every point of a
    request: in the request line, the head, the body. No traceback, node serves."""
    cuts = [1, 5, 20, len(HEAD) - 3, len(HEAD) + 10, len(VALID) - len(BODY) - 1,
            len(VALID) - 10]
    for i in range(300):
        data = VALID[:cuts[i % len(cuts)]]
        s = connect(hnode)
        s.sendall(data)
        if i % 2:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    assert_serves(hnode)
    wait_until(lambda: hnode.get("/healthz").status_code == 200, 5)
    assert_log_clean(hnode)


@pytest.mark.timeout(30)
def test_idle_keep_alive_is_closed_after_idle_timeout(hnode: NodeProcess) -> None:
    with connect(hnode) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        assert read_all(s, IDLE_TIMEOUT + SLACK + 2) == b"", "something after the answer"
        idle = time.monotonic() - answered
    assert IDLE_TIMEOUT - 0.1 <= idle <= IDLE_TIMEOUT + SLACK, idle
    # a connection in use outlives the idle timeout: requests 0.5 s apart for 1.5 timeouts
    with connect(hnode) as s:
        s.settimeout(5)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5 * IDLE_TIMEOUT:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            time.sleep(0.5)  # the client's think time, not a wait for the node
    assert_log_clean(hnode)


@pytest.mark.timeout(30)
def test_head_and_body_deadline(hnode: NodeProcess) -> None:
    """A head trickled a byte at a time, or a body sent in part, is cut at the header
    deadline however steadily bytes arrive (a per-read timeout would never fire)."""
    line = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    with connect(hnode) as s:
        t0 = time.monotonic()
        closed = False
        for b in line:
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if not is_open(s):
                closed = True
                break
            assert time.monotonic() - t0 < HEADER_TIMEOUT + SLACK, "still open"
            time.sleep(0.1)  # the trickle's pace
        assert closed, "the whole trickle was accepted"
        took = time.monotonic() - t0
    assert HEADER_TIMEOUT - 0.1 <= took <= HEADER_TIMEOUT + SLACK, took
    with connect(hnode) as s:
        t0 = time.monotonic()
        s.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY[:10])
        raw = read_all(s, HEADER_TIMEOUT + SLACK + 2)
        took = time.monotonic() - t0
    check_answer(raw, {400, None}, "body cut short, connection left open")
    assert HEADER_TIMEOUT - 0.1 <= took <= HEADER_TIMEOUT + SLACK, took
    assert_serves(hnode)
    assert_log_clean(hnode)


@pytest.mark.timeout(60)
@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(["delete", "insert", "replace", "repeat", "cut"]),
                                st.integers(0, len(VALID)), st.integers(1, 40), st.binary(min_size=1, max_size=12)),
                      min_size=1, max_size=4))
def test_fuzz_mutated_requests(hnode: NodeProcess, edits: list[tuple[str, int, int, bytes]]) -> None:
    """Mutations of a valid POST /queue: every answer is a status below 500, or a close."""
    data = mutate(VALID, edits)
    raw = exchange(hnode, data, timeout=HEADER_TIMEOUT + SLACK + 3)
    if raw:
        assert raw.startswith(b"HTTP/1.1 "), (data, raw[:300])
        codes = [int(c) for c in STATUS.findall(raw)]
        assert codes and all(100 <= c < 500 for c in codes), (data, raw[:600])
    assert_log_clean(hnode)


@pytest.mark.timeout(30)
def test_shared_node_log_is_clean_at_the_end(hnode: NodeProcess) -> None:
    assert_serves(hnode)
    assert_log_clean(hnode, whole=True)


# ================================================================ nodes of their own


@pytest.mark.timeout(90)
def test_5000_idle_connections_do_not_block_healthz(node_factory: Any) -> None:
    """5,000 connections that sent a few bytes of a request line and then nothing:
    /healthz still answers at once, and the header deadline closes them all."""
    n, timeout = 5000, 8.0
    raise_own_nofile(n + 500)
    node = node_factory(options={"http_header_timeout": timeout})
    socks: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for _ in range(n):
            s = connect(node, timeout=5)
            s.sendall(b"GET /heal")
            socks.append(s)
        opened = time.monotonic() - t0
        assert opened < timeout - 1, f"opening took {opened:.1f}s: the check below needs them open"
        t1 = time.monotonic()
        with connect(node, timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = read_all(s, 5)
        took = time.monotonic() - t1
        assert response(raw)[0] == 200, raw[:300]
        assert took < 2.0, f"/healthz took {took:.2f}s behind {n} idle connections"
        still = sum(is_open(s) for s in socks[-1000:])
        assert still == 1000, f"only {still} of the newest 1000 idle connections were open"
        wait_closed(socks, timeout + SLACK + 5)
        elapsed = time.monotonic() - t0
        assert elapsed >= timeout - 0.1, elapsed
    finally:
        for s in socks:
            s.close()
    assert_serves(node)
    assert_log_clean(node)


@pytest.mark.timeout(60)
def test_connection_cap_evicts_the_longest_waiting(node_factory: Any) -> None:
    """At max_connections a new connection closes the oldest idle one, so a client with
    a request still gets in: first-come idle sockets cannot hold the node."""
    cap = 16
    node = node_factory(options={"max_connections": cap})
    node.close()  # the harness's keep-alive session would count as one more idle socket
    # once this is answered, the node has seen the earlier close too (same event loop)
    check_answer(exchange(node, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"), {200},
                 "healthz")
    socks = []
    try:
        for _ in range(cap + 4):  # accepted, hence admitted, in connection order
            s = connect(node)
            s.sendall(b"GET /heal")
            socks.append(s)
        wait_closed(socks[:4], 5)
        with connect(node) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert response(read_all(s, 5))[0] == 200
        wait_closed(socks[4:5], 5)
        assert all(is_open(s) for s in socks[5:]), [is_open(s) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert_serves(node)
    assert_log_clean(node)


@pytest.mark.timeout(60)
def test_open_file_limit_is_raised_at_start(tmp_path: Path, proc_registry: ProcessRegistry) -> None:
    config = write_node_config(tmp_path / "n.ini")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 11000:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} is below what the default cap needs")
    low = NodeProcess(tmp_path, "low", config=config, registry=proc_registry,
                      program=["prlimit", "--nofile=1024:" + ("unlimited" if hard ==
                               resource.RLIM_INFINITY else str(hard)),
                               sys.executable, "-m", "miyamoto"])
    low.start().wait_ready()
    limits = Path(f"/proc/{low.pid}/limits").read_text()
    (row,) = [r for r in limits.splitlines() if r.startswith("Max open files")]
    assert int(row.split()[3]) > 11000, row
    assert "open-file limit raised from 1024" in low.log_text()
    low.kill()
    # a hard limit too low for max_connections: the node caps its connections and says so
    capped = NodeProcess(tmp_path, "capped", config=config, registry=proc_registry,
                         program=["prlimit", "--nofile=1024:1024", sys.executable, "-m", "miyamoto"])
    capped.start().wait_ready()
    assert "does not fit the open-file limit 1024" in capped.log_text(), capped.log_text(30)
    assert_serves(capped)
    assert_log_clean(capped)


MIB = 1024 * 1024  # the default max_body


def _json_body(size: int, url: str) -> bytes:
    """A JSON task of exactly ``size`` bytes."""
    base = {"url": url, "params": {"pad": ""}}
    pad = size - len(json.dumps(base).encode())
    assert pad > 0
    base["params"]["pad"] = "x" * pad
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


def _form_body(size: int, url: str) -> bytes:
    base = urlencode({"task.url": url, "pad": ""})
    body = (base + "x" * (size - len(base))).encode()
    assert len(body) == size
    return body


def _batch_body(size: int, url: str) -> bytes:
    base = [{"url": url, "params": {"pad": ""}}]
    pad = size - len(json.dumps(base).encode())
    base[0]["params"]["pad"] = "x" * pad
    body = json.dumps(base).encode()
    assert len(body) == size
    return body


def _ids(answer: dict) -> list[str]:
    if "tasks" in answer:  # a batch
        assert all(t["status"] == "scheduled" for t in answer["tasks"]), answer
        return [t["id"] for t in answer["tasks"]]
    return [answer["id"]]


@pytest.mark.timeout(60)
def test_a_request_of_exactly_the_body_limit_is_taken(node, sink):
    url = f"{sink.url}/big"
    ids = []
    cases = [("/queue", "application/json", _json_body),
             ("/queue", "application/x-www-form-urlencoded", _form_body),
             ("/queue/default/batch", "application/json", _batch_body)]
    for path, ctype, make in cases:
        headers = {"Content-Type": ctype}
        r = node.post(path, data=make(MIB, url), headers=headers)
        assert r.status_code == 200, (path, ctype, r.status_code, r.text[:300])
        ids += _ids(r.json())
        # and one byte more is refused, naming the body
        r = node.post(path, data=make(MIB + 1, url), headers=headers)
        assert r.status_code == 413 and r.json()["field"] == "body", (path, r.status_code, r.text)
        # the same without a Content-Length (chunked)
        body = make(MIB, url)
        r = node.post(path, data=iter([body[:1000], body[1000:]]), headers=headers)
        assert r.status_code == 200, ("chunked", path, ctype, r.status_code, r.text[:300])
        ids += _ids(r.json())
        body = make(MIB + 1, url)
        r = node.post(path, data=iter([body[:1000], body[1000:]]), headers=headers)
        assert r.status_code == 413, ("chunked", path, r.status_code, r.text[:300])
    reqs = sink.wait_for(count=len(ids), path="/big", timeout=20)
    assert sorted(r.task_id for r in reqs) == sorted(ids)
