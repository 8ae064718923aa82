"""The sibling protocol's simulator over random seeds (tests/sim/siblings_sim.py): seeds
0-499 here, with the expiring tasks; 500-999, with the long tasks, in
test_siblings_random_later.py.

Files of their own, apart from unit/replicas/test_siblings.py: the suite hands whole files
to its workers (--dist loadfile), and these runs are many seconds of CPU that should not
queue behind the rest, nor make one file the suite's long tail.
"""

from __future__ import annotations

import pytest

from siblings_sim import random_run, random_runs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(5))
def test_random_runs_are_safe(chunk):
    """Seeds 0-499 (500-999 in test_siblings_random_later.py), 100 per chunk, with loss,
    delay, pauses, partitions, crashes."""
    acked, dups = random_runs(range(chunk * 100, chunk * 100 + 100))
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
