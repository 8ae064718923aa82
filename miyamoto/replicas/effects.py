"""What the sibling machine asks the cluster layer to do: plain values, no behaviour.

``Siblings.step`` (``miyamoto.replicas.siblings``) decides and returns a ``Ready``: the
effects, in the order they are to be carried out, and the answer to the event where it
has one. ``miyamoto.cluster.layer`` carries them out against the engine and the outbox,
and the simulator (``tests/sim/siblings_sim.py``) against its model of a node. Keeping them
as data is what lets both run the same decisions; the set is closed, so a carrier that
meets a kind it does not know fails loudly instead of dropping it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from miyamoto.replicas import messages as m
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send


class Move(enum.Enum):
    """How an ``Update`` moves a copy's fire time."""
    LATER = "later"      # only ever later: a hold
    EXACT = "exact"      # to this time: a sibling's retry, a released claim
    EARLIER = "earlier"  # only ever earlier: a leaver's hand-off


@dataclass(frozen=True, slots=True)
class Update:
    """Bring this node's copy in step: a new fire time (moved as ``how`` says), a state
    a sibling reached, its attempts and last response. Applies only to a live copy; a
    copy that is running keeps running."""
    id: str
    at: float | None = None
    how: Move = Move.LATER
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
    """Forget this node's copy (live, or the record of an ended one): the task was
    re-homed while this node was away."""
    id: str


@dataclass(frozen=True, slots=True)
class SetReplicas:
    """The task's replica set is now ``replicas`` (this node still holds a copy)."""
    id: str
    replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Restore:
    """Store ``copies`` (new copies of a task that lost some) on their holders; once
    all are stored, step ``events.Restored`` with the task as it is then."""
    id: str
    replicas: tuple[str, ...]
    copies: tuple[Task, ...]


@dataclass(frozen=True, slots=True)
class RestoreLost:
    """Members ``lost`` are gone: walk every live copy, memory's and the journal's, a
    page at a time, stepping ``events.LostPage`` with each (the machine plans the
    restores; the walk is the caller's, since most copies may be only on disk)."""
    lost: frozenset[str]


@dataclass(frozen=True, slots=True)
class AskWhenPaged:
    """This node is back in touch: every copy written to the journal so far asks its
    siblings first when it is paged in (step ``events.Reloaded`` with those)."""


@dataclass(frozen=True, slots=True)
class Reconcile:
    """This node is back after it may have been dropped (a restart, a drop from the
    roster, a long time out of touch): walk every copy it holds, the journal's too,
    live or ended, a page at a time, stepping ``events.Reconciling`` with each; the
    machine probes their siblings for what happened meanwhile (an end, a move)."""


@dataclass(frozen=True, slots=True)
class TakeEnd:
    """Our ended copy is of an earlier run than a sibling's, which ended too (the task
    was rerun and ended again while we were away): take that run's end."""
    id: str
    state: State
    reruns: int
    attempts: int
    last: dict | None
    finished: float  # our clock


@dataclass(frozen=True, slots=True)
class JoinRun:
    """Our ended copy is of an earlier run than a sibling's live one (the task was rerun
    while we were away): run ours again, in run ``reruns``, as a rerun does each copy."""
    id: str
    reruns: int


@dataclass(frozen=True, slots=True)
class MoveLone:
    """On a graceful stop: store these copies, which have no live sibling, elsewhere."""
    copies: tuple[Task, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    """News that came before our copy was stored: step it now as if just received
    (with the copy as it is once the effects before this one are carried out)."""
    sender: str
    msg: m.SiblingNews


@dataclass(frozen=True, slots=True)
class Refresh:
    """Send sibling ``to`` this node's copy's version (its last replace: params, body,
    content_type, eta, revision) by the replace path: its copy asked with an older one."""
    id: str
    to: str


Effect = (Send | Update | Fire | CancelCopy | Drop | SetReplicas | Restore | RestoreLost
          | AskWhenPaged | Reconcile | TakeEnd | JoinRun | MoveLone | Replay | Refresh)


@dataclass(frozen=True, slots=True)
class Ready:
    """What one step decided: ``effects`` to carry out in order, and for ``events.Due``
    the answer ``go`` (deliver the copy now, after sending the effects' CLAIMs), for
    ``events.Folded`` the round ``n`` its STOREs carry (0: none)."""
    effects: tuple[Effect, ...] = ()
    go: bool = False
    n: int = 0
