"""miyamoto.cli.sdnotify: one datagram to $NOTIFY_SOCKET (a path or an abstract name),
nothing without it, and a warning, not an exception, when systemd is not listening."""

from __future__ import annotations

import os
import socket

import pytest

from helpers import NotifySocket
from miyamoto.cli import sdnotify


@pytest.mark.timeout(10)
def test_an_abstract_socket_gets_the_state_from_this_process():
    listener = NotifySocket()
    try:
        assert sdnotify.notify("READY=1\nSTATUS=up", env={"NOTIFY_SOCKET": listener.name})
        assert listener.poll() == [(os.getpid(), "READY=1\nSTATUS=up")]
    finally:
        listener.close()


@pytest.mark.timeout(10)
def test_a_socket_path_gets_the_state(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        assert sdnotify.notify("STOPPING=1", env={"NOTIFY_SOCKET": path})
        assert sock.recv(100) == b"STOPPING=1"


def test_without_the_variable_nothing_is_sent():
    assert sdnotify.notify("READY=1", env={}) is False
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": ""}) is False


def test_a_socket_nobody_listens_on_is_a_warning(tmp_path, caplog):
    path = str(tmp_path / "gone")
    assert sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": path}) is False
    assert f"cannot send READY=1 to {path}" in caplog.text
