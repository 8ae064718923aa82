"""gevent.pywsgi with TCP_NODELAY on every accepted socket.

pywsgi writes a response's headers and body in two sends; without TCP_NODELAY every
keep-alive response after the first waits ~40 ms for a delayed ACK (gevent #1233).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import gevent.pool
from gevent.pywsgi import WSGIHandler, WSGIServer

log = logging.getLogger(__name__)


MAX_HEADERS = 100
MAX_LINE = 65536


class _Headers:
    """The part of pywsgi's header object (an email.message subclass) that pywsgi uses,
    parsed by hand: the email parser was ~9% of a node's CPU under load."""

    __slots__ = ("_items", "_map", "status")

    def __init__(self, items: list[tuple[str, str]], status: str = ""):
        self._items = items
        self._map: dict[str, str] = {}
        for k, v in items:
            self._map.setdefault(k.lower(), v)
        self.status = status

    def get(self, name: str, default: Any = None) -> Any:
        return self._map.get(name.lower(), default)

    getheader = get

    def __delitem__(self, name: str) -> None:
        low = name.lower()
        self._items = [(k, v) for k, v in self._items if k.lower() != low]
        self._map.pop(low, None)

    @property
    def headers(self) -> Any:
        for k, v in self._items:
            yield f"{k}: {v}\r\n"

    @property
    def typeheader(self) -> str | None:
        return self._map.get("content-type")


def _read_headers(rfile: Any) -> _Headers:
    items: list[tuple[str, str]] = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            return _Headers([], "Line too long")
        if line in (b"\r\n", b"\n", b""):
            return _Headers(items)
        if len(items) >= MAX_HEADERS:
            return _Headers([], "Too many headers")
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and items:  # obsolete line folding
            k, v = items[-1]
            items[-1] = (k, v + " " + text.strip())
            continue
        name, sep, value = text.partition(":")
        if not sep or not name or name != name.strip():
            return _Headers([], "Invalid header line")
        items.append((name, value.strip()))


class _QuietHandler(WSGIHandler):
    def log_request(self) -> None:  # access logs off: they cost more than the request
        pass

    def MessageClass(self, rfile: Any, *args: Any) -> _Headers:  # noqa: N802 (pywsgi's name)
        return _read_headers(rfile)

    def _write_with_headers(self, data: bytes) -> None:
        """Status line, headers and body in one send (pywsgi makes two)."""
        self.headers_sent = True
        self.finalize_headers()
        out = bytearray(b"HTTP/1.1 ")
        out += self.status
        out += b"\r\n"
        for header, value in self.response_headers:
            out += header
            out += b": "
            out += value
            out += b"\r\n"
        out += b"\r\n"
        if data and len(data) <= 65536 and not self.response_use_chunked:
            out += data
            self._sendall(out)
        else:
            self._sendall(out)
            self._write(data)


class HTTPServer(WSGIServer):
    handler_class = _QuietHandler

    def __init__(self, address: tuple[str, int], app: Any, max_connections: int = 4096):
        super().__init__(address, app, spawn=gevent.pool.Pool(max_connections), log=None,
                         error_log=_ErrorLog())

    def handle(self, sock: socket.socket, address: Any) -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        super().handle(sock, address)


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
