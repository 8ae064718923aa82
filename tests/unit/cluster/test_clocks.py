"""Clocks that disagree: peers' offsets estimated from round trips, copies fired by the
receiver's clock. The real-process test runs one node of three under libfaketime, 30 s
ahead: before, a third of the tasks (those whose first copy it held) were delivered 30 s
early."""

from __future__ import annotations

import glob
import time

import pytest

from helpers import cluster_view, plan_cluster, wait_converged, wait_until
from miyamoto.cluster.clocks import PeerClocks

AHEAD = 30.0


def test_offset_from_round_trips_takes_the_narrowest_sample():
    c = PeerClocks(max_skew=1.0)
    assert c.estimate("b", 100.0) is None and c.to_local("b", 150.0, 100.0) == 150.0
    # the peer is 30 s ahead; round trips of 0.2 s, 0.02 s and 2 s
    c.sample("b", 100.0, 130.1, 100.2)
    c.sample("b", 101.0, 131.01, 101.02)
    c.sample("b", 102.0, 133.0, 104.0)  # waited in a queue on the way back: 1 s off
    est = c.estimate("b", 104.0)
    assert est.offset == pytest.approx(30.0) and est.error == pytest.approx(0.01)
    assert c.to_local("b", 1000.0, 104.0) == pytest.approx(970.0)
    assert c.view("b", 104.0)["clock_skewed"] is True
    # crossing is reported once each way
    assert c.check("b", 104.0) == (True, est)
    assert c.check("b", 104.5) is None
    for i in range(8):  # the peer's clock is fixed: the old samples age out of the window
        c.sample("b", 110.0 + i, 110.0 + i + 0.3 + 0.01, 110.0 + i + 0.02)
    skewed, est2 = c.check("b", 120.0)
    assert skewed is False and est2.offset == pytest.approx(0.3)
    # an offset within its error, or under 50 ms, is not corrected: it would add noise
    d = PeerClocks(max_skew=1.0)
    d.sample("b", 100.0, 100.03, 100.002)
    assert d.to_local("b", 500.0, 100.1) == 500.0
    d.sample("b", 101.0, 101.3, 101.001)  # narrower: it wins
    assert d.to_local("b", 500.0, 101.1) == pytest.approx(499.7005)
    # answers that cannot be ours, and stale estimates, are not used
    assert c.sample("c", 200.0, 210.0, 199.0) is None
    assert c.sample("c", 200.0, 210.0, 200.0 + 61) is None
    c.sample("c", 200.0, 210.0, 200.1)
    assert c.estimate("c", 200.1 + 61) is None


def test_within_the_error_is_not_skew():
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 100.0, 101.4, 101.0)  # offset 0.9 ± 0.5
    assert c.check("b", 101.0) is None
    c.sample("b", 102.0, 104.7, 102.4)  # offset 2.5 ± 0.2: 2.3 > 1 even at best
    assert c.check("b", 103.0)[0] is True


# libfaketime preloaded into the node itself, not the `faketime` wrapper: the wrapper
# forks the node as its child, and a test that kills the wrapper left the node running
FAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                            + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)


@pytest.mark.skipif(FAKETIME is None, reason="needs libfaketime (Debian package faketime)")
@pytest.mark.timeout(120)
def test_a_node_thirty_seconds_ahead_delivers_nothing_early(tmp_path, proc_registry, sink):
    from conftest import write_node_config

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
