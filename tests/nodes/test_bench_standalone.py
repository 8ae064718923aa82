"""scripts/bench.py --standalone: N single nodes on this machine, not a cluster, with the
same load spread over them. It is the floor a cluster's CPU per task is compared with:
what N processes cost on the box without any cluster traffic (issue 19: co-location apart
from the protocol's cost).

A short real run: two nodes the bench starts in memory, its own sink. Each node leads a
roster of one (GET /cluster), no cluster message is sent, both nodes took enqueues, and
every task is delivered once. The flag's wrong uses exit 2 naming it.
"""

from __future__ import annotations

import pytest

import helpers  # noqa: F401  (puts scripts/ on sys.path)
import bench
from test_bench_plot import SHORT, result_line, run_bench


@pytest.mark.timeout(150)
def test_standalone_nodes_share_the_load_and_send_no_cluster_message() -> None:
    report = result_line(run_bench(*SHORT, "--nodes", "2", "--standalone", "--quiet"))
    assert report["standalone"] is True and report["nodes"] == 2
    metrics = report["server_metrics"]
    # the largest roster of the nodes (harness.server_metrics): one, each node alone
    assert metrics["cluster_members"] == 1, metrics
    assert report["per_task"]["messages"] == 0, report["per_task"]
    assert report["duplicated"] == 0 and report["stored_per_task"] == 1.0
    cpu = report["cpu_s"]
    assert cpu["n1"] > 0 and cpu["n2"] > 0, cpu  # both served enqueues and deliveries


def test_standalone_nodes_are_planned_unseeded(tmp_path) -> None:
    nodes = bench.plan_nodes(bench.parse_args(["--nodes", "3", "--standalone", "--memory"]),
                             str(tmp_path))
    assert [n.seeds for n in nodes] == [[], [], []]
    cluster = bench.plan_nodes(bench.parse_args(["--nodes", "3", "--memory"]), str(tmp_path))
    assert [bool(n.seeds) for n in cluster] == [False, True, True]


@pytest.mark.parametrize("bad", [["--standalone"], ["--nodes", "1", "--standalone"],
                                 ["--nodes", "2", "--standalone", "--replication", "2"],
                                 ["--standalone", "--server", "http://127.0.0.1:9"]])
def test_standalone_without_nodes_of_its_own_exits_2_naming_it(bad: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(bad)
    assert e.value.code == 2
    assert "--standalone" in capsys.readouterr().err
