"""Restoring lost copies (miyamoto.replicas.restore): the planning functions called
directly, as plain functions of what they read (the sibling machine's door tests in
test_siblings.py drive them through ``Siblings.step``)."""

from __future__ import annotations

import pytest

from miyamoto.replicas import messages as m
from miyamoto.replicas import restore
from miyamoto.replicas.effects import Restore, SetReplicas
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send

pytestmark = pytest.mark.timeout(30)

OFFSET = 5.0


def _copy(replica: int = 1, **kw) -> Task:
    return Task(id="t1", queue="q", url="http://w/", replicas=("a", "b", "c"),
                replica=replica, fire_at=105.0, **kw)


def _plan(t: Task) -> Restore:
    """b restores a's copy of ``t`` on d (the only free member)."""
    (plan,) = restore.plan_restores("b", frozenset({"b", "c", "d"}), {"a"}, [t], OFFSET)
    assert plan.replicas == ("d", "b", "c")
    return plan


def _news(effects: list) -> list:
    """What the new holder d is told (after SetReplicas and the old holders' REPLICAS)."""
    assert effects[:2] == [SetReplicas("t1", ("d", "b", "c")),
                           Send("c", m.Replicas("t1", ("d", "b", "c")))]
    return effects[2:]


@pytest.mark.parametrize("history", [
    ({"attempt": 1, "status": 500},),
    ({"attempt": 1, "status": 503}, {"attempt": 2, "status": 500}),
], ids=["one-attempt", "two-attempts"])
def test_a_retry_meanwhile_tells_the_new_holder_the_latest_attempt(history):
    """Planned from a copy before its attempt ended, stored after that attempt failed:
    the RETRY carries the newest history entry (history is oldest first), the one the
    old holders heard of and the new copy never saw."""
    n = len(history)
    before = _copy(attempts=n - 1, history=history[:-1])
    plan = _plan(before)
    now_copy = before.evolve(attempts=n, history=history, fire_at=104.0,
                             last={"status": 500})
    effects = restore.restored("b", plan, now_copy, lease=90.0, now=101.0)
    assert _news(effects) == [Send("d", m.Retry("t1", 1, 3.0, n, {"status": 500},
                                                history[-1]))]


def test_a_running_copy_held_by_a_worker_claims_held_and_one_not_held_does_not():
    """A copy a worker holds (its 202 accepted attempt) tells the new holder its claim
    is ``held``: it outlives the claimer's process; a plain running copy's does not."""
    before = _copy()
    plan = _plan(before)
    held = before.evolve(state=State.RUNNING, attempts=1, accepted=1)
    assert _news(restore.restored("b", plan, held, lease=90.0, now=101.0)) == \
        [Send("d", m.Claim("t1", 1, 90.0, held=True))]
    plain = before.evolve(state=State.RUNNING, attempts=1)
    assert _news(restore.restored("b", plan, plain, lease=90.0, now=101.0)) == \
        [Send("d", m.Claim("t1", 1, 90.0, held=False))]
