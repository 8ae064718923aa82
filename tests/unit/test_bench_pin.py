"""scripts/bench.py --pin: the load generator's CPU first, then one per started node,
round-robin; a CPU this machine does not let us use, or a bad list, exits 2 naming it."""

from __future__ import annotations

import os

import pytest

import helpers  # noqa: F401  (puts scripts/ on sys.path)
import bench

CPU = min(os.sched_getaffinity(0))


def test_pin_gives_the_first_cpu_to_the_bench_and_the_rest_to_the_nodes_in_turn() -> None:
    args = bench.parse_args(["--pin", f"{CPU},{CPU}", "--nodes", "3"])
    assert args.pin_cpus == [CPU, CPU]
    assert [bench.node_cpu(args, i) for i in range(3)] == [CPU, CPU, CPU]
    args.pin_cpus = [0, 1, 2]  # as on a machine with three cores
    assert [bench.node_cpu(args, i) for i in range(3)] == [1, 2, 1]
    args.pin_cpus = [5]  # one CPU: the nodes share the bench's
    assert bench.node_cpu(args, 2) == 5
    assert bench.node_cpu(bench.parse_args([]), 0) is None


def test_pinned_nodes_start_under_taskset(tmp_path) -> None:
    args = bench.parse_args(["--pin", f"{CPU},{CPU}", "--nodes", "2", "--memory"])
    nodes = bench.plan_nodes(args, str(tmp_path))
    assert [n.command()[:3] for n in nodes] == [["taskset", "-c", str(CPU)]] * 2
    plain = bench.plan_nodes(bench.parse_args(["--nodes", "2", "--memory"]), str(tmp_path))
    assert all(n.command()[0] != "taskset" for n in plain)


@pytest.mark.parametrize("spec, words", [("x", "comma list"), ("99999", "not all usable"),
                                         ("", "comma list")])
def test_a_bad_pin_exits_2_naming_it(spec: str, words: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--pin", spec])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--pin" in err and words in err


def test_pin_is_not_for_servers_we_did_not_start(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--pin", str(CPU), "--server", "http://127.0.0.1:9"])
    assert "--pin" in capsys.readouterr().err
