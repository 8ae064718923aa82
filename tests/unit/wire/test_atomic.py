"""Replacing a small file whole (``miyamoto.wire.atomic``): on a real directory, the
bytes, the mode and no temporary file left, done or failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miyamoto.wire.atomic import atomic_write

pytestmark = pytest.mark.timeout(10)


def test_the_file_is_replaced_whole_private_by_default(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"old and longer")
    os.chmod(path, 0o644)
    atomic_write(str(path), b"new")
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o600
    atomic_write(str(path), b"shared", mode=0o644)
    assert path.read_bytes() == b"shared" and path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_a_bare_name_is_written_in_the_working_directory(tmp_path: Path,
                                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    atomic_write("boot", b"12\n", mode=0o644)
    assert (tmp_path / "boot").read_bytes() == b"12\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boot"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                            monkeypatch) -> None:
    path = tmp_path / "defs"
    path.write_bytes(b"old")

    def broken(*args: object) -> None:
        raise OSError(5, "I/O error")
    for step in ("fsync", "replace"):  # the write's sync, or the rename over the file
        with monkeypatch.context() as m:
            m.setattr(os, step, broken)
            with pytest.raises(OSError, match="I/O error"):
                atomic_write(str(path), b"new")
        assert path.read_bytes() == b"old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["defs"]


def test_no_descriptor_is_left_open(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for i in range(20):
        atomic_write(str(tmp_path / "f"), b"%d" % i)
    assert len(os.listdir("/proc/self/fd")) == before
