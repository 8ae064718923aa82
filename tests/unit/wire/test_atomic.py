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

    def broken(fd: int) -> None:
        raise OSError(5, "I/O error")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="I/O error"):
        atomic_write(str(path), b"new")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["defs"]
