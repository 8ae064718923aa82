"""The HTTP/1.1 server loop (``miyamoto.http.server``) in-process, on a real socket on 127.0.0.1,
with a small WSGI app: the parts of the WSGI contract that pywsgi used to provide and the
loop now does itself (Content-Length and Date filled in, HTTP/1.0 keep-alive, HEAD,
``Expect: 100-continue``, an unread body discarded, ``close()`` on the result, an app
error answered 500 without detail), the environ built from the head, a bad head or body
answered and closed, the cap, the deadlines and the stop. The hostile-client cases,
against a real node, are tests/nodes/test_http_hardening.py."""

from __future__ import annotations

import json
import logging
import time
from email.utils import parsedate_to_datetime
import socket as pysocket
from typing import Any, Iterator

import gevent
import gevent.event
import gevent.socket
import gevent.ssl
import pytest

from dispatchkit import wait_for
from miyamoto.config.tls import server_context
from miyamoto.http.server import HTTPServer
from tlscerts import Pair, make_ca, make_cert

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
    # a real HTTP date, within a few seconds of now
    assert abs(parsedate_to_datetime(headers["date"]).timestamp() - time.time()) < 60
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


# ---------------------------------------------------------------- the environ and the answer

def seen_app(environ: dict[str, Any], start_response: Any) -> Any:
    """Answers with what the server put in the environ (JSON)."""
    keys = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL", "CONTENT_TYPE",
            "CONTENT_LENGTH", "REMOTE_ADDR", "HTTP_X_A", "HTTP_COOKIE", "HTTP_X_UNDER",
            "SERVER_SOFTWARE", "wsgi.url_scheme", "wsgi.input_terminated")
    body = json.dumps({k: environ.get(k) for k in keys}).encode()
    environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


@pytest.fixture
def serve() -> Iterator[Any]:
    """serve(app, **options) -> a connected socket to a server running ``app``."""
    made: list[tuple[HTTPServer, Any]] = []

    def start(application: Any, **kw: Any) -> Any:
        srv = HTTPServer(("127.0.0.1", 0), application, **{"header_timeout": 5,
                                                           "idle_timeout": 5, **kw})
        srv.start()
        sock = gevent.socket.create_connection(("127.0.0.1", srv.server_port), timeout=5)
        made.append((srv, sock))
        return sock
    yield start
    for srv, sock in made:
        sock.close()
        srv.stop(timeout=1)


def test_the_environ_is_built_from_the_head(serve):
    sock = serve(seen_app)
    sock.sendall(b"POST /a%20b/%C3%A9?x=1&y HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n"
                 b"Cookie: a=1\r\nCookie: b=2\r\nX_Under: no\r\nContent-Type: text/plain\r\n"
                 b"Content-Length: 3\r\n\r\nabc")
    status, _, body = _response(sock, bytearray())
    env = json.loads(body)
    assert env == {"REQUEST_METHOD": "POST", "PATH_INFO": "/a b/\xc3\xa9", "QUERY_STRING": "x=1&y",
                   "SERVER_PROTOCOL": "HTTP/1.1", "CONTENT_TYPE": "text/plain",
                   "CONTENT_LENGTH": "3", "REMOTE_ADDR": "127.0.0.1", "HTTP_X_A": "1,2",
                   "HTTP_COOKIE": "a=1; b=2", "HTTP_X_UNDER": None,
                   "SERVER_SOFTWARE": "miyamoto", "wsgi.url_scheme": "http",
                   # the input ends where the body does (a chunked body has no length)
                   "wsgi.input_terminated": True}
    sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
    env = json.loads(_response(sock, bytearray())[2])
    assert env["CONTENT_TYPE"] is None and env["CONTENT_LENGTH"] is None
    assert env["SERVER_PROTOCOL"] == "HTTP/1.0"


def fixed(status: str, headers: list, body: bytes = b"") -> Any:
    def application(environ: dict[str, Any], start_response: Any) -> Any:
        start_response(status, list(headers))
        return [body]
    return application


def test_no_content_length_or_body_for_204_and_304(serve):
    for status in ("204 No Content", "304 Not Modified"):
        sock = serve(fixed(status, [("X-A", "1")], b""))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")
        buf = bytearray()
        line, headers, _ = _response(sock, buf, head_only=True)
        assert line == f"HTTP/1.1 {status}" and "content-length" not in headers
        line2, _, _ = _response(sock, buf, head_only=True)
        assert line2 == line  # nothing between the two answers


def test_the_apps_own_date_and_length_are_kept(serve):
    sock = serve(fixed("200 OK", [("Date", "Thu, 01 Jan 1970 00:00:00 GMT"),
                                  ("Content-Length", "2")], b"ok"))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    buf = bytearray()
    while b"ok" not in buf:
        buf += sock.recv(65536)
    text = bytes(buf).decode()
    assert text.count("Date:") == 1 and "1970" in text and text.count("Content-Length") == 1


def test_a_large_body_arrives_whole(serve):
    big = bytes(range(256)) * 1024  # 256 KiB: more than one send
    sock = serve(fixed("200 OK", [], big))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    _, headers, body = _response(sock, bytearray())
    assert headers["content-length"] == str(len(big)) and body == big


@pytest.mark.parametrize("application", [
    fixed("200 OK\r\nX-Injected: 1", []), fixed("200 OK", [("X-A", "a\r\nX-B: b")]),
    fixed("200 OK", [("X-A\n", "a")])])
def test_cr_or_lf_from_the_app_is_a_500_not_a_split_response(serve, application, caplog):
    sock = serve(application)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    status, headers, body = _response(sock, bytearray())
    assert status == "HTTP/1.1 500 Internal Server Error" and "x-injected" not in headers
    assert "x-b" not in headers and _closed(sock)


def test_an_app_that_writes_or_never_starts_is_a_500(serve, caplog):
    def writes(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [])(b"x")
        return []

    def silent(environ: dict[str, Any], start_response: Any) -> Any:
        return [b"x"]
    for application in (writes, silent):
        sock = serve(application)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert _response(sock, bytearray())[0] == "HTTP/1.1 500 Internal Server Error"
    assert "write() is not supported" in caplog.text
    assert "did not call start_response" in caplog.text


def test_a_bad_head_is_a_json_4xx_then_a_close(serve):
    sock = serve(app)
    sock.sendall(b"GET / HTTP/1.1\r\nX-A : 1\r\n\r\nGET /a HTTP/1.1\r\n\r\n")
    status, headers, body = _response(sock, bytearray())
    assert status == "HTTP/1.1 400 Bad Request" and headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"status": "error", "error": "malformed request header field"}
    assert _closed(sock)  # the pipelined request after it is not answered


def test_a_request_line_past_8192_bytes_is_414_uri_too_long(serve):
    sock = serve(app)
    sock.sendall(b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\n\r\n")
    status, headers, body = _response(sock, bytearray())
    assert status == "HTTP/1.1 414 URI Too Long" and headers["connection"] == "close"
    assert json.loads(body) == {"status": "error",
                                "error": "request line longer than 8192 bytes"}


def test_a_client_that_leaves_mid_head_is_closed_quietly(serve, caplog):
    sock = serve(app)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: h")
    sock.shutdown(pysocket.SHUT_WR)  # the head ends here
    assert _closed(sock)
    assert "Traceback" not in caplog.text


def test_a_broken_body_is_answered_then_closed(serve):
    def reads(environ: dict[str, Any], start_response: Any) -> Any:
        try:
            environ["wsgi.input"].read()
        except (OSError, ValueError):
            start_response("400 Bad Request", [])
            return [b"bad body"]
        start_response("200 OK", [])
        return [b"ok"]
    sock = serve(reads)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
                 b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    status, headers, body = _response(sock, bytearray())
    assert (status, body) == ("HTTP/1.1 400 Bad Request", b"bad body")
    assert headers["connection"] == "close" and _closed(sock)


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(serve):
    started, release = gevent.event.Event(), gevent.event.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> Any:
        started.set()
        release.wait(5)
        start_response("200 OK", [])
        return [b"done"]
    first = serve(slow, max_connections=1)
    first.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert started.wait(5)  # busy in the application: not a waiter to evict
    port = first.getpeername()[1]
    second = gevent.socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        status, headers, body = _response(second, bytearray())
        assert status == "HTTP/1.1 503 Service Unavailable"
        assert json.loads(body)["error"] == "too many connections" and _closed(second)
    finally:
        second.close()
        release.set()
    assert _response(first, bytearray())[2] == b"done"


def test_a_silent_connection_is_closed_at_its_deadline(serve):
    sock = serve(app, header_timeout=0.2, idle_timeout=0.2)
    assert _closed(sock)  # no request within header_timeout (swept every 50 ms)


def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout(serve):
    sock = serve(app, header_timeout=5, idle_timeout=0.2)
    sock.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _response(sock, bytearray())[2] == b"hello"
    assert _closed(sock)


def test_stop_closes_waiting_connections_and_lets_busy_ones_finish():
    release = gevent.event.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> Any:
        release.wait(5)
        start_response("200 OK", [])
        return [b"done"]
    srv = HTTPServer(("127.0.0.1", 0), slow, header_timeout=5, idle_timeout=5)
    srv.start()
    busy = gevent.socket.create_connection(("127.0.0.1", srv.server_port), timeout=5)
    idle = gevent.socket.create_connection(("127.0.0.1", srv.server_port), timeout=5)
    busy.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    wait_for(lambda: srv.connections.waiting == 1 and len(srv.connections) == 2)  # admitted
    stopper = gevent.spawn(srv.stop, 5)
    assert _closed(idle)
    release.set()
    assert _response(busy, bytearray())[2] == b"done"
    assert _closed(busy)  # answered, then closed: no next request while stopping
    stopper.join(5)
    for s in (busy, idle):
        s.close()


def test_accepted_sockets_send_at_once():
    """TCP_NODELAY on every accepted socket: a keep-alive answer must not wait ~40 ms
    for the client's delayed ACK."""
    listener = gevent.socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = gevent.socket.create_connection(listener.getsockname(), timeout=5)
    accepted, address = listener.accept()
    srv = HTTPServer(("127.0.0.1", 0), app)
    g = gevent.spawn(srv.handle, accepted, address)
    client.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _response(client, bytearray())[2] == b"hello"
    assert accepted.getsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_NODELAY) != 0
    client.close()
    g.join(5)
    for s in (accepted, listener):
        s.close()


def test_a_body_read_by_lines_arms_the_request_deadline(serve):
    seen: list[float] = []

    def lines(environ: dict[str, Any], start_response: Any) -> Any:
        stream = environ["wsgi.input"]
        first = stream.readline()
        seen.append(stream.conn.deadline)  # disarmed again once the read is done
        start_response("200 OK", [])
        return [first + stream.read()]
    sock = serve(lines)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 8\r\n\r\nab\ncdefg")
    assert _response(sock, bytearray())[2] == b"ab\ncdefg"
    assert seen == [float("inf")]


def test_a_client_that_closes_before_a_request_is_let_go_quietly(serve, caplog):
    sock = serve(app)
    sock.shutdown(pysocket.SHUT_WR)
    assert _closed(sock)
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("how", ["read", "readline"])
def test_a_body_that_stalls_is_cut_at_the_request_deadline(serve, how):
    """The application reads the body, so only the stream knows the node waits for the
    client: a body that stops coming is cut at the request's deadline, never waited on."""
    def reader(environ: dict[str, Any], start_response: Any) -> Any:
        try:
            getattr(environ["wsgi.input"], how)()
        except (OSError, ValueError):
            pass
        start_response("400 Bad Request", [])
        return [b"cut"]
    sock = serve(reader, header_timeout=0.3, idle_timeout=5)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nab")
    assert _closed(sock)


# ---------------------------------------------------------------- TLS
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    return {"ca": ca, "one": make_cert(d, ca, "one"), "two": make_cert(d, ca, "two"),
            "client": make_cert(d, ca, "client", client=True),
            "stranger": make_cert(d, make_ca(d, "other-ca"), "stranger", client=True)}


def _server_tls(pair: Pair, client_ca: str = "") -> Any:
    return server_context(pair.cert, pair.key, client_ca, factory=gevent.ssl.SSLContext)


def _tls_connect(srv: HTTPServer, ca: Pair, client: Pair | None = None) -> Any:
    ctx = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_CLIENT)  # a cooperative client
    ctx.load_verify_locations(cafile=ca.cert)
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    raw = gevent.socket.create_connection(("127.0.0.1", srv.server_port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def _peer_name(sock: Any) -> str:
    return dict(x[0] for x in sock.getpeercert()["subject"])["commonName"]


@pytest.fixture
def tls_server(tls_files) -> Iterator[HTTPServer]:
    def scheme(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [])
        return [environ["wsgi.url_scheme"].encode()]
    srv = HTTPServer(("127.0.0.1", 0), scheme, header_timeout=0.3, idle_timeout=5,
                     tls=_server_tls(tls_files["one"]))
    srv.start()
    yield srv
    srv.stop(timeout=1)


def test_tls_serves_keep_alive_requests_and_a_new_certificate_to_new_connections(
        tls_server, tls_files):
    old = _tls_connect(tls_server, tls_files["ca"])
    buf = bytearray()
    old.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _response(old, buf)[2] == b"https" and _peer_name(old) == "one"
    tls_server.use_tls(_server_tls(tls_files["two"]))  # SIGHUP's reload
    new = _tls_connect(tls_server, tls_files["ca"])
    new.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _response(new, bytearray())[2] == b"https" and _peer_name(new) == "two"
    old.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")  # the open connection stays
    assert _response(old, buf)[0] == "HTTP/1.1 200 OK"
    old.close()
    new.close()


def test_a_handshake_that_never_comes_is_swept_and_plain_http_closed_quietly(
        tls_server, tls_files, caplog):
    silent = gevent.socket.create_connection(("127.0.0.1", tls_server.server_port), timeout=5)
    assert _closed(silent)  # at header_timeout (0.3 s), not never
    plain = gevent.socket.create_connection(("127.0.0.1", tls_server.server_port), timeout=5)
    plain.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    try:
        with gevent.Timeout(5, False):
            answer = plain.recv(65536)  # an alert, or nothing
    except OSError:  # a reset: the request was still unread when the server closed
        answer = b""
    assert not answer.startswith(b"HTTP/")  # never a plaintext answer
    plain.close()
    sock = _tls_connect(tls_server, tls_files["ca"])  # still serving
    sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _response(sock, bytearray())[2] == b"https"
    sock.close()
    assert "Traceback" not in caplog.text and len(tls_server.connections) <= 1


def test_mutual_tls_serves_only_clients_whose_certificate_the_ca_signed(tls_files, caplog):
    srv = HTTPServer(("127.0.0.1", 0), app, header_timeout=5, idle_timeout=5,
                     tls=_server_tls(tls_files["one"], tls_files["ca"].cert))
    srv.start()
    try:
        sock = _tls_connect(srv, tls_files["ca"], tls_files["client"])
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
        assert _response(sock, bytearray())[2] == b"hello"
        sock.close()
        for client in (None, tls_files["stranger"]):
            with pytest.raises((OSError, AssertionError)):  # refused in or right after the handshake
                sock = _tls_connect(srv, tls_files["ca"], client)
                sock.sendall(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
                _response(sock, bytearray())
        assert "Traceback" not in caplog.text
    finally:
        srv.stop(timeout=1)
