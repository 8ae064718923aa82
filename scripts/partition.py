#!/usr/bin/env python3
"""Partition scenarios on a real 5-node cluster in network namespaces (needs root).

    sudo .venv/bin/python scripts/partition.py [follower|leader|flap|all] [--seed 1]

follower: cut one follower's cluster link for --cut-s (10 s), heal.
leader:   split the leader and one follower (a minority) from the other three for --cut-s.
flap:     one follower's link down --flap-down (2 s), up --flap-up (2 s), --flap-times (5).

The nodes run the test suite's fast timings (heartbeat 0.1 s, failure timeout 1 s,
election 0.3-0.6 s, replica_offset 1 s), replication --replication (2). The stream is
--rate (100) enqueues/s, each with a 1-3 s countdown, over the nodes that are not cut,
bounded in count and time. A sink in the root namespace counts deliveries by X-Task-Id.
After the heal: one roster, every acknowledged task delivered (--drain-s), a grace period,
then ONE JSON line per scenario on stdout (see harness/partition.py for the fields).
Traffic stays in the namespaces this run makes (10.77.N / 10.78.N, see harness/netns.py),
which are deleted on exit.
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
from harness import HarnessError  # noqa: E402  (scripts/ is not a package)
from harness.netns import unavailable  # noqa: E402
from harness.partition import PLANS, Options, PartitionScenario  # noqa: E402


def log(msg: str) -> None:
    print(f"[partition {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="partition.py", description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", nargs="?", default="all", choices=[*PLANS, "all"])
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--replication", type=int, default=2)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--cut-s", type=float, default=10.0)
    p.add_argument("--flap-down", type=float, default=2.0)
    p.add_argument("--flap-up", type=float, default=2.0)
    p.add_argument("--flap-times", type=int, default=5)
    p.add_argument("--drain-s", type=float, default=40.0)
    p.add_argument("--grace-s", type=float, default=3.0)
    p.add_argument("--keep-dir", action="store_true", help="keep the node logs and data")
    return p.parse_args(argv)


def _sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    why = unavailable()
    if why:
        log(why)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    code = 0
    for plan in (PLANS if a.plan == "all" else (a.plan,)):
        opts = Options(plan=plan, seed=a.seed, replication=a.replication, rate=a.rate,
                       cut_s=a.cut_s, flap_down=a.flap_down, flap_up=a.flap_up,
                       flap_times=a.flap_times, drain_s=a.drain_s, grace_s=a.grace_s)
        scenario = PartitionScenario(opts, log)
        failed = False
        try:
            with scenario:
                report = scenario.run()
        except HarnessError as e:
            report, failed = {"plan": plan, "error": str(e).splitlines()[0]}, True
            log(str(e))
        except KeyboardInterrupt:
            log("interrupted")
            return 130
        finally:
            if a.keep_dir or failed:
                log(f"kept {scenario.workdir}")
            else:
                shutil.rmtree(scenario.workdir, ignore_errors=True)
        code = code or int(failed)
        print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
