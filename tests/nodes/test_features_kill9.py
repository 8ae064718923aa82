"""scripts/features_kill9.py's cheapest scenarios, through its own functions, on a real
3-node cluster and a real sink: a debounced task delivered once, not early, while its
first copy's node is killed and restarted; tasks expiring behind a paused queue while a
copy holder is down, each ended once (one failure_callback, no delivery). So the script
cannot rot: its cluster, its kill -9 and restart, its figures and its checks run here."""

from __future__ import annotations

import pytest

import features_kill9 as k9


@pytest.mark.timeout(120)
def test_debounce_and_expiry_survive_a_kill_9(tmp_path) -> None:
    cluster = k9.Cluster(str(tmp_path))
    try:
        cluster.start()
        results = [k9.run_one(cluster, "debounce"),
                   k9.run_one(cluster, "expiry", count=4, ttl=4.0)]
    finally:
        cluster.stop()
    for res in results:
        assert res.ok, res.line()
    debounce, expiry = results
    assert debounce.figures["deliveries"] == 1 and debounce.figures["late_s"] >= -0.1
    assert expiry.figures["callbacks_per_task"] == "1-1"
    assert expiry.figures["late_deliveries"] == 0


def test_a_result_fails_on_a_problem_and_says_it() -> None:
    res = k9.Result("x", figures={"deliveries": 2, "late_s": 0.123})
    assert res.ok and res.line().startswith("x             ok (0s) deliveries=2 late_s=0.12")
    res.check(False, "2 deliveries, not 1")
    assert not res.ok and "FAIL" in res.line() and "2 deliveries, not 1" in res.line()
    with pytest.raises(SystemExit) as e:  # argparse: a name no scenario has
        k9.main(["--only", "nosuch"])
    assert e.value.code == 2
