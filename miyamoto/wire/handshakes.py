"""The handshakes the ROUTER refused, from libzmq's socket monitor: logged and counted.

A peer with a different CURVE key pair never reaches the ZAP handler: it encrypts its
HELLO to another server key, so libzmq drops the connection during the handshake and
tells no one but a socket monitor (HANDSHAKE_FAILED_PROTOCOL, "cryptographic"). Without
this both sides stayed silent and the refused-key counter stayed at 0. The monitor's
events carry no peer address; ACCEPTED carries the connection's fd, whose peer is read
at once (it may be gone by then: "?"), and the next DISCONNECTED of that fd after a
failed handshake names it.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from miyamoto.wire.zmqio import NOBLOCK, Readable

log = logging.getLogger(__name__)

EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
KEY_ERRORS = frozenset({zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC,
                        zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
                        zmq.PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE})
MAX_PEERS = 1024  # accepted connections whose address is remembered


class HandshakeWatch:
    """Reads the ROUTER's monitor socket until ``stopped()``; ``refused(kind, address)``
    is called once per handshake refused (kind "key": another key pair or no CURVE;
    "protocol": not a ZeroMQ peer at all, e.g. an HTTP client)."""

    def __init__(self, monitor: zmq.Socket, refused: Callable[[str, str], None],
                 stopped: Callable[[], bool]) -> None:
        self.monitor = monitor
        self.refused = refused
        self.stopped = stopped
        self._peers: dict[int, str] = {}
        self._failed: list[str] = []  # kinds of failed handshakes waiting for their fd

    def serve(self) -> None:
        readable = Readable(self.monitor)
        try:
            while not self.stopped():
                try:
                    frames = self.monitor.recv_multipart(NOBLOCK)
                except zmq.Again:
                    readable.wait()
                    continue
                except zmq.ZMQError:
                    if self.stopped():
                        return
                    raise
                self.event(parse_monitor_message(frames))
        finally:
            readable.close()

    def event(self, e: dict[str, Any]) -> None:
        kind, value = e["event"], e["value"]
        if kind == zmq.EVENT_ACCEPTED:
            if len(self._peers) >= MAX_PEERS:
                self._peers.clear()
            self._peers[value] = peer_of(value)
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            if len(self._failed) >= MAX_PEERS:
                del self._failed[0]
            self._failed.append("key" if value in KEY_ERRORS else "protocol")
        elif kind == zmq.EVENT_DISCONNECTED:
            address = self._peers.pop(value, "?")
            if self._failed:
                self.refused(self._failed.pop(0), address)


def peer_of(fd: int) -> str:
    """host:port at the other end of a socket fd, or "?" (closed, not TCP)."""
    try:
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
            host, port = s.getpeername()[:2]
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"
