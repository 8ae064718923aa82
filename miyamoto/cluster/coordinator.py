"""Storing copies: an enqueue's N copies, a lost member's restored copies, a stopping
node's lone copies; and this node's side of a peer's STORE.

An enqueue places its copies on the ring (``replication.place``), stores the local one
in this greenlet and the others with STORE/STORED, and answers once ``min_replicas``
are committed; otherwise every copy is cancelled (a CANCEL that overtakes its STORE is
kept and applied on arrival) and the client hears 503. A named task is stored on the
name's owner (its first copy) first, so racing enqueues of one name sent to different
nodes cannot both win, nor both lose.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Protocol

import gevent
import gevent.pool

from miyamoto.cluster.requests import Requests
from miyamoto.config.settings import Config
from miyamoto.engine.engine import Engine
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.tasks.task import State, Task

log = logging.getLogger(__name__)
# the times a copy from a peer carries on its clock (``admit`` moves them onto ours)
_PEER_TIMES = ("eta", "fire_at", "created", "expires_at")


class Members(Protocol):
    """What the coordinator needs of the cluster layer (``miyamoto.cluster.layer``)."""

    @property
    def zones(self) -> Mapping[str, str]:
        """member -> zone, for placement (``replication.spread``)."""

    def ring(self) -> tuple[str, ...]:
        """The roster's member ids: where copies go, whose STORE we take."""

    def send(self, member_id: str, msg: object) -> bool:
        """Queue a message for a member; False if it has no address."""

    def await_contact(self, timeout: float) -> bool:
        """In contact with a majority now, or within ``timeout``."""

    def replay(self, task_id: str) -> None:
        """Our copy was just stored: apply the siblings' news that came before it."""

    def fold(self, copy: Task) -> tuple[int, float]:
        """Our new copy is about to be sent to its siblings: the round of the ASK its
        STOREs carry (0: none; ``events.Folded``) and the lease that ASK names."""

    def clock_shift(self, peer: str) -> float:
        """What to take off a peer's wall time (one above 0: 0 is "not set") to put it
        on our clock."""


class Coordinator:
    def __init__(self, config: Config, engine: Engine, requests: Requests,
                 members: Members, cursor: int):
        self.config = config
        self.me = config.node
        self.engine = engine
        self.requests = requests
        self.members = members
        self.cursor = cursor  # the next unnamed task's first replica, on the ring
        self.enqueuing: dict[str, bool] = {}  # waiting enqueues: True once a copy is held
        self.stopping = False

    def stop_taking(self) -> None:
        """A graceful stop began: a peer's STORE is refused from now on (its sender stores
        the copy elsewhere), while this node hands its own copies away."""
        self.stopping = True

    # ------------------------------------------------------------ enqueue
    def enqueue(self, task: Task) -> Task:
        ring = self.members.ring()
        if self.me not in ring:
            raise Unavailable("this node is not (yet) a member of the cluster")
        # cut off, or back from a pause: its view may be stale
        if not self.members.await_contact(self.config.replication_timeout):
            raise Unavailable("this node cannot reach a majority of the cluster")
        replicas = replication.place(ring, self.config.replication, task, self.cursor,
                                     self.members.zones, first=self.me)
        if task.name is None:
            self.cursor += 1
        copies = replication.copies(task, replicas, self.config.replica_offset)
        need = min(self.config.min_replicas, len(copies))
        hold = need > 1  # our copy must not fire before the others confirm: 503 may come
        if not hold:
            return self._store_copies(task, copies, need, hold)
        # a copy of it restored here while we wait (its holder lost meanwhile) is held
        # like ours until the answer (settle); a refusal's abort then undoes it
        self.enqueuing[task.id] = False
        try:
            return self._store_copies(task, copies, need, hold)
        finally:
            if self.enqueuing.pop(task.id, False):
                self.engine.release(task.id)

    def _store_copies(self, task: Task, copies: list[Task], need: int, hold: bool) -> Task:
        stored: list[Task] = []
        try:
            self._store_all(task, copies, stored, hold)
        except Unavailable:  # our own journal refused: undo the copies sent elsewhere
            self.abort(copies)
            raise
        if len(stored) < need:
            self.abort(copies)
            raise Unavailable(f"stored on {len(stored)} of {len(copies)} replicas, "
                              f"{need} needed")
        if hold:
            for c in copies:
                if c.replicas[c.replica] == self.me:
                    self.engine.release(c.id)
        return copies[0]

    def _store_all(self, task: Task, copies: list[Task], stored: list[Task],
                   hold: bool) -> None:
        if task.ordering_key is not None:
            self._store_ordered(copies, stored, hold)
            return
        if task.name is None:
            stored += self.store(copies, hold)
            return
        try:
            stored += self.store(copies[:1], hold)
            stored += self.store(copies[1:], hold)
        except Duplicate:
            self.abort(copies)
            raise

    def _store_ordered(self, copies: list[Task], stored: list[Task], hold: bool) -> None:
        """An ordered task's first copy goes to its key's owner, which gives it its place
        in the key's line (``Engine.ordered``); the others follow with that place. Its
        owner unreachable, the task is refused (503): no other node may number it."""
        owner = copies[0].replicas[0]
        if owner == self.me:
            copies[0] = self.engine.ordered(copies[0])
        try:
            first = self.store(copies[:1], hold)
        except Duplicate:
            self.abort(copies)
            raise
        if not first or not first[0].ordering_seq:
            self.abort(copies)
            raise Unavailable(f"the owner of ordering key {copies[0].ordering_key!r} "
                              f"({owner}) did not take the task")
        seq = first[0].ordering_seq
        copies[:] = [c.evolve(ordering_seq=seq) for c in copies]
        stored += first
        try:
            stored += self.store(copies[1:], hold)
        except Duplicate:
            self.abort(copies)
            raise

    def abort(self, copies: list[Task]) -> None:
        """Undo a refused enqueue on every copy, releasing the name it reserved. A copy
        restored here while the enqueue waited (a sibling lost meanwhile) is undone
        too; one restored elsewhere, by the holders it was restored from."""
        self.engine.abort(copies[0].id)  # ours, placed or restored (a no-op if none)
        for c in copies:
            holder = c.replicas[c.replica]
            if holder != self.me:
                self.members.send(holder, m.Cancel(c.id, abort=True))

    def store(self, copies: list[Task], hold: bool = False) -> list[Task]:
        """Store copies (the local one in this greenlet, remote ones by STORE); return
        those stored. Duplicate if a holder refused a copy for its name."""
        if not copies:
            return []
        remote = [c for c in copies if c.replicas[c.replica] != self.me]
        local = [c for c in copies if c.replicas[c.replica] == self.me]
        first = next((c for c in local if c.replica == 0), None) if remote else None
        if first is not None and first.ordering_key is not None:
            first = None  # it starts when its key's line lets it: it asks then
        ask, lease = self.members.fold(first) if first is not None else (0, 0.0)
        call = self.requests.send({
            i: (c.replicas[c.replica],
                lambda req, to, c=c: m.Store(req, to, c.encode(), ask, lease))
            for i, c in enumerate(remote)})
        stored: list[Task] = []
        duplicate: str | None = None
        try:
            for c in local:
                try:
                    self.engine.add(c, wait=True, hold=hold)
                    stored.append(c)
                    self.members.replay(c.id)
                except Duplicate as e:
                    duplicate = e.original_id
        finally:
            answers = self.requests.collect(call, self.config.replication_timeout)
        for i, answer in answers.items():
            if isinstance(answer, m.Stored) and answer.ok:
                stored.append(remote[i].evolve(ordering_seq=answer.seq) if answer.seq
                              and not remote[i].ordering_seq else remote[i])
            elif isinstance(answer, m.Stored) and answer.duplicate is not None:
                duplicate = answer.duplicate
        if duplicate is not None:
            raise Duplicate(duplicate)
        return stored

    def store_quietly(self, task: Task) -> None:
        """A callback task: stored like any other, its refusal only logged."""
        try:
            self.enqueue(task)
        except (Unavailable, Duplicate) as e:
            log.warning("cluster: callback task %s not stored: %s", task.id, e)

    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]:
        def one(t: Task) -> dict[str, Any]:
            try:
                s = self.enqueue(t)
                return {"status": "scheduled", "id": s.id, "queue": s.queue, "eta": s.eta,
                        "name": s.name, "replicas": list(s.replicas)}
            except Duplicate as e:
                return {"status": "duplicate", "id": e.original_id, "name": t.name}
            except Unavailable as e:
                return {"status": "error", "id": t.id, "name": t.name, "error": str(e)}
        # the tasks of one ordering key go one after another, in the list's order (their
        # owner numbers them as they come); the rest, and other keys, side by side
        results: list[dict[str, Any]] = [{} for _ in tasks]
        lines: dict[tuple[str, str], list[int]] = {}
        units: list[list[int]] = []
        for i, t in enumerate(tasks):
            if t.ordering_key is None:
                units.append([i])
            else:
                lines.setdefault((t.queue, t.ordering_key), []).append(i)

        def run(unit: list[int]) -> None:
            for i in unit:
                results[i] = one(tasks[i])
        gevent.pool.Pool(64).map(run, units + list(lines.values()))
        return results

    # ------------------------------------------------------------ a peer's STORE
    # A peer's STOREs are taken in two halves: ``admit``, in the receive loop as each is
    # read (checked, handed to the journal, so an ASK read right after it finds the copy
    # and answers for it), and ``settle``, in one greenlet per batch of STOREs read in one
    # go: one waited commit for all of them, then a STORED for each.
    def admit(self, sender: str, msg: m.Store) -> Task | m.Stored | None:
        """A peer's copy, handed to the journal; or the answer at once (a refusal), or
        None (the message is dropped)."""
        try:
            task = Task.decode(msg.task)
        except ValueError as e:
            log.warning("cluster: dropped STORE from %r: %s", sender[:64], e)
            return None
        if not task.replicas or task.replicas[task.replica] != self.me:
            log.warning("cluster: dropped STORE from %r: a copy that is not this node's",
                        sender[:64])
            return None
        if sender not in self.members.ring():
            # a node out of the roster enqueues on a stale view (back from a pause, cut
            # off): its copies' news would not reach it, so take none of them
            return m.Stored(msg.req, task.id, False, error="not a member")
        if self.stopping:
            return m.Stored(msg.req, task.id, False, error="stopping")
        # the copy's times are on the sender's clock: fire it by ours
        changes: dict[str, Any] = {} if task.state == State.SCHEDULED else \
            {"state": State.SCHEDULED}
        shift = self.members.clock_shift(sender)
        if shift:
            changes.update({k: t - shift for k in _PEER_TIMES
                            if (t := getattr(task, k) or 0) > 0})
        copy = self.engine.ordered(task.evolve(**changes) if changes else task)
        try:
            held = self.engine.admit(copy)
            if held is not copy:  # a repeat of a copy held already
                return m.Stored(msg.req, task.id, True, seq=held.ordering_seq)
        except Duplicate as e:
            return m.Stored(msg.req, task.id, False, duplicate=e.original_id)
        except Exception as e:  # a full disk must reach the coordinator as a refusal
            log.error("cluster: could not store %s: %s", task.id, e)
            return m.Stored(msg.req, task.id, False, error=type(e).__name__)
        return copy

    def settle(self, admitted: list[tuple[m.Store, Task]],
               answer: Callable[[str], m.Answer | None] = lambda task_id: None,
               ) -> list[tuple[m.Store, m.Stored]]:
        """Commit the admitted copies (one wait for all); each STORE's answer, carrying
        ``answer(task id)`` (to the ASK the STORE carried) where it was stored; a copy
        not stored asks for its answer too, and sends none."""
        tasks = [t for _, t in admitted]
        held = [t for t in tasks if t.id in self.enqueuing]
        timed = tasks
        try:
            if held:  # restored here while our own enqueue of it waits: not timed yet
                for t in held:
                    self.enqueuing[t.id] = True
                self.engine.settle(held, hold=True)
                timed = [t for t in tasks if t.id not in self.enqueuing]
            if timed:
                self.engine.settle(timed)
        except Exception as e:
            log.error("cluster: could not store %d copies: %s", len(tasks), e)
            for t in tasks:
                answer(t.id)  # not stored: its answer is not sent
            return [(msg, m.Stored(msg.req, t.id, False, error=type(e).__name__))
                    for msg, t in admitted]
        for t in tasks:
            self.members.replay(t.id)
        return [(msg, m.Stored(msg.req, t.id, True, answer=answer(t.id), seq=t.ordering_seq))
                for msg, t in admitted]

    # ------------------------------------------------------------ a graceful stop
    def move_lone_copies(self, lone: list[Task]) -> None:
        """On a graceful stop, store elsewhere the tasks that have no live sibling copy
        (replication 1, or their siblings are gone), so they do not wait for this node
        to come back. What cannot be moved within shutdown_timeout stays in the journal."""
        others = [mem for mem in self.members.ring() if mem != self.me]
        if not others or not lone:
            return
        moved = 0

        def move(i: int, t: Task) -> None:
            nonlocal moved
            copy = t.evolve(replicas=(others[i % len(others)],), replica=0)
            try:
                if self.store([copy]):
                    self.engine.drop(t.id)
                    moved += 1
            except Duplicate:  # the target already holds it under that name
                self.engine.drop(t.id)

        pool = gevent.pool.Pool(128)
        with gevent.Timeout(self.config.shutdown_timeout, False):
            for i, t in enumerate(lone):
                pool.spawn(move, i, t)
            pool.join()
        pool.kill()
        log.info("cluster: moved %d of %d tasks without a live sibling", moved, len(lone))
