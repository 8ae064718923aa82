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


class _QuietHandler(WSGIHandler):
    def log_request(self) -> None:  # access logs off: they cost more than the request
        pass


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
