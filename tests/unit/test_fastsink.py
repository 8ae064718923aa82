"""scripts/harness/fastsink, the bench's counting sink, over real sockets on 127.0.0.1:
keep-alive and pipelined requests each answered in order, chunked bodies, a query
string's seq, the run nonce, and a request it cannot parse answered 400 and closed.

The client is gevent's socket, so that the sink's StreamServer runs on this process's
hub while the test reads. Nothing here monkey-patches.
"""

from __future__ import annotations

import gevent
import gevent.socket
import pytest

import helpers  # noqa: F401  (puts scripts/ on sys.path)
from harness.fastsink import Sink

pytestmark = pytest.mark.timeout(20)


def _post(seq: str, run: str = "r1", task_id: str = "t", close: bool = False) -> bytes:
    body = f"seq={seq}&run={run}&pad=x".encode()
    return (f"POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Task-Id: {task_id}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _read_answers(sock: gevent.socket.socket, n: int, deadline: float = 5.0) -> bytes:
    """Read until ``n`` answers came, or the sink closed; fails at the deadline."""
    got = b""
    with gevent.Timeout(deadline):
        while got.count(b"HTTP/1.1 ") < n:
            data = sock.recv(65536)
            if not data:
                break
            got += data
    return got


@pytest.fixture
def sink():
    s = Sink(run="r1").start()
    yield s
    s.stop(timeout=0.1)


def _connect(sink: Sink) -> gevent.socket.socket:
    return gevent.socket.create_connection(("127.0.0.1", sink.port), timeout=5)


def test_pipelined_requests_on_one_connection_are_each_answered_and_counted(sink) -> None:
    sock = _connect(sink)
    try:
        sock.sendall(b"".join(_post(str(i), task_id=f"t{i}") for i in range(5)))
        got = _read_answers(sock, 5)
        assert got.count(b"HTTP/1.1 200 OK\r\n") == 5, got
        sock.sendall(_post("1", task_id="t1"))  # the same connection is kept: a duplicate
        assert _read_answers(sock, 1).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        sock.close()
    s = sink.stats
    assert s.requests == 6 and s.delivered == 5
    assert s.duplicated_seqs() == ["1"] and s.duplicated_ids() == ["t1"]
    assert s.id_of_seq["3"] == "t3"


def test_a_chunked_body_a_query_string_and_another_run(sink) -> None:
    sock = _connect(sink)
    try:
        chunked = (b"POST /hook HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"4\r\nseq=\r\n8\r\n7&run=r1\r\n0\r\n\r\n")
        query = b"GET /hook?seq=8&run=r1 HTTP/1.1\r\nHost: h\r\n\r\n"
        stale = _post("9", run="old")
        sock.sendall(chunked + query + stale)
        assert _read_answers(sock, 3).count(b" 200 OK") == 3
    finally:
        sock.close()
    assert sorted(sink.stats.first_at) == ["7", "8"]
    assert sink.stats.foreign == 1  # seq 9 is of another run


def test_connection_close_is_honoured(sink) -> None:
    sock = _connect(sink)
    try:
        sock.sendall(_post("1", close=True))
        got = _read_answers(sock, 2)  # the sink closes after its one answer
        assert got.count(b"HTTP/1.1 ") == 1 and got.endswith(b"\r\n\r\n"), got
    finally:
        sock.close()


def test_garbage_is_answered_400_and_closed_and_the_sink_serves_on(sink) -> None:
    sock = _connect(sink)
    try:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        got = _read_answers(sock, 2)
        assert got.startswith(b"HTTP/1.1 400 "), got
        assert got.count(b"HTTP/1.1 ") == 1
    finally:
        sock.close()
    sock = _connect(sink)
    try:
        sock.sendall(_post("5"))
        assert _read_answers(sock, 1).startswith(b"HTTP/1.1 200 OK")
    finally:
        sock.close()
    assert sink.stats.delivered == 1


def test_first_delivery_time_is_the_sinks_clock() -> None:
    ticks = iter([10.0, 11.0])
    s = Sink(clock=lambda: next(ticks)).start()
    try:
        for seq in ("a", "b"):
            sock = _connect(s)
            try:
                sock.sendall(_post(seq))
                assert _read_answers(sock, 1).startswith(b"HTTP/1.1 200")
            finally:
                sock.close()
    finally:
        s.stop(timeout=0.1)
    assert s.stats.first_at == {"a": 10.0, "b": 11.0} and s.stats.last_at == 11.0
    assert s.stats.foreign == 0  # no run given: every seq counts
