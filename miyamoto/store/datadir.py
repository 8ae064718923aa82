"""The exclusive lock on a data dir: one node per journal.

Two nodes on one journal would both deliver its tasks and overwrite each other's
records, so a node takes ``flock(LOCK_EX | LOCK_NB)`` on ``<data_dir>/lock`` before it
opens the journal, and writes its pid there so that the one refused can name the
holder. flock, not a pid file alone: the kernel drops the lock when its holder dies,
even by ``kill -9``, so a stale file never blocks a restart (the pid in it is only
ever read after the lock was refused, i.e. while its writer is alive).

The lock must stay ours for as long as we write: if the lock file is deleted or
replaced under a running node, a second node could lock the new file and open the
same journal. ``intact()`` tells whether the path still names the file we locked;
``retake()`` locks the file now at the path (or a new one).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os

log = logging.getLogger(__name__)

LOCK_NAME = "lock"


class DataDirLocked(OSError):
    """Another live process holds the data dir's lock."""

    def __init__(self, data_dir: str, pid: int | None):
        holder = f"pid {pid}" if pid is not None else "a process whose pid is unknown"
        super().__init__(errno.EAGAIN, f"data dir {data_dir} is in use by another node ({holder})")
        self.data_dir = data_dir
        self.pid = pid


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


class DataDirLock:
    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.path = os.path.join(data_dir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Lock the data dir (creating the lock file); DataDirLocked names the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise DataDirLocked(self.data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def intact(self) -> bool:
        """Does the lock path still name the file we hold locked?"""
        if self._fd is None:
            return False
        try:
            st, mine = os.stat(self.path), os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def retake(self) -> None:
        """Lock what the path names now (the data dir is made again if it was removed);
        DataDirLocked if another node got there first. Our old lock is kept until the
        new one is held."""
        os.makedirs(self.data_dir, exist_ok=True)
        self.acquire()
        log.warning("data dir %s: its lock file was deleted or replaced; locked it again",
                    self.data_dir)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None
