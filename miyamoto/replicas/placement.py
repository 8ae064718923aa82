"""Where a task's copies live and when each fires: pure functions, no I/O.

Placement: an unnamed task's first copy stays on the node that took the enqueue
(``first``: no STORE hop for it, and that node delivers), the others go to the next
ring members from a round-robin cursor (spreading load); without ``first``, all N are
consecutive members from the cursor. A named task goes to the N members that rank highest for
hash(queue, name, member) (rendezvous hashing), so two enqueues of one name meet on the
same nodes, where the first of them (the name's owner) refuses the second, and a roster
change moves a name's replicas by at most one member. A task with an ordering key is
placed so by (queue, key) instead: the key's owner holds the first copy of each of its
tasks and gives it its place in the key's line (``engine.ordering``). Copy i fires at eta + i * offset; when a sibling claims,
retries or hands off, every other copy keeps its distance, measured in ring steps from
that sibling (``rank``).

Failure domains: with ``zones`` (member -> zone), copies go to distinct zones whenever
the roster spans enough of them (``spread``): the order above still decides, but a
member whose zone already holds a copy is passed over while another zone has a
candidate. So a machine or rack that dies takes at most one copy of a task with it.
"""

from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

from miyamoto.tasks.task import Task


def place(ring: Sequence[str], n: int, task: Task, cursor: int,
          zones: Mapping[str, str] | None = None, first: str | None = None) -> tuple[str, ...]:
    """The replica set for a new task: min(n, len(ring)) distinct members, in fire order;
    an unnamed task's starts with ``first`` (the enqueuing node) when it is in the ring."""
    if not ring:
        return ()
    n = max(1, min(n, len(ring)))
    key = owner_key(task)
    if key is not None:
        # rendezvous hashing: each member's score for this name is fixed, so a member
        # joining or leaving moves a name's replica set by at most one member, and with
        # n >= 2 the set always keeps a member that holds the name (which refuses it);
        # with zones the top-ranked member (the name's owner) is always first
        order = ranked(ring, key)
    else:
        start = cursor % len(ring)
        order = [ring[(start + i) % len(ring)] for i in range(len(ring))]
        if first is not None and first in ring:
            order.remove(first)
            order.insert(0, first)
    return spread(order, n, zones or {})


def owner_key(task: Task) -> bytes | None:
    """What a task's copies are placed by, if not by the cursor: an ordered task's key
    (so every task of a key has its copy i on the same member, and the key's owner,
    the first, holds them all), else a named task's name."""
    if task.ordering_key is not None:
        return f"{task.queue}\x00{task.ordering_key}\x01".encode()
    if task.name is not None:
        return f"{task.queue}\x00{task.name}\x00".encode()
    return None


def ranked(ring: Sequence[str], key: bytes) -> list[str]:
    """The members in rendezvous order for ``key``: the first is its owner."""
    return sorted(ring, key=lambda m: hashlib.sha1(key + m.encode()).digest(), reverse=True)


def spread(order: Sequence[str], n: int, zones: Mapping[str, str],
           used: Sequence[str] = ()) -> tuple[str, ...]:
    """The first ``n`` of ``order``, passing over members of a zone that already holds a
    copy (of ``used`` or of those chosen) while another zone has a candidate."""
    seen = {zones.get(m, m) for m in used}
    first: list[str] = []
    rest: list[str] = []
    for m in order:
        z = zones.get(m, m)  # a member without a zone is a zone of its own
        (rest if z in seen else first).append(m)
        seen.add(z)
    return tuple((first + rest)[:n])


def copies(task: Task, replicas: tuple[str, ...], offset: float) -> list[Task]:
    """One copy per replica, copy i firing i offsets after the eta."""
    return [task.evolve(replicas=replicas, replica=i, fire_at=task.eta + i * offset)
            for i in range(len(replicas))]


def rank(mine: int, theirs: int, n: int) -> int:
    """How many offsets after copy ``theirs`` copy ``mine`` should fire (1..n-1)."""
    if n <= 1:
        return 0
    r = (mine - theirs) % n
    return r if r else n


def sibling_fire_at(base: float, mine: int, theirs: int, n: int, offset: float) -> float:
    """When copy ``mine`` fires, given that copy ``theirs`` fires (or is held) until ``base``."""
    return base + rank(mine, theirs, n) * offset


def replacement(ring: Sequence[str], replicas: tuple[str, ...], lost: str,
                zones: Mapping[str, str] | None = None) -> str | None:
    """A live member to take ``lost``'s place in ``replicas``: the first ring member after
    the lost one that holds no copy yet, in a zone that holds none if there is one; None
    if every member already holds one."""
    holders = set(replicas)
    candidates = sorted(m for m in ring if m not in holders)
    if not candidates:
        return None
    order = [m for m in candidates if m > lost] + [m for m in candidates if m <= lost]
    kept = [r for r in replicas if r != lost]
    return spread(order, 1, zones or {}, used=kept)[0]


def restorer(replicas: tuple[str, ...], alive: set[str]) -> str | None:
    """The surviving holder that restores lost copies: the first live one in fire order."""
    for r in replicas:
        if r in alive:
            return r
    return None
