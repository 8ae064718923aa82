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
