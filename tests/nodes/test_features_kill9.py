"""scripts/features_kill9.py's cheapest scenarios, through its own functions, on a real
3-node cluster and a real sink: a long task's lease honoured through a kill -9 and a
restart of the node that delivered it (retried after the lease, not before; a report
while that node is down is not told the attempt is over); a debounced task delivered
once, not early, while its first copy's node is killed and restarted; tasks expiring
behind a paused queue while a copy holder is down, each ended once (one
failure_callback, no delivery); labelled tasks due in 10 minutes searched after their
first copies' node was killed and restarted: none on two pages (its stale copies,
restored elsewhere meanwhile, are dropped as it rejoins, before it says it is ready).
So the script cannot rot: its cluster, its kill -9 and restart, its figures and its
checks run here."""

from __future__ import annotations

import pytest

import features_kill9 as k9


@pytest.mark.timeout(120)
def test_a_lease_debounce_expiry_and_search_survive_a_kill_9(tmp_path) -> None:
    cluster = k9.Cluster(str(tmp_path))
    try:
        cluster.start()
        results = [k9.run_one(cluster, "long_task", lease=10.0), k9.run_one(cluster, "debounce"),
                   k9.run_one(cluster, "expiry", count=4, ttl=4.0),
                   k9.run_one(cluster, "labels")]
    finally:
        cluster.stop()
    for res in results:
        assert res.ok, res.line()
    long, debounce, expiry, labels = results
    # the lease held through the kill -9 and the restart: the retry came after it
    assert long.figures["deliveries_a"] == 2 and long.figures["retry_after_lease_end_s"] >= -0.25
    assert long.figures["report_while_down"] != 409 and long.figures["deliveries_b"] == 1
    assert debounce.figures["deliveries"] == 1 and debounce.figures["late_s"] >= -0.1
    assert expiry.figures["callbacks_per_task"] == "1-1"
    assert expiry.figures["late_deliveries"] == 0
    # the restarted node's stale first copies were gone by the first search after it
    assert [labels.figures[f"after_{n}_repeated"] for n in "abc"] == [0, 0, 0]
    assert labels.figures["queue_scheduled"] == 30


def test_a_result_fails_on_a_problem_and_says_it() -> None:
    res = k9.Result("x", figures={"deliveries": 2, "late_s": 0.123})
    assert res.ok and res.line().startswith("x             ok (0s) deliveries=2 late_s=0.12")
    res.check(False, "2 deliveries, not 1")
    assert not res.ok and "FAIL" in res.line() and "2 deliveries, not 1" in res.line()
    with pytest.raises(SystemExit) as e:  # argparse: a name no scenario has
        k9.main(["--only", "nosuch"])
    assert e.value.code == 2
