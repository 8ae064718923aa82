"""Restoring lost copies and handing copies off on a graceful stop: pure planning.

Decisions of the sibling machine (``miyamoto.replicas.siblings``, their only caller),
kept apart as plain functions of what they read (this node's id, the roster, an offset)
because they keep no state and are tested as such: the first live replica of a task
that lost copies restores them on the next ring members, each new copy keeping its
distance in offsets; a stopping node tells each due copy's next live sibling to fire at
its time, and stores elsewhere the copies that have none.
"""

from __future__ import annotations

from typing import Container, Iterable, Mapping

from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.replicas.effects import Restore, SetReplicas
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send

HANDOFF_CHUNK = 500  # copies named in one HANDOFF


# ------------------------------------------------------------ restoring copies
def plan_restores(me: str, members: frozenset[str], lost: frozenset[str] | set[str],
                  copies: Iterable[Task], offset: float,
                  zones: Mapping[str, str] | None = None,
                  must_ask: Container[str] = frozenset()) -> list[Restore]:
    """New copies for the tasks that lost some, where ``me`` is the restorer; a new
    copy goes to a zone that holds none of the task's copies where there is one. Not
    from a copy that must ask (its node was away): the lost member may have delivered
    the task meanwhile, and a new copy made from our stale one would answer ``go``."""
    ring = sorted(members)
    plans: list[Restore] = []
    for t in copies:
        if t.state.ended or t.id in must_ask or not lost.intersection(t.replicas) or \
                replication.restorer(t.replicas, set(members)) != me:
            continue
        replicas, new = t.replicas, []
        for gone in [r for r in t.replicas if r in lost]:
            sub = replication.replacement(ring, replicas, gone, zones)
            if sub is not None:
                replicas = tuple(sub if r == gone else r for r in replicas)
                new.append(replicas.index(sub))
        if new:
            n = len(replicas)
            plans.append(Restore(t.id, replicas, tuple(
                t.evolve(replicas=replicas, replica=i, state=State.SCHEDULED,
                         fire_at=replication.sibling_fire_at(t.fire_at, i, t.replica, n,
                                                             offset))
                for i in new)))
    return plans


def restored(me: str, r: Restore, now_copy: Task | None,
             lease: float, now: float) -> list[SetReplicas | Send]:
    """The new copies are stored: switch to the new replica set, tell the old holders,
    and tell the new ones what happened to the task while they were being stored
    (``lease``: a running copy's claim, its attempt's deadline plus the claim lease).
    An attempt that ended in a retry meanwhile is news too: its RETRY went to the old
    holders only, and a new copy made from the running one fired at once and delivered
    that attempt again, early (retry_delays [1, 3] under kill -9: the worker saw the
    second attempt twice, 0.9 s apart)."""
    new_holders = {c.replicas[c.replica] for c in r.copies}
    effects: list[SetReplicas | Send] = [SetReplicas(r.id, r.replicas)]
    effects += [Send(h, m.Replicas(r.id, r.replicas)) for h in r.replicas
                if h != me and h not in new_holders]
    news: m.Claim | m.Done | m.Failed | m.Cancel | m.Retry | None = None
    if now_copy is not None and now_copy.state == State.SCHEDULED and \
            any(c.attempts < now_copy.attempts for c in r.copies):
        attempt = now_copy.history[-1] if now_copy.history else None
        news = m.Retry(r.id, now_copy.replica, max(0.0, now_copy.fire_at - now),
                       now_copy.attempts, now_copy.last, attempt)
    elif now_copy is not None and now_copy.state == State.RUNNING:
        news = m.Claim(r.id, now_copy.replica, lease, held=now_copy.accepted > 0)
    elif now_copy is not None and now_copy.state == State.SUCCEEDED:
        news = m.Done(r.id, now_copy.attempts, now_copy.last)
    elif now_copy is not None and now_copy.state in (State.FAILED, State.EXPIRED):
        news = m.Failed(r.id, now_copy.attempts, now_copy.last,
                        expired=now_copy.state == State.EXPIRED)
    elif now_copy is not None and now_copy.state.ended:
        news = m.Cancel(r.id)
    if news is not None:
        effects += [Send(h, news) for h in sorted(new_holders)]
    return effects


# ------------------------------------------------------------ a graceful stop
def handoff_plan(me: str, members: frozenset[str], copies: Iterable[Task],
                 now: float) -> tuple[list[Send], list[Task]]:
    """On a graceful stop: HANDOFFs telling each scheduled copy's next live sibling
    to fire at our time, and the copies with no live sibling (to store elsewhere)."""
    plan: dict[str, list[tuple[str, float]]] = {}
    lone: list[Task] = []
    for t in copies:
        if t.state != State.SCHEDULED:
            continue
        n = len(t.replicas)
        nxt = next((t.replicas[(t.replica + k) % n] for k in range(1, n)
                    if t.replicas[(t.replica + k) % n] in members
                    and t.replicas[(t.replica + k) % n] != me), None)
        if nxt is None:
            lone.append(t)
        else:
            plan.setdefault(nxt, []).append((t.id, max(0.0, t.fire_at - now)))
    sends = [Send(to, m.Handoff(tuple(items[i:i + HANDOFF_CHUNK])))
             for to, items in plan.items() for i in range(0, len(items), HANDOFF_CHUNK)]
    return sends, lone
