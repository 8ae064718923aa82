"""The sibling protocol's simulator over 1,000 random seeds (tests/sim/siblings_sim.py).

A file of its own, apart from unit/replicas/test_siblings.py: the suite hands whole files to its
two workers, and these runs are minutes of CPU that should not queue behind the rest.
"""

from __future__ import annotations

import pytest

from siblings_sim import random_run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(10))
def test_random_runs_are_safe(chunk):
    """1,000 seeded runs (100 per chunk) with loss, delay, pauses, partitions, crashes."""
    dups = acked = 0
    for seed in range(chunk * 100, chunk * 100 + 100):
        sim = random_run(seed)
        dups += sim.duplicates()
        acked += len(sim.acked)
    assert acked > 1000
    print(f"chunk {chunk}: {acked} acknowledged, {dups} excused duplicates")


@pytest.mark.timeout(300)
def test_random_runs_with_expiring_tasks_are_safe():
    """100 seeded runs where a third of the tasks expire 0.05-3 s after their eta: no copy
    starts after its expiry, every copy of an expired task ends as expired (never as a
    failure with attempts left), and every other acknowledged task is delivered."""
    expired = acked = 0
    for seed in range(100):
        sim = random_run(seed, expiry_rate=0.3)
        expired += len(sim.expired)
        acked += len(sim.acked)
    assert expired > 100 and acked > 1000
    print(f"{acked} acknowledged, {expired} expired")


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
