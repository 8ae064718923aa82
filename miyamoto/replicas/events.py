"""What the cluster layer tells the sibling machine: one frozen dataclass per kind of event.

``Siblings.step(event, now)`` is the machine's one door (as etcd raft's ``Step``): the
caller hands it what happened, with the copies it needs read from the engine, and
carries out the ``Ready`` it gets back (``miyamoto.replicas.effects``). The set is
closed; the order of the work that follows an event is the machine's, not the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from miyamoto.replicas import messages as m
from miyamoto.replicas.effects import Restore
from miyamoto.tasks.task import Task

EMPTY: Mapping[str, Task] = MappingProxyType({})  # none given: nothing is pruned or forgotten


@dataclass(frozen=True)
class Tick:
    """Time passes. ``contact``: this node hears a majority of the roster now; ``live``:
    its live copies (read seldom: on a change of contact, for a lost claimer's copies,
    to prune marks). Lost members' consequences follow here, once in contact."""
    contact: bool
    live: Mapping[str, Task] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class Members:
    """The roster changed: its ``members``, their ``zones`` (member -> failure domain,
    where a restore puts new copies), ``live``: the ids of this node's live copies,
    ``incarnations``: member -> the incarnation the roster names (a new one: it restarted,
    and the claims of its earlier one are void)."""
    members: tuple[str, ...]
    live: Iterable[str] = ()
    zones: Mapping[str, str] = field(default_factory=dict)
    incarnations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """A sibling's message about task ``msg.id``; ``copy`` is our live copy, if any
    (for ASK: our copy or its ended record); ``behind``: another task of the copy's
    ordering key comes first in our line of that key (``engine.ordering``)."""
    sender: str
    msg: m.SiblingNews
    copy: Task | None
    behind: bool = False


@dataclass(frozen=True)
class HandoffReceived:
    """A sibling stopping gracefully hands us its due copies."""
    sender: str
    msg: m.Handoff


@dataclass(frozen=True)
class Due:
    """Our copy is due (``deadline``: how long its attempt may take). The answer is
    ``Ready.go``: deliver it now, or hold it (its siblings' answers fire it again)."""
    copy: Task
    deadline: float


@dataclass(frozen=True)
class Expiring:
    """Our due copy's expiry has come while it waits to start. ``Ready.go``: it may end
    as expired now; else a sibling we answered ``go`` (or that claimed) may be
    delivering it, and the copy is pushed back past that claim (an ``Update``), to be
    judged again when due: a task a sibling started is not expired under it."""
    copy: Task


@dataclass(frozen=True)
class Folded:
    """Our new ``copy`` is about to be sent to its siblings in STOREs: if it is copy 0
    and due at once, its ASK rides in them (``Ready.n``: the round; 0: it asks when due).
    ``deadline``: how long its attempt may take (the ASK's lease, with claim_lease)."""
    copy: Task
    deadline: float


@dataclass(frozen=True)
class Outcome:
    """Our attempt ended with ``copy`` (succeeded, failed, or scheduled for a retry)."""
    copy: Task


@dataclass(frozen=True)
class LeaseExtended:
    """Our running ``copy``'s worker took it for ``lease`` more seconds (a long task's
    202, or its heartbeat): the siblings are claimed that long, so their copies wait."""
    copy: Task
    lease: float


@dataclass(frozen=True)
class Reloaded:
    """Copies read from the journal that the cluster may have handled without us (a
    restart, or paged in after this node was out of touch): each asks first. ``start``:
    the node's start reloaded them (its journal's every copy reconciles once back in
    touch, ``effects.Reconcile``)."""
    task_ids: tuple[str, ...]
    start: bool = False


@dataclass(frozen=True)
class Stored:
    """Our copy of ``task_id`` was just stored (or rerun): news that came before it
    is replayed."""
    task_id: str


@dataclass(frozen=True)
class LostPage:
    """A page of our live copies, for ``effects.RestoreLost``: members ``lost`` are
    gone; the tasks among these that lost copies, and that we restore, get new ones."""
    lost: frozenset[str]
    copies: tuple[Task, ...]


@dataclass(frozen=True)
class Restored:
    """The new copies of ``plan`` are all stored; ``copy`` is our copy as it is now,
    ``deadline`` how long its attempt may take (if it is running)."""
    plan: Restore
    copy: Task | None
    deadline: float


@dataclass(frozen=True)
class Reconciling:
    """A page of the copies this node held when it came back (``effects.Reconcile``),
    live and ended, as the engine has them now: each asks its live siblings, by probe,
    whether its task ended or moved meanwhile."""
    copies: tuple[Task, ...]


@dataclass(frozen=True)
class Stopping:
    """A graceful stop: hand our scheduled ``copies`` to their next live siblings."""
    copies: tuple[Task, ...]


Event = (Tick | Members | Received | HandoffReceived | Due | Expiring | Folded | Outcome
         | LeaseExtended | Reloaded | Stored | LostPage | Restored | Reconciling | Stopping)
