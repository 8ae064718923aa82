"""The node's HTTP server: gevent.pywsgi with strict request heads, read deadlines, a
connection cap and TCP_NODELAY.

pywsgi writes a response's headers and body in two sends; without TCP_NODELAY every
keep-alive response after the first waits ~40 ms for a delayed ACK (gevent #1233), so
``_Handler`` sends them in one and sets TCP_NODELAY on every accepted socket.

What pywsgi left open, and where it is closed: request heads are read by
``miyamoto.httphead`` (64 KiB cap, 431; no ambiguous framing, 400); a connection's
deadlines and the cap are ``miyamoto.connections`` (see there why a full server evicts
the longest-waiting connection rather than refusing new ones); and a client's fault
never reaches the log as a traceback or the client as a 500: a broken head gets a JSON
4xx and a close, a broken body (short, bad chunk, client gone) a 400 from the
application or a quiet close, a socket error a quiet close.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Callable

import gevent.pool
import ujson
from gevent.pywsgi import Input, WSGIHandler, WSGIServer, unquote_latin1

from miyamoto.connections import INF, Conn, Connections
from miyamoto.httphead import BadRequest, ClientGone, keep_alive, read_head, read_request_line

log = logging.getLogger(__name__)

_REASONS = {400: "Bad Request", 413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}
LINGER = 1.0  # s an answered bad request has to stop sending before its socket closes
BACKLOG = 1024


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


class _Handler(WSGIHandler):
    """One connection: requests read by ``httphead``, answered by the application."""

    conn: Conn
    served = 0
    wsgi_input: _Input

    def log_request(self) -> None:  # access logs off: they cost more than the request
        pass

    def handle(self) -> None:
        try:
            while self.handle_one_request():
                pass
        except OSError:  # the client went away, or a deadline shut the socket
            pass
        finally:
            self.server.connections.remove(self.conn)
            try:
                self.rfile.close()  # drops the socket's last file reference: the fd closes
            except OSError:
                pass
            self.__dict__.pop("rfile", None)
            self.__dict__.pop("wsgi_input", None)

    def handle_one_request(self) -> bool:
        """Read and answer one request; True: keep the connection for another."""
        conns: Connections = self.server.connections
        conn, rfile = self.conn, self.rfile
        if self.served:
            if not conns.idle(conn) or not rfile.peek(1):
                return False
            conns.request(conn)
        try:
            line = read_request_line(rfile)
            if line is None:
                return False
            head = read_head(rfile, self.server.max_header_bytes, line.version)
        except ClientGone:
            return False
        except BadRequest as e:
            log.debug("http: %s from %s: %s", e.status, self.client_address, e.message)
            self._refuse(e.status, e.message)
            return False
        conns.busy(conn)
        self.command, self.path, self.request_version = line.method, line.target, line.version
        self.headers = head  # type: ignore[assignment]
        self.content_length = head.content_length  # type: ignore[assignment]
        self.close_connection = not keep_alive(head, line.version)
        self.environ = self.get_environ()
        self.application = self.server.application
        self.handle_one_response()
        self.served += 1
        return not self.close_connection and not rfile.closed

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request that cannot be read, then close without a reset: stop
        sending, and read what the client still sends (for at most LINGER s), so that
        the answer is not destroyed by an RST before the client reads it."""
        sock = self.socket
        sock.sendall(error_response(status, message))
        self.server.connections.linger(self.conn, LINGER)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass

    def handle_one_response(self) -> None:
        self.status = None
        self.headers_sent = False
        self.result = None
        self.response_use_chunked = False
        self.connection_upgraded = False
        self.response_length = 0
        stream = self.wsgi_input
        try:
            self.run_application()
            if stream.failed:
                self.close_connection = True
            else:
                stream._discard()
        except OSError:  # a write to a client that left, or a broken body: just close
            self.close_connection = True
        except Exception:
            log.exception("http: %s %s failed", self.command, self.path)
            self.close_connection = True
            if not self.headers_sent:
                self.socket.sendall(error_response(500, "internal error"))

    def _write_with_headers(self, data: bytes) -> None:
        """Status line, headers and body in one send (pywsgi makes two)."""
        self.headers_sent = True
        self.finalize_headers()
        if self.wsgi_input.failed:
            self.close_connection = True
        out = bytearray(b"HTTP/1.1 ")
        out += self.status
        out += b"\r\n"
        for header, value in self.response_headers:
            out += header
            out += b": "
            out += value
            out += b"\r\n"
        if self.close_connection and self.request_version == "HTTP/1.1" and not any(
                h.lower() == b"connection" for h, _ in self.response_headers):
            out += b"Connection: close\r\n"
        out += b"\r\n"
        if data and len(data) <= 65536 and not self.response_use_chunked:
            out += data
            self._sendall(out)
        else:
            self._sendall(out)
            self._write(data)

    def get_environ(self) -> dict[str, Any]:
        """The WSGI environ, built straight from the parsed head (pywsgi re-splits
        header lines); the body stream is always ``_Input`` (no upgrades here)."""
        env = self.server.get_environ()
        env["REQUEST_METHOD"] = self.command
        env["SCRIPT_NAME"] = ""
        path, _, query = self.path.partition("?")
        env["PATH_INFO"] = unquote_latin1(path)
        env["QUERY_STRING"] = query
        head = self.headers
        ctype = head.typeheader
        if ctype is not None:
            env["CONTENT_TYPE"] = ctype
        if head.content_length is not None:
            env["CONTENT_LENGTH"] = str(head.content_length)
        env["SERVER_PROTOCOL"] = self.request_version
        address = self.client_address
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
        self.wsgi_input = _Input(self.rfile, head.content_length, self.conn,
                                 self.socket if expect else None, head.chunked)
        env["wsgi.input"] = self.wsgi_input
        env["wsgi.input_terminated"] = True
        return env


class HTTPServer(WSGIServer):
    """``max_connections`` open at once (beyond it, see ``miyamoto.connections``), each
    with ``header_timeout`` s to send a request's head and body and ``idle_timeout`` s
    between requests; heads beyond ``max_header_bytes`` get 431."""

    handler_class = _Handler

    def __init__(self, address: tuple[str, int] | socket.socket, app: Any, *,
                 max_connections: int = 10000, header_timeout: float = 10.0,
                 idle_timeout: float = 30.0, max_header_bytes: int = 65536):
        # a listening socket (SO_REUSEPORT, node.py) comes with its own backlog
        backlog = None if isinstance(address, socket.socket) else BACKLOG
        super().__init__(address, app, backlog=backlog, spawn=gevent.pool.Pool(None), log=None,
                         error_log=_ErrorLog())
        self.connections = Connections(max_connections, header_timeout, idle_timeout)
        self.max_header_bytes = max_header_bytes
        self._sweeper: Any = None

    def start(self) -> None:
        super().start()
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
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn = self.connections.admit(sock)
        if conn is None:
            why = "stopping" if self.connections.closing else "too many connections"
            try:
                sock.sendall(error_response(503, why))
            except OSError:
                pass
            return
        handler = self.handler_class(sock, address, self)
        handler.conn = conn
        handler.handle()


class _ErrorLog:
    """pywsgi's error log as a file-like object that writes to logging."""

    def write(self, data: str) -> None:
        data = data.strip()
        if data:
            log.warning("http: %s", data)

    def flush(self) -> None:
        pass

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)
