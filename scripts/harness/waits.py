"""Deadlines and ports: the two things every harness wait and every node start need.

Plain stdlib, no gevent: the tests run it in threads, the scripts under gevent's
monkey-patching (where ``time.sleep`` yields to the hub), and both behave the same.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

LOCALHOST = "127.0.0.1"
# Addresses the harness may talk to: loopback, and those of the network namespaces a
# ``harness.netns.Net`` of this process made (it adds and removes its own).
LOCAL_HOSTS: set[str] = {LOCALHOST}


class HarnessError(AssertionError):
    """A harness wait ran out or a node died; an ``AssertionError`` so pytest reports it
    as a failed check, and a type of its own so scripts can turn it into an exit code."""


class NodeDied(HarnessError):
    """A node process exited while something waited for it."""


def wait_until(fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
               what: str | None = None) -> Any:
    """Poll ``fn`` until it returns something truthy; return that, or fail at the deadline.

    Exceptions from ``fn`` count as "not yet" (the last one is reported on timeout), except
    ``NodeDied``: a node that exited will not come back by itself, so the wait ends at once.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except NodeDied:
            raise
        except Exception as e:  # e.g. connection refused while a node starts
            last_exc = e
        if time.monotonic() >= deadline:
            desc = what or getattr(fn, "__name__", "condition")
            extra = f" (last error: {last_exc!r})" if last_exc else ""
            raise HarnessError(f"timed out after {timeout:g}s waiting for {desc}{extra}")
        time.sleep(interval)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS just handed out on 127.0.0.1 (held until all are known)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOCALHOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_refuses(port: int, host: str = LOCALHOST) -> bool:
    """True when nothing accepts connections on ``port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return False
    except OSError:
        return True
