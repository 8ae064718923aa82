"""The sibling protocol's simulator over random seeds 500-999, and with long tasks
(tests/sim/siblings_sim.py); seeds 0-499, and the expiring tasks, are in
test_siblings_random.py. Two files, so that the suite's workers (--dist loadfile) share
these runs."""

from __future__ import annotations

import pytest

from siblings_sim import random_run, random_runs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(5, 10))
def test_random_runs_are_safe(chunk):
    """Seeds 500-999, 100 per chunk, with loss, delay, pauses, partitions, crashes."""
    acked, dups = random_runs(range(chunk * 100, chunk * 100 + 100))
    assert acked > 1000
    print(f"chunk {chunk}: {acked} acknowledged, {dups} excused duplicates")


@pytest.mark.timeout(300)
def test_random_runs_with_long_tasks_are_safe():
    """60 seeded runs where a third of the deliveries are long tasks (a 202, 8-15 s of
    work, a heartbeat every 0.6 s): no sibling starts one under a lease its holder's
    worker holds, and every acknowledged task is delivered."""
    acked = 0
    for seed in range(60):
        sim = random_run(seed, long_rate=0.3)
        acked += len(sim.acked)
    assert acked > 600
