"""The HTTP/1.1 server loop (``miyamoto.http.server``) in-process, on a real socket on 127.0.0.1,
with a small WSGI app: the parts of the WSGI contract that pywsgi used to provide and the
loop now does itself (Content-Length and Date filled in, HTTP/1.0 keep-alive, HEAD,
``Expect: 100-continue``, an unread body discarded, ``close()`` on the result, an app
error answered 500 without detail). The hostile-client cases, against a real node, are
tests/nodes/test_http_hardening.py."""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator

import gevent
import gevent.socket
import pytest

from miyamoto.http.server import HTTPServer

pytestmark = pytest.mark.timeout(30)


class _Result(list):
    closed = 0

    def close(self) -> None:
        _Result.closed += 1


def app(environ: dict[str, Any], start_response: Any) -> Any:
    path = environ["PATH_INFO"]
    if path == "/boom":
        raise RuntimeError("planted failure")
    if path == "/echo":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    if path == "/close":
        start_response("200 OK", [("Connection", "close"), ("Content-Length", "2")])
        return [b"ok"]
    start_response("201 Created", [("Content-Type", "text/plain"),
                                   ("X-Query", environ["QUERY_STRING"]),
                                   ("X-Method", environ["REQUEST_METHOD"]),
                                   ("X-Path", path)])
    return _Result([b"hel", b"lo"])  # no Content-Length: the server counts


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(("127.0.0.1", 0), app, header_timeout=5, idle_timeout=5)
    srv.start()
    yield srv
    srv.stop(timeout=1)


@pytest.fixture
def conn(server: HTTPServer) -> Iterator[Any]:
    sock = gevent.socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
    yield sock
    sock.close()


def _response(sock: Any, buf: bytearray, head_only: bool = False) -> tuple[str, dict, bytes]:
    """One response: (status line, lower-cased headers, body) from ``buf`` + the socket."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {bytes(buf)!r}"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    n = 0 if head_only else int(headers.get("content-length", 0))
    while len(rest) < n:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    buf[:] = rest[n:]
    return lines[0], headers, rest[:n]


def _closed(sock: Any) -> bool:
    with gevent.Timeout(5, False):
        return sock.recv(1) == b""
    return False


def test_pipelined_keep_alive_requests_get_complete_answers(conn):
    _Result.closed = 0
    conn.sendall(b"GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\n"
                 b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd")
    buf = bytearray()
    status, headers, body = _response(conn, buf)
    assert status == "HTTP/1.1 201 Created" and body == b"hello"
    assert headers["content-length"] == "5" and headers["x-query"] == "x=1"
    assert "date" in headers and "connection" not in headers
    status, headers, body = _response(conn, buf)
    assert (status, body) == ("HTTP/1.1 200 OK", b"abcd")
    assert _Result.closed == 1


def test_an_unread_body_is_discarded_before_the_next_request(conn):
    conn.sendall(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nxxxxx"
                 b"GET /b?second HTTP/1.1\r\nHost: h\r\n\r\n")
    buf = bytearray()
    status, headers, _ = _response(conn, buf)
    assert (status, headers["x-method"], headers["x-path"]) == ("HTTP/1.1 201 Created", "POST", "/a")
    # the next request line starts after the body: not "xxxxxGET"
    status, headers, _ = _response(conn, buf)
    assert (status, headers["x-method"], headers["x-path"], headers["x-query"]) == \
        ("HTTP/1.1 201 Created", "GET", "/b", "second")


def test_http10_closes_unless_asked_to_keep_alive(server):
    for ask, kept in ((b"", False), (b"Connection: keep-alive\r\n", True)):
        sock = gevent.socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
        sock.sendall(b"GET /a HTTP/1.0\r\n" + ask + b"\r\n")
        buf = bytearray()
        status, headers, body = _response(sock, buf)
        assert body == b"hello"
        assert headers["connection"] == ("keep-alive" if kept else "close")
        if kept:
            sock.sendall(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            assert _response(sock, buf)[2] == b"hello"
        else:
            assert _closed(sock)
        sock.close()


def test_connection_close_from_the_app_or_the_client_closes(conn, server):
    conn.sendall(b"GET /close HTTP/1.1\r\nHost: h\r\n\r\n")
    status, headers, body = _response(conn, bytearray())
    assert headers["connection"] == "close" and body == b"ok" and _closed(conn)
    sock = gevent.socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    status, headers, body = _response(sock, bytearray())
    assert headers["connection"] == "close" and _closed(sock)
    sock.close()


def test_head_gets_the_length_without_the_body(conn):
    conn.sendall(b"HEAD /a HTTP/1.1\r\nHost: h\r\n\r\nGET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    buf = bytearray()
    status, headers, body = _response(conn, buf, head_only=True)
    assert headers["content-length"] == "5" and body == b""
    assert _response(conn, buf)[2] == b"hello"  # nothing stray between the two


def test_expect_100_continue(conn):
    conn.sendall(b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    buf = bytearray()
    assert _response(conn, buf, head_only=True)[0] == "HTTP/1.1 100 Continue"
    conn.sendall(b"abc")
    assert _response(conn, buf)[2] == b"abc"


def test_an_app_error_is_a_500_without_detail(conn, caplog):
    with caplog.at_level(logging.ERROR, logger="miyamoto.http.server"):
        conn.sendall(b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, body = _response(conn, bytearray())
    assert status == "HTTP/1.1 500 Internal Server Error"
    assert json.loads(body) == {"status": "error", "error": "internal error"}
    assert b"planted" not in body and _closed(conn)
    assert any("planted failure" in r.exc_text for r in caplog.records if r.exc_text)


def test_send_all_finishes_what_one_send_cannot():
    """More than the socket buffers hold: the first send is partial, the rest waits."""
    from miyamoto.sockets import send_all

    listener = gevent.socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sender = gevent.socket.create_connection(listener.getsockname(), timeout=10)
    receiver, _ = listener.accept()
    data = bytes(range(256)) * (32 * 1024)  # 8 MiB
    got = bytearray()

    def drain() -> None:
        while len(got) < len(data):
            chunk = receiver.recv(1 << 20)
            if not chunk:
                return
            got.extend(chunk)
    reader = gevent.spawn(drain)
    send_all(sender, data)
    reader.join(timeout=10)
    assert bytes(got) == data
    for s in (sender, receiver, listener):
        s.close()
