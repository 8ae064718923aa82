"""The delivery client (``miyamoto.delivery.httpclient``) against real sockets on 127.0.0.1: what it
sends, keep-alive reuse, the connect-time target check (a resolver stub stands in for
DNS), answers framed every way HTTP/1.1 allows, the limits (1 MiB, the deadline), no
redirects, the origin LRU, and TLS with verification (a throwaway self-signed cert)."""

from __future__ import annotations

import shutil
import socket
import ssl
import select
import subprocess
import threading
import time
from typing import Any, Callable

import gevent
import pytest

from miyamoto.delivery import httpclient
from miyamoto.delivery.httpclient import DeliveryError, HTTPClient, TargetRefused
from miyamoto.delivery.targets import TargetGuard

pytestmark = pytest.mark.timeout(30)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
# (request number, request) -> answer (a list: sent piece by piece; None: close)
Reply = Callable[[int, bytes], "bytes | list[bytes] | None"]


def _read_request(conn: socket.socket, buf: bytearray) -> bytes | None:
    """One request (head and Content-Length body) from ``buf`` + the socket."""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    buf[:] = rest[length:]
    return head + b"\r\n\r\n" + rest[:length]


class RawServer:
    """A thread that answers each request with ``reply(n, request)`` (None: close)."""

    def __init__(self, reply: Reply, wrap: Callable[[socket.socket], Any] | None = None):
        self.reply = reply
        self.wrap = wrap
        self.connections = 0
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)  # many clients may connect at once (the idle bound)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if self.wrap is not None:
                conn = self.wrap(conn)
            buf = bytearray()
            while True:
                req = _read_request(conn, buf)
                if req is None:
                    return
                self.requests.append(req)
                answer = self.reply(len(self.requests), req)
                if answer is None:
                    return
                for k, piece in enumerate(answer if isinstance(answer, list) else [answer]):
                    if k:
                        time.sleep(0.1)  # a list: its pieces a moment apart (separate reads)
                    conn.sendall(piece)
        except OSError:
            pass
        finally:
            conn.close()

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.stopped = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(reply: Reply = lambda n, req: OK, **kw: Any) -> RawServer:
        servers.append(RawServer(reply, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def client():
    c = HTTPClient(guard=TargetGuard())
    yield c
    c.close()


def _resolving_to(monkeypatch: pytest.MonkeyPatch, addresses: list[str]) -> None:
    """The client's resolver answers ``addresses`` for any name (stands in for DNS)."""
    def fake(host, port, *args):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]
    monkeypatch.setattr(httpclient.gevent.socket, "getaddrinfo", fake)


def test_sends_one_well_formed_request_and_reuses_the_connection(serve, client):
    srv = serve()
    for i in range(3):
        resp = client.request("POST", srv.url("/w?x=1"), body=b"a=%d" % i,
                              headers={"X-Task-Id": "t1", "Content-Type": "text/plain"},
                              timeout=5)
        assert (resp.status, resp.body) == (200, b"ok")
        assert resp.headers["Content-Length"] == "2"
    assert srv.connections == 1
    head = srv.requests[0].decode()
    assert head.startswith("POST /w?x=1 HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{srv.port}\r\n" in head
    assert "\r\nX-Task-Id: t1\r\n" in head and "\r\nContent-Length: 3\r\n" in head
    assert head.endswith("\r\n\r\na=0")


def test_a_get_without_body_sends_no_content_length(serve, client):
    srv = serve()
    client.request("GET", srv.url("/g?a=b"), body=b"", headers={}, timeout=5)
    assert srv.requests[0].startswith(b"GET /g?a=b HTTP/1.1\r\n")
    assert b"content-length" not in srv.requests[0].lower()


def test_a_bodyless_post_says_content_length_zero_and_a_delete_sends_its_body(serve, client):
    # a POST, PUT or PATCH always frames its body (servers answer 411 without a length)
    srv = serve()
    client.request("POST", srv.url("/p"), body=b"", headers={}, timeout=5)
    assert b"\r\nContent-Length: 0\r\n" in srv.requests[0]
    client.request("DELETE", srv.url("/d"), body=b"x=1", headers={}, timeout=5)
    assert b"\r\nContent-Length: 3\r\n" in srv.requests[1]
    assert srv.requests[1].endswith(b"\r\n\r\nx=1")


def test_a_host_name_is_resolved_by_the_system_resolver(serve, client):
    srv = serve()
    resp = client.request("POST", srv.url("/n", host="localhost"), body=b"", headers={},
                          timeout=5)
    assert resp.status == 200
    assert f"\r\nHost: localhost:{srv.port}\r\n".encode() in srv.requests[0]


def test_a_closed_idle_connection_is_not_reused(serve, client):
    srv = serve(_answer_then_close)
    assert client.request("POST", srv.url(), body=b"", headers={}, timeout=5).status == 200
    idle = next(iter(client._origins.values())).idle
    deadline = time.monotonic() + 5  # until the server's close reached the pooled socket
    while time.monotonic() < deadline and httpclient._alive(idle[0]):
        time.sleep(0.01)
    assert client.request("POST", srv.url(), body=b"", headers={}, timeout=5).status == 200
    assert srv.connections == 2


def test_the_liveness_check_peeks_and_reads_nothing(client):
    """_alive looks at a pooled connection without taking from it (MSG_PEEK): a stray
    byte is seen (the connection is out of step) and is still there to be read."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    sock = httpclient._open((socket.AF_INET, socket.SOCK_STREAM, 6, "",
                             lsock.getsockname()), 5)
    peer, _ = lsock.accept()
    try:
        assert httpclient._alive(sock)  # nothing to read: usable
        peer.sendall(b"x")
        assert select.select([sock.fileno()], [], [], 5)[0]  # the byte has arrived
        assert not httpclient._alive(sock)
        assert not httpclient._alive(sock)  # peeked, not taken: seen again
        sock.settimeout(1)
        assert sock.recv(16) == b"x"
    finally:
        sock.close()
        peer.close()
        lsock.close()


def test_at_most_128_idle_connections_are_kept_per_origin(serve, client):
    """130 requests at once to one origin open 130 connections; the pool keeps 128 of
    them (the other 2 are closed), so the next 130 at once open 2 anew."""
    n = 130
    cond = threading.Condition()

    def all_at_once(i: int, req: bytes) -> bytes:  # answer once the whole round has come
        goal = -(-i // n) * n
        with cond:
            cond.notify_all()
            assert cond.wait_for(lambda: len(srv.requests) >= goal, timeout=10)
        return OK
    srv = serve(all_at_once)

    def round_() -> None:
        jobs = [gevent.spawn(client.request, "POST", srv.url(), body=b"", headers={},
                             timeout=15) for _ in range(n)]
        gevent.joinall(jobs, timeout=20, raise_error=True)
        assert [j.value.status for j in jobs] == [200] * n
    round_()
    assert srv.connections == n
    assert len(next(iter(client._origins.values())).idle) == 128
    round_()
    assert srv.connections == n + 2
    assert len(next(iter(client._origins.values())).idle) == 128


def test_a_url_without_a_port_goes_to_its_schemes_port(serve, client, monkeypatch):
    """http: port 80 (and no port in the Host header), https: 443; a resolver stub
    records the port asked for and points http at the test's server."""
    srv = serve()
    asked: list[int] = []

    def fake(host, port, *args):
        asked.append(port)
        if port == 443:
            raise OSError("no https server here")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", srv.port))]
    monkeypatch.setattr(httpclient.gevent.socket, "getaddrinfo", fake)
    resp = client.request("POST", "http://hook.example/x", body=b"", headers={}, timeout=5)
    assert resp.status == 200 and asked == [80]
    assert b"\r\nHost: hook.example\r\n" in srv.requests[0]
    with pytest.raises(DeliveryError, match="cannot resolve hook.example"):
        client.request("POST", "https://hook.example/x", body=b"", headers={}, timeout=5)
    assert asked == [80, 443]


def test_urls_that_repeat_are_split_once(serve, client, monkeypatch):
    """A task's target URL repeats: each distinct URL is split once and kept."""
    srv = serve()
    splits: list[str] = []
    real = httpclient.urlsplit
    monkeypatch.setattr(httpclient, "urlsplit", lambda url: splits.append(url) or real(url))
    urls = [srv.url(f"/hook/{i}") for i in range(3)]
    for _ in range(2):
        for url in urls:
            assert client.request("POST", url, body=b"", headers={}, timeout=5).status == 200
    assert splits == urls
    assert [r.split(b" ")[1] for r in srv.requests] == [b"/hook/%d" % i for i in range(3)] * 2


def _answer_then_close(n: int, req: bytes) -> bytes | None:
    """Answers keep-alive (no Connection: close) and then the thread closes the socket:
    what a server that times idle connections out looks like to the client."""
    raise _Close(OK)


class _Close(Exception):
    def __init__(self, data: bytes):
        self.data = data


@pytest.fixture(autouse=True)
def _close_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """RawServer: a reply that raises _Close sends its bytes and closes the connection."""
    original = RawServer._conn

    def conn(self: RawServer, sock: socket.socket) -> None:
        reply = self.reply

        def wrapped(n: int, req: bytes) -> bytes | None:
            try:
                return reply(n, req)
            except _Close as c:
                sock.sendall(c.data)
                return None
        self.reply = wrapped
        try:
            original(self, sock)
        finally:
            self.reply = reply
    monkeypatch.setattr(RawServer, "_conn", conn)


def test_an_interim_100_is_skipped(serve, client):
    srv = serve(lambda n, req: b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
    resp = client.request("POST", srv.url(), body=b"x", headers={}, timeout=5)
    assert (resp.status, resp.body) == (200, b"ok")


def test_chunked_and_close_delimited_answers(serve, client):
    chunked = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    srv = serve(lambda n, req: chunked)
    resp = client.request("POST", srv.url(), body=b"", headers={}, timeout=5)
    assert (resp.status, resp.body) == (201, b"abcde")
    srv2 = serve(lambda n, req: (_ for _ in ()).throw(
        _Close(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end")))
    resp = client.request("POST", srv2.url(), body=b"", headers={}, timeout=5)
    assert (resp.status, resp.body) == (200, b"to the end")
    key = ("http", "127.0.0.1", srv2.port, 5, None)
    assert client._origins[key].idle == []  # close-delimited: never reused


def test_a_truncated_answer_is_a_delivery_error(serve, client):
    srv = serve(lambda n, req: (_ for _ in ()).throw(
        _Close(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")))
    with pytest.raises(DeliveryError, match="closed before a whole answer"):
        client.request("POST", srv.url(), body=b"", headers={}, timeout=5)


def test_an_answer_over_1_mib_is_refused(serve, client):
    big = b"x" * (httpclient.MAX_RESPONSE + 10)
    srv = serve(lambda n, req: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
    with pytest.raises(DeliveryError, match="larger than 1 MiB"):
        client.request("POST", srv.url(), body=b"", headers={}, timeout=5)


def test_a_trickling_answer_cannot_outlast_the_timeout(client):
    """One byte every 0.1 s of a 100-byte body: each read is quick, the whole is not."""
    stop = threading.Event()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]

    def trickle() -> None:
        c, _ = lsock.accept()
        with c:
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            while not stop.wait(0.1):
                try:
                    c.sendall(b"x")
                except OSError:
                    return
    threading.Thread(target=trickle, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(DeliveryError, match="no answer within 1 s"):
            client.request("POST", f"http://127.0.0.1:{port}/", body=b"", headers={}, timeout=1)
        assert time.monotonic() - t0 < 3
    finally:
        stop.set()
        lsock.close()


def _slow_for_slow_paths(n: int, req: bytes) -> bytes:
    if req.startswith(b"GET /slow"):
        time.sleep(0.6)
    return OK


@pytest.mark.parametrize("first", [5.0, 0.3])
def test_each_request_keeps_its_own_timeout_on_a_pooled_origin(serve, client, first):
    """Connections are pooled per (origin, timeout): a request never inherits the timeout
    of the one that opened a connection to the same origin before it."""
    srv = serve(_slow_for_slow_paths)
    client.request("GET", srv.url("/fast"), body=b"", headers={}, timeout=first)
    with pytest.raises(DeliveryError, match="no answer within 0.3 s"):  # not the pooled 5 s
        client.request("GET", srv.url("/slow"), body=b"", headers={}, timeout=0.3)
    resp = client.request("GET", srv.url("/slow"), body=b"", headers={}, timeout=5.0)
    assert resp.status == 200  # its own 5 s, not the pooled 0.3 s


def test_a_redirect_is_the_answer_not_a_hop(serve, client):
    srv = serve(lambda n, req: b"HTTP/1.1 302 Found\r\nLocation: /next\r\nContent-Length: 0\r\n\r\n")
    resp = client.request("POST", srv.url(), body=b"", headers={}, timeout=5)
    assert resp.status == 302 and len(srv.requests) == 1


def test_a_header_with_a_line_break_is_refused_before_sending(serve, client):
    srv = serve()
    with pytest.raises(DeliveryError, match="CR, LF"):
        client.request("POST", srv.url(), body=b"", headers={"X-A": "1\r\nX-B: 2"}, timeout=5)
    assert srv.connections == 0


def test_refuses_a_denied_literal_without_connecting(serve):
    srv = serve()
    c = HTTPClient(guard=TargetGuard(deny=["127.0.0.0/8"]))
    with pytest.raises(TargetRefused, match="target_deny 127.0.0.0/8"):
        c.request("POST", srv.url(), body=b"", headers={}, timeout=5)
    assert srv.connections == 0


def test_checks_every_resolved_address(serve, client, monkeypatch):
    srv = serve()
    _resolving_to(monkeypatch, ["127.0.0.1", "169.254.169.254"])
    with pytest.raises(TargetRefused) as info:
        client.request("GET", srv.url(host="rebind.example"), body=b"", headers={}, timeout=5)
    assert "169.254.169.254" in str(info.value) and "cloud-metadata" in str(info.value)
    assert srv.connections == 0
    _resolving_to(monkeypatch, ["127.0.0.1"])
    resp = client.request("GET", srv.url(host="rebind.example"), body=b"", headers={}, timeout=5)
    assert resp.status == 200 and srv.connections == 1
    assert f"\r\nHost: rebind.example:{srv.port}\r\n".encode() in srv.requests[0]


def test_refuses_the_nodes_own_port_by_name(serve, monkeypatch):
    srv = serve()
    _resolving_to(monkeypatch, ["127.0.0.1"])
    c = HTTPClient(guard=TargetGuard(endpoints=lambda: [("127.0.0.1", srv.port)]))
    with pytest.raises(TargetRefused, match="cluster-endpoint"):
        c.request("POST", srv.url("/queues/x/purge", host="self.example"), body=b"",
                  headers={}, timeout=5)
    assert srv.connections == 0


def test_a_refused_connect_is_a_delivery_error(client):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(DeliveryError, match="cannot connect"):
        client.request("POST", f"http://127.0.0.1:{port}/", body=b"", headers={}, timeout=5)


def test_origins_are_kept_in_a_bounded_lru(serve):
    servers = [serve() for _ in range(3)]
    c = HTTPClient(max_origins=2)
    for s in servers:
        c.request("POST", s.url(), body=b"", headers={}, timeout=5)
    assert [k[2] for k in c._origins] == [servers[1].port, servers[2].port]
    c.close()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a throwaway certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=20)
    return d / "cert.pem", d / "key.pem"


def test_a_pooled_tls_connection_gets_each_requests_whole_timeout(serve, cert):
    """An answer read in more than one piece waits only the time left for each later
    piece; the pooled connection then has the whole timeout back for the next request
    (not what was left at the end of the last one)."""
    certfile, keyfile = cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certfile, keyfile)

    def late(i: int, req: bytes) -> bytes | list[bytes]:
        if i == 1:  # the head at 1.0 s of the 1.5, the body a moment after (a second read)
            time.sleep(1.0)
            return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"ok"]
        time.sleep(0.9)  # more than the 0.5 s that was left, less than the 1.5 s
        return OK
    srv = serve(late, wrap=lambda s: server_ctx.wrap_socket(s, server_side=True))
    c = HTTPClient(ssl_context=httpclient.gevent.ssl.create_default_context(cafile=str(certfile)))
    try:
        url = f"https://127.0.0.1:{srv.port}/t"
        assert c.request("POST", url, body=b"", headers={}, timeout=1.5).body == b"ok"
        (idle,) = next(iter(c._origins.values())).idle
        assert idle.gettimeout() == 1.5
        assert c.request("POST", url, body=b"", headers={}, timeout=1.5).body == b"ok"
        assert srv.connections == 1
    finally:
        c.close()


def test_https_verifies_the_certificate(serve, cert, monkeypatch):
    certfile, keyfile = cert
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certfile, keyfile)
    srv = serve(wrap=lambda s: server_ctx.wrap_socket(s, server_side=True))
    url = f"https://127.0.0.1:{srv.port}/secure"
    trusting = httpclient.gevent.ssl.create_default_context(cafile=str(certfile))
    c = HTTPClient(ssl_context=trusting)
    for _ in range(2):
        resp = c.request("POST", url, body=b"a=1", headers={}, timeout=5)
        assert (resp.status, resp.body) == (200, b"ok")
    assert srv.connections == 1  # kept alive under TLS too
    c.close()
    default = HTTPClient()  # the system's trust store does not know the throwaway cert
    with pytest.raises(DeliveryError, match="(?i)certificate"):
        default.request("POST", url, body=b"", headers={}, timeout=5)
    default.close()
