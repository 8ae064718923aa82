"""``miyamoto.sockets.send_all``: one send on the OS socket when it takes everything, the
rest (or all of it, when the OS socket would block) through gevent's sendall, and a
socket without an OS socket (TLS) through sendall alone. A real 8 MiB send:
tests/unit/http/test_server.py."""

from __future__ import annotations

import pytest

from miyamoto.sockets import send_all

pytestmark = pytest.mark.timeout(10)


class Raw:
    def __init__(self, takes: int | None) -> None:
        self.takes = takes  # bytes one send takes; None: it would block
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        if self.takes is None:
            raise BlockingIOError()
        self.sent.append(bytes(data[:self.takes]))
        return min(self.takes, len(data))


class Sock:
    def __init__(self, raw: Raw | None) -> None:
        if raw is not None:
            self._sock = raw
        self.rest: list[bytes] = []

    def sendall(self, data: bytes | memoryview) -> None:
        self.rest.append(bytes(data))


def test_all_in_one_send() -> None:
    raw = Raw(takes=100)
    s = Sock(raw)
    send_all(s, b"x" * 100)
    assert raw.sent == [b"x" * 100] and s.rest == []


def test_what_one_send_leaves_goes_through_sendall() -> None:
    raw = Raw(takes=3)
    s = Sock(raw)
    send_all(s, b"abcdefg")
    assert raw.sent == [b"abc"] and s.rest == [b"defg"]


def test_a_send_that_would_block_leaves_it_all_to_sendall() -> None:
    s = Sock(Raw(takes=None))
    send_all(s, b"abc")
    assert s.rest == [b"abc"]


def test_a_socket_without_an_os_socket_uses_sendall() -> None:
    s = Sock(None)
    send_all(s, b"abc")
    assert s.rest == [b"abc"]
