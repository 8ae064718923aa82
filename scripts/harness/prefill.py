"""Write N delayed tasks straight into a node's journal, before it starts.

So that memory and restart time can be measured with millions of pending tasks without
an hour of enqueues. The rows go through the journal's own code (``JournalFile`` opens
the file with its schema and takes the data dir's lock, ``journal.write_tasks`` writes
the rows a group commit writes, triggers and all), not through SQL of its own that
could drift from the node's. The tasks are what the bench enqueues with ``--delayed``:
the sink's URL, params ``run`` and ``seq``, a single copy on the node, due
``countdown`` s from now and spread evenly over ``spread`` s after that.

``bench.py --prefill N`` runs ``measure_prefill``: it starts the node(s) empty, reads
their RSS, stops them, fills each journal, starts them again on it (timed until
/readyz answers 200), and reads RSS again; then the bench's chosen run goes on, against
nodes holding N pending tasks each (the enqueue rate with a full journal).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

from miyamoto.store.file import JournalFile
from miyamoto.store.journal import write_tasks
from miyamoto.tasks.task import Task, new_id

from harness.procfs import dir_bytes, mb, proc_status_kb

BATCH = 20_000  # rows per transaction


def tasks(n: int, node: str, url: str, run: str, *, countdown: float, spread: float,
          queue: str = "default", now: float | None = None, start: int = 0):
    """The ``n`` tasks to write, one at a time (a generator: 10 M are never all held)."""
    now = time.time() if now is None else now
    for i in range(start, start + n):
        fire = now + countdown + (spread * i / n if n else 0.0)
        yield Task(id=new_id(), queue=queue, url=url, params={"run": run, "seq": str(i)},
                   eta=fire, created=now, fire_at=fire, replicas=(node,), replica=0)


def prefill(data_dir: str, n: int, node: str, url: str, run: str = "prefill", *,
            countdown: float = 3600.0, spread: float = 3600.0, queue: str = "default",
            progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write ``n`` tasks into the journal in ``data_dir`` (its node must be stopped:
    the data dir's lock refuses otherwise); returns what it took."""
    os.makedirs(data_dir, exist_ok=True)
    f = JournalFile(data_dir, os.path.join(data_dir, "journal.sqlite3"), False)
    t0 = time.monotonic()
    f.open()
    try:
        db = f.conn()
        db.execute("PRAGMA cache_size = -262144")  # 256 MiB: the id index outgrows the default
        gen = tasks(n, node, url, run, countdown=countdown, spread=spread, queue=queue)
        written = 0
        while written < n:
            batch = [t for _, t in zip(range(min(BATCH, n - written)), gen)]
            written += write_tasks(db, batch)
            if progress is not None:
                progress(written)
    finally:
        f.close()
        f.release()
    return {"prefill_tasks": n, "prefill_s": round(time.monotonic() - t0, 3),
            "prefill_journal_bytes": dir_bytes(data_dir)}


def measure_prefill(args: Any, nodes: Sequence[Any], sink_url: str, run: str,
                    start: Callable[[], Any], stop: Callable[[], Any],
                    log: Callable[[str], None]) -> dict[str, Any]:
    """Empty RSS, fill each node's journal with ``args.prefill`` tasks, restart timed,
    RSS again; the report's keys. The nodes are left running, on the full journals."""
    out: dict[str, Any] = {"prefill_tasks": args.prefill}
    time.sleep(args.settle)
    empty = {n.node_id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    stop()
    fills = {}
    for n in nodes:
        log(f"prefill: writing {args.prefill} tasks into {n.data_dir}")
        fills[n.node_id] = prefill(
            n.data_dir, args.prefill, n.node_id, sink_url, run, countdown=args.countdown,
            spread=args.prefill_spread,
            progress=lambda k: log(f"prefill: {k}") if k % 1_000_000 == 0 else None)
    out["prefill_s"] = {k: v["prefill_s"] for k, v in fills.items()}
    journal = {k: v["prefill_journal_bytes"] for k, v in fills.items()}
    out["prefill_journal_bytes"] = journal
    out["prefill_journal_bytes_per_task"] = round(sum(journal.values()) / len(journal)
                                                  / args.prefill)
    t0 = time.monotonic()
    start()
    for n in nodes:
        n.wait_ready(args.startup_timeout, ready=True)
    out["prefill_ready_s"] = round(time.monotonic() - t0, 3)
    log(f"prefill: node(s) serving {out['prefill_ready_s']} s after start")
    time.sleep(args.settle)
    full = {n.node_id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    out["rss_empty_mb"] = {k: mb(v) for k, v in empty.items()}
    out["rss_prefilled_mb"] = {k: mb(v) for k, v in full.items()}
    growth = [full[k] - empty[k] for k in empty if full[k] is not None and empty[k] is not None]
    out["rss_growth_bytes_per_prefilled_task"] = (
        round(sum(growth) * 1024 / len(growth) / args.prefill) if growth else None)
    return out
