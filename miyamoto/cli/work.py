"""The pull queues' commands: ``lease``, ``ack``, ``nack``, ``extend``, and ``work``, a
tiny pull worker.

``miyamoto work QUEUE -- command args...`` leases tasks of a pull queue and runs the
command once per task: the task's body (as it is) or its params (as a JSON object) on
stdin, ``MIYAMOTO_TASK_ID``, ``MIYAMOTO_ATTEMPT``, ``MIYAMOTO_QUEUE`` (and
``MIYAMOTO_TASK_NAME`` when named) in its environment. While the command runs its lease
is extended every third of it; exit 0 acks the task, anything else nacks it (retried
after ``--nack-delay``, else its backoff). ``--concurrency`` commands run at once, each
in a thread with its own client. SIGINT or SIGTERM stops leasing: the commands running
finish and are answered, tasks leased meanwhile are given back, and it exits 0.
``--max-tasks`` and ``--once`` bound a run (tests, cron jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

from miyamoto.cli.usage import UsageError

POLL_WAIT = 5.0  # s: each lease's long poll; a stop is noticed within it


def add_commands(sub: Any, common: argparse.ArgumentParser,
                 command: Callable[[Callable[[Any, argparse.Namespace], int]], Any]) -> None:
    """``command`` wraps a function of (client, args) as the CLI's client commands are."""
    lease = sub.add_parser("lease", parents=[common], help="lease due tasks of a pull queue")
    lease.add_argument("queue", help="the pull queue")
    lease.add_argument("--max-tasks", type=int, default=1, help="at most this many (1-100)")
    lease.add_argument("--lease", type=float, default=60.0, metavar="SECONDS",
                       help="each lease's span (default 60)")
    lease.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="wait up to this long for due tasks (at most 60; default 0)")
    lease.set_defaults(func=command(_lease))
    for name, helptext in (("ack", "a leased task succeeded"),
                           ("nack", "a leased task failed this attempt: retry it"),
                           ("extend", "a leased task's lease runs longer")):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("id", help="task id")
        p.add_argument("lease_token", metavar="TOKEN", help="the token its lease carried")
        if name == "nack":
            p.add_argument("--delay", type=float, metavar="SECONDS",
                           help="retry after this long (default: the task's backoff)")
        if name == "extend":
            p.add_argument("--lease", type=float, metavar="SECONDS",
                           help="seconds from now (default: the lease's own span)")
        p.set_defaults(func=command(_answer), answer=name)
    work = sub.add_parser("work", parents=[common],
                          help="a pull worker: run a command per leased task")
    work.add_argument("queue", help="the pull queue")
    work.add_argument("argv", nargs="*", metavar="COMMAND",
                      help="the command and its arguments, after -- (miyamoto work q -- "
                           "./job.sh --flag)")
    work.add_argument("--concurrency", type=int, default=1, help="commands at once (1-64)")
    work.add_argument("--lease", type=float, default=60.0, metavar="SECONDS",
                      help="each lease's span, extended while the command runs (default 60)")
    work.add_argument("--max-tasks", type=int, metavar="N", help="stop after N tasks")
    work.add_argument("--once", action="store_true", help="one lease round, then stop")
    work.add_argument("--nack-delay", type=float, metavar="SECONDS",
                      help="a failed command's task is retried after this (default: backoff)")
    work.set_defaults(func=command(_work))


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``work ... -- command args``: (what the parser reads, the command), so that the
    command's own flags are not taken for ours; (argv, None) for any other command."""
    if "work" not in argv or "--" not in argv or argv.index("work") > argv.index("--"):
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def _lease(client: Any, args: argparse.Namespace) -> int:
    tasks = client.lease(args.queue, args.max_tasks, args.lease, args.wait)
    print(json.dumps({"queue": args.queue, "tasks": tasks}, indent=2, sort_keys=True,
                     ensure_ascii=False))
    return 0


def _answer(client: Any, args: argparse.Namespace) -> int:
    if args.answer == "ack":
        out = client.ack(args.id, args.lease_token)
    elif args.answer == "nack":
        out = client.nack(args.id, args.lease_token, args.delay)
    else:
        out = client.extend(args.id, args.lease_token, args.lease)
    print(json.dumps(out, indent=2, sort_keys=True, ensure_ascii=False))
    return 0


class Worker:
    """The worker's state: when to stop, and what it did (shared by its threads)."""

    def __init__(self, client_factory: Callable[[], Any], args: argparse.Namespace):
        self.make_client = client_factory
        self.args = args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.started = 0  # tasks taken on (bounded by --max-tasks)
        self.acked = self.nacked = self.returned = 0

    def take(self, n: int) -> int:
        """How many more tasks this thread may lease now (0: stop)."""
        with self.lock:
            if self.stop.is_set():
                return 0
            if self.args.max_tasks is None:
                return n
            left = self.args.max_tasks - self.started
            return max(0, min(n, left))

    def loop(self) -> None:
        client = self.make_client()
        try:
            while not self.stop.is_set():
                n = self.take(1)
                if not n:
                    return
                tasks = client.lease(self.args.queue, n, self.args.lease,
                                     0.0 if self.args.once else POLL_WAIT)
                for task in tasks:
                    self.one(client, task)
                if self.args.once:
                    return
        finally:
            client.close()

    def one(self, client: Any, task: dict[str, Any]) -> None:
        with self.lock:
            stopping = self.stop.is_set() or (self.args.max_tasks is not None
                                              and self.started >= self.args.max_tasks)
            if not stopping:
                self.started += 1
        if stopping:  # leased as the worker stopped: given back at once
            client.nack(task, delay=0)
            with self.lock:
                self.returned += 1
            return
        ok = run_command(client, self.args.argv, task, self.args.lease)
        if ok:
            client.ack(task)
        else:
            client.nack(task, delay=self.args.nack_delay)
        with self.lock:
            if ok:
                self.acked += 1
            else:
                self.nacked += 1


def run_command(client: Any, argv: list[str], task: dict[str, Any], lease: float) -> bool:
    """Run ``argv`` for ``task``, extending its lease every third of it; True on exit 0."""
    env = dict(os.environ, MIYAMOTO_TASK_ID=str(task["id"]),
               MIYAMOTO_ATTEMPT=str(task.get("attempt", 1)),
               MIYAMOTO_QUEUE=str(task.get("queue", "")))
    if task.get("name"):
        env["MIYAMOTO_TASK_NAME"] = str(task["name"])
    body = task.get("body")
    data = (body if body is not None else json.dumps(task.get("params") or {})).encode()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env)
    except OSError as e:
        print(f"miyamoto work: cannot run {argv[0]}: {e}", file=sys.stderr)
        return False
    feeder = threading.Thread(target=_feed, args=(proc, data), daemon=True)
    feeder.start()
    while True:
        try:
            code = proc.wait(timeout=max(0.5, lease / 3))
            break
        except subprocess.TimeoutExpired:
            try:
                client.extend(task, lease_s=lease)
            except Exception as e:  # the lease is over: the command's answer will be 409
                print(f"miyamoto work: task {task['id']}: could not extend: {e}",
                      file=sys.stderr)
    feeder.join(timeout=1)
    return code == 0


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:
        pass  # the command did not read its stdin


def _work(client: Any, args: argparse.Namespace) -> int:
    argv = args.argv
    if not argv:
        raise UsageError("give the command to run after --")
    if not 1 <= args.concurrency <= 64:
        raise UsageError("--concurrency must be 1-64")
    if not 1 <= args.lease <= 7 * 86400:
        raise UsageError("--lease must be 1-604800 seconds")
    args.argv = argv
    worker = Worker(client.clone, args)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: worker.stop.set())
    threads = [threading.Thread(target=_guarded, args=(worker,), daemon=True)
               for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.2)
    print(json.dumps({"queue": args.queue, "acked": worker.acked, "nacked": worker.nacked,
                      "given_back": worker.returned}, sort_keys=True))
    return 0


def _guarded(worker: Worker) -> None:
    """One worker thread; a node that cannot be reached is said, and the thread goes on."""
    while not worker.stop.is_set():
        try:
            worker.loop()
            return
        except Exception as e:
            print(f"miyamoto work: {e}", file=sys.stderr)
            if worker.args.once:
                return
            worker.stop.wait(1.0)
