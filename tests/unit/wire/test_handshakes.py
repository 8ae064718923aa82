"""The refused handshakes read from libzmq's socket monitor (``miyamoto.wire.handshakes``):
which refusals are told, with which address, the bound on remembered connections, and
the reader's end, over a real zmq socket pair standing in for the monitor. The whole
path (a real ROUTER refusing a peer's key): tests/unit/wire/test_transport.py."""

from __future__ import annotations

import socket
import struct
from typing import Iterator

import gevent
import pytest
import zmq
import zmq.green

from dispatchkit import wait_for
from miyamoto.wire import handshakes
from miyamoto.wire.handshakes import MAX_PEERS, HandshakeWatch

pytestmark = pytest.mark.timeout(30)

CRYPTO = zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC


def ev(kind: int, value: int) -> dict:
    return {"event": kind, "value": value, "endpoint": b"tcp://127.0.0.1:1"}


@pytest.fixture
def told(monkeypatch) -> Iterator[tuple[HandshakeWatch, list]]:
    monkeypatch.setattr(handshakes, "peer_of", lambda fd: f"10.0.0.{fd}:5")
    refused: list[tuple[str, str]] = []
    yield HandshakeWatch(None, lambda kind, addr: refused.append((kind, addr)),  # type: ignore[arg-type]
                         lambda: False), refused


def test_a_failed_handshake_is_told_at_its_disconnect_with_the_address(told) -> None:
    w, refused = told
    w.event(ev(zmq.EVENT_ACCEPTED, 7))
    w.event(ev(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, CRYPTO))
    assert refused == []
    w.event(ev(zmq.EVENT_DISCONNECTED, 7))
    assert refused == [("key", "10.0.0.7:5")]
    w.event(ev(zmq.EVENT_ACCEPTED, 8))
    w.event(ev(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0))
    w.event(ev(zmq.EVENT_DISCONNECTED, 9))  # a connection never seen accepted
    assert refused[-1] == ("protocol", "?")
    w.event(ev(zmq.EVENT_DISCONNECTED, 8))  # a plain disconnect: nothing to tell
    assert len(refused) == 2


def test_at_most_max_peers_addresses_are_remembered(told) -> None:
    w, refused = told
    for fd in range(1, MAX_PEERS + 1):
        w.event(ev(zmq.EVENT_ACCEPTED, fd))
    w.event(ev(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, CRYPTO))
    w.event(ev(zmq.EVENT_DISCONNECTED, 1))
    assert refused == [("key", "10.0.0.1:5")]  # the first of 1024 is still known
    w.event(ev(zmq.EVENT_ACCEPTED, 1))  # 1024 again
    w.event(ev(zmq.EVENT_ACCEPTED, 5000))  # one more: the old ones are forgotten
    for fd in (2, 5000):
        w.event(ev(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, CRYPTO))
        w.event(ev(zmq.EVENT_DISCONNECTED, fd))
    assert refused[1:] == [("key", "?"), ("key", "10.0.0.5000:5")]


def _pair() -> tuple[zmq.Context, zmq.Socket, zmq.Socket]:
    ctx = zmq.green.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://monitor-test")
    b.connect("inproc://monitor-test")
    return ctx, a, b


@pytest.mark.parametrize("stopping", [True, False])
def test_the_reader_tells_events_and_ends_quietly_only_when_stopped(stopping: bool) -> None:
    ctx, monitor, feed = _pair()
    refused: list[tuple[str, str]] = []
    stop = {"now": False}
    w = HandshakeWatch(monitor, lambda k, a: refused.append((k, a)), lambda: stop["now"])
    reader = gevent.spawn(w.serve)
    try:
        for kind, value in ((zmq.EVENT_ACCEPTED, -1), (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                                                        CRYPTO), (zmq.EVENT_DISCONNECTED, -1)):
            feed.send_multipart([struct.pack("=hi", kind, value), b"tcp://127.0.0.1:1"])
        wait_for(lambda: refused == [("key", "?")], 10)
        stop["now"] = stopping
        monitor.close(linger=0)  # the next read fails: ZMQError (ENOTSOCK)
        reader.join(10)
        assert reader.dead
        if stopping:
            assert reader.successful()  # a read failing while stopping is the end
        else:
            assert isinstance(reader.exception, zmq.ZMQError)  # otherwise it is an error
    finally:
        reader.kill()
        feed.close(linger=0)
        ctx.term()


class _Peer6:
    """A socket whose peer is an IPv6 address (host, port, flowinfo, scope id)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def getpeername(self):
        return ("::1", 6001, 0, 0)


def test_the_peer_of_a_connection_is_its_host_and_port(monkeypatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            conn, _ = server.accept()
            with conn:
                port = client.getsockname()[1]
                assert handshakes.peer_of(conn.fileno()) == f"127.0.0.1:{port}"
    with socket.create_server(("127.0.0.1", 0)) as unconnected:
        assert handshakes.peer_of(unconnected.fileno()) == "?"  # no peer: not connected
    monkeypatch.setattr(handshakes.socket, "fromfd", lambda fd, family, kind: _Peer6())
    assert handshakes.peer_of(3) == "::1:6001"  # IPv6: its host and port, no more
