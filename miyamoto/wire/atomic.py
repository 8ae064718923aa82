"""Replacing a small file whole: a crash leaves the old bytes or the new, never torn ones.

Write a temporary file beside it, fsync, rename it over the file, fsync the directory
(the definitions' file, ``miyamoto.definitions.sync``; a node's boot counter and key,
``miyamoto.wire.identity``). Here, beside identity, as ``miyamoto.store`` imports
the wire (its DecodeError): a home in store would be a circle.
"""

from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write temp, fsync, rename over, fsync the directory: all of it or none. The
    file ends with ``mode``; a failed write leaves no temporary file."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:  # mkstemp's
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
