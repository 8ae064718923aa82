"""Many queues on one node: how GET /queues, GET /queues/<one> and /metrics fare.

Starts one node of the code in ``--repo`` (default: this checkout; give another
checkout to compare), enqueues one task due in an hour to each of ``--queues`` queue
names, then times each read ``--reads`` times and prints the medians, the answers'
sizes, the node's RSS and how many enqueues were refused (and with what):

    python scripts/queues_at_cap.py --queues 1000
    python scripts/queues_at_cap.py --queues 10000 --repo .
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(repo: Path, data: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(repo))
    env = {k: v for k, v in env.items() if not k.startswith("MIYAMOTO_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "miyamoto", "serve", "--http", f"127.0.0.1:{port}",
         "--data-dir", data, "--cluster", f"tcp://127.0.0.1:{_free_port()}",
         "--log-level", "warning"], cwd=repo, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the node did not become ready in 20 s")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _time(session: requests.Session, url: str, reads: int) -> tuple[float, int, int]:
    """(median ms, bytes, status) of ``reads`` GETs."""
    times, size, status = [], 0, 0
    for _ in range(reads):
        t = time.perf_counter()
        r = session.get(url, timeout=30)
        times.append((time.perf_counter() - t) * 1000)
        size, status = len(r.content), r.status_code
    return statistics.median(times), size, status


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--repo", type=Path, default=HERE)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as data:
        proc, url = _start(a.repo.resolve(), data)
        try:
            s = requests.Session()
            refused: Counter[str] = Counter()
            example = ""
            rss0 = _rss_mb(proc.pid)
            for i in range(a.queues):
                r = s.post(f"{url}/queue/q{i:05d}", timeout=30,
                           json={"url": "http://127.0.0.1:9/w", "countdown": 3600})
                if r.status_code != 200:
                    refused[f"{r.status_code} naming {r.json().get('field')}"] += 1
                    example = example or r.json().get("error", "")
            print(f"repo {a.repo}: {a.queues} queue names enqueued, "
                  f"{sum(refused.values())} refused {dict(refused) or ''}")
            if example:
                print(f"  e.g. {example}")
            for path in ("/queues", "/queues?limit=100", "/queues/q00000", "/metrics"):
                ms, size, status = _time(s, url + path, a.reads)
                print(f"GET {path:20s} {status}  median {ms:7.1f} ms  {size / 1024:8.1f} KiB")
            print(f"RSS {rss0:.0f} -> {_rss_mb(proc.pid):.0f} MB")
        finally:
            proc.terminate()
            proc.wait(15)


if __name__ == "__main__":
    main()
