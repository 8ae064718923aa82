"""The cluster layer: carries out what membership and replication decide.

It owns the transport (ZeroMQ) and the membership state machine, ticks the latter,
and turns messages into engine calls. Enqueues go through here: the task's copies are
placed on the ring (``replication.place``), stored with STORE/STORED, and the client
hears 200 once ``min_replicas`` copies are committed. While a copy runs its siblings
hear CLAIM, then DONE, RETRY or FAILED. Queries that a node cannot answer alone (a
task held elsewhere, cluster-wide counts, pause/purge) go to every member as REQUEST
and come back as REPLY. A node with no peers is a cluster of one: the same code paths,
all local.

Peers are untrusted input: every handler checks the payload's shape and drops what
does not fit, logging it; nothing a peer sends can raise out of ``_on_message``.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import time
import uuid
from typing import Any, Callable, Iterable

import gevent
import gevent.pool
import gevent.queue

from miyamoto import replication
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.membership import Member, Membership, Roster, Send, Timing
from miyamoto.outbox import Outbox, unbatch
from miyamoto.protocol import DecodeError, Verb
from miyamoto.task import State, Task
from miyamoto.transport import CurveKeys, Transport

log = logging.getLogger(__name__)

_MEMBERSHIP = frozenset({Verb.JOIN, Verb.REDIRECT, Verb.ROSTER, Verb.HEARTBEAT,
                         Verb.HEARTBEAT_ACK, Verb.VOTE_REQUEST, Verb.VOTE, Verb.LEAVE})
_ORDER = {"succeeded": 4, "failed": 4, "cancelled": 4, "running": 2, "scheduled": 1}
HANDOFF_CHUNK = 500
EARLY_MAX = 20_000  # sibling news held for copies not stored yet
EARLY_TTL = 120.0
EARLY_PER_TASK = 16
CLAIMS_MAX = 100_000  # claims heard whose outcome has not come yet
CONFIRM_RETRY = 0.5


class BadMessage(ValueError):
    pass


def _str(payload: dict, key: str) -> str:
    v = payload.get(key)
    if not isinstance(v, str) or not v or len(v) > 1000:
        raise BadMessage(f"{key} is not a string")
    return v


def _num(payload: dict, key: str) -> float:
    v = payload.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadMessage(f"{key} is not a finite number")
    return float(v)


def _int(payload: dict, key: str) -> int:
    v = payload.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadMessage(f"{key} is not an integer")
    return v


def _opt_dict(payload: dict, key: str) -> dict | None:
    v = payload.get(key)
    if v is not None and not isinstance(v, dict):
        raise BadMessage(f"{key} is not an object")
    return v


class Cluster:
    def __init__(self, node: Any):
        self.node = node
        self.engine = node.engine
        self.config = cfg = node.config
        self.me = cfg.node
        self.clock: Callable[[], float] = node.clock
        member = Member(cfg.node, cfg.advertise, cfg.http)
        timing = Timing(heartbeat_interval=cfg.heartbeat_interval,
                        failure_timeout=cfg.failure_timeout,
                        election_timeout_min=cfg.election_timeout_min,
                        election_timeout_max=cfg.election_timeout_max)
        seeds = [s for s in cfg.seeds if s not in (cfg.cluster, cfg.advertise)]
        # membership runs on the monotonic clock; a restarted node (its journal existed)
        # must not count as a first start in a bootstrap election
        self.membership = Membership(member, seeds, timing, random.Random(), time.monotonic(),
                                     first_start=not node.journal.existed)
        curve = CurveKeys(cfg.curve_public, cfg.curve_secret) if cfg.curve_public else None
        self.transport = Transport(cfg.node, cfg.cluster, self._on_message, curve=curve)
        self.group = gevent.pool.Group()
        self.outbox = Outbox(self.transport.send, self.group)
        self.pending: dict[str, gevent.queue.Queue] = {}
        self.cursor = random.randrange(1 << 30)
        self.roster: Roster = self.membership.roster
        # copies reloaded from the journal: confirm with a sibling before delivering,
        # since the cluster may have delivered (or re-homed) them while we were away
        self.unconfirmed: set[str] = set(self.engine.live) if seeds else set()
        self._left = False
        # a sibling may claim or finish a task before our copy of it is committed
        # (STORE and DONE travel on different connections): keep such news and apply
        # it once the copy is stored, so a finished task is never delivered twice
        # task id -> (claimer, its replica index): whose lease holds our copy back
        self.claims: dict[str, tuple[str, int]] = {}
        self.early: collections.OrderedDict[str, list[tuple[float, Verb, dict]]] = \
            collections.OrderedDict()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.transport.start()
        self.engine.hooks = _Hooks(self)
        self.engine.spawn_task = lambda t: self.group.spawn(self._store_quietly, t)
        self._roster_changed(None, self.membership.roster)
        self.group.spawn(self._tick_loop)

    def stop(self) -> None:
        self.group.kill()
        self.transport.stop()

    def leave(self) -> None:
        """Graceful stop: hand due copies to their next sibling at once, leave the roster."""
        if self._left:
            return
        self._left = True
        self.engine.scheduler.stop()
        handoff: dict[str, list[list]] = {}
        alive = set(self.roster.ids())
        for t in list(self.engine.live.values()):
            if t.state != State.SCHEDULED or len(t.replicas) < 2:
                continue
            n = len(t.replicas)
            for step in range(1, n):
                nxt = t.replicas[(t.replica + step) % n]
                if nxt in alive and nxt != self.me:
                    handoff.setdefault(nxt, []).append([t.id, t.fire_at])
                    break
        for member, items in handoff.items():
            for i in range(0, len(items), HANDOFF_CHUNK):
                self._send(member, Verb.HANDOFF, {"tasks": items[i:i + HANDOFF_CHUNK]})
        if handoff:
            log.info("cluster: handed %d copies to siblings", sum(map(len, handoff.values())))
        self._move_lone_copies(alive)
        self._send_all(self.membership.leave(time.monotonic()))
        gevent.sleep(0.05)  # let the sockets flush before the engine drains

    def _move_lone_copies(self, alive: set[str]) -> None:
        """On a graceful stop, store elsewhere the tasks that have no live sibling copy
        (replication 1, or their siblings are gone), so they do not wait for this node
        to come back. What cannot be moved within shutdown_timeout stays in the journal."""
        others = [m for m in self.roster.ids() if m != self.me]
        if not others:
            return
        lone = [t for t in self.engine.live.values() if t.state == State.SCHEDULED
                and not any(r in alive and r != self.me for r in t.replicas)]
        if not lone:
            return
        moved = 0

        def move(i: int, t: Task) -> None:
            nonlocal moved
            target = others[i % len(others)]
            copy = t.evolve(replicas=(target,), replica=0)
            try:
                if self._store([copy]):
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

    # ------------------------------------------------------------ membership
    def _tick_loop(self) -> None:
        period = max(0.01, min(0.1, self.config.heartbeat_interval / 4))
        while True:
            try:
                self._send_all(self.membership.tick(time.monotonic()))
                self._check_roster()
            except Exception:
                log.exception("cluster: tick failed")
            gevent.sleep(period)

    def _send_all(self, sends: Iterable[Send]) -> None:
        for s in sends:
            self.transport.send(s.to, s.address, s.verb, s.payload)

    def _check_roster(self) -> None:
        new = self.membership.roster
        if new != self.roster:
            old, self.roster = self.roster, new
            self._roster_changed(old, new)

    def _roster_changed(self, old: Roster | None, new: Roster) -> None:
        self.engine.dispatcher.set_share(max(1, len(new.members)))
        for m in new.members:
            if m.id != self.me:
                self.transport.connect(m.cluster)  # a first send to a new DEALER would fail
        if old is None:
            return
        log.info("cluster: roster v%d term %d leader %s members %s", new.version, new.term,
                 new.leader, ",".join(new.ids()))
        if self.me not in old.ids() and self.me in new.ids() and len(new.members) > 1:
            self.group.spawn(self._sync_pauses)
        if self.me in old.ids() and self.me not in new.ids():
            # the others may re-home and deliver our copies while we are out: check each
            # with a sibling before delivering it
            log.warning("cluster: this node was dropped from the roster")
            self.unconfirmed.update(self.engine.live)
        lost = set(old.ids()) - set(new.ids()) - {self.me}
        for member_id in lost:
            m = old.get(member_id)
            if m is not None:
                self.transport.forget(m.cluster)
        if lost and self.me in new.ids():
            self._release_claims(lost)
            self.group.spawn(self._restore, lost, new)

    def _sync_pauses(self) -> None:
        """On (re)joining, take the leader's paused/running queues: a pause or resume
        made while this node was away must hold here too."""
        leader = self.membership.leader
        source = leader if leader and leader != self.me else (self._others() or [None])[0]
        if source is None:
            return
        result = self._request_all("paused", {}, [source]).get(source)
        if not isinstance(result, dict):
            return
        for queue, paused in result.items():
            if isinstance(queue, str) and isinstance(paused, bool) and \
                    self.engine.dispatcher.view(queue).paused != paused:
                log.info("cluster: queue %s is %s cluster-wide", queue,
                         "paused" if paused else "running")
                self.engine.pause(queue, paused)

    def claim_payload(self, t: Task) -> dict[str, Any]:
        """CLAIM: hold the siblings off for this attempt's deadline plus the lease."""
        q = self.engine.queue_config(t.queue)
        until = self.clock() + (t.timeout or q.timeout) + self.config.claim_lease
        return {"id": t.id, "replica": t.replica, "until": until}

    def _catch_up(self, task_id: str, holders: set[str]) -> None:
        """Our copy may have been claimed or finished while the new copies were stored:
        tell their holders what the siblings listed before them already heard."""
        now = self.engine.live.get(task_id)
        if now is not None and now.state == State.RUNNING:
            news = (Verb.CLAIM, self.claim_payload(now))
        elif now is None and (ended := self.engine.get(task_id)) is not None:
            verb = {State.SUCCEEDED: Verb.DONE, State.FAILED: Verb.FAILED,
                    State.CANCELLED: Verb.CANCEL}.get(ended.state)
            if verb is None:
                return
            news = (verb, {"id": task_id, "attempts": ended.attempts, "last": ended.last})
        else:
            return
        for holder in holders:
            self._send(holder, *news)

    def _note_claim(self, task_id: str, claimer: str, replica: int) -> None:
        self.claims.pop(task_id, None)
        self.claims[task_id] = (claimer, replica)
        while len(self.claims) > CLAIMS_MAX:
            self.claims.pop(next(iter(self.claims)))

    def _release_claims(self, lost: set[str]) -> None:
        """Copies held off by a claim of a member that is gone fire again at their
        offset from now, instead of waiting out the dead claimer's lease."""
        now = self.clock()
        for task_id, (claimer, theirs) in list(self.claims.items()):
            if claimer not in lost:
                continue
            del self.claims[task_id]
            t = self.engine.live.get(task_id)
            if t is not None and t.state == State.SCHEDULED:
                fire = replication.sibling_fire_at(now, t.replica, theirs, len(t.replicas),
                                                   self.config.replica_offset)
                self.engine.apply_remote(task_id, state=State.SCHEDULED, fire_at=fire)

    def _restore(self, lost: set[str], roster: Roster) -> None:
        """Give every task that lost a copy a new one, if this node is its restorer.
        A new copy counts only once its holder answered STORED; until then (or if it
        never does) the task keeps its old replica set."""
        alive = set(roster.ids())
        ring = roster.ids()
        restored = 0

        def restore_one(t: Task) -> None:
            nonlocal restored
            t = self.engine.live.get(t.id)  # as it is now, not as it was listed
            if t is None or t.state.ended:
                return
            replicas = t.replicas
            new_copies = []
            for gone in [r for r in t.replicas if r in lost]:
                sub = replication.replacement(ring, replicas, gone)
                if sub is None:
                    continue
                replicas = tuple(sub if r == gone else r for r in replicas)
                new_copies.append((sub, replicas.index(sub)))
            if not new_copies:
                return
            n = len(replicas)
            copies = [t.evolve(replicas=replicas, replica=index, state=State.SCHEDULED,
                               fire_at=replication.sibling_fire_at(
                                   t.fire_at, index, t.replica, n, self.config.replica_offset))
                      for _, index in new_copies]
            try:
                stored = self._store(copies)
            except Duplicate:  # the new holder has the name reserved: it is not ours
                stored = []
            if len(stored) < len(copies):
                log.warning("cluster: could not restore every copy of %s", t.id)
                return
            self.engine.set_replicas(t.id, replicas, self.me)
            new_holders = {s for s, _ in new_copies}
            for r in replicas:
                if r != self.me and r not in new_holders:
                    self._send(r, Verb.REPLICAS, {"id": t.id, "replicas": list(replicas)})
            self._catch_up(t.id, new_holders)
            restored += 1

        pool = gevent.pool.Pool(64)
        for t in list(self.engine.live.values()):
            if lost.intersection(t.replicas) and \
                    replication.restorer(t.replicas, alive) == self.me:
                pool.spawn(restore_one, t)
        pool.join()
        if restored:
            log.info("cluster: restored copies of %d tasks lost with %s", restored,
                     ",".join(sorted(lost)))

    # ------------------------------------------------------------ sending
    def _address(self, member_id: str) -> str | None:
        if member_id == self.me:
            return self.config.advertise
        m = self.roster.get(member_id)
        return m.cluster if m is not None else None

    def _send(self, member_id: str, verb: Verb, payload: dict, address: str | None = None,
              on_fail: Callable[[], Any] | None = None) -> bool:
        """Queue a message for a member (batched per peer); False if it has no address.
        on_fail runs if the batch holding it cannot be sent."""
        address = address or self._address(member_id)
        if address is None:
            return False
        self.outbox.put(member_id, address, verb, payload, on_fail)
        return True

    def _siblings(self, t: Task, verb: Verb, payload: dict) -> None:
        for r in t.replicas:
            if r != self.me:
                self._send(r, verb, payload)

    def _others(self) -> list[str]:
        return [m for m in self.roster.ids() if m != self.me]

    # ------------------------------------------------------------ requests
    def _send_requests(self, asks: dict[Any, tuple[str, Verb, dict]]
                       ) -> tuple[gevent.queue.Queue, dict[str, Any]]:
        """Send each request (key -> member, verb, payload) with a fresh req id; answers
        (or stand-ins for unreachable members) arrive on the returned queue."""
        q: gevent.queue.Queue = gevent.queue.Queue()
        reqs: dict[str, Any] = {}
        for key, (member, verb, payload) in asks.items():
            req = uuid.uuid4().hex
            reqs[req] = key
            self.pending[req] = q
            fail = _failer(q, req)
            if not self._send(member, verb, dict(payload, req=req,
                                                 reply_to=self.config.advertise), on_fail=fail):
                fail()
        return q, reqs

    def _collect(self, q: gevent.queue.Queue, reqs: dict[str, Any],
                 timeout: float) -> dict[Any, dict]:
        """Answers by key, until all came or timeout; then forget the requests."""
        answers: dict[Any, dict] = {}
        if not reqs:  # a copy stored only here: no queue to wait on, no timer
            return answers
        try:
            with gevent.Timeout(timeout, False):
                while len(answers) < len(reqs):
                    req, answer = q.get()
                    if req in reqs:
                        answers[reqs[req]] = answer
        finally:
            for req in reqs:
                self.pending.pop(req, None)
        return answers

    def _ask(self, members: list[str], verb: Verb, payloads: dict[str, dict],
             timeout: float) -> dict[str, dict]:
        """One request per member; the answers that came within timeout."""
        q, reqs = self._send_requests({m: (m, verb, payloads[m]) for m in members})
        return self._collect(q, reqs, timeout)

    def _request_all(self, op: str, args: dict, members: list[str] | None = None) -> dict[str, Any]:
        members = self._others() if members is None else members
        if not members:
            return {}
        answers = self._ask(members, Verb.REQUEST, {m: {"op": op, "args": args} for m in members},
                            self.config.replication_timeout)
        return {m: a.get("result") for m, a in answers.items() if a.get("ok", True)}

    # ------------------------------------------------------------ enqueue
    def enqueue(self, task: Task) -> Task:
        if self.me not in self.roster.ids():
            raise Unavailable("this node is not (yet) a member of the cluster")
        ring = self.roster.ids()
        replicas = replication.place(ring, self.config.replication, task, self.cursor)
        if task.name is None:
            self.cursor += 1
        copies = replication.copies(task, replicas, self.config.replica_offset)
        stored: list[Task] = []
        try:
            self._store_all(task, copies, stored)
        except Unavailable:  # our own journal refused: undo the copies sent elsewhere
            self._abort(copies)
            raise
        need = min(self.config.min_replicas, len(copies))
        if len(stored) < need:
            # copies whose STORED is merely late would still fire: cancel every copy
            # (a CANCEL that overtakes its STORE is kept and applied on arrival)
            self._abort(copies)
            raise Unavailable(f"stored on {len(stored)} of {len(copies)} replicas, "
                              f"{need} needed")
        return copies[0]

    def _store_all(self, task: Task, copies: list[Task], stored: list[Task]) -> None:
        """Store the copies, the name's owner first for a named task; ``stored`` collects
        the copies that were stored."""
        if task.name is not None:
            # the name's owner (first copy) decides alone, so racing enqueues of one
            # name sent to different nodes cannot both win, nor both lose
            owner, rest = copies[:1], copies[1:]
            try:
                stored += self._store(owner)
                stored += self._store(rest)
            except Duplicate:
                self._abort(copies)
                raise
        else:
            stored += self._store(copies)

    def _abort(self, copies: list[Task]) -> None:
        """Undo a refused enqueue on every copy, releasing the name it reserved."""
        for c in copies:
            holder = c.replicas[c.replica]
            if holder == self.me:
                self.engine.abort(c.id)
            else:
                self._send(holder, Verb.CANCEL, {"id": c.id, "abort": True})

    def _store(self, copies: list[Task]) -> list[Task]:
        """Store copies (local one in this greenlet, remote ones by STORE); return those
        stored. Duplicate if the name's holder refused the first copy."""
        if not copies:
            return []
        remote = [c for c in copies if c.replicas[c.replica] != self.me]
        local = [c for c in copies if c.replicas[c.replica] == self.me]
        q, reqs = self._send_requests({i: (c.replicas[c.replica], Verb.STORE, {"task": c.encode()})
                                       for i, c in enumerate(remote)})
        stored: list[Task] = []
        duplicate: str | None = None
        try:
            for c in local:
                try:
                    self.engine.add(c, wait=True)
                    stored.append(c)
                    self._replay_early(c.id)
                except Duplicate as e:
                    duplicate = e.original_id
        finally:
            answers = self._collect(q, reqs, self.config.replication_timeout)
        for i, answer in answers.items():
            if answer.get("ok"):
                stored.append(remote[i])
            elif isinstance(answer.get("duplicate"), str):
                duplicate = answer["duplicate"]
        if duplicate is not None:
            raise Duplicate(duplicate)
        return stored

    def _store_quietly(self, task: Task) -> None:
        try:
            self.enqueue(task)
        except (Unavailable, Duplicate) as e:
            log.warning("cluster: callback task %s not stored: %s", task.id, e)

    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]:
        def one(t: Task) -> dict[str, Any]:
            try:
                s = self.enqueue(t)
                return {"status": "scheduled", "id": s.id, "queue": s.queue, "eta": s.eta,
                        "replicas": list(s.replicas)}
            except Duplicate as e:
                return {"status": "duplicate", "id": e.original_id}
            except Unavailable as e:
                return {"status": "error", "id": t.id, "error": str(e)}
        pool = gevent.pool.Pool(64)
        return list(pool.imap(one, tasks))

    # ------------------------------------------------------------ queries
    def get_task(self, task_id: str) -> dict[str, Any] | None:
        found: list[dict] = []
        local = self.engine.get(task_id)
        if local is not None:
            found.append(dict(local.summary(), node=self.me))
        # ask the siblings even when this copy has ended: ``copies`` lists every copy
        for m, result in self._request_all("get", {"id": task_id}).items():
            if isinstance(result, dict):
                found.append(dict(result, node=m))
        if not found:
            return None
        found = [s for s in found if _summary_ok(s)]
        if not found:
            return None
        best = max(found, key=lambda s: (_ORDER.get(s["state"], 0), s["attempts"],
                                         -s["replica"]))
        best = dict(best)
        best["copies"] = sorted(({"node": s["node"], "replica": s.get("replica"),
                                  "state": s.get("state"), "next_attempt": s.get("next_attempt")}
                                 for s in found), key=lambda c: c["replica"] or 0)
        return best

    def cancel(self, task_id: str) -> dict[str, Any] | None:
        results: list[Any] = []
        try:
            t = self.engine.cancel(task_id)
            if t is not None:
                results.append(t.summary())
        except Conflict as e:
            results.append({"conflict": str(e)})
        results += list(self._request_all("cancel", {"id": task_id}).values())
        return self._pick(results)

    def rerun(self, task_id: str) -> dict[str, Any] | None:
        results: list[Any] = []
        try:
            results.append(self._rerun_local(task_id))
        except Conflict as e:
            results.append({"conflict": str(e)})
        results += list(self._request_all("rerun", {"id": task_id}).values())
        return self._pick(results)

    def _rerun_local(self, task_id: str) -> dict | None:
        t = self.engine.get(task_id)
        if t is None:
            return None
        delay = t.replica * self.config.replica_offset
        t = self.engine.rerun(task_id, delay=delay)
        if t is None:
            return None
        # a sibling's rerun copy may already have claimed or finished: its news was
        # kept while our copy had ended
        self._replay_early(task_id)
        current = self.engine.get(task_id)
        return (current or t).summary()

    @staticmethod
    def _pick(results: list[Any]) -> dict[str, Any] | None:
        """One answer from many copies: a done operation beats a conflict beats nothing."""
        done = [r for r in results if isinstance(r, dict) and "conflict" not in r and _summary_ok(r)]
        if done:
            return min(done, key=lambda r: r.get("replica", 0))
        conflicts = [r for r in results if isinstance(r, dict) and "conflict" in r]
        if conflicts:
            raise Conflict(str(conflicts[0]["conflict"]))
        return None

    def queue_counts(self) -> dict[str, dict[str, int]]:
        total = self.engine.queue_counts(primary_only=True)
        for result in self._request_all("counts", {}).values():
            if not isinstance(result, dict):
                continue
            for q, states in result.items():
                if isinstance(states, dict):
                    mine = total.setdefault(str(q), {})
                    for s, n in states.items():
                        if isinstance(n, int) and not isinstance(n, bool):
                            mine[str(s)] = mine.get(str(s), 0) + n
        return total

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]:
        seen: dict[str, dict] = {t.id: t.summary() for t in self.engine.list(queue, state, limit)}
        args = {"queue": queue, "state": state.value, "limit": limit}
        for result in self._request_all("list", args).values():
            if isinstance(result, list):
                for s in result:
                    if isinstance(s, dict) and isinstance(s.get("id"), str):
                        seen.setdefault(s["id"], s)
        out = sorted(seen.values(), key=lambda s: s.get("next_attempt") or s.get("finished") or 0)
        return out[:limit]

    def control(self, queue: str, action: str) -> dict[str, Any]:
        result = self._control_local(queue, action)
        for r in self._request_all("control", {"queue": queue, "action": action}).values():
            if isinstance(r, dict) and isinstance(r.get("purged"), int):
                result["purged"] = result.get("purged", 0) + r["purged"]
        return result

    def _control_local(self, queue: str, action: str) -> dict[str, Any]:
        if action == "purge":
            return {"purged": self.engine.purge(queue)}
        if action == "resume":
            self._restagger(queue)
        self.engine.pause(queue, action == "pause")
        return {}

    def _restagger(self, queue: str) -> None:
        """Before a queue resumes: copies that fell due while it was paused would all fire
        at once, every replica of a task together, their CLAIMs crossing (a duplicate for
        each task). Keep the replicas' offsets, counted from now: copy i fires i offsets
        after the first, which has claimed by then."""
        now = self.clock()
        offset = self.config.replica_offset
        for t in list(self.engine.live.values()):
            if t.queue == queue and t.state == State.SCHEDULED and t.replica > 0 \
                    and t.fire_at < now + t.replica * offset:
                self.engine.apply_remote(t.id, fire_at=now + t.replica * offset)

    def info(self) -> dict[str, Any]:
        r = self.membership.roster
        health = self.membership.health(time.monotonic())
        return {
            "node": self.me, "role": self.membership.role, "leader": r.leader,
            "term": self.membership.term, "version": r.version,
            "members": [{"id": m.id, "http": m.http, "cluster": m.cluster,
                         "leader": m.id == r.leader,
                         "last_heard": 0.0 if m.id == self.me else health.get(m.id)}
                        for m in r.members],
        }

    def ready(self) -> tuple[bool, str]:
        if self.me not in self.roster.ids():
            return False, "not yet in the cluster roster"
        if self.membership.leader is None:
            return False, "no leader"
        return True, "ok"

    # ------------------------------------------------------------ receiving
    def _on_message(self, sender: str, verb: Verb, payload: dict) -> None:
        try:
            if verb == Verb.BATCH:
                for inner_verb, inner in unbatch(payload):
                    self._on_message(sender, inner_verb, inner)
            elif verb in _MEMBERSHIP:
                self._send_all(self.membership.step(sender, verb, payload, time.monotonic()))
                self._check_roster()
            elif verb in (Verb.STORED, Verb.REPLY):
                req = payload.get("req")
                q = self.pending.get(req) if isinstance(req, str) else None
                if q is not None:
                    q.put((req, payload))
            elif verb == Verb.STORE:
                self.group.spawn(self._on_store, sender, payload)
            elif verb == Verb.REQUEST:
                self.group.spawn(self._on_request, sender, payload)
            else:
                self._on_sibling(verb, payload)
        except (BadMessage, DecodeError) as e:
            log.warning("cluster: dropped %s from %r: %s", verb.value, sender[:64], e)

    def _reply_address(self, sender: str, payload: dict) -> str:
        address = payload.get("reply_to")
        if isinstance(address, str) and address.startswith("tcp://") and len(address) < 300:
            return address
        known = self._address(sender)
        if known is None:
            raise BadMessage("no reply_to and sender not in roster")
        return known

    def _on_store(self, sender: str, payload: dict) -> None:
        try:
            task = Task.decode(payload.get("task"))
            address = self._reply_address(sender, payload)
            req = payload.get("req")
            if not isinstance(req, str):
                raise BadMessage("req is not a string")
            if not task.replicas or task.replicas[task.replica % len(task.replicas)] != self.me:
                raise BadMessage("STORE of a copy that is not this node's")
        except (BadMessage, DecodeError) as e:
            log.warning("cluster: dropped STORE from %r: %s", sender[:64], e)
            return
        answer: dict[str, Any] = {"req": req, "id": task.id}
        if self._left:
            answer.update(ok=False, error="stopping")
            if req:
                self._send(sender, Verb.STORED, answer, address=address)
            return
        try:
            self.engine.add(task.evolve(state=State.SCHEDULED), wait=True)
            answer["ok"] = True
        except Duplicate as e:
            answer.update(ok=False, duplicate=e.original_id)
        except Exception as e:  # a full disk must reach the coordinator as a refusal
            log.exception("cluster: could not store %s", task.id)
            answer.update(ok=False, error=type(e).__name__)
        if answer["ok"]:
            self._replay_early(task.id)
        if req:
            self._send(sender, Verb.STORED, answer, address=address)

    def _on_request(self, sender: str, payload: dict) -> None:
        try:
            req = _str(payload, "req")
            op = _str(payload, "op")
            args = _opt_dict(payload, "args") or {}
            address = self._reply_address(sender, payload)
            result = self._serve(op, args)
            answer = {"req": req, "ok": True, "result": result}
        except (BadMessage, DecodeError, ValueError, KeyError) as e:
            log.warning("cluster: dropped REQUEST from %r: %s", sender[:64], e)
            return
        except Conflict as e:
            answer = {"req": req, "ok": True, "result": {"conflict": str(e)}}
        self._send(sender, Verb.REPLY, answer, address=address)

    def _serve(self, op: str, args: dict) -> Any:
        if op == "get":
            t = self.engine.get(_str(args, "id"))
            return t.summary() if t is not None else None
        if op == "cancel":
            t = self.engine.cancel(_str(args, "id"))
            return t.summary() if t is not None else None
        if op == "rerun":
            return self._rerun_local(_str(args, "id"))
        if op == "paused":
            return {n: q.paused for n, q in self.engine.dispatcher.queues.items()}
        if op == "counts":
            return self.engine.queue_counts(primary_only=True)
        if op == "list":
            state = State(_str(args, "state"))
            limit = max(1, min(1000, _int(args, "limit")))
            return [t.summary() for t in self.engine.list(_str(args, "queue"), state, limit)]
        if op == "control":
            action = _str(args, "action")
            if action not in ("pause", "resume", "purge"):
                raise BadMessage("unknown control action")
            return self._control_local(_str(args, "queue"), action)
        raise BadMessage(f"unknown op {op[:32]!r}")

    def _on_sibling(self, verb: Verb, payload: dict) -> None:
        engine = self.engine
        if verb == Verb.HANDOFF:
            items = payload.get("tasks")
            if not isinstance(items, list):
                raise BadMessage("tasks is not a list")
            for item in items[:10_000]:
                if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                        and isinstance(item[1], (int, float)) and not isinstance(item[1], bool)):
                    engine.apply_remote(item[0], fire_at=float(item[1]), earliest=True)
            return
        task_id = _str(payload, "id")
        if task_id not in engine.live and verb != Verb.REPLICAS:
            self._keep_early(task_id, verb, payload)
            return
        if verb == Verb.CLAIM:
            t = engine.live.get(task_id)
            if t is not None:
                theirs = _int(payload, "replica")
                fire = replication.sibling_fire_at(_num(payload, "until"), t.replica, theirs,
                                                   len(t.replicas), self.config.replica_offset)
                engine.apply_remote(task_id, fire_at=fire)
                if 0 <= theirs < len(t.replicas):
                    self._note_claim(task_id, t.replicas[theirs], theirs)
            return
        self.claims.pop(task_id, None)
        if verb == Verb.RETRY:
            t = engine.live.get(task_id)
            if t is not None:
                fire = replication.sibling_fire_at(_num(payload, "fire_at"), t.replica,
                                                   _int(payload, "replica"), len(t.replicas),
                                                   self.config.replica_offset)
                engine.apply_remote(task_id, state=State.SCHEDULED, fire_at=fire,
                                    attempts=_int(payload, "attempts"),
                                    last=_opt_dict(payload, "last"))
        elif verb in (Verb.DONE, Verb.FAILED):
            engine.apply_remote(task_id,
                                state=State.SUCCEEDED if verb == Verb.DONE else State.FAILED,
                                attempts=_int(payload, "attempts"), last=_opt_dict(payload, "last"))
        elif verb == Verb.CANCEL:
            if payload.get("abort") is True:
                engine.abort(task_id)
                return
            try:
                engine.cancel(task_id)
            except Conflict:
                pass
        elif verb == Verb.REPLICAS:
            replicas = payload.get("replicas")
            if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
                raise BadMessage("replicas is not a list of ids")
            engine.set_replicas(task_id, tuple(replicas), self.me)

    def _keep_early(self, task_id: str, verb: Verb, payload: dict) -> None:
        now = time.monotonic()
        news = self.early.setdefault(task_id, [])
        if len(news) >= EARLY_PER_TASK:
            return
        news.append((now, verb, payload))
        self.early.move_to_end(task_id)
        while self.early:
            first = next(iter(self.early.values()))
            if len(self.early) <= EARLY_MAX and now - first[0][0] < EARLY_TTL:
                break
            self.early.popitem(last=False)

    def _replay_early(self, task_id: str) -> None:
        for _, verb, payload in self.early.pop(task_id, ()):
            try:
                self._on_sibling(verb, payload)
            except BadMessage:
                pass

    # ------------------------------------------------------------ confirming stale copies
    def confirm(self, t: Task) -> bool:
        """For a copy reloaded after a restart: is it still ours to deliver?"""
        if self.me not in self.roster.ids():
            # not back in the cluster yet: ask again shortly (the siblings may well
            # have delivered it while we were away)
            self.unconfirmed.add(t.id)
            self.engine.apply_remote(t.id, fire_at=self.clock() + CONFIRM_RETRY)
            return False
        siblings = [r for r in t.replicas if r != self.me and r in self.roster.ids()]
        if not siblings:
            return True
        for result in self._request_all("get", {"id": t.id}, siblings).values():
            if not isinstance(result, dict):
                continue
            state = result.get("state")
            if state == State.RUNNING.value:
                # a sibling is delivering it right now: look again after its lease
                self.unconfirmed.add(t.id)
                self.engine.apply_remote(t.id, fire_at=self.clock() + self.config.claim_lease)
                return False
            if state in (State.SUCCEEDED.value, State.FAILED.value, State.CANCELLED.value):
                self.engine.apply_remote(t.id, state=State(state),
                                         attempts=result.get("attempts")
                                         if isinstance(result.get("attempts"), int) else None,
                                         last=result.get("last_response")
                                         if isinstance(result.get("last_response"), dict) else None)
                return False
            replicas = result.get("replicas")
            if isinstance(replicas, list) and self.me not in replicas:
                log.info("cluster: task %s was re-homed while this node was away", t.id)
                self.engine.drop(t.id)
                return False
        return True


def _summary_ok(s: Any) -> bool:
    """A task summary from a peer with the fields we sort and pick by, well typed."""
    return (isinstance(s, dict) and isinstance(s.get("id"), str) and s.get("state") in _ORDER
            and isinstance(s.get("attempts"), int) and isinstance(s.get("replica"), int))


def _failer(q: gevent.queue.Queue, req: str) -> Callable[[], None]:
    """An answer standing in for a peer that could not be reached."""
    return lambda: q.put((req, {"ok": False, "error": "unreachable"}))


class _Hooks:
    """The engine's view of the siblings: CLAIM before delivery, then the outcome."""

    def __init__(self, cluster: Cluster):
        self.c = cluster

    def claim(self, t: Task) -> bool:
        c = self.c
        c.claims.pop(t.id, None)
        if t.id in c.unconfirmed:
            c.unconfirmed.discard(t.id)
            if not c.confirm(t):
                return False
        if len(t.replicas) > 1:
            c._siblings(t, Verb.CLAIM, c.claim_payload(t))
        return True

    def done(self, t: Task) -> None:
        if len(t.replicas) > 1:
            self.c._siblings(t, Verb.DONE, {"id": t.id, "attempts": t.attempts, "last": t.last})

    def retried(self, t: Task) -> None:
        if len(t.replicas) > 1:
            self.c._siblings(t, Verb.RETRY, {"id": t.id, "replica": t.replica,
                                             "fire_at": t.fire_at, "attempts": t.attempts,
                                             "last": t.last})

    def failed(self, t: Task) -> None:
        if len(t.replicas) > 1:
            self.c._siblings(t, Verb.FAILED, {"id": t.id, "attempts": t.attempts, "last": t.last})
