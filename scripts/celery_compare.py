#!/usr/bin/env python
"""Celery 5 with Redis against one Miyamoto node, in one run on this box, to the same sink.

The box is shared and its speed varies by 2x from day to day (DESIGN, measured facts), so
only a ratio measured in one run means anything. This script measures both sides, one
after the other, with the same load shape and the same sink (scripts/harness/fastsink,
in this process):

* Celery: Debian's ``redis-server`` started here on a free 127.0.0.1 port in a temp dir
  (no persistence), a worker ``celery worker -P prefork -c 2`` on it, and a task that
  POSTs its params to the sink as a form (``requests``, one Session per worker process).
  ``--tasks`` tasks are sent with ``apply_async`` from ``--connections`` greenlets.
* Miyamoto: one node, through scripts/bench.py's own functions (``bench.parse_args`` and
  ``bench.bench``: the same code as ``bench.py --tasks N --connections C``).

delivered_per_s is the same figure for both: distinct tasks delivered / (first enqueue
start .. last first delivery). Prints ONE JSON line: both rates, the ratio, and each
side's CPU seconds. Every phase is bounded in time; only 127.0.0.1 is contacted; the
worker and redis are stopped (SIGTERM, then SIGKILL) on exit, error or Ctrl-C, and die
with this script (PR_SET_PDEATHSIG) if it is killed outright.

Needs the ``compare`` extra (``pip install -e '.[compare]'``) and ``redis-server`` on PATH
(``apt-get install redis-server``).

  .venv/bin/python scripts/celery_compare.py                      # 20,000 tasks, 50 conns
  .venv/bin/python scripts/celery_compare.py --tasks 5000 --bench-arg=--memory
  git archive OLD | tar -x -C /tmp/old && .venv/bin/python scripts/celery_compare.py \
      --variant "before=env PYTHONPATH=/tmp/old $PWD/.venv/bin/python -P -m miyamoto"
"""

from __future__ import annotations

if __name__ == "__main__":  # the entry point patches once, before anything imports socket
    from gevent import monkey

    monkey.patch_all()

import argparse
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

import gevent
import ujson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (scripts/bench.py: the Miyamoto side is its code, not a copy)
from harness import LOCALHOST, free_port, wait_until  # noqa: E402
from harness.fastload import ms_summary  # noqa: E402
from harness.fastsink import Sink  # noqa: E402
from harness.procfs import loadavg, proc_cpu_s  # noqa: E402
from harness.nodes import _PRCTL, PR_SET_PDEATHSIG  # noqa: E402

clock = time.perf_counter

TASKS_MODULE = '''\
"""The Celery side of scripts/celery_compare.py: POST the params to the sink as a form."""
import os

import requests
from celery import Celery

app = Celery("compare", broker=os.environ["COMPARE_BROKER"])
app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)
_session = None


@app.task(name="compare.post")
def post(url, params):
    global _session
    if _session is None:  # one keep-alive session per worker process
        _session = requests.Session()
    _session.post(url, data=params, timeout=10).raise_for_status()
'''


def log(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="celery_compare.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20000, help="tasks per side (default 20000)")
    p.add_argument("--connections", type=int, default=50,
                   help="enqueueing greenlets / connections per side (default 50)")
    p.add_argument("--concurrency", type=int, default=2, help="celery worker -c (default 2)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="s to wait for a side's deliveries after its last enqueue (default 300)")
    p.add_argument("--bench-arg", action="append", default=[], metavar="ARG",
                   help="extra scripts/bench.py argument for the Miyamoto side (repeat), "
                        "e.g. --bench-arg=--memory")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=NODE_CMD",
                   help="also run the Miyamoto side with bench.py --node-cmd NODE_CMD, "
                        "reported as NAME (repeat; e.g. before=\"env PYTHONPATH=/tmp/old "
                        "python -P -m miyamoto\" for a before/after in one run: -P, or "
                        "the repo's own package shadows the old one)")
    p.add_argument("--skip-celery", action="store_true", help="only the Miyamoto side")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.connections < 1 or args.concurrency < 1:
        p.error("--tasks, --connections and --concurrency must be >= 1")
    for v in args.variant:
        if "=" not in v:
            p.error(f"--variant wants NAME=NODE_CMD, got {v!r}")
    return args


def _die_with_parent() -> None:
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _spawn(cmd: list[str], cwd: str, env: dict[str, str], logname: str) -> subprocess.Popen:
    out = open(os.path.join(cwd, logname), "wb")
    try:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    finally:
        out.close()


def _stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> int | None:
    """SIGTERM the process group, SIGKILL what is left after ``timeout`` s."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except ProcessLookupError:
            pass
    return proc.returncode


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (the prefork pool)."""
    total = proc_cpu_s(pid) or 0.0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        kids = []
    return total + sum(proc_cpu_s(k) or 0.0 for k in kids)


def _redis(workdir: str) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("celery_compare: redis-server not found (apt-get install redis-server)")
    port = free_port()
    proc = _spawn([exe, "--bind", LOCALHOST, "--port", str(port), "--dir", workdir,
                   "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
                  workdir, dict(os.environ), "redis.log")
    import redis

    r = redis.Redis(host=LOCALHOST, port=port, socket_timeout=1)
    wait_until(lambda: proc.poll() is None and r.ping(), 20, interval=0.1,
               what=f"redis-server on {port}")
    return proc, port


def run_celery(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """Redis, a prefork worker, ``args.tasks`` tasks; the same figures as bench.py."""
    with open(os.path.join(workdir, "compare_tasks.py"), "w") as f:
        f.write(TASKS_MODULE)
    redis_proc = worker = None
    sink = Sink(run=uuid.uuid4().hex[:12], clock=clock).start()
    try:
        redis_proc, port = _redis(workdir)
        broker = f"redis://{LOCALHOST}:{port}/0"
        env = dict(os.environ, COMPARE_BROKER=broker, PYTHONPATH=workdir)
        worker = _spawn([sys.executable, "-m", "celery", "-A", "compare_tasks", "worker",
                         "-P", "prefork", "-c", str(args.concurrency), "--loglevel", "warning",
                         "--without-gossip", "--without-mingle", "--without-heartbeat"],
                        workdir, env, "worker.log")
        os.environ["COMPARE_BROKER"] = broker
        sys.path.insert(0, workdir)
        import compare_tasks  # the same module the worker runs, as the sending side

        task = compare_tasks.post
        url = sink.url()
        log("waiting for the celery worker (a warm-up task)")
        task.apply_async(args=(url, {"run": sink.run, "seq": "warm"}))
        wait_until(lambda: "warm" in sink.stats.first_at, 60, interval=0.1,
                   what="the celery worker's first delivery")
        cpu0 = _tree_cpu_s(worker.pid) + (proc_cpu_s(redis_proc.pid) or 0.0)
        send_at: dict[str, float] = {}
        errors = 0
        counter = itertools.count()

        def sender() -> None:
            nonlocal errors
            for seq in counter:
                if seq >= args.tasks:
                    return
                s = str(seq)
                send_at[s] = clock()
                try:
                    task.apply_async(args=(url, {"run": sink.run, "seq": s}))
                except Exception as e:  # noqa: BLE001 - one failed send is one error
                    errors += 1
                    log(f"send failed: {e!r}")

        log(f"celery: sending {args.tasks} tasks from {args.connections} greenlets")
        t0 = clock()
        gevent.joinall([gevent.spawn(sender) for _ in range(args.connections)],
                       timeout=args.timeout)
        sent = clock()
        first = sink.stats.first_at
        deadline = clock() + args.timeout
        report_at = clock() + 5
        while clock() < deadline and sum(1 for s in send_at if s in first) < len(send_at):
            if clock() >= report_at:
                log(f"celery: {sink.stats.delivered} of {len(send_at)} delivered")
                report_at = clock() + 5
            gevent.sleep(0.05)
        cpu = _tree_cpu_s(worker.pid) + (proc_cpu_s(redis_proc.pid) or 0.0) - cpu0
        got = [s for s in send_at if s in first]
        end = max((first[s] for s in got), default=t0)
        return {"enqueued": len(send_at) - errors, "errors": errors,
                "enqueue_per_s": round(len(send_at) / max(sent - t0, 1e-9), 1),
                "delivered": len(got), "lost": len(send_at) - errors - len(got),
                "delivered_per_s": round(len(got) / max(end - t0, 1e-9), 1),
                "latency_ms": ms_summary(sorted(first[s] - send_at[s] for s in got)),
                "cpu_s_worker_and_redis": round(cpu, 2)}
    finally:
        log(f"stopping the worker ({_stop(worker)}) and redis ({_stop(redis_proc)})")
        sink.stop(timeout=0.5)


def run_miyamoto(args: argparse.Namespace, node_cmd: str | None = None) -> dict[str, Any]:
    extra = [] if node_cmd is None else [f"--node-cmd={node_cmd}"]
    bench_args = bench.parse_args(["--tasks", str(args.tasks), "--connections",
                                   str(args.connections), "--timeout", str(args.timeout),
                                   *args.bench_arg, *extra])
    report = bench.bench(bench_args)
    keys = ("journal", "enqueued", "enqueue_per_s", "delivered", "lost", "duplicated",
            "delivered_per_s", "latency_ms", "cpu_s")
    return {k: report.get(k) for k in keys}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="miyamoto-compare-")
    main_greenlet = gevent.getcurrent()
    handler = gevent.signal_handler(signal.SIGTERM,
                                    lambda: main_greenlet.throw(SystemExit(143)))
    out: dict[str, Any] = {"tasks": args.tasks, "connections": args.connections,
                           "celery_pool": f"prefork -c {args.concurrency}",
                           "loadavg_1m_start": loadavg()}
    try:
        if not args.skip_celery:
            out["celery"] = run_celery(args, workdir)
        log("miyamoto: one node through scripts/bench.py")
        out["miyamoto"] = run_miyamoto(args)
        for v in args.variant:
            name, cmd = v.split("=", 1)
            log(f"miyamoto variant {name}: --node-cmd {cmd}")
            out[f"miyamoto_{name}"] = run_miyamoto(args, cmd)
    except KeyboardInterrupt:
        print("celery_compare: interrupted", file=sys.stderr)
        return 130
    finally:
        handler.cancel()
        shutil.rmtree(workdir, ignore_errors=True)
    m = out["miyamoto"].get("delivered_per_s")
    c = out.get("celery", {}).get("delivered_per_s")
    out["ratio"] = round(m / c, 2) if m and c else None
    for v in args.variant:
        name = v.split("=", 1)[0]
        mv = out[f"miyamoto_{name}"].get("delivered_per_s")
        out[f"ratio_{name}"] = round(mv / c, 2) if mv and c else None
    out["loadavg_1m_end"] = loadavg()
    print(ujson.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
