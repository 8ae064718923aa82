"""scripts/bench.py's progress bars and --plot: short real runs of the bench (its own node
in memory, its own sink, a few hundred tasks), plus the pieces alone.

The bench's contract is kept: one JSON line on stdout, progress on stderr only. A bar is
drawn on a terminal or with --progress, not on a pipe; --plot writes a PNG made by
matplotlib, and without matplotlib the bench exits 2 before starting anything.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from helpers import REPO

BENCH = str(REPO / "scripts" / "bench.py")
SHORT = ["--memory", "--tasks", "300", "--connections", "10", "--timeout", "40",
         "--startup-timeout", "40", "--stop-timeout", "5", "--grace", "0.2"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BAR = "task/s"  # tqdm's rate unit, in every bar line and nowhere else


def bench_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIYAMOTO_")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def run_bench(*args: str, stderr=subprocess.PIPE, env=None,
              timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, BENCH, *args], stdout=subprocess.PIPE,
                          stderr=stderr, text=True, timeout=timeout, env=env or bench_env())


def result_line(cp: subprocess.CompletedProcess) -> dict:
    import json

    assert cp.returncode == 0, (cp.returncode, cp.stdout[-2000:], cp.stderr[-4000:])
    lines = cp.stdout.splitlines()
    assert len(lines) == 1, cp.stdout[:2000]  # the one result line, nothing else on stdout
    report = json.loads(lines[0])
    assert report["delivered"] == 300 and report["lost"] == 0, report
    return report


def png_chunks(data: bytes) -> dict[bytes, list[bytes]]:
    """The chunks of a PNG by type; asserts the signature and every chunk's CRC."""
    assert data[:8] == PNG_SIGNATURE
    chunks: dict[bytes, list[bytes]] = {}
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.setdefault(kind, []).append(body)
        at += 12 + length
    assert b"IHDR" in chunks and b"IDAT" in chunks and b"IEND" in chunks
    return chunks


def made_by_matplotlib(chunks: dict[bytes, list[bytes]]) -> bool:
    texts = dict(c.split(b"\0", 1) for c in chunks.get(b"tEXt", []))
    return texts.get(b"Software", b"").startswith(b"Matplotlib")


@pytest.mark.timeout(150)
def test_short_run_writes_a_matplotlib_png_and_no_bar_on_a_pipe(tmp_path: Path) -> None:
    out = tmp_path / "latency.png"
    started = time.monotonic()
    cp = run_bench(*SHORT, "--plot", str(out))
    report = result_line(cp)
    assert time.monotonic() - started < 120
    chunks = png_chunks(out.read_bytes())
    assert made_by_matplotlib(chunks)
    width, height = struct.unpack(">II", chunks[b"IHDR"][0][:8])
    assert width >= 600 and height >= 300, (width, height)
    assert f"wrote the latency plot to {out}" in cp.stderr
    assert BAR not in cp.stderr and "\r" not in cp.stderr, cp.stderr[-2000:]  # piped: no bar
    assert report["mode"] == "throughput"


@pytest.mark.timeout(150)
def test_bars_with_the_flag_and_on_a_terminal(tmp_path: Path) -> None:
    cp = run_bench(*SHORT, "--progress")
    result_line(cp)
    assert "enqueued" in cp.stderr and "300/300" in cp.stderr and BAR in cp.stderr
    assert "delivered" in cp.stderr

    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real size
    try:
        proc = subprocess.Popen([sys.executable, BENCH, *SHORT], stdout=subprocess.PIPE,
                                stderr=slave, text=True, env=bench_env())
        os.close(slave)
        drawn = io.BytesIO()
        while True:  # read the terminal until the bench closes it (exits)
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer is gone
                break
            if not chunk:
                break
            drawn.write(chunk)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
    result_line(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, ""))
    text = drawn.getvalue().decode("utf-8", "replace")
    assert "300/300" in text and BAR in text, text[-2000:]


@pytest.mark.timeout(60)
def test_plot_without_matplotlib_or_with_a_bad_target_exits_2(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = bench_env(PYTHONPATH=f"{shim.parent}{os.pathsep}{REPO}")
    started = time.monotonic()
    cp = run_bench(*SHORT, "--plot", str(tmp_path / "x.png"), env=env, timeout=30)
    assert cp.returncode == 2 and cp.stdout == "", (cp.stdout, cp.stderr)
    assert "--plot needs matplotlib" in cp.stderr and "pip install" in cp.stderr
    assert "Traceback" not in cp.stderr and "starting" not in cp.stderr  # no node started
    assert time.monotonic() - started < 20
    assert not (tmp_path / "x.png").exists()
    for bad in (["--plot", str(tmp_path / "no" / "such" / "dir.png")],
                ["--plot", str(tmp_path / "d.png"), "--delayed", "10"]):
        cp = run_bench(*SHORT, *bad, timeout=30)
        assert cp.returncode == 2 and "--plot" in cp.stderr and "Traceback" not in cp.stderr


@pytest.mark.timeout(60)
def test_plot_and_progress_pieces(tmp_path: Path) -> None:
    from harness import plot, progress

    report = {"mode": "paced", "tasks": 50, "nodes": 3, "replication": 2, "journal": "disk",
              "connections": 4, "paced_rate": 20.0}
    assert plot.title(report) == ("Miyamoto bench: paced, 50 tasks, 3 node(s), replication 2, "
                                  "disk journal, 4 connections, paced 20/s")
    for name, samples in (("some", [0.001 * (1 + i % 17) for i in range(500)]),
                          ("none", []), ("one", [0.004])):
        path = tmp_path / f"{name}.png"
        plot.write_png(str(path), samples, report)
        assert made_by_matplotlib(png_chunks(path.read_bytes())), name

    class Stream(io.StringIO):
        def __init__(self, tty: bool) -> None:
            super().__init__()
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert progress.enabled(False, False, Stream(True))
    assert not progress.enabled(False, False, Stream(False))
    assert progress.enabled(False, True, Stream(False))
    assert not progress.enabled(True, True, Stream(True))  # --quiet wins
