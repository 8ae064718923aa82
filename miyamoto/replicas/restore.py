"""Restoring lost copies and handing copies off on a graceful stop: pure planning.

These are decisions of the sibling protocol (``miyamoto.replicas.siblings``) that read its view
(this node's id, the roster, the timings) but keep no state of their own: the first
live replica of a task that lost copies restores them on the next ring members, each
new copy keeping its distance in offsets; a stopping node tells each due copy's next
live sibling to fire at its time, and stores elsewhere the copies that have none.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.replicas.effects import Restore, Send, SetReplicas
from miyamoto.replicas.siblings import Siblings
from miyamoto.tasks.task import State, Task

HANDOFF_CHUNK = 500  # copies named in one HANDOFF


# ------------------------------------------------------------ restoring copies
def plan_restores(s: Siblings, lost: set[str], copies: Iterable[Task], now: float,
                  zones: Mapping[str, str] | None = None) -> list[Any]:
    """New copies for the tasks that lost some, where this node is the restorer; a new
    copy goes to a zone that holds none of the task's copies where there is one. Not
    from a copy that must ask (its node was away): the lost member may have delivered
    the task meanwhile, and a new copy made from our stale one would answer ``go``."""
    ring = sorted(s.members)
    effects: list[Any] = []
    for t in copies:
        if t.state.ended or t.id in s.must_ask or not lost.intersection(t.replicas) or \
                replication.restorer(t.replicas, set(s.members)) != s.me:
            continue
        replicas, new = t.replicas, []
        for gone in [r for r in t.replicas if r in lost]:
            sub = replication.replacement(ring, replicas, gone, zones)
            if sub is not None:
                replicas = tuple(sub if r == gone else r for r in replicas)
                new.append(replicas.index(sub))
        if new:
            n = len(replicas)
            effects.append(Restore(t.id, replicas, tuple(
                t.evolve(replicas=replicas, replica=i, state=State.SCHEDULED,
                         fire_at=replication.sibling_fire_at(t.fire_at, i, t.replica, n,
                                                             s.t.offset))
                for i in new)))
    return effects

def restored(s: Siblings, r: Restore, now_copy: Task | None, deadline: float) -> list[Any]:
    """The new copies are stored: switch to the new replica set, tell the old holders,
    and tell the new ones what happened to the task while they were being stored."""
    new_holders = {c.replicas[c.replica] for c in r.copies}
    effects: list[Any] = [SetReplicas(r.id, r.replicas)]
    effects += [Send(h, m.Replicas(r.id, r.replicas)) for h in r.replicas
                if h != s.me and h not in new_holders]
    news: Any = None
    if now_copy is not None and now_copy.state == State.RUNNING:
        news = m.Claim(r.id, now_copy.replica, deadline + s.t.claim_lease)
    elif now_copy is not None and now_copy.state.ended:
        kind = {State.SUCCEEDED: m.Done, State.FAILED: m.Failed}.get(now_copy.state)
        news = kind(r.id, now_copy.attempts, now_copy.last) if kind else m.Cancel(r.id)
    if news is not None:
        effects += [Send(h, news) for h in sorted(new_holders)]
    return effects

# ------------------------------------------------------------ a graceful stop
def handoff_plan(s: Siblings, copies: Iterable[Task], now: float) -> tuple[list[Send], list[Task]]:
    """On a graceful stop: HANDOFFs telling each scheduled copy's next live sibling
    to fire at our time, and the copies with no live sibling (to store elsewhere)."""
    plan: dict[str, list[tuple[str, float]]] = {}
    lone: list[Task] = []
    for t in copies:
        if t.state != State.SCHEDULED:
            continue
        n = len(t.replicas)
        nxt = next((t.replicas[(t.replica + k) % n] for k in range(1, n)
                    if t.replicas[(t.replica + k) % n] in s.members
                    and t.replicas[(t.replica + k) % n] != s.me), None)
        if nxt is None:
            lone.append(t)
        else:
            plan.setdefault(nxt, []).append((t.id, max(0.0, t.fire_at - now)))
    sends = [Send(to, m.Handoff(tuple(items[i:i + HANDOFF_CHUNK])))
             for to, items in plan.items() for i in range(0, len(items), HANDOFF_CHUNK)]
    return sends, lone
