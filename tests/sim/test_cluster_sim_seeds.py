"""Seeds 250-499 of the composed cluster's simulation (tests/sim/cluster_sim.py), in a file
of their own so the suite's two workers share the 500 runs (test_cluster_sim.py has the
first 250 and the planted bugs)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import cluster_sim as cs  # noqa: E402


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(5, 10))
def test_seeded_runs_keep_the_rules(chunk: int) -> None:
    for seed in range(chunk * 50, (chunk + 1) * 50):
        cs.run_seed(seed)
