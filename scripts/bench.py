#!/usr/bin/env python
"""Benchmark Miyamoto end to end: enqueue over HTTP, count deliveries at a local sink.

By default the bench starts its own node(s) as subprocesses on free 127.0.0.1 ports
(data in a temp dir, or in memory with --memory), runs a sink in its own process,
enqueues --tasks tasks from --connections keep-alive connections (round-robin over
the nodes), waits until every acknowledged task was delivered (or --timeout), waits
a grace period to catch duplicates, stops the nodes and prints ONE JSON line.

Modes:
  (default)        as fast as possible: enqueue and delivery throughput, latency
  --paced RATE     enqueue RATE tasks/s: unloaded enqueue-to-delivery latency
  --delayed N      enqueue N tasks due in --countdown s (far future) and report the
                   node's RSS before/after and the journal's size on disk

Examples:
  .venv/bin/python scripts/bench.py                             # 1 node, disk, 20k tasks
  .venv/bin/python scripts/bench.py --memory --tasks 5000
  .venv/bin/python scripts/bench.py --nodes 3 --replication 2 --rss
  .venv/bin/python scripts/bench.py --paced 100                 # 1000 tasks at 100/s
  .venv/bin/python scripts/bench.py --delayed 100000
  .venv/bin/python scripts/bench.py --server http://127.0.0.1:8088 --tasks 2000

Result keys (times from this process's perf_counter; the sink runs in-process):
  enqueue_per_s    200-acknowledged enqueues / (first request start .. last response)
  enqueue_ms       enqueue request round trip p50/p99/max
  delivered_per_s  distinct tasks delivered / (first enqueue start .. last first delivery)
  latency_ms       enqueue request start -> first delivery at the sink, p50/p99/max
  lost             acknowledged (200) but not delivered by --timeout
  duplicated       tasks (by seq) delivered more than once, counted during --grace too
  duplicated_ids / id_mismatch / foreign_deliveries   the same by X-Task-Id; deliveries
                   whose X-Task-Id differs from the enqueue's id; deliveries not of this run
  elapsed_s        first enqueue -> all delivered (or timeout), without the grace
  cpu_s            CPU seconds of the bench and of each node during the run
  server_metrics   the nodes' /metrics summed (counters as the run's increase)
  stored_per_task  tasks_stored_total / enqueued: the replication actually done
  stop_s, stop_codes   SIGTERM-to-exit time and exit codes (-9 = had to be killed)
  --rss adds rss_peak_mb (VmHWM), rss_mb, journal_bytes (data dir while running) and
  journal_bytes_stopped; --delayed reports rss_before/after_mb, rss_growth_bytes_per_task,
  journal_bytes(_per_task), delivered_early (must be 0) and, with --restart,
  restart_ready_s and rss_restarted_mb.

Only 127.0.0.1 is ever contacted. Progress goes to stderr, the result line to stdout.
Every phase is bounded in time; the nodes the bench started are stopped (SIGTERM,
then SIGKILL after --stop-timeout) on success, error, Ctrl-C or SIGTERM, and die
with the bench (PR_SET_PDEATHSIG) if it is killed outright.
"""

from __future__ import annotations

if __name__ == "__main__":  # the entry point patches once, before anything imports socket
    from gevent import monkey

    monkey.patch_all()

import argparse
import ctypes
import itertools
import math
import resource
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import gevent
import gevent.pool
import ujson
from geventhttpclient import HTTPClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sink import Sink  # noqa: E402  (scripts/ is not a package)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCALHOST = "127.0.0.1"
DEFAULT_TASKS = 20000
DEFAULT_PACED_TASKS = 1000
DEFAULT_REPLICA_OFFSET = 5.0  # the server's default; the bench never changes it
POLL = 0.05  # seconds between checks of the sink while waiting
ERROR_SAMPLES = 5
clock = time.perf_counter


def log(msg: str) -> None:
    """Progress line on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- options


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    load = p.add_argument_group("load")
    load.add_argument("--tasks", type=int, default=None,
                      help=f"tasks to enqueue (default {DEFAULT_TASKS}; "
                           f"{DEFAULT_PACED_TASKS} with --paced)")
    load.add_argument("--connections", type=int, default=50,
                      help="concurrent enqueueing greenlets = keep-alive connections (default 50)")
    load.add_argument("--paced", type=float, default=None, metavar="RATE",
                      help="enqueue at a fixed RATE tasks/s instead of as fast as possible")
    load.add_argument("--delayed", type=int, default=None, metavar="N",
                      help="enqueue N far-future tasks (no delivery run); report the nodes' "
                           "RSS before/after and the journal size on disk")
    load.add_argument("--countdown", type=float, default=3600.0,
                      help="task.countdown of --delayed tasks, seconds (default 3600)")
    load.add_argument("--queue", default=None,
                      help="queue name: POST /queue/NAME instead of POST /queue")
    load.add_argument("--json", action="store_true",
                      help="enqueue with JSON bodies instead of form bodies")
    load.add_argument("--request-timeout", type=float, default=30.0,
                      help="per enqueue request network timeout, s (default 30)")
    load.add_argument("--enqueue-timeout", type=float, default=600.0,
                      help="stop issuing enqueues after this many s; the rest count as "
                           "not_sent (default 600)")

    nodes = p.add_argument_group("nodes")
    nodes.add_argument("--server", action="append", default=[], metavar="URL",
                       help="target an already running node http://127.0.0.1:PORT instead of "
                            "starting nodes (repeat for several; enqueues go round-robin)")
    nodes.add_argument("--pid", action="append", type=int, default=[],
                       help="with --server and --rss/--delayed: pid(s) of the node process(es)")
    nodes.add_argument("--nodes", type=int, default=1,
                       help="number of nodes to start; >1 forms a cluster seeded by node 1 "
                            "(default 1)")
    nodes.add_argument("--replication", type=int, default=None,
                       help="--replication passed to the nodes (default: the server's)")
    nodes.add_argument("--memory", action="store_true",
                       help="start nodes with --data-dir :memory: (no journal on disk)")
    nodes.add_argument("--node-cmd", default=f"{shlex.quote(sys.executable)} -m miyamoto",
                       help="command that runs Miyamoto (default: this python -m miyamoto); "
                            "'serve' and the options are appended")
    nodes.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                       help="extra environment for started nodes, e.g. MIYAMOTO_FOO=1 (repeat)")
    nodes.add_argument("--log-level", default="warning",
                       help="--log-level of started nodes (default warning)")
    nodes.add_argument("--startup-timeout", type=float, default=60.0,
                       help="s to wait for /healthz and a formed cluster (default 60)")
    nodes.add_argument("--stop-timeout", type=float, default=5.0,
                       help="s between SIGTERM and SIGKILL when stopping nodes (default 5)")
    nodes.add_argument("--keep-dir", action="store_true",
                       help="keep the temp dir (node logs and data) and print its path")

    out = p.add_argument_group("measurement")
    out.add_argument("--timeout", type=float, default=120.0,
                     help="s to wait for all deliveries after the last enqueue (default 120)")
    out.add_argument("--grace", type=float, default=None,
                     help="s to keep counting after the last delivery, to catch duplicates "
                          "(default: replica offset + 1 with several nodes, else 0.5)")
    out.add_argument("--settle", type=float, default=2.0,
                     help="--delayed: s to wait after the last enqueue before measuring "
                          "(default 2)")
    out.add_argument("--restart", action="store_true",
                     help="--delayed: then stop the node(s), start them again on the same "
                          "journal and report the time until they serve and their RSS")
    out.add_argument("--rss", action="store_true",
                     help="also report the nodes' peak RSS (VmHWM) and journal file sizes")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    validate(p, args)
    return args


def validate(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject contradictory or unsafe options; fill mode-dependent defaults."""
    if args.paced is not None and args.delayed is not None:
        p.error("--paced and --delayed are exclusive")
    if args.paced is not None and args.paced <= 0:
        p.error("--paced RATE must be > 0")
    if args.delayed is not None:
        if args.delayed < 1:
            p.error("--delayed N must be >= 1")
        args.tasks = args.delayed
    elif args.tasks is None:
        args.tasks = DEFAULT_PACED_TASKS if args.paced is not None else DEFAULT_TASKS
    if args.tasks < 1 or args.connections < 1 or args.nodes < 1:
        p.error("--tasks, --connections and --nodes must be >= 1")
    if args.server:
        if args.nodes != 1 or args.memory or args.replication is not None:
            p.error("--server excludes --nodes, --memory and --replication")
        for url in args.server:
            parts = urlsplit(url)
            if parts.scheme != "http" or parts.hostname != LOCALHOST or not parts.port:
                p.error(f"--server must be http://127.0.0.1:PORT, got {url!r}")
        args.nodes = len(args.server)
    if args.restart and (args.delayed is None or args.server or args.memory):
        p.error("--restart needs --delayed and started nodes with a disk journal")
    for kv in args.node_env:
        if "=" not in kv:
            p.error(f"--node-env wants KEY=VALUE, got {kv!r}")
    if args.grace is None:
        offset = float(dict(kv.split("=", 1) for kv in args.node_env).get(
            "MIYAMOTO_REPLICA_OFFSET", DEFAULT_REPLICA_OFFSET))
        args.grace = offset + 1.0 if args.nodes > 1 else 0.5


# --------------------------------------------------------------------------- HTTP helpers


def http_get(url: str, timeout: float = 2.0) -> bytes | None:
    """GET from 127.0.0.1 on a fresh connection (None on any failure or non-200)."""
    parts = urlsplit(url)
    assert parts.hostname == LOCALHOST, url
    client = HTTPClient(LOCALHOST, parts.port, connection_timeout=timeout,
                        network_timeout=timeout)
    try:
        resp = client.get(parts.path or "/")
        body = resp.read()
        return body if resp.status_code == 200 else None
    except Exception:  # noqa: BLE001 - a probe: any failure means "not (yet) there"
        return None
    finally:
        client.close()


def http_get_json(url: str, timeout: float = 2.0) -> Any:
    """GET a JSON document from 127.0.0.1 (None on any failure, non-200 or bad JSON)."""
    body = http_get(url, timeout)
    if body is None:
        return None
    try:
        return ujson.loads(body) if body else {}
    except ValueError:
        return None


def server_metrics(nodes: Sequence[Node]) -> dict[str, float]:
    """Unlabelled `miyamoto_*` samples of every node's /metrics, summed over the nodes
    (`cluster_*` gauges, one value per cluster, as their maximum)."""
    totals: dict[str, float] = {}
    for node in nodes:
        text = (http_get(node.url + "/metrics") or b"").decode("utf-8", "replace")
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if not name.startswith("miyamoto_") or "{" in name:
                continue
            try:
                key, number = name.removeprefix("miyamoto_"), float(value)
            except ValueError:
                continue
            if key.startswith("cluster_") and not key.endswith("_total"):
                totals[key] = max(totals.get(key, number), number)
            else:
                totals[key] = totals.get(key, 0.0) + number
    return {k: int(v) if v.is_integer() else v for k, v in sorted(totals.items())}


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters (`*_total`) as the run's increase; gauges as their value at the end."""
    return {k: v - before.get(k, 0) if k.endswith("_total") else v for k, v in after.items()}


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (bind to 0, all held until all chosen)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOCALHOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------- nodes


@dataclass
class Node:
    """One Miyamoto node, started by the bench or given with --server."""

    id: str
    url: str
    cluster: str = ""
    data_dir: str | None = None
    log_path: str | None = None
    proc: subprocess.Popen | None = None
    pid: int | None = None

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace")


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the node when the bench dies (Linux PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def node_command(args: argparse.Namespace, node: Node, seeds: list[str]) -> list[str]:
    cmd = shlex.split(args.node_cmd) + [
        "serve",
        "--http", node.url.removeprefix("http://"),
        "--cluster", node.cluster,
        "--data-dir", node.data_dir or ":memory:",
        "--node", node.id,
        "--log-level", args.log_level,
    ]
    if seeds:
        cmd += ["--seeds", ",".join(seeds)]
    if args.replication is not None:
        cmd += ["--replication", str(args.replication)]
    return cmd


def spawn_node(args: argparse.Namespace, node: Node, seeds: list[str]) -> None:
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in args.node_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = node_command(args, node, seeds)
    assert node.log_path is not None
    with open(node.log_path, "ab") as logf:
        logf.write(("$ " + shlex.join(cmd) + "\n").encode())
        logf.flush()
        node.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=logf,
            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    node.pid = node.proc.pid


def plan_nodes(args: argparse.Namespace, workdir: str) -> list[Node]:
    """Ports, ids, data dirs and log files of the nodes to start."""
    ports = free_ports(2 * args.nodes)
    nodes = []
    for i in range(args.nodes):
        nid = f"n{i + 1}"
        data = None if args.memory else os.path.join(workdir, nid)
        if data:
            os.makedirs(data, exist_ok=True)
        nodes.append(Node(
            id=nid, url=f"http://{LOCALHOST}:{ports[2 * i]}",
            cluster=f"tcp://{LOCALHOST}:{ports[2 * i + 1]}", data_dir=data,
            log_path=os.path.join(workdir, f"{nid}.log")))
    return nodes


class BenchError(RuntimeError):
    """A node failed to start, or died during the run."""


def check_alive(nodes: Sequence[Node]) -> None:
    for n in nodes:
        if n.proc is not None and n.proc.poll() is not None:
            raise BenchError(f"node {n.id} exited with {n.proc.returncode}:\n{n.log_tail()}")


def wait_healthy(nodes: Sequence[Node], deadline: float) -> None:
    pending = list(nodes)
    while pending:
        check_alive(pending)
        pending = [n for n in pending if http_get_json(n.url + "/healthz", 1.0) is None]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise BenchError("no /healthz 200 from " + ", ".join(n.id for n in pending)
                               + "".join(f"\n--- {n.id}:\n{n.log_tail()}" for n in pending))
        gevent.sleep(0.1)


def cluster_view(node: Node) -> dict[str, Any] | None:
    view = http_get_json(node.url + "/cluster", 2.0)
    return view if isinstance(view, dict) else None


def wait_formed(nodes: Sequence[Node], deadline: float) -> dict[str, Any]:
    """Until every node's /cluster shows all members and the same non-null leader."""
    want = len(nodes)
    views: list[dict[str, Any] | None] = []
    while True:
        check_alive(nodes)
        views = [cluster_view(n) for n in nodes]
        leaders = {v.get("leader") for v in views if v}
        if (all(v and len(v.get("members") or []) == want for v in views)
                and len(leaders) == 1 and None not in leaders):
            assert views[0] is not None
            return views[0]
        if time.monotonic() > deadline:
            seen = "; ".join(
                f"{n.id}: no answer" if not v else
                f"{n.id}: leader {v.get('leader')}, term {v.get('term')}, "
                f"members {[m.get('id') for m in v.get('members') or []]}"
                for n, v in zip(nodes, views, strict=True))
            raise BenchError(f"cluster of {want} not formed in time ({seen})"
                               + "".join(f"\n--- {n.id}:\n{n.log_tail()}" for n in nodes))
        gevent.sleep(0.2)


def start_nodes(args: argparse.Namespace, nodes: list[Node]) -> dict[str, Any]:
    """Start node 1, then the others seeded with node 1; wait for a formed cluster."""
    deadline = time.monotonic() + args.startup_timeout
    spawn_node(args, nodes[0], [])
    wait_healthy(nodes[:1], deadline)
    for n in nodes[1:]:
        spawn_node(args, n, [nodes[0].cluster])
    wait_healthy(nodes, deadline)
    view = wait_formed(nodes, deadline)
    return view


def stop_nodes(nodes: Sequence[Node], timeout: float) -> None:
    """SIGTERM every started node, SIGKILL what is left after `timeout` s."""
    running = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
    for proc in running:
        try:
            proc.terminate()
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# --------------------------------------------------------------------------- /proc


def proc_status_kb(pid: int | None, key: str) -> int | None:
    """A `VmXXX:` value (kB) from /proc/<pid>/status."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def dir_bytes(path: str | None) -> int | None:
    """Total size of the files under `path` (None for no data dir)."""
    if not path:
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def loadavg() -> float | None:
    """The box's 1-minute load average: other work on it skews every number."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


def proc_cpu_s(pid: int | None) -> float | None:
    """utime + stime of a process, seconds (/proc/<pid>/stat)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(nodes: Sequence[Node]) -> dict[str, float | None]:
    """CPU seconds used so far by the bench itself and by each node."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    snap: dict[str, float | None] = {"bench": usage.ru_utime + usage.ru_stime}
    snap.update({n.id: proc_cpu_s(n.pid) for n in nodes})
    return snap


def cpu_delta(before: dict[str, float | None],
              after: dict[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, end in after.items():
        start = before.get(key)
        out[key] = None if start is None or end is None else round(end - start, 2)
    return out


# --------------------------------------------------------------------------- load


@dataclass
class Load:
    """What the enqueue side sent and got back, indexed by seq."""

    n: int
    send_at: list[float] = field(init=False)
    ids: list[str | None] = field(init=False)
    rtt: list[float] = field(default_factory=list)
    errors: int = 0
    not_sent: int = 0
    error_kinds: Counter = field(default_factory=Counter)
    first_send: float = 0.0
    last_done: float = 0.0

    def __post_init__(self) -> None:
        self.send_at = [0.0] * self.n
        self.ids = [None] * self.n

    @property
    def acked(self) -> int:
        return sum(1 for i in self.ids if i is not None)

    def acked_seqs(self) -> Iterator[int]:
        return (s for s, i in enumerate(self.ids) if i is not None)


class Enqueuer:
    """Sends tasks numbered 0..n-1 round-robin over the nodes, keep-alive, pooled."""

    def __init__(self, args: argparse.Namespace, nodes: Sequence[Node], sink_url: str,
                 run: str) -> None:
        self.load = Load(args.tasks)
        self.path = "/queue" + (f"/{quote(args.queue, safe='')}" if args.queue else "")
        self.countdown = args.countdown if args.delayed is not None else None
        self.json = args.json
        self.sink_url = sink_url
        self.run = run
        self.clients = [
            HTTPClient(LOCALHOST, urlsplit(n.url).port, concurrency=args.connections,
                       connection_timeout=args.request_timeout,
                       network_timeout=args.request_timeout)
            for n in nodes]
        self.headers = {"Content-Type": "application/json" if self.json
                        else "application/x-www-form-urlencoded"}
        self._form_prefix = self._make_form_prefix()

    def _make_form_prefix(self) -> bytes:
        parts = [f"task.url={quote(self.sink_url, safe='')}"]
        if self.countdown is not None:
            parts.append(f"task.countdown={self.countdown:g}")
        parts.append(f"run={self.run}")
        return ("&".join(parts) + "&seq=").encode()

    def body(self, seq: int) -> bytes:
        if not self.json:
            return self._form_prefix + str(seq).encode()
        doc: dict[str, Any] = {"url": self.sink_url,
                               "params": {"run": self.run, "seq": str(seq)}}
        if self.countdown is not None:
            doc["countdown"] = self.countdown
        return ujson.dumps(doc).encode()

    def _error(self, kind: str) -> None:
        self.load.errors += 1
        self.load.error_kinds[kind[:160]] += 1

    def send(self, seq: int) -> None:
        """One enqueue; records its start time, its task id on 200, or an error."""
        client = self.clients[seq % len(self.clients)]
        body = self.body(seq)
        start = clock()
        self.load.send_at[seq] = start
        if not self.load.first_send:
            self.load.first_send = start
        try:
            resp = client.post(self.path, body=body, headers=self.headers)
            data = resp.read()
            status = resp.status_code
        except Exception as exc:  # noqa: BLE001 - every failure of one request is one error
            self._error(f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.load.last_done = max(self.load.last_done, clock())
        self.load.rtt.append(clock() - start)
        if status != 200:
            self._error(f"HTTP {status}: {data[:120]!r}")
            return
        try:
            task_id = ujson.loads(data)["id"]
        except (ValueError, KeyError, TypeError):
            self._error(f"HTTP 200 without an id: {data[:120]!r}")
            return
        self.load.ids[seq] = str(task_id)

    def run_fast(self, connections: int, time_limit: float) -> None:
        """`connections` greenlets pull the next seq until all are sent or time is up."""
        counter = itertools.count()
        deadline = clock() + time_limit

        def worker() -> None:
            for seq in counter:
                if seq >= self.load.n:
                    return
                if clock() > deadline:
                    self.load.not_sent += 1
                    continue
                self.send(seq)

        gevent.joinall([gevent.spawn(worker) for _ in range(connections)])

    def run_paced(self, rate: float, connections: int, time_limit: float) -> None:
        """Start one enqueue every 1/rate s (at most `connections` in flight)."""
        pool = gevent.pool.Pool(connections)
        t0 = clock()
        deadline = t0 + time_limit
        for seq in range(self.load.n):
            if clock() > deadline:
                self.load.not_sent = self.load.n - seq
                break
            delay = t0 + seq / rate - clock()
            if delay > 0:
                gevent.sleep(delay)
            pool.spawn(self.send, seq)
        pool.join()

    def close(self) -> None:
        for c in self.clients:
            c.close()


# --------------------------------------------------------------------------- measurement


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def ms_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    values = sorted(seconds)
    return {k: None if v is None else round(v * 1000, 2)
            for k, v in (("p50", percentile(values, 0.50)), ("p99", percentile(values, 0.99)),
                         ("max", values[-1] if values else None))}


def any_alive(nodes: Sequence[Node]) -> bool:
    """False once every node the bench started has exited (True for --server nodes)."""
    started = [n.proc for n in nodes if n.proc is not None]
    return not started or any(p.poll() is None for p in started)


def node_exits(nodes: Sequence[Node]) -> dict[str, int]:
    """Exit codes of started nodes that died before the bench stopped them."""
    return {n.id: n.proc.returncode for n in nodes
            if n.proc is not None and n.proc.poll() is not None}


def wait_deliveries(sink: Sink, load: Load, nodes: Sequence[Node], timeout: float,
                    quiet: bool) -> None:
    """Until every acknowledged seq reached the sink, `timeout` s pass or all nodes died."""
    pending = {str(s) for s in load.acked_seqs()}
    deadline = clock() + timeout
    next_report = clock() + 2.0
    first_at = sink.stats.first_at
    while pending and clock() < deadline:
        pending = {s for s in pending if s not in first_at}
        if pending and not any_alive(nodes):
            log(f"every node exited; {len(pending)} tasks undelivered")
            return
        if not quiet and clock() >= next_report:
            log(f"delivered {sink.stats.delivered}, waiting for {len(pending)}")
            next_report = clock() + 2.0
        gevent.sleep(POLL)


def delivery_report(sink: Sink, load: Load) -> dict[str, Any]:
    """lost / duplicated / latency / rates from what was sent and what arrived."""
    stats = sink.stats
    latencies, lost, mismatched = [], 0, 0
    for seq in load.acked_seqs():
        key = str(seq)
        at = stats.first_at.get(key)
        if at is None:
            lost += 1
            continue
        latencies.append(at - load.send_at[seq])
        delivered_id = stats.id_of_seq.get(key)
        if delivered_id is not None and delivered_id != load.ids[seq]:
            mismatched += 1
    span = stats.last_at - load.first_send if stats.delivered else 0.0
    return {
        "delivered": stats.delivered,
        "delivered_per_s": round(stats.delivered / span, 1) if span > 0 else None,
        "latency_ms": ms_summary(latencies),
        "lost": lost,
        "duplicated": len(stats.duplicated_seqs()),
        "duplicated_ids": len(stats.duplicated_ids()),
        "id_mismatch": mismatched,
        "foreign_deliveries": stats.foreign,
    }


def replicas_per_task(metrics: dict[str, float], acked: int) -> float | None:
    """Copies stored per acknowledged task, from the nodes' tasks_stored_total."""
    stored = metrics.get("tasks_stored_total")
    return None if stored is None or not acked else round(stored / acked, 2)


def enqueue_report(load: Load) -> dict[str, Any]:
    span = load.last_done - load.first_send
    acked = load.acked
    out: dict[str, Any] = {
        "enqueued": acked,
        "enqueue_per_s": round(acked / span, 1) if span > 0 else None,
        "enqueue_errors": load.errors,
        "enqueue_ms": ms_summary(load.rtt),
    }
    if load.not_sent:
        out["not_sent"] = load.not_sent
    if load.error_kinds:
        out["enqueue_error_samples"] = dict(load.error_kinds.most_common(ERROR_SAMPLES))
    return out


def resources(nodes: Sequence[Node]) -> dict[str, Any]:
    return {
        "rss_peak_mb": {n.id: mb(proc_status_kb(n.pid, "VmHWM")) for n in nodes},
        "rss_mb": {n.id: mb(proc_status_kb(n.pid, "VmRSS")) for n in nodes},
        "journal_bytes": {n.id: dir_bytes(n.data_dir) for n in nodes},
    }


# --------------------------------------------------------------------------- runs


def base_report(args: argparse.Namespace, view: dict[str, Any] | None,
                mode: str) -> dict[str, Any]:
    replication = args.replication
    if replication is None and view:
        replication = view.get("replication") or view.get("replication_factor")
    if args.server:
        journal = None
    else:
        journal = "memory" if args.memory else "disk"
    return {"mode": mode, "tasks": args.tasks, "nodes": args.nodes, "replication": replication,
            "journal": journal, "connections": args.connections,
            "loadavg_1m": None if (la := loadavg()) is None else round(la, 2)}


def run_delivery(args: argparse.Namespace, nodes: Sequence[Node], sink: Sink, run: str,
                 report: dict[str, Any]) -> None:
    """Throughput or paced run: enqueue, wait for deliveries, grace, measure."""
    enq = Enqueuer(args, nodes, sink.url(), run)
    cpu0, metrics0 = cpu_snapshot(nodes), server_metrics(nodes)
    t0 = clock()
    try:
        if args.paced is not None:
            log(f"enqueueing {args.tasks} tasks at {args.paced:g}/s")
            enq.run_paced(args.paced, args.connections, args.enqueue_timeout)
        else:
            log(f"enqueueing {args.tasks} tasks from {args.connections} connections")
            enq.run_fast(args.connections, args.enqueue_timeout)
    finally:
        enq.close()
    load = enq.load
    log(f"enqueued {load.acked} ({load.errors} errors) in {clock() - t0:.2f}s; "
        f"delivered so far {sink.stats.delivered}")
    wait_deliveries(sink, load, nodes, args.timeout, args.quiet)
    done = clock()
    cpu = cpu_delta(cpu0, cpu_snapshot(nodes))
    if args.grace > 0:
        log(f"grace {args.grace:g}s for duplicates")
        gevent.sleep(args.grace)
    report.update(enqueue_report(load))
    report.update(delivery_report(sink, load))
    report["elapsed_s"] = round(done - load.first_send, 3)
    report["cpu_s"] = cpu
    if args.paced is not None:
        report["paced_rate"] = args.paced
    if args.rss:
        report.update(resources(nodes))
    report["server_metrics"] = metrics_delta(metrics0, server_metrics(nodes))
    report["stored_per_task"] = replicas_per_task(report["server_metrics"], load.acked)


def run_delayed(args: argparse.Namespace, nodes: Sequence[Node], sink: Sink, run: str,
                report: dict[str, Any]) -> None:
    """Enqueue far-future tasks; RSS before/after and the journal's size on disk."""
    before = {n.id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    metrics0 = server_metrics(nodes)
    enq = Enqueuer(args, nodes, sink.url(), run)
    log(f"enqueueing {args.tasks} tasks due in {args.countdown:g}s")
    try:
        enq.run_fast(args.connections, args.enqueue_timeout)
    finally:
        enq.close()
    log(f"enqueued {enq.load.acked} ({enq.load.errors} errors); settling {args.settle:g}s")
    gevent.sleep(args.settle)
    after = {n.id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    journal = {n.id: dir_bytes(n.data_dir) for n in nodes}
    report.update(enqueue_report(enq.load))
    report["countdown_s"] = args.countdown
    report["rss_before_mb"] = {k: mb(v) for k, v in before.items()}
    report["rss_after_mb"] = {k: mb(v) for k, v in after.items()}
    report["rss_peak_mb"] = {n.id: mb(proc_status_kb(n.pid, "VmHWM")) for n in nodes}
    growth = [a - b for b, a in ((before[k], after[k]) for k in before)
              if a is not None and b is not None]
    acked = enq.load.acked
    report["rss_growth_bytes_per_task"] = (
        round(sum(growth) * 1024 / acked) if growth and acked else None)
    report["journal_bytes"] = journal
    sizes = [v for v in journal.values() if v is not None]
    report["journal_bytes_per_task"] = round(sum(sizes) / acked) if sizes and acked else None
    report["delivered_early"] = sink.stats.requests  # due in an hour: must be 0
    report["elapsed_s"] = round(enq.load.last_done - enq.load.first_send, 3)
    report["server_metrics"] = metrics_delta(metrics0, server_metrics(nodes))
    report["stored_per_task"] = replicas_per_task(report["server_metrics"], acked)


def run_restart(args: argparse.Namespace, nodes: list[Node], report: dict[str, Any]) -> None:
    """--restart: start the stopped nodes again on their data; time until they serve."""
    log("restarting the node(s) on their journal")
    t0 = time.monotonic()
    start_nodes(args, nodes)
    report["restart_ready_s"] = round(time.monotonic() - t0, 3)
    gevent.sleep(args.settle)
    report["rss_restarted_mb"] = {n.id: mb(proc_status_kb(n.pid, "VmRSS")) for n in nodes}
    report["restarted_metrics"] = server_metrics(nodes)


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit in the main greenlet, so cleanup runs."""
    main = gevent.getcurrent()
    handler = gevent.signal_handler(signal.SIGTERM,
                                    lambda: main.throw(SystemExit(128 + signal.SIGTERM)))
    try:
        yield
    finally:
        handler.cancel()


def target_nodes(args: argparse.Namespace, workdir: str) -> list[Node]:
    if args.server:
        pids = args.pid + [None] * (len(args.server) - len(args.pid))
        return [Node(id=f"s{i + 1}", url=url.rstrip("/"), pid=pid)
                for i, (url, pid) in enumerate(zip(args.server, pids, strict=True))]
    return plan_nodes(args, workdir)


def mode_of(args: argparse.Namespace) -> str:
    if args.delayed is not None:
        return "delayed"
    return "paced" if args.paced is not None else "throughput"


def measure(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """Start (or find) the nodes and the sink, run the chosen mode, stop everything."""
    run = uuid.uuid4().hex[:12]
    sink = Sink(run=run, clock=clock).start()
    nodes: list[Node] = []
    report: dict[str, Any] = {}
    try:
        nodes = target_nodes(args, workdir)
        log(f"sink on {sink.url()}; workdir {workdir}")
        if args.server:
            wait_healthy(nodes, time.monotonic() + args.startup_timeout)
            view = cluster_view(nodes[0])
        else:
            log(f"starting {len(nodes)} node(s): " + ", ".join(n.url for n in nodes))
            view = start_nodes(args, nodes)
            log(f"cluster ready: leader {view.get('leader')}, term {view.get('term')}; pids "
                + ", ".join(f"{n.id}={n.pid}" for n in nodes))
        report.update(base_report(args, view, mode_of(args)))
        if args.delayed is not None:
            run_delayed(args, nodes, sink, run, report)
        else:
            run_delivery(args, nodes, sink, run, report)
        exits = node_exits(nodes)
        if exits:
            log(f"node(s) died during the run: {exits}")
            report["node_exits"] = exits
        if args.restart:
            stop_nodes(nodes, args.stop_timeout)
            report["journal_bytes_stopped"] = {n.id: dir_bytes(n.data_dir) for n in nodes}
            run_restart(args, nodes, report)
    finally:
        t0 = time.monotonic()
        stop_nodes(nodes, args.stop_timeout)
        if not args.server:
            report["stop_s"] = round(time.monotonic() - t0, 3)
            report["stop_codes"] = {n.id: n.proc.returncode for n in nodes if n.proc}
        sink.stop(timeout=0.5)
    if not args.server and not args.memory and (args.rss or args.delayed is not None):
        report["journal_bytes_stopped"] = {n.id: dir_bytes(n.data_dir) for n in nodes}
    return report


def bench(args: argparse.Namespace) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="miyamoto-bench-")
    try:
        return measure(args, workdir)
    finally:
        if args.keep_dir:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quiet:
        global log
        log = lambda msg: None  # noqa: E731
    try:
        with terminate_on_sigterm():
            report = bench(args)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    print(ujson.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
