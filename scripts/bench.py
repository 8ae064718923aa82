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
  --qstash         any of these through QStash's face: POST /v2/publish/<sink URL> with
                   the same form body (compare per_task.cpu_ms with a native run)

Progress bars (enqueued, delivered) are drawn on stderr when it is a terminal, or with
--progress; never with --quiet. --plot FILE writes the enqueue-to-delivery latency
distribution (histogram and CDF, titled with the run's parameters) as a PNG; it needs
matplotlib: pip install -e '.[plot]'.

Examples:
  .venv/bin/python scripts/bench.py                             # 1 node, disk, 20k tasks
  .venv/bin/python scripts/bench.py --memory --tasks 5000
  .venv/bin/python scripts/bench.py --nodes 3 --replication 2 --rss
  .venv/bin/python scripts/bench.py --paced 100                 # 1000 tasks at 100/s
  .venv/bin/python scripts/bench.py --memory --plot latency.png
  .venv/bin/python scripts/bench.py --delayed 100000
  .venv/bin/python scripts/bench.py --nodes 3 --replication 2 --pin 0,1,2,3  # a core each
  .venv/bin/python scripts/bench.py --nodes 3 --standalone      # 3 single nodes, no cluster
  .venv/bin/python scripts/bench.py --nodes 3 --replication 2 --entry 1  # enqueue through n1
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
  switches         each node's hub thread during the run: "woke" (voluntary context
                   switches: sleeps it was woken from) and "preempted" (involuntary: another
                   process took its core); with more processes than cores, and at rates
                   where each task wakes a node, these (and the cold caches each wake
                   brings) are what co-location adds to a cluster's CPU per task
  server_metrics   the nodes' /metrics summed (counters as the run's increase)
  stored_per_task  tasks_stored_total / enqueued: the replication actually done
  per_task         per delivered task: the nodes' CPU ms, journal commits, cluster messages
                   sent (each inside a BATCH counted) and by verb, the nodes' wakes and
                   preemptions (switches, summed)
  stores_sent      a cluster's STOREs sent by each node during the run (the copies its
                   enqueues placed elsewhere: with --entry K only the first K send any)
  stop_s, stop_codes   SIGTERM-to-exit time and exit codes (-9 = had to be killed)
  --rss adds rss_peak_mb (VmHWM), rss_mb, journal_bytes (data dir while running) and
  journal_bytes_stopped; --delayed reports rss_before/after_mb, rss_growth_bytes_per_task,
  journal_bytes(_per_task), delivered_early (must be 0) and, with --restart,
  restart_ready_s and rss_restarted_mb.

Nodes (harness.NodeProcess), the sink (harness.fastsink), the load generator
(harness.fastload) and the /proc readers are the shared harness in scripts/harness,
which the tests use too. Only 127.0.0.1 is ever contacted. Progress goes to stderr, the result line to stdout.
Every phase is bounded in time; the nodes the bench started are stopped (SIGTERM,
then SIGKILL after --stop-timeout) on success, error, Ctrl-C or SIGTERM, and die
with the bench (PR_SET_PDEATHSIG) if it is killed outright.
"""

from __future__ import annotations

if __name__ == "__main__":  # the entry point patches once, before anything imports socket
    from gevent import monkey

    monkey.patch_all()

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import gevent
import ujson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# scripts/ is not a package: the shared harness (the tests use it too) is found beside us
from harness import (LOCALHOST, HarnessError, NodeProcess, http_get_json,  # noqa: E402
                     is_counter, metrics, plan_cluster, probe_view, server_metrics, stop_all, wait_converged,
                     wait_until)
from harness.fastload import (Enqueuer, delivery_report, enqueue_report,  # noqa: E402
                              node_exits, per_task_report, replicas_per_task, resources,
                              wait_deliveries)
from harness.fastsink import Sink  # noqa: E402
from harness import plot, progress  # noqa: E402
from harness.prefill import measure_prefill  # noqa: E402
from harness.procfs import (cpu_delta, cpu_snapshot, dir_bytes, loadavg, mb,  # noqa: E402
                            switch_delta, switch_snapshot,
                            proc_status_kb)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TASKS = 20000
DEFAULT_PACED_TASKS = 1000
DEFAULT_REPLICA_OFFSET = 5.0  # the server's default; the bench never changes it
clock = time.perf_counter
_STORES_SENT = 'cluster_messages_total{direction="sent",verb="STORE"}'


def log(msg: str) -> None:
    """Progress line on stderr (through tqdm, so that it does not break a bar)."""
    progress.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}")


# --------------------------------------------------------------------------- options


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _load_options(p.add_argument_group("load"))
    _node_options(p.add_argument_group("nodes"))
    _measurement_options(p.add_argument_group("measurement"))
    args = p.parse_args(argv)
    validate(p, args)
    return args


def _load_options(load: argparse._ArgumentGroup) -> None:
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
    load.add_argument("--prefill", type=int, default=None, metavar="N",
                      help="first write N tasks due in --countdown s (spread over "
                           "--prefill-spread s) straight into each node's journal and "
                           "report RSS and restart time with them (harness/prefill.py)")
    load.add_argument("--prefill-spread", type=float, default=3600.0, help=argparse.SUPPRESS)
    load.add_argument("--countdown", type=float, default=3600.0,
                      help="task.countdown of --delayed tasks, seconds (default 3600)")
    load.add_argument("--queue", default=None,
                      help="queue name: POST /queue/NAME instead of POST /queue")
    load.add_argument("--qstash", action="store_true",
                      help="publish through QStash's face (POST /v2/publish/<sink URL>, "
                           "or /v2/enqueue/<--queue>/...) with the same form body")
    load.add_argument("--json", action="store_true",
                      help="enqueue with JSON bodies instead of form bodies")
    load.add_argument("--request-timeout", type=float, default=30.0,
                      help="per enqueue request network timeout, s (default 30)")
    load.add_argument("--enqueue-timeout", type=float, default=600.0,
                      help="stop issuing enqueues after this many s; the rest count as "
                           "not_sent (default 600)")


def _node_options(nodes: argparse._ArgumentGroup) -> None:
    nodes.add_argument("--server", action="append", default=[], metavar="URL",
                       help="target an already running node http://127.0.0.1:PORT instead of "
                            "starting nodes (repeat for several; enqueues go round-robin)")
    nodes.add_argument("--pid", action="append", type=int, default=[],
                       help="with --server and --rss/--delayed: pid(s) of the node process(es)")
    nodes.add_argument("--nodes", type=int, default=1,
                       help="number of nodes to start; >1 forms a cluster seeded by node 1 "
                            "(default 1)")
    nodes.add_argument("--standalone", action="store_true",
                       help="with --nodes N: N single nodes, not a cluster (enqueues still go "
                            "round-robin): what N processes cost on this machine without any "
                            "cluster traffic, the floor a cluster's CPU per task is measured on")
    nodes.add_argument("--entry", type=int, default=None, metavar="K",
                       help="enqueue through the first K nodes only (default: all, "
                            "round-robin): a cluster whose clients know one node, and the "
                            "same protocol's cost with its entry work on fewer processes")
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
    nodes.add_argument("--pin", default=None, metavar="CPUS",
                       help="pin processes to CPUs: a comma list, the first for this process "
                            "(load generator and sink), then one per started node, round-robin "
                            "(e.g. 0,1,2,3: each on its own core; taskset -c for the nodes)")
    nodes.add_argument("--keep-dir", action="store_true",
                       help="keep the temp dir (node logs and data) and print its path")


def _measurement_options(out: argparse._ArgumentGroup) -> None:
    out.add_argument("--timeout", type=float, default=120.0,
                     help="s to wait for all deliveries after the last enqueue (default 120)")
    out.add_argument("--grace", type=float, default=None,
                     help="s to keep counting after the last delivery, to catch duplicates "
                          "(default: replica offset + 1 with a cluster, else 0.5)")
    out.add_argument("--settle", type=float, default=2.0,
                     help="--delayed: s to wait after the last enqueue before measuring "
                          "(default 2)")
    out.add_argument("--restart", action="store_true",
                     help="--delayed: then stop the node(s), start them again on the same "
                          "journal and report the time until they serve and their RSS")
    out.add_argument("--rss", action="store_true",
                     help="also report the nodes' peak RSS (VmHWM) and journal file sizes")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    out.add_argument("--progress", action="store_true",
                     help="draw progress bars on stderr even when it is not a terminal "
                          "(by default only on a terminal; never with --quiet)")
    out.add_argument("--plot", metavar="FILE",
                     help="write the enqueue-to-delivery latency distribution (histogram "
                          "and CDF) as a PNG to FILE; needs matplotlib (the 'plot' extra)")


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
    if args.standalone and (args.server or args.replication is not None or args.nodes < 2):
        p.error("--standalone starts --nodes N (2 or more) single nodes: not with --server "
                "or --replication")
    if args.entry is not None and not 1 <= args.entry <= args.nodes:
        p.error(f"--entry K must be between 1 and the {args.nodes} node(s)")
    if args.entry is not None and args.standalone:
        p.error("--entry with --standalone would leave single nodes without load")
    if args.restart and (args.delayed is None or args.server or args.memory):
        p.error("--restart needs --delayed and started nodes with a disk journal")
    args.pin_cpus = _pin_cpus(p, args)
    for kv in args.node_env:
        if "=" not in kv:
            p.error(f"--node-env wants KEY=VALUE, got {kv!r}")
    if args.plot is not None:
        if args.delayed is not None:
            p.error("--plot needs deliveries: not with --delayed")
        try:
            plot.require()
        except plot.PlotUnavailable as e:
            p.error(str(e))
        where = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(where) or not os.access(where, os.W_OK):
            p.error(f"--plot {args.plot}: {where} is not a writable directory")
    args.bars = progress.enabled(args.quiet, args.progress)
    if args.grace is None:
        offset = float(dict(kv.split("=", 1) for kv in args.node_env).get(
            "MIYAMOTO_REPLICA_OFFSET", DEFAULT_REPLICA_OFFSET))
        args.grace = offset + 1.0 if args.nodes > 1 and not args.standalone else 0.5



def stores_sent(nodes: Sequence[NodeProcess | ExternalNode]) -> dict[str, int]:
    """Each node's STOREs sent so far (0 for a node that did not answer)."""
    return {n.node_id: int((metrics(n) or {}).get(_STORES_SENT, 0)) for n in nodes}


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters (`*_total`, histograms' `_count`/`_sum`) as the run's increase; gauges as
    their value at the end."""
    return {k: v - before.get(k, 0) if is_counter(k) else v for k, v in after.items()}


# --------------------------------------------------------------------------- nodes


class BenchError(RuntimeError):
    """A node failed to start, or died during the run."""


@dataclass
class ExternalNode:
    """A node given with --server: the bench neither starts nor stops it."""

    node_id: str
    url: str
    pid: int | None = None
    data_dir: str | None = None
    proc: None = None


def _pin_cpus(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[int] | None:
    """--pin's CPUs, each one this machine lets us use; None without --pin."""
    if args.pin is None:
        return None
    if args.server:
        p.error("--pin pins the nodes the bench starts: not with --server")
    try:
        cpus = [int(c) for c in args.pin.split(",")]
    except ValueError:
        p.error(f"--pin wants a comma list of CPU numbers, got {args.pin!r}")
    usable = os.sched_getaffinity(0)
    if not cpus or any(c not in usable for c in cpus):
        p.error(f"--pin: CPUs {args.pin} are not all usable here (usable: "
                f"{','.join(map(str, sorted(usable)))})")
    return cpus


def node_cpu(args: argparse.Namespace, i: int) -> int | None:
    """The CPU --pin gives node i (0-based), or None."""
    cpus = args.pin_cpus
    if not cpus:
        return None
    rest = cpus[1:] or cpus
    return rest[i % len(rest)]


def plan_nodes(args: argparse.Namespace, workdir: str) -> list[NodeProcess]:
    """The nodes to start: n1 unseeded, the others seeded with n1 (harness.plan_cluster),
    or with --standalone none seeded (each its own one-node cluster); with --pin each
    node's command starts under taskset on its CPU."""
    extra = ["--log-level", args.log_level]
    if args.replication is not None:
        extra += ["--replication", str(args.replication)]
    nodes = plan_cluster(workdir, [f"n{i + 1}" for i in range(args.nodes)], seed_all=False,
                         alone=args.standalone,
                         program=shlex.split(args.node_cmd), extra_args=extra,
                         raw_env=dict(kv.split("=", 1) for kv in args.node_env),
                         inherit_miyamoto_env=True, cwd=REPO_ROOT, own_session=True)
    for i, n in enumerate(nodes):
        cpu = node_cpu(args, i)
        if cpu is not None:
            n.program = ["taskset", "-c", str(cpu), *n.program]
        if args.memory:
            n.data_dir = ":memory:"
        else:
            os.makedirs(n.data_dir, exist_ok=True)
    return nodes


def wait_healthy(nodes: Sequence[ExternalNode], timeout: float) -> None:
    """Until every --server node answers GET /healthz."""
    for n in nodes:
        wait_until(lambda: http_get_json(n.url + "/healthz", 1.0) is not None, timeout,
                   interval=0.1, what=f"GET {n.url}/healthz")


def start_nodes(args: argparse.Namespace, nodes: list[NodeProcess]) -> dict[str, Any]:
    """Start node 1, then the others seeded with node 1; wait for a formed cluster (with
    --standalone: each node leads its own)."""
    deadline = time.monotonic() + args.startup_timeout
    if args.standalone:
        for n in nodes:
            n.start()
        views = [wait_converged([n], max(0.1, deadline - time.monotonic())) for n in nodes]
        return views[0]
    nodes[0].start().wait_ready(args.startup_timeout, ready=False)
    for n in nodes[1:]:
        n.start()
    for n in nodes[1:]:
        n.wait_ready(max(0.1, deadline - time.monotonic()), ready=False)
    return wait_converged(nodes, max(0.1, deadline - time.monotonic()))


def stop_nodes(nodes: Sequence[NodeProcess | ExternalNode], timeout: float) -> dict[str, Any]:
    """SIGTERM every started node, SIGKILL what is left after `timeout` s."""
    return stop_all([n for n in nodes if isinstance(n, NodeProcess)], timeout)


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
            **({"standalone": True} if args.standalone else {}),
            **({"entry": args.entry} if args.entry is not None else {}),
            "loadavg_1m": None if (la := loadavg()) is None else round(la, 2)}


def answered(load: Any) -> int:
    """Enqueues that are over: acknowledged, failed, or given up for time."""
    return load.acked + load.errors + load.not_sent


def run_delivery(args: argparse.Namespace, nodes: Sequence[NodeProcess | ExternalNode], sink: Sink, run: str,
                 report: dict[str, Any]) -> None:
    """Throughput or paced run: enqueue, wait for deliveries, grace, measure."""
    enq = Enqueuer(nodes[:args.entry], sink.url(), run, tasks=args.tasks,
                   connections=args.connections,
                   request_timeout=args.request_timeout, queue=args.queue, json=args.json,
                   qstash=args.qstash)
    cpu0, metrics0 = cpu_snapshot(nodes), server_metrics(nodes)
    switches0 = switch_snapshot(nodes)
    stores0 = stores_sent(nodes) if args.nodes > 1 else {}
    t0 = clock()
    load = enq.load
    if args.paced is not None:
        log(f"enqueueing {args.tasks} tasks at {args.paced:g}/s")
    else:
        log(f"enqueueing {args.tasks} tasks from {args.connections} connections")
    try:
        with progress.bar(args.bars, "enqueued", args.tasks, lambda: answered(load)):
            if args.paced is not None:
                enq.run_paced(args.paced, args.connections, args.enqueue_timeout)
            else:
                enq.run_fast(args.connections, args.enqueue_timeout)
    finally:
        enq.close()
    log(f"enqueued {load.acked} ({load.errors} errors) in {clock() - t0:.2f}s; "
        f"delivered so far {sink.stats.delivered}")
    with progress.bar(args.bars, "delivered", load.acked, lambda: sink.stats.delivered):
        wait_deliveries(sink, load, nodes, args.timeout, log)
    done = clock()
    cpu = cpu_delta(cpu0, cpu_snapshot(nodes))
    switches = switch_delta(switches0, switch_snapshot(nodes))
    if args.grace > 0:
        log(f"grace {args.grace:g}s for duplicates")
        gevent.sleep(args.grace)
    report.update(enqueue_report(load))
    report.update(delivery_report(sink, load))
    report["elapsed_s"] = round(done - load.first_send, 3)
    report["cpu_s"] = cpu
    report["switches"] = switches
    if args.paced is not None:
        report["paced_rate"] = args.paced
    if args.rss:
        report.update(resources(nodes))
    report["server_metrics"] = metrics_delta(metrics0, server_metrics(nodes))
    if stores0:
        report["stores_sent"] = {k: v - stores0.get(k, 0) for k, v in stores_sent(nodes).items()}
    report["stored_per_task"] = replicas_per_task(report["server_metrics"], load.acked)
    report["per_task"] = per_task_report(report["server_metrics"], cpu,
                                         report.get("delivered") or 0, switches)
    if args.plot is not None:
        try:
            plot.write_png(args.plot, plot.latency_samples(sink, load), report)
            log(f"wrote the latency plot to {args.plot}")
        except OSError as e:  # the result line is still printed; the exit code says it
            log(f"cannot write --plot {args.plot}: {e}")
            args.plot_failed = True


def run_delayed(args: argparse.Namespace, nodes: Sequence[NodeProcess | ExternalNode], sink: Sink, run: str,
                report: dict[str, Any]) -> None:
    """Enqueue far-future tasks; RSS before/after and the journal's size on disk."""
    before = {n.node_id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    metrics0 = server_metrics(nodes)
    enq = Enqueuer(nodes[:args.entry], sink.url(), run, tasks=args.tasks,
                   connections=args.connections, request_timeout=args.request_timeout,
                   queue=args.queue, countdown=args.countdown, json=args.json)
    log(f"enqueueing {args.tasks} tasks due in {args.countdown:g}s")
    try:
        with progress.bar(args.bars, "enqueued", args.tasks, lambda: answered(enq.load)):
            enq.run_fast(args.connections, args.enqueue_timeout)
    finally:
        enq.close()
    log(f"enqueued {enq.load.acked} ({enq.load.errors} errors); settling {args.settle:g}s")
    gevent.sleep(args.settle)
    after = {n.node_id: proc_status_kb(n.pid, "VmRSS") for n in nodes}
    journal = {n.node_id: dir_bytes(n.data_dir) for n in nodes}
    report.update(enqueue_report(enq.load))
    report["countdown_s"] = args.countdown
    report["rss_before_mb"] = {k: mb(v) for k, v in before.items()}
    report["rss_after_mb"] = {k: mb(v) for k, v in after.items()}
    report["rss_peak_mb"] = {n.node_id: mb(proc_status_kb(n.pid, "VmHWM")) for n in nodes}
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


def run_restart(args: argparse.Namespace, nodes: list[NodeProcess], report: dict[str, Any]) -> None:
    """--restart: start the stopped nodes again on their data; time until they serve."""
    log("restarting the node(s) on their journal")
    t0 = time.monotonic()
    start_nodes(args, nodes)
    report["restart_ready_s"] = round(time.monotonic() - t0, 3)
    gevent.sleep(args.settle)
    report["rss_restarted_mb"] = {n.node_id: mb(proc_status_kb(n.pid, "VmRSS")) for n in nodes}
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


def target_nodes(args: argparse.Namespace,
                 workdir: str) -> list[NodeProcess] | list[ExternalNode]:
    if args.server:
        pids = args.pid + [None] * (len(args.server) - len(args.pid))
        return [ExternalNode(node_id=f"s{i + 1}", url=url.rstrip("/"), pid=pid)
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
    nodes: list[Any] = []
    report: dict[str, Any] = {}
    try:
        nodes = target_nodes(args, workdir)
        log(f"sink on {sink.url()}; workdir {workdir}")
        if args.server:
            wait_healthy(nodes, args.startup_timeout)
            view = probe_view(nodes[0])
        else:
            log(f"starting {len(nodes)} node(s): " + ", ".join(n.url for n in nodes))
            view = start_nodes(args, nodes)
            log(f"cluster ready: leader {view.get('leader')}, term {view.get('term')}; pids "
                + ", ".join(f"{n.node_id}={n.pid}" for n in nodes))
            if args.prefill and not args.memory:
                report.update(measure_prefill(args, nodes, sink.url(), run,
                                              lambda: start_nodes(args, nodes),
                                              lambda: stop_nodes(nodes, args.stop_timeout), log))
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
            report["journal_bytes_stopped"] = {n.node_id: dir_bytes(n.data_dir) for n in nodes}
            run_restart(args, nodes, report)
    finally:
        t0 = time.monotonic()
        codes = stop_nodes(nodes, args.stop_timeout)
        if not args.server:
            report["stop_s"] = round(time.monotonic() - t0, 3)
            report["stop_codes"] = codes
        sink.stop(timeout=0.5)
    if not args.server and not args.memory and (args.rss or args.delayed is not None):
        report["journal_bytes_stopped"] = {n.node_id: dir_bytes(n.data_dir) for n in nodes}
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
    if args.pin_cpus:  # before any thread starts: the sink's and the load's inherit it
        os.sched_setaffinity(0, {args.pin_cpus[0]})
    if args.quiet:
        global log
        log = lambda msg: None  # noqa: E731
    try:
        with terminate_on_sigterm():
            report = bench(args)
    except (BenchError, HarnessError) as exc:  # a node failed to start or died
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    print(ujson.dumps(report), flush=True)
    return 1 if getattr(args, "plot_failed", False) else 0


if __name__ == "__main__":
    sys.exit(main())
