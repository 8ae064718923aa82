"""A node's wire identity, kept in its data dir: its incarnation counter and its own key.

``next_boot`` is the incarnation every frame carries (``miyamoto.wire.freshness``): it
must grow at every start, or a restarted node's new frames would look like replays of
its old ones. So it is kept on disk (``<data_dir>/boot``, written and fsynced before the
node sends anything) and is also at least the wall clock in milliseconds: a node whose
data dir was wiped still starts above what its peers remember of it, as long as its
clock did not go back by more than its downtime.

Files are replaced atomically (write a temporary file, fsync, rename, fsync the dir),
so a crash leaves the old value or the new one, never a torn one.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

log = logging.getLogger(__name__)

BOOT_FILE = "boot"


def _replace(path: str, data: bytes, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def next_boot(data_dir: str, clock: Callable[[], float] = time.time) -> int:
    """This start's incarnation: above the last one kept in ``data_dir`` and at least
    the clock in ms; kept there before it is returned."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, BOOT_FILE)
    try:
        with open(path, "rb") as f:
            last = int(f.read(32).strip() or b"0")
    except FileNotFoundError:
        last = 0
    except ValueError:
        log.warning("%s is not a number: the incarnation starts from the clock", path)
        last = 0
    boot = max(last + 1, int(clock() * 1000))
    _replace(path, f"{boot}\n".encode())
    return boot
