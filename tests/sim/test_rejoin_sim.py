"""A restarted node rejoins (tests/sim/rejoin_sim.py): seeded runs of the composed cluster in
which no node is left, once quiet, with a copy of a task that ended or moved elsewhere
while it was down; and the checker catches the planted bugs (the rejoin's walk never
made, the later run's end not taken)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import pytest

from miyamoto.cluster import layer
from miyamoto.replicas.effects import Reconcile, TakeEnd

sys.path.insert(0, os.path.dirname(__file__))
import rejoin_sim as rs  # noqa: E402


@pytest.mark.timeout(300)
def test_seeded_rejoins_leave_no_stale_copy() -> None:
    for seed in range(40):
        rs.run_seed(seed)


def _ignoring(kind: type) -> contextlib.AbstractContextManager:
    @contextlib.contextmanager
    def plant() -> Iterator[None]:
        carry_out = layer.Cluster.carry_out

        def planted(self: layer.Cluster, effects: object) -> None:
            carry_out(self, [e for e in effects if not isinstance(e, kind)])  # type: ignore[attr-defined]
        layer.Cluster.carry_out = planted  # type: ignore[method-assign]
        try:
            yield
        finally:
            layer.Cluster.carry_out = carry_out  # type: ignore[method-assign]
    return plant  # type: ignore[return-value]


@pytest.mark.timeout(300)
def test_the_checker_catches_a_node_ready_before_its_copies_are_settled() -> None:
    """The planted bug: /readyz does not wait for the rejoin's walk (Cluster.ready
    without its last check): a read on the node as it says ready still finds the
    copies restored elsewhere while it was down."""
    @contextlib.contextmanager
    def plant() -> Iterator[None]:
        ready = layer.Cluster.ready

        def planted(self: layer.Cluster) -> tuple[bool, str]:
            ok = self.roster is not None and self.me in self.roster.ids() and \
                self.membership is not None and self.membership.leader is not None
            return ok, "ok"
        layer.Cluster.ready = planted  # type: ignore[method-assign]
        try:
            yield
        finally:
            layer.Cluster.ready = ready  # type: ignore[method-assign]
    for seed in range(8):
        try:
            rs.rejoin_scenario(seed, plant)  # type: ignore[arg-type]
        except rs.SafetyViolation as e:
            assert "moved elsewhere" in str(e)
            return
    pytest.fail("a node ready before its copies were settled was not caught in 8 seeds")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, words", [(Reconcile, "moved elsewhere"),
                                         (TakeEnd, "ended in a later run")])
def test_the_checker_catches_a_rejoin_that_does_not_reconcile(kind: type, words: str) -> None:
    """The planted bugs: the cluster layer ignores Reconcile (no copy probes at the
    rejoin: far copies restored elsewhere stay, as before the fix), or TakeEnd (a
    stale end of an earlier run stays). The checker must say so within a few seeds."""
    for seed in range(8):
        try:
            rs.rejoin_scenario(seed, _ignoring(kind))
        except rs.SafetyViolation as e:
            assert words in str(e)
            return
    pytest.fail(f"ignoring {kind.__name__} was not caught in 8 seeds")
