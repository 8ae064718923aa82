"""The data dir's lock: one node per journal, the holder named to the one refused, and a
lock file deleted or replaced under a running node noticed and taken again.

flock locks belong to an open file description, so a second ``DataDirLock`` in this
same process is refused exactly as a second node would be."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from miyamoto.store import datadir
from miyamoto.store.datadir import DataDirLock, DataDirLocked

pytestmark = pytest.mark.timeout(30)


def held(tmp_path: Path) -> DataDirLock:
    lock = DataDirLock(str(tmp_path))
    lock.acquire()
    return lock


def test_the_lock_file_holds_our_pid_alone(tmp_path: Path) -> None:
    """A shorter pid written over a longer one must not leave the longer one's tail."""
    (tmp_path / "lock").write_text("123456789012\n")
    lock = held(tmp_path)
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"
    umask = os.umask(0)
    os.umask(umask)
    lock.release()
    os.unlink(tmp_path / "lock")
    held(tmp_path).release()
    assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o644 & ~umask


def test_a_second_node_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = held(tmp_path)
    with pytest.raises(DataDirLocked) as e:
        DataDirLock(str(tmp_path)).acquire()
    assert e.value.pid == os.getpid() and e.value.data_dir == str(tmp_path)
    assert f"pid {os.getpid()}" in str(e.value) and str(tmp_path) in str(e.value)
    first.release()
    held(tmp_path).release()  # released: the next one gets it


@pytest.mark.parametrize("text", ["", "not a pid\n"])
def test_a_holder_whose_pid_cannot_be_read_is_named_unknown(tmp_path: Path, text: str) -> None:
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, text.encode())
        with pytest.raises(DataDirLocked) as e:
            DataDirLock(str(tmp_path)).acquire()
        assert e.value.pid is None and "a process whose pid is unknown" in str(e.value)
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_refused_or_failed_lock_leaves_no_descriptor_open(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    first = held(tmp_path)
    before = open_fds()
    for _ in range(3):
        with pytest.raises(DataDirLocked):
            DataDirLock(str(tmp_path)).acquire()
    assert open_fds() == before
    first.release()

    def broken(fd: int, how: int) -> None:
        raise OSError(5, "I/O error")
    monkeypatch.setattr(datadir.fcntl, "flock", broken)
    before = open_fds()
    with pytest.raises(OSError) as e:
        DataDirLock(str(tmp_path)).acquire()
    assert e.value.errno == 5 and open_fds() == before  # flock's own error, nothing else


def test_intact_until_the_lock_file_is_deleted_or_replaced(tmp_path: Path) -> None:
    lock = DataDirLock(str(tmp_path))
    assert not lock.intact()  # not held yet
    lock.acquire()
    assert lock.intact()
    os.unlink(tmp_path / "lock")
    assert not lock.intact()
    lock.retake()
    assert lock.intact()
    (tmp_path / "other").write_text("")
    os.replace(tmp_path / "other", tmp_path / "lock")
    assert not lock.intact()
    lock.release()
    assert not lock.intact()


def test_retake_locks_the_new_file_and_keeps_one_descriptor(tmp_path: Path) -> None:
    lock = held(tmp_path)
    before = open_fds()
    os.unlink(tmp_path / "lock")
    lock.retake()
    assert open_fds() == before  # the old descriptor is closed once the new one holds
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(DataDirLocked):  # the new file is really locked
        DataDirLock(str(tmp_path)).acquire()
    lock.release()


def test_retake_makes_a_removed_data_dir_again(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    lock = held(d)
    os.unlink(d / "lock")
    os.rmdir(d)
    lock.retake()
    assert lock.intact() and (d / "lock").exists()
    lock.release()


def test_retake_refused_when_another_node_got_there_first(tmp_path: Path) -> None:
    lock = held(tmp_path)
    os.unlink(tmp_path / "lock")
    other = held(tmp_path)
    with pytest.raises(DataDirLocked):
        lock.retake()
    other.release()
    lock.release()


def test_release_twice_is_harmless(tmp_path: Path) -> None:
    lock = held(tmp_path)
    lock.release()
    lock.release()
    held(tmp_path).release()
