"""The composed cluster on virtual time (tests/sim/cluster_sim.py): 500 seeded runs of
three or five real nodes under network, pause, crash and clock faults, checked at every
delivery start and at the end; and a bug planted in the composition is caught."""

from __future__ import annotations

import os
import sys

import pytest

from miyamoto.cluster import layer
from miyamoto.replicas.effects import Update

sys.path.insert(0, os.path.dirname(__file__))
import cluster_sim as cs  # noqa: E402

SEEDS = 500
CHUNKS = 10  # pytest-xdist's workers share them


def _run(seed: int, faults: tuple[str, ...] = cs.FAULTS) -> cs.Sim:
    try:
        return cs.scenario(seed, faults)
    except Exception as e:
        raise AssertionError(f"seed {seed} failed: {e}\nreplay: {cs.replay_command(seed, faults)}"
                             ) from e


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeded_runs_keep_the_rules(chunk: int) -> None:
    per = SEEDS // CHUNKS
    for seed in range(chunk * per, (chunk + 1) * per):
        _run(seed)


@pytest.mark.timeout(120)
def test_a_fault_free_run_delivers_every_acknowledged_task_once() -> None:
    sim = _run(10_001, ())
    c = sim.checker
    assert len(c.acked) >= 15
    assert all(sum(ok for _, _, ok in c.deliveries[t]) == 1 for t in c.acked)
    assert len(c.leaders) >= 1


@pytest.mark.timeout(120)
def test_the_same_seed_replays_the_same_run() -> None:
    a, b = cs.scenario(7), cs.scenario(7)
    assert dict(a.checker.deliveries) == dict(b.checker.deliveries)
    assert a.network.sent == b.network.sent


@pytest.mark.timeout(300)
def test_a_composition_that_drops_the_siblings_pushes_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: the cluster layer ignores the sibling machine's Update effects
    that move a copy's fire time (a sibling's claim, retry, released claim). The
    checker must fail within a bounded number of seeds."""
    carry_out = layer.Cluster.carry_out

    def planted(self: layer.Cluster, effects: object) -> None:
        carry_out(self, [e for e in effects  # type: ignore[attr-defined]
                         if not (isinstance(e, Update) and e.state is None)])
    monkeypatch.setattr(layer.Cluster, "carry_out", planted)
    for seed in range(25):
        try:
            cs.scenario(seed)
        except cs.SafetyViolation:
            return
    pytest.fail("the planted bug was not caught in 25 seeds")
