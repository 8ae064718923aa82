"""scripts/bench.py --entry K: the load goes through the first K nodes only, as from
clients that know one node. With the rest of a cluster holding copies only, the same
protocol's cost can be read with its entry work on fewer processes (issue 19: a
replicated task's cost apart from how the box spreads it).

A short real run: two nodes at replication 2, every enqueue through n1: n1 sends a STORE
for every task and n2 none, and every task is delivered once. The flag's wrong uses exit
2 naming it.
"""

from __future__ import annotations

import pytest

import helpers  # noqa: F401  (puts scripts/ on sys.path)
import bench
from test_bench_plot import SHORT, result_line, run_bench


@pytest.mark.timeout(150)
def test_every_enqueue_goes_through_the_entry_node() -> None:
    report = result_line(run_bench(*SHORT, "--nodes", "2", "--replication", "2",
                                   "--entry", "1", "--quiet"))
    assert report["entry"] == 1 and report["nodes"] == 2
    assert report["stores_sent"] == {"n1": 300, "n2": 0}, report["stores_sent"]
    assert report["lost"] == 0 and report["duplicated"] == 0
    assert report["stored_per_task"] == 2.0
    # each node's hub woke (or was preempted) during the run, and per task it is summed
    switches = report["switches"]
    assert set(switches) == {"n1", "n2"}, switches
    assert all(s["woke"] + s["preempted"] > 0 for s in switches.values()), switches
    assert report["per_task"]["woke"] > 0, report["per_task"]


@pytest.mark.parametrize("bad", [["--entry", "2"], ["--nodes", "3", "--entry", "0"],
                                 ["--nodes", "2", "--standalone", "--entry", "1"],
                                 ["--server", "http://127.0.0.1:9", "--entry", "2"]])
def test_an_entry_beyond_the_nodes_exits_2_naming_it(bad: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(bad)
    assert e.value.code == 2
    assert "--entry" in capsys.readouterr().err
