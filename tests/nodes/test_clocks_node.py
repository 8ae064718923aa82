"""A node whose clock runs 30 s ahead of its peers' (libfaketime, in one node of three)
fires the copies it holds by its own clock and delivers nothing early: before, a third
of the tasks (those whose first copy it held) were delivered 30 s early. The offset
estimates themselves are tested in tests/unit/cluster/test_clocks.py."""

from __future__ import annotations

import glob
import time

import pytest

from conftest import write_node_config
from helpers import cluster_view, plan_cluster, wait_converged, wait_until


AHEAD = 30.0

# libfaketime preloaded into the node itself, not the `faketime` wrapper: the wrapper
# forks the node as its child, and a test that kills the wrapper left the node running
FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                            + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian package faketime)")
@pytest.mark.timeout(120)
def test_a_node_thirty_seconds_ahead_delivers_nothing_early(tmp_path, proc_registry, sink):
    nodes = plan_cluster(tmp_path, ["a", "b", "fast"], config=write_node_config(
        tmp_path / "n.ini", {"replication": 2}), registry=proc_registry)
    fast = nodes[2]
    fast.raw_env.update({"LD_PRELOAD": FAKETIME, "FAKETIME": f"+{AHEAD:g}s",
                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
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
    seen = {m["id"]: m for m in cluster_view(nodes[0])["members"]}
    assert seen["fast"]["clock_offset"] == pytest.approx(AHEAD, abs=0.5), seen
    assert seen["fast"]["clock_skewed"] and not seen["b"]["clock_skewed"], seen
    from_fast = {m["id"]: m for m in cluster_view(fast)["members"]}
    assert from_fast["a"]["clock_offset"] == pytest.approx(-AHEAD, abs=0.5), from_fast
    for n in (nodes[0], fast):
        wait_until(lambda n=n: "beyond max_clock_skew" in n.log_text(), 10,
                   what=f"{n.node_id} to log the skew")
    assert "miyamoto_peer_clock_offset_seconds" in nodes[0].get("/metrics").text

    countdown = 2.0
    due: dict[str, float] = {}
    for i in range(60):  # from every node, so every node holds first and second copies
        n = nodes[i % 3]
        t0 = time.time()
        t = n.enqueue(url=f"{sink.url}/skew", countdown=countdown)
        due[t["id"]] = t0 + countdown  # the true time, on the test's (real) clock
    reqs = sink.wait_for(lambda rs: {r.task_id for r in rs} >= set(due), path="/skew",
                         timeout=40)
    early = sorted(due[r.task_id] - r.time for r in reqs if r.task_id in due)
    print(f"\nearliest delivery: {early[-1] * 1000:.0f} ms before its due time "
          f"(latest {-early[0] * 1000:.0f} ms after)")
    # 100 ms plus the estimate's error (a few ms on loopback)
    assert early[-1] < 0.1 + max(m["clock_error"] for m in seen.values() if m["clock_error"])
