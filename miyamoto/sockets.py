"""Sending a small message on a gevent socket in one system call.

gevent's ``sendall`` wraps every call in a memoryview, a ``getsockopt(SO_SNDBUF)`` system
call and a chunking loop (for PyPy's sake); with one request or response per call that
was ~4% of a node's CPU under ``scripts/bench.py``. A message that fits in the socket's
send buffer (all of the node's answers and deliveries, nearly always) goes out with one
``send`` on the OS socket under the gevent one, which is non-blocking already; whatever
is left, if anything, goes through gevent's ``sendall`` and waits as it would. Plain
TCP sockets only: a TLS socket's OS socket carries ciphertext.
"""

from __future__ import annotations

from typing import Any


def send_all(sock: Any, data: bytes) -> None:
    """``sock.sendall(data)`` for a plain gevent TCP socket, in one syscall when it can."""
    raw = getattr(sock, "_sock", None)
    if raw is None:
        sock.sendall(data)
        return
    try:
        sent = raw.send(data)
    except BlockingIOError:
        sent = 0
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])
