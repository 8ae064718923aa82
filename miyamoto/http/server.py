"""The node's HTTP server: an HTTP/1.1 loop on gevent's StreamServer, with strict request
heads, read deadlines, a connection cap and TCP_NODELAY.

Why not gevent.pywsgi (which this replaced): under ``scripts/bench.py`` its handler
machinery (per-request attribute resets, header re-encoding, ``finalize_headers``, two
sends per response) was about a third of the server's CPU beyond the application. This
loop reads a request with ``miyamoto.http.head``, hands the application a plain WSGI
environ (built from a per-server template and the parsed head), and writes status line,
headers and body with one ``sendall`` from cached status lines; TCP_NODELAY is set on
every accepted socket (a keep-alive response must not wait ~40 ms for a delayed ACK,
gevent #1233). The body stream is still pywsgi's ``Input`` (Content-Length, chunked,
``Expect: 100-continue``), wrapped so that the request's deadline is armed while it reads.

What is closed, and where: request heads are read by ``miyamoto.http.head`` (64 KiB cap,
431; no ambiguous framing, 400); a connection's deadlines and the cap are
``miyamoto.http.connections`` (see there why a full server evicts the longest-waiting
connection rather than refusing new ones); and a client's fault never reaches the log as
a traceback or the client as a 500: a broken head gets a JSON 4xx and a close, a broken
body (short, bad chunk, client gone) a 400 from the application or a quiet close, a
socket error a quiet close.

TLS (``tls``, an ``ssl.SSLContext``): the accepted socket is admitted first and wrapped
after, so the handshake runs under the connection's first deadline (a client that opens
a connection and never finishes its handshake is swept like one that never sends a
head); a failed handshake is a quiet close. ``use_tls`` swaps the context for
connections accepted from then on (SIGHUP: a renewed certificate), with the listener
and the open connections untouched.
"""

from __future__ import annotations

import _socket
import logging
import socket
import ssl
import sys
import time
from functools import partial
from typing import Any, Callable
from wsgiref.handlers import format_date_time

import gevent.pool
import ujson
from gevent.pywsgi import Input, unquote_latin1
from gevent.server import StreamServer

from miyamoto.http.connections import INF, Conn, Connections
from miyamoto.http.head import BadRequest, ClientGone, Head, keep_alive, read_head, \
                               read_request_line
from miyamoto.sockets import send_all

log = logging.getLogger(__name__)

_REASONS = {400: "Bad Request", 413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}
LINGER = 1.0  # s an answered bad request has to stop sending before its socket closes
BACKLOG = 1024
_ONE_SEND = 65536  # a body up to this size goes out in the same send as the head
_STATUS_LINES: dict[str, bytes] = {}  # "200 OK" -> b"HTTP/1.1 200 OK\r\n", per status seen
_MAX_STATUS_LINES = 64


def error_response(status: int, message: str) -> bytes:
    """A whole response that closes the connection, with a JSON body shaped like the API's
    errors (``{"status": "error", "error": ...}``)."""
    body = ujson.dumps({"status": "error", "error": message}).encode()
    return (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class _Input(Input):
    """pywsgi's body stream, with the request's deadline armed while it reads (the
    application reads the body, so only the stream knows when the node waits for it) and
    a record of a failed read (the stream is then out of step: close after answering)."""

    __slots__ = ("conn", "failed")

    def __init__(self, rfile: Any, content_length: int | None, conn: Conn,
                 sock: Any = None, chunked: bool = False):
        Input.__init__(self, rfile, content_length, socket=sock, chunked_input=chunked)
        self.conn = conn
        self.failed = False

    def read(self, length: int | None = None) -> bytes:
        return self._guarded(Input.read, length)

    def readline(self, size: int | None = None) -> bytes:
        return self._guarded(Input.readline, size)

    def _guarded(self, fn: Callable[[Input, int | None], bytes], n: int | None) -> bytes:
        conn = self.conn
        conn.deadline = conn.request_deadline
        try:
            return fn(self, n)
        except BaseException:
            self.failed = True
            raise
        finally:
            conn.deadline = INF


class _Date:
    """The Date header's value, formatted once a second rather than once a response."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def now(self) -> bytes:
        t = int(time.time())
        if t != self.second:
            self.second = t
            self.value = format_date_time(t).encode("latin-1")
        return self.value


class _Response:
    """What the application gave ``start_response``; ``head()`` renders the bytes."""

    __slots__ = ("status", "headers", "code", "connection", "length", "date")

    def __init__(self) -> None:
        self.status = ""
        self.headers: list[tuple[str, str]] = []
        self.code = 0
        self.connection: str | None = None  # the application's Connection header
        self.length: str | None = None
        self.date = False

    def start(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        """WSGI start_response: the checks pywsgi makes (no CR/LF anywhere, latin-1)."""
        if "\r" in status or "\n" in status:
            raise ValueError("carriage return or newline in status", status)
        for name, value in headers:
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
                raise ValueError("carriage return or newline in a header", name)
            low = name.lower()
            if low == "content-length":
                self.length = value
            elif low == "connection":
                self.connection = value.lower()
            elif low == "date":
                self.date = True
        self.status, self.headers, self.code = status, headers, int(status.split(" ", 1)[0])
        return self._write_unsupported

    @staticmethod
    def _write_unsupported(data: bytes) -> None:
        raise NotImplementedError("write() is not supported: return the body")

    def head(self, body_len: int, close: bool, version: str, date: bytes) -> bytearray:
        line = _STATUS_LINES.get(self.status)
        if line is None:
            line = f"HTTP/1.1 {self.status}\r\n".encode("latin-1")
            if len(_STATUS_LINES) < _MAX_STATUS_LINES:
                _STATUS_LINES[self.status] = line
        out = bytearray(line)
        for name, value in self.headers:
            out += f"{name}: {value}\r\n".encode("latin-1")
        if not self.date:
            out += b"Date: " + date + b"\r\n"
        if self.length is None and self.code not in (204, 304):
            out += b"Content-Length: %d\r\n" % body_len
        if self.connection is None:
            if version == "HTTP/1.0":
                out += b"Connection: close\r\n" if close else b"Connection: keep-alive\r\n"
            elif close:
                out += b"Connection: close\r\n"
        out += b"\r\n"
        return out


class _FdShutter:
    """What the sweep shuts down for a TLS connection: its file descriptor, under the
    SSL socket. ``SSLSocket.shutdown`` drops the TLS state first, so a reader blocked in
    it would wake with a ValueError, not the OSError that ends a connection quietly."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def shutdown(self, how: int) -> None:
        s = _socket.socket(fileno=self.fd)
        try:
            s.shutdown(how)
        finally:
            s.detach()


class HTTPServer(StreamServer):
    """``max_connections`` open at once (beyond it, see ``miyamoto.http.connections``), each
    with ``header_timeout`` s to send a request's head and body and ``idle_timeout`` s
    between requests; heads beyond ``max_header_bytes`` get 431. ``app`` is a WSGI
    application (``miyamoto.http.api.Api``); with ``tls`` it is served over https."""

    def __init__(self, address: tuple[str, int] | socket.socket, app: Any, *,
                 max_connections: int = 10000, header_timeout: float = 10.0,
                 idle_timeout: float = 30.0, max_header_bytes: int = 65536,
                 tls: ssl.SSLContext | None = None):
        # a listening socket (SO_REUSEPORT, node.py) comes with its own backlog
        backlog = None if isinstance(address, socket.socket) else BACKLOG
        super().__init__(address, backlog=backlog, spawn=gevent.pool.Pool(None))
        self.application = app
        self.connections = Connections(max_connections, header_timeout, idle_timeout)
        self.max_header_bytes = max_header_bytes
        self._sweeper: Any = None
        self._environ: dict[str, Any] = {}
        self._date = _Date()
        self.tls = tls

    def use_tls(self, tls: ssl.SSLContext) -> None:
        """Serve connections accepted from now on with ``tls`` (a reloaded certificate)."""
        self.tls = tls

    def start(self) -> None:
        super().start()
        host, port = self.address[0], self.address[1]
        self._environ = {
            "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_SOFTWARE": "miyamoto",
            "SERVER_NAME": str(host), "SERVER_PORT": str(port), "SCRIPT_NAME": "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http" if self.tls is None else "https",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False, "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True}
        interval = self.connections.sweep_interval
        self._sweeper = self.loop.timer(interval, interval, ref=False)
        self._sweeper.start(self.connections.sweep)  # in the hub: it only shuts sockets

    def stop(self, timeout: float | None = None) -> None:
        """Close the listener and every waiting connection; busy ones finish their
        request (for ``timeout`` s, then they are killed)."""
        self.connections.close_waiting()
        try:
            super().stop(timeout)
        finally:
            if self._sweeper is not None:
                self._sweeper.stop()
                self._sweeper.close()
                self._sweeper = None

    def handle(self, sock: socket.socket, address: Any) -> None:
        """One connection, request after request (StreamServer closes the socket after)."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conns = self.connections
        conn = conns.admit(sock)
        if conn is None:
            why = "stopping" if conns.closing else "too many connections"
            try:
                sock.sendall(error_response(503, why))
            except OSError:
                pass
            return
        if self.tls is None:
            self._serve(sock, conn, address, partial(send_all, sock))
            return
        conn.sock = _FdShutter(sock.fileno())  # the same descriptor under the TLS socket
        try:
            tls_sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError:
            conns.remove(conn)
            return
        try:  # within the connection's first deadline: the sweep shuts the descriptor
            tls_sock.do_handshake()
        except OSError as e:  # not TLS, a certificate refused (mutual TLS), a client gone
            log.debug("http: TLS handshake with %s failed: %s", address, e)
            conns.remove(conn)
        else:  # sendall: send_all writes the OS socket, which carries ciphertext here
            self._serve(tls_sock, conn, address, tls_sock.sendall)
        finally:
            tls_sock.close()  # StreamServer closes only the socket it accepted, detached now

    def _serve(self, sock: Any, conn: Conn, address: Any, send: Callable[[bytes], None]) -> None:
        """Request after request on one admitted connection."""
        conns = self.connections
        rfile = sock.makefile("rb", -1)
        try:
            served = 0
            while True:
                if served:
                    if not conns.idle(conn) or not rfile.peek(1):
                        break
                    conns.request(conn)
                if not self._one(sock, rfile, conn, address, send):
                    break
                served += 1
        except OSError:  # the client went away, or a deadline shut the socket
            pass
        finally:
            conns.remove(conn)
            try:
                rfile.close()
            except OSError:
                pass

    def _one(self, sock: socket.socket, rfile: Any, conn: Conn, address: Any,
             send: Callable[[bytes], None]) -> bool:
        """Read and answer one request; True: keep the connection for another."""
        try:
            line = read_request_line(rfile)
            if line is None:
                return False
            head = read_head(rfile, self.max_header_bytes, line.version)
        except ClientGone:
            return False
        except BadRequest as e:
            log.debug("http: %s from %s: %s", e.status, address, e.message)
            self._refuse(sock, conn, e.status, e.message)
            return False
        self.connections.busy(conn)
        close = not keep_alive(head, line.version)
        environ, stream = self._environ_for(line.method, line.target, line.version, head,
                                            address, rfile, conn, sock)
        close = self._respond(send, environ, stream, line.version, close)
        return not close

    def _environ_for(self, method: str, target: str, version: str, head: Head,
                     address: Any, rfile: Any, conn: Conn,
                     sock: socket.socket) -> tuple[dict[str, Any], _Input]:
        """The WSGI environ, straight from the parsed head: names with ``_`` and the
        two fields carried as CONTENT_TYPE / CONTENT_LENGTH are left out, as pywsgi does."""
        env = self._environ.copy()
        env["REQUEST_METHOD"] = method
        path, _, query = target.partition("?")
        env["PATH_INFO"] = unquote_latin1(path)
        env["RAW_URI"] = target  # as sent (pywsgi's name): a URL inside the path keeps its %XX
        env["QUERY_STRING"] = query
        env["SERVER_PROTOCOL"] = version
        ctype = head.typeheader
        if ctype is not None:
            env["CONTENT_TYPE"] = ctype
        if head.content_length is not None:
            env["CONTENT_LENGTH"] = str(head.content_length)
        if isinstance(address, tuple):
            env["REMOTE_ADDR"] = str(address[0])
            env["REMOTE_PORT"] = str(address[1])
        for name, value in head.fields:
            key = name.environ
            if key is None:
                continue
            if key in env:
                env[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                env[key] = value
        expect = env.get("HTTP_EXPECT", "").lower() == "100-continue"
        stream = _Input(rfile, head.content_length, conn, sock if expect else None, head.chunked)
        env["wsgi.input"] = stream
        return env, stream

    def _respond(self, send: Callable[[bytes], None], environ: dict[str, Any], stream: _Input,
                 version: str, close: bool) -> bool:
        """Run the application and send its answer in one send; True: close after it."""
        resp = _Response()
        sent = False
        try:
            result = self.application(environ, resp.start)
            try:
                body = b"".join(result)
            finally:
                closer = getattr(result, "close", None)
                if closer is not None:
                    closer()
            if not resp.status:
                raise RuntimeError("the application did not call start_response")
            close = close or stream.failed or resp.connection == "close"
            out = resp.head(len(body), close, version, self._date.now())
            sent = True
            if environ["REQUEST_METHOD"] == "HEAD" or resp.code in (204, 304):
                send(out)
            elif len(body) <= _ONE_SEND:
                out += body
                send(out)
            else:
                send(out)
                send(body)
            if stream.failed:
                return True
            stream._discard()
            return close
        except OSError:  # a write to a client that left, or a broken body: just close
            return True
        except Exception:
            log.exception("http: %s %s failed", environ["REQUEST_METHOD"], environ["PATH_INFO"])
            if not sent:
                send(error_response(500, "internal error"))
            return True

    def _refuse(self, sock: socket.socket, conn: Conn, status: int, message: str) -> None:
        """Answer a request that cannot be read, then close without a reset: stop
        sending, and read what the client still sends (for at most LINGER s), so that
        the answer is not destroyed by an RST before the client reads it."""
        sock.sendall(error_response(status, message))
        self.connections.linger(conn, LINGER)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


__all__ = ["BACKLOG", "HTTPServer", "error_response"]
