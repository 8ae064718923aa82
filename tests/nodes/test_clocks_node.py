"""A node whose clock runs 30 s ahead of its peers' (libfaketime, in one node of three):
it fires the copies it holds by its own clock, takes a client's absolute eta on the
cluster's clock, and does not lead, so nothing is delivered early and no schedule tick
either. Before, a third of the countdown tasks (those whose first copy it held) went
30 s early, every absolute eta it took went early by the skew, and with it leading
every tick arrived 29.3-29.97 s early. The estimates and the placement are tested in
tests/unit/cluster/test_clocks.py, the whole cluster at +30, -8 and -60 s in
tests/sim/test_cluster_sim.py; scripts/clock_skew.py measures -8 and -60 s for real."""

from __future__ import annotations

import glob
import time

import pytest

from conftest import write_node_config
from helpers import cluster_view, plan_cluster, wait_converged, wait_until


AHEAD = 30.0
EARLY = 0.1  # s, plus the estimate's error (a few ms on loopback)
# s: a tick goes up to a second late on a loaded box whatever the clocks (the ticker's
# 0.2 s period, its enqueue's and cursor write's round trips, the delivery's asks); a
# clock bug is the skew's size (29-30 s here)
LATE = 3.0

# libfaketime preloaded into the node itself, not the `faketime` wrapper: the wrapper
# forks the node as its child, and a test that kills the wrapper left the node running
FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                            + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian package faketime)")
@pytest.mark.timeout(120)
def test_a_node_thirty_seconds_ahead_delivers_nothing_early(tmp_path, proc_registry, sink):
    # failure_timeout as by default: at a load of 9 the tests' 1 s drops members
    nodes = plan_cluster(tmp_path, ["a", "b", "c"], config=write_node_config(
        tmp_path / "n.ini", {"replication": 2, "failure_timeout": 3.0,
                             "election_timeout_min": 1.0, "election_timeout_max": 2.0}),
        registry=proc_registry)
    # the skewed node gets the lowest cluster address: the bootstrap's first turn is
    # its, so it often leads first and must hand over (the log says whether it did)
    fast = min(nodes, key=lambda n: n.cluster_addr)
    fast.raw_env.update({"LD_PRELOAD": FAKETIME, "FAKETIME": f"+{AHEAD:g}s",
                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    slow = [n for n in nodes if n is not fast]
    for n in nodes:
        n.start()
    for n in nodes:
        n.wait_ready(20)
    wait_converged(nodes, timeout=20)

    def offsets_known() -> bool:
        for n in nodes:
            for m in cluster_view(n)["members"]:
                if m["id"] != n.node_id and m.get("clock_offset") is None:
                    return False
        return True

    wait_until(offsets_known, 15, what="every node to know every peer's clock offset")
    seen = {m["id"]: m for m in cluster_view(slow[0])["members"]}
    assert seen[fast.node_id]["clock_offset"] == pytest.approx(AHEAD, abs=0.5), seen
    assert seen[fast.node_id]["clock_skewed"] and not seen[slow[1].node_id]["clock_skewed"]
    from_fast = wait_until(lambda: (lambda v: v if v["clock"]["skewed"] else None)(
        cluster_view(fast)), 5, what="the fast node to place itself beyond max_clock_skew")
    assert from_fast["clock"]["offset"] == pytest.approx(-AHEAD, abs=0.5), from_fast
    # placed once a majority's estimates are fresh (under load one may lapse for a probe:
    # the node then knows only its own clock and the far one, and does not guess)
    right = {"offset": 0.0, "placed": True, "skewed": False}
    wait_until(lambda: cluster_view(slow[0])["clock"] == right, 10,
               what="a right clock to place itself on the cluster's")
    for n in (slow[0], fast):
        wait_until(lambda n=n: "beyond max_clock_skew" in n.log_text(), 10,
                   what=f"{n.node_id} to log the skew")
    assert "miyamoto_peer_clock_offset_seconds" in slow[0].get("/metrics").text
    assert "miyamoto_cluster_clock_skewed 1.0" in fast.get("/metrics").text
    assert "clock" in fast.get("/readyz").json()["reason"]
    led = "our clock is off the cluster" in fast.log_text()  # it led, and handed over
    wait_until(lambda: all(cluster_view(n)["leader"] not in (None, fast.node_id)
                           for n in nodes), 10, what="a leader whose clock is right")

    posted = time.time()
    beat = {"name": "beat", "every": 1, "task": {"url": f"{sink.url}/beat"}}
    wait_until(lambda: slow[0].post("/schedules", json=beat, timeout=15).status_code == 200,
               15, what="the new leader to take the schedule")  # (503 until it holds
    # a majority's definitions)
    due: dict[str, float] = {}
    for i in range(60):  # from every node, so every node holds first and second copies
        n = nodes[i % 3]
        t0 = time.time()  # the true time, on the test's (real) clock
        if i % 2:
            t = n.enqueue(url=f"{sink.url}/skew", countdown=2.0)
            due[t["id"]] = t0 + 2.0
        else:
            t = n.enqueue(url=f"{sink.url}/skew", eta=t0 + 3.0)
            due[t["id"]] = t0 + 3.0
    reqs = sink.wait_for(lambda rs: {r.task_id for r in rs} >= set(due), path="/skew",
                         timeout=40)
    beats = sink.wait_for(count=6, path="/beat", timeout=20)
    late = sorted(r.time - due[r.task_id] for r in reqs if r.task_id in due)
    first: dict[str, float] = {}
    for q in beats:
        first.setdefault(q.headers["X-Task-Name"], q.time)
    # (the tick of the second the schedule was made in fires at once: not on time)
    ticks = sorted(t - int(name.rsplit(":", 1)[1]) for name, t in first.items()
                   if int(name.rsplit(":", 1)[1]) >= posted)
    print(f"\nfast led first: {led}; tasks {late[0]:+.3f} to {late[-1]:+.3f} s, "
          f"ticks {ticks[0]:+.3f} to {ticks[-1]:+.3f} s against their due times")
    error = max(m["clock_error"] for m in seen.values() if m["clock_error"])
    assert late[0] > -(EARLY + error) and ticks[0] > -(EARLY + error), (late, ticks)
    assert late[-1] < LATE and ticks[-1] < LATE, (late, ticks)
