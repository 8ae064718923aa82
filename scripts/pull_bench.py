#!/usr/bin/env python
"""Pull against push on one node, in one run: how fast a worker drains a full queue.

Starts a node (data in a temp dir), fills a pull queue with --tasks tasks and drains it
twice: with the Python client (lease --batch tasks at a time, ack each) and with
``miyamoto work --concurrency C -- true`` (a process per task); then fills a paused push
queue aimed at a local sink, resumes it and times its deliveries. Prints ONE JSON line
of tasks/s. Every wait has a deadline; traffic goes only to 127.0.0.1.

  .venv/bin/python scripts/pull_bench.py --tasks 2000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import NodeProcess, Sink, run_cli, wait_until, write_ini  # noqa: E402

from miyamoto import Client  # noqa: E402


def _fill(client: Client, queue: str, n: int, url: str | None) -> None:
    task = {"params": {"k": "v"}} if url is None else {"url": url, "params": {"k": "v"}}
    for i in range(0, n, 500):
        client.enqueue_batch([dict(task) for _ in range(min(500, n - i))], queue=queue)


def _drained(node: NodeProcess, queue: str, n: int, timeout: float) -> None:
    wait_until(lambda: node.counts(queue)["succeeded"] >= n, timeout,
               interval=0.1, what=f"{n} {queue} tasks succeeded")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=100, help="max_tasks per lease (client)")
    ap.add_argument("--concurrency", type=int, default=4, help="miyamoto work --concurrency")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    n = args.tasks
    with tempfile.TemporaryDirectory() as tmp:
        ini = write_ini(Path(tmp) / "node.ini", {
            "miyamoto": {"log_level": "warning"},
            "queue:client": {"mode": "pull"}, "queue:work": {"mode": "pull"},
            "queue:push": {"paused": "true"}})
        node = NodeProcess(tmp, "bench", config=ini).start().wait_ready()
        sink = Sink().start()
        out: dict = {"tasks": n}
        try:
            with Client(node.url, timeout=60) as c:
                _fill(c, "client", n, None)
                start, done = time.monotonic(), 0
                while done < n and time.monotonic() - start < args.timeout:
                    for t in c.lease("client", max_tasks=args.batch, lease_s=60, wait_s=1):
                        c.ack(t)
                        done += 1
                out["pull_client_per_s"] = round(n / (time.monotonic() - start), 1)
                _fill(c, "work", n, None)
                start = time.monotonic()
                r = run_cli("work", "work", "--server", node.url, "--concurrency",
                            str(args.concurrency), "--max-tasks", str(n), "--", "true",
                            timeout=args.timeout)
                assert r.returncode == 0, r.stderr
                out["pull_work_per_s"] = round(n / (time.monotonic() - start), 1)
                _drained(node, "work", n, 30)
                _fill(c, "push", n, sink.url_for("/w"))
                start = time.monotonic()
                c.resume("push")
                _drained(node, "push", n, args.timeout)
                out["push_per_s"] = round(n / (time.monotonic() - start), 1)
        finally:
            sink.stop()
            node.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
