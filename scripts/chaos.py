#!/usr/bin/env python3
"""Fault scenarios on a real 3-node cluster under a steady enqueue stream.

    .venv/bin/python scripts/chaos.py pause [--seed 1] [--pauses leader,leader,follower,follower]
    .venv/bin/python scripts/chaos.py kill [--seed 1] [--duration 120]
    .venv/bin/python scripts/chaos.py kill --client one-node --unnamed   (a naive client)

pause: SIGSTOP a node for --pause-s (10 s), SIGCONT, wait until the cluster agrees again
       and --gap-s more, once per role in --pauses (the leader twice, then a follower
       twice, by default; the leader is looked up afresh each time).
kill:  kill -9 a random node every 4-8 s and start it again 2-5 s later, for --duration.

Nodes run with the server's default timings (replica_offset 5 s, heartbeat 0.5 s,
failure timeout 3 s), replication --replication (2). The stream is --rate (100)
enqueues/s round-robin over all nodes, bounded in count and time, of named tasks sent
through miyamoto.Client with every node's URL (--client failover: a refused connection
or a 503 moves the enqueue to another node), or with plain requests to one node each
(--client one-node), and --unnamed for tasks without names (not retried after a 503);
enqueue_errors counts the enqueues that failed at the client. The sink counts
deliveries by X-Task-Id. After the faults every acknowledged task gets --drain-s to be
delivered and --grace-s more for late duplicates; then ONE JSON line on stdout:
acknowledged, delivered, lost, duplicates (extra deliveries), duplicated_tasks,
in_flight_at_faults (the victims' miyamoto_deliveries_in_flight right before each
signal), and per fault its duplicates, in-flight count and time to agree again.
Progress goes to stderr. Only 127.0.0.1 is contacted; every node started is stopped on
exit, error, Ctrl-C or SIGTERM (and is SIGKILLed by the kernel if this process dies).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# this checkout's miyamoto (the stream's Client), not an installed one
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import HarnessError  # noqa: E402  (scripts/ is not a package)
from harness.chaos import Options, Scenario  # noqa: E402


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, bool]:
    p = argparse.ArgumentParser(prog="chaos.py", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["pause", "kill"])
    p.add_argument("--seed", type=int, default=None, help="victims and timings (default: random, printed)")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--replication", type=int, default=2)
    p.add_argument("--rate", type=float, default=100.0, help="enqueues/s (default 100)")
    p.add_argument("--pause-s", type=float, default=10.0, help="seconds each pause lasts")
    p.add_argument("--pauses", default="leader,leader,follower,follower",
                   help="roles to pause, in order (leader, follower, any)")
    p.add_argument("--gap-s", type=float, default=3.0, help="healthy seconds between faults")
    p.add_argument("--duration", type=float, default=120.0, help="kill mode: seconds of faults")
    p.add_argument("--kill-every", type=span, default=(4.0, 8.0), metavar="LO-HI")
    p.add_argument("--restart-after", type=span, default=(2.0, 5.0), metavar="LO-HI")
    p.add_argument("--drain-s", type=float, default=90.0, help="bound on the wait for deliveries")
    p.add_argument("--grace-s", type=float, default=6.0, help="seconds to catch late duplicates")
    p.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--log-level", default="info", help="nodes' --log-level")
    p.add_argument("--client", choices=["failover", "one-node"], default="failover",
                   help="the stream's client (default failover: miyamoto.Client, all nodes)")
    p.add_argument("--unnamed", action="store_true", help="tasks without names")
    p.add_argument("--keep-dir", action="store_true", help="keep the node logs and data")
    a = p.parse_args(argv)
    roles = [r for r in a.pauses.split(",") if r]
    if any(r not in ("leader", "follower", "any") for r in roles) or a.nodes < 2 or a.rate <= 0:
        p.error("--pauses takes leader/follower/any; --nodes >= 2; --rate > 0")
    if any("=" not in kv for kv in a.node_env):
        p.error("--node-env wants KEY=VALUE")
    opts = Options(mode=a.mode, seed=a.seed, nodes=a.nodes, replication=a.replication,
                   rate=a.rate, pause_s=a.pause_s, pauses=roles, gap_s=a.gap_s,
                   duration_s=a.duration, kill_every=a.kill_every,
                   restart_after=a.restart_after, drain_s=a.drain_s, grace_s=a.grace_s,
                   node_env=dict(kv.split("=", 1) for kv in a.node_env),
                   log_level=a.log_level, client=a.client, named=not a.unnamed)
    return opts, a.keep_dir


def _sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    opts, keep = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    scenario = Scenario(opts, log)
    report: dict = {}
    code = 0
    try:
        with scenario:
            report = scenario.run()
    except HarnessError as e:
        report, code = {"error": str(e).splitlines()[0]}, 1
        log(str(e))
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if keep or code:
            log(f"kept {scenario.workdir}")
        else:
            shutil.rmtree(scenario.workdir, ignore_errors=True)
    report.setdefault("seed", scenario.seed)
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
