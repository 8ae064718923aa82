"""A paused node must not deliver again what its siblings delivered.

Real processes, as a user runs them: 3 nodes, replication 2, the default timings
(replica_offset 5 s, heartbeat 0.5 s, failure timeout 3 s), 100 enqueues/s round-robin
over all nodes. The leader is frozen (SIGSTOP) for 10 s and resumed (SIGCONT) twice,
then a follower twice, on one cluster; the scenario is ``harness.chaos`` (the same code
``scripts/chaos.py pause`` runs). Every acknowledged task must be delivered, and the
only duplicates allowed are deliveries that were in flight on the paused node when it
stopped (its ``miyamoto_deliveries_in_flight``, sampled right before each SIGSTOP, plus
the deliveries that reached the sink between that sample and the signal).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import loaded  # (helpers also puts scripts/ on sys.path for the harness)
from harness import HarnessError, ProcessRegistry
from harness.chaos import Options, Scenario


def run_pauses(workdir: Path, registry: ProcessRegistry) -> dict:
    """The pause scenario; a harness failure is an error, not the bug under test. Each
    wait for the nodes to be ready (at the start, and after each resume) polls
    /readyz until a deadline of 30 s on an idle box, longer on a loaded one."""
    opts = Options(mode="pause", seed=6, pauses=("leader", "leader", "follower", "follower"),
                   pause_s=10.0, gap_s=3.0, grace_s=6.0, drain_s=60.0, workdir=str(workdir),
                   startup_s=loaded(30.0))
    try:
        with Scenario(opts, log=lambda msg: print(f"[pause] {msg}", flush=True),
                      registry=registry) as scenario:
            return scenario.run()
    except HarnessError as e:
        raise RuntimeError(f"the pause scenario could not run: {e}") from None


@pytest.mark.timeout(480)  # twice the idle budget: the readiness waits stretch under load
def test_pausing_a_node_loses_nothing_and_repeats_only_what_was_in_flight(tmp_path: Path,
        proc_registry: ProcessRegistry) -> None:
    report = run_pauses(tmp_path, proc_registry)
    counts = {k: report[k] for k in ("sent", "acknowledged", "delivered", "lost", "duplicates",
                                     "duplicated_tasks", "in_flight_at_faults",
                                     "started_around_faults", "drain_s")}
    per_pause = [(f["role"], f["node"], f["in_flight"], f["duplicates"]) for f in report["faults"]]
    print("pause scenario:", json.dumps(counts), "per pause (role, node, in flight, dups):",
          per_pause, flush=True)
    # the scenario really ran: four pauses under a stream most of which was acknowledged
    if len(report["faults"]) != 4 or report["acknowledged"] < 0.5 * report["sent"] \
            or report["sent"] < 3000 or report["in_flight_unknown"]:
        raise RuntimeError(f"the pause scenario did not run as planned: {report}")
    assert report["lost"] == 0, f"acknowledged tasks never delivered: {counts}"
    # a delivery the paused node started between its /metrics sample and the SIGSTOP is
    # in flight too: bounded by the sink's arrivals in that window (a few milliseconds)
    allowed = report["in_flight_at_faults"] + report["started_around_faults"]
    assert report["duplicates"] <= allowed, \
        f"more duplicates than deliveries in flight at the pauses: {counts}; {per_pause}"
