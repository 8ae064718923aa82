"""What the sibling protocol asks the cluster layer to do: plain values, no behaviour.

``miyamoto.replicas.siblings`` decides; ``miyamoto.cluster.coordinator`` carries these out against the
engine and the outbox, and the simulator (``tests/sim/siblings_sim.py``) against its model
of a node. Keeping them as data is what lets both run the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from miyamoto.tasks.task import State, Task

LATER, EXACT, EARLIER = "later", "exact", "earlier"


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` (a ``miyamoto.wire.messages`` dataclass) to member ``to``."""
    to: str
    msg: Any


@dataclass(frozen=True, slots=True)
class Update:
    """Bring this node's copy in step: a new fire time (``how``: only ever later, set
    exactly, or only ever earlier), a state a sibling reached, its attempts and last
    response. Applies only to a live copy; a copy that is running keeps running."""
    id: str
    at: float | None = None
    how: str = LATER
    state: State | None = None
    attempts: int | None = None
    last: dict | None = None
    attempt: dict | None = None  # the sibling's attempt, for our copy's history


@dataclass(frozen=True, slots=True)
class Fire:
    """Run this node's copy now if it is due (its siblings acknowledged its claim).
    Not a change of the copy: nothing is written, the copy is only timed again."""
    id: str


@dataclass(frozen=True, slots=True)
class CancelCopy:
    """Cancel this node's copy (``abort``: the enqueue was refused, free its name)."""
    id: str
    abort: bool = False


@dataclass(frozen=True, slots=True)
class Drop:
    """Forget this node's copy: the task was re-homed while this node was away."""
    id: str


@dataclass(frozen=True, slots=True)
class SetReplicas:
    """The task's replica set is now ``replicas`` (this node still holds a copy)."""
    id: str
    replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Restore:
    """Store ``copies`` (new copies of a task that lost some) on their holders; once
    all are stored, call ``Siblings.restored`` with the task as it is then."""
    id: str
    replicas: tuple[str, ...]
    copies: tuple[Task, ...]
