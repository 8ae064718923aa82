"""Ordering keys in the composed cluster on virtual time (tests/sim/cluster_sim.py,
``ordered_scenario``): a stream of ordered tasks of a few keys on 3 nodes with
replication 2, the owner of a key killed mid-stream (with more faults in some runs),
checked by ``OrderChecker`` (one at a time per key, in seq order, none skipped, the
enqueue order kept, none stuck beyond one lease); and the checker catches planted bugs:
a line that admits the next task without waiting, and siblings that answer an ASK
without looking at their own line of the key (the hand-over's guard)."""

from __future__ import annotations

import os
import sys

import pytest

from miyamoto.engine.ordering import Lines

sys.path.insert(0, os.path.dirname(__file__))
import cluster_sim as cs  # noqa: E402


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chunk", range(2))
def test_ordered_runs_with_the_owner_killed_keep_the_rules(chunk: int) -> None:
    for seed in range(chunk * 20, (chunk + 1) * 20):
        sim = cs.run_ordered(seed)
        assert len(sim.order.seqs) >= 10


@pytest.mark.timeout(300)
def test_ordered_runs_under_more_faults_keep_the_rules() -> None:
    for seed in range(100, 115):
        cs.run_ordered(seed, ("crash", "pause", "cut", "oneway"))


def _caught_within(seeds: range) -> str:
    for seed in seeds:
        try:
            cs.ordered_scenario(seed)
        except cs.SafetyViolation as e:
            return str(e)
    raise AssertionError(f"the planted bug survived seeds {seeds.start}-{seeds.stop - 1}")


@pytest.mark.timeout(300)
def test_a_line_that_admits_the_next_without_waiting_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Lines, "may_start", lambda self, t: True)
    monkeypatch.setattr(Lines, "ahead_of", lambda self, q, k, s, i: None)
    assert "key k" in _caught_within(range(5))


@pytest.mark.timeout(300)
def test_siblings_that_ignore_their_line_at_a_hand_over_are_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the ASK's guard is gone: a restarted owner, or a copy restored elsewhere,
    whose own line lacks the earlier tasks runs ahead of them."""
    monkeypatch.setattr(Lines, "ahead_of", lambda self, q, k, s, i: None)
    assert "key k" in _caught_within(range(40))
