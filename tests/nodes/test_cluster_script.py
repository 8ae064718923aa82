"""scripts/cluster.py runs cluster.example.ini as the README says, and survives a kill -9
of one node: the others keep running, it says so, and `restart ID` brings it back."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from helpers import REPO, free_ports, run_cli, wait_until
from harness import child_env


def example_ini(tmp_path) -> tuple[str, dict[str, int]]:
    """cluster.example.ini on free ports, its journals under tmp_path."""
    text = (REPO / "cluster.example.ini").read_text()
    ports = free_ports(6)
    http = {}
    for i, node in enumerate("abc"):
        text = text.replace(f"127.0.0.1:808{i + 1}", f"127.0.0.1:{ports[i]}")
        text = text.replace(f"127.0.0.1:600{i + 1}", f"127.0.0.1:{ports[3 + i]}")
        text = text.replace(f"./miyamoto-data/{node}", str(tmp_path / "data" / node))
        http[node] = ports[i]
    path = tmp_path / "cluster.ini"
    path.write_text(text)
    return str(path), http


def ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.timeout(90)
def test_the_cluster_script_keeps_the_others_running_and_restarts_one(tmp_path):
    ini, http = example_ini(tmp_path)
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "cluster.py"), ini],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=child_env(), cwd=tmp_path, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")),
                     daemon=True).start()
    text = lambda: "".join(out)  # noqa: E731
    try:
        wait_until(lambda: all(ready(p) for p in http.values()), 30, what="a, b and c ready")
        cp = run_cli("status", "--json", "--server", f"http://127.0.0.1:{http['a']}")
        assert cp.returncode == 0 and '"a"' in cp.stdout and '"c"' in cp.stdout, cp
        proc.stdin.write("kill b\n")
        proc.stdin.flush()
        wait_until(lambda: "node b exited with code -9; the others keep running" in text(), 10,
                   what="the script to report b's death")
        time.sleep(1.0)  # the others are not stopped with it
        assert proc.poll() is None and ready(http["a"]) and ready(http["c"]), text()[-2000:]
        proc.stdin.write("restart b\n")
        proc.stdin.flush()
        wait_until(lambda: ready(http["b"]), 30, what="b back")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, text()[-3000:]
    assert "Traceback" not in text(), text()[-3000:]
