"""A simulator for the sibling protocol (``miyamoto.replicas.siblings``): nodes, copies, a lossy
network, pauses, partitions, crashes and member drops, in simulated time.

Each simulated node runs the real ``Siblings`` machine, fed only through its door
(``step(event, now)``), and carries out the effects it returns on a small model of the engine (copies with a state and a fire time, deliveries that take a
while and succeed or fail, a journal that survives a crash). The roster is kept by an
oracle that drops a member unreachable from the majority for ``failure_timeout`` and
takes it back once it is reachable again; a node's *contact* (its delivery lease) lapses
a little after it is cut off, before the majority drops it, as ``Membership.in_contact``
does. Messages are delayed, reordered and lost; a paused node's messages wait in its
inbox, and on resume it runs its due copies, its inbox and its tick in a random order.

The checker watches every delivery start and raises ``SafetyViolation`` when
- a node starts a delivery of a task after it applied a sibling's end of it (DONE...),
- a node starts a delivery while it holds a sibling's unexpired claim on a delivery
  that is still running (whether or not the claimer is still in the roster, paused or
  cut off: a claim outlives its holder's roster entry until its lease ends),
- a node out of contact (or out of the roster) starts a delivery of a task with siblings
  (two ticks after its lease ran out: the machine learns of contact at its tick),
- a task is delivered again and no excuse holds. This is the strict rule ("no side of a
  cut delivers what the other side will"); the excuses, in the simulator's terms, for a
  node N starting a delivery of a task that node O already started successfully:
  * in flight at a fault: O's delivery was running when O crashed or paused, or when a
    partition put O off the majority side; or O was cleared to start by an answer that
    was on its way across a partition when it began (sent before, read after the cut);
  * outlived its lease: O's delivery took longer than its claim's lease;
  * its news was lost: O's DONE/FAILED did not reach N, and the lossy network lost it
    on its way to N or to another sibling (which may have restored N's copy from what it
    knew). A cut is no excuse here: a real link loses nothing but what a cut stops.
  A sibling's claim that never reached N is no excuse: N may deliver only once O has
  answered it (or left N's roster), so O's claim must have been acknowledged by N.
With ``long_rate``, that share of the deliveries is a long task's: its worker answers 202
and works for 8-15 s (past any attempt's claim), heartbeating every HEARTBEAT seconds for
LEASE more (``LeaseExtended``); the checker then also raises when a sibling starts the task
while the holder's worker still holds a lease it took through a heartbeat (one not sent
across a cut), whatever the holder's state in the roster.
At the end every acknowledged task that was not cancelled (or expired) must have been
delivered. With ``expiry_rate``, that share of the tasks has an ``expires_at``: a copy
due after its own expiry (copy i's is i offsets later), or whose retry would come after
it, ends as expired and tells its siblings (FAILED news that says so); the checker then
also raises when a copy starts after its expiry, or when a copy ended as failed with
attempts left (an expiry heard as a failure).
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from miyamoto.replicas import effects as fx
from miyamoto.replicas import events as ev
from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.replicas.siblings import Siblings, SiblingTiming
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send

OFFSET = 1.0
TIMING = SiblingTiming(offset=OFFSET, claim_lease=5.0, ask_timeout=0.3, ask_lease=1.0,
                       stall_gap=0.3, away_after=1.5)
DEADLINE = 1.0          # an attempt's dispatch deadline
TICK = 0.1
FAILURE_TIMEOUT = 1.5   # the oracle drops a member unreachable this long
REJOIN = 0.4            # ... and takes it back once reachable this long
MAX_ATTEMPTS = 3
LEASE = 2.0             # a long task's lease, taken again at each heartbeat
HEARTBEAT = 0.6         # a long task's worker heartbeats this often


class SafetyViolation(AssertionError):
    pass


class Copies(dict[str, Task]):
    """A node's journal of copies, live and ended, that also knows which are scheduled:
    each tick looks for the due ones among those, not among every copy the run made."""

    def __init__(self, copies: Mapping[str, Task] | None = None):
        super().__init__()
        self.scheduled: set[str] = set()
        for task_id, t in (copies or {}).items():
            self[task_id] = t

    def __setitem__(self, task_id: str, t: Task) -> None:
        super().__setitem__(task_id, t)
        if t.state == State.SCHEDULED:
            self.scheduled.add(task_id)
        else:
            self.scheduled.discard(task_id)

    def __delitem__(self, task_id: str) -> None:
        super().__delitem__(task_id)
        self.scheduled.discard(task_id)

    def pop(self, task_id: str, *default: Any) -> Any:  # type: ignore[override]
        self.scheduled.discard(task_id)
        return super().pop(task_id, *default)


@dataclass
class SimNode:
    id: str
    machine: Siblings
    copies: Copies = field(default_factory=Copies)  # the journal: live and ended
    up: bool = True
    paused: bool = False
    inbox: list[tuple[str, Any]] = field(default_factory=list)
    running: dict[str, float] = field(default_factory=dict)  # task id -> attempt start
    ended_by_news: set[str] = field(default_factory=set)
    claims_seen: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> (from, until)
    incs_heard: dict[str, str] = field(default_factory=dict)  # the roster incarnations sent
    contact: bool = True
    cut_at: float | None = None


class LiveView(Mapping[str, Task]):
    """A node's live copies, read on demand (the machine looks at them seldom)."""

    def __init__(self, copies: dict[str, Task]):
        self._copies = copies

    def __getitem__(self, task_id: str) -> Task:
        t = self._copies[task_id]
        if t.state.ended:
            raise KeyError(task_id)
        return t

    def __iter__(self) -> Iterator[str]:
        return (i for i, t in self._copies.items() if not t.state.ended)

    def __len__(self) -> int:
        return sum(1 for t in self._copies.values() if not t.state.ended)


class Sim:
    def __init__(self, seed: int, n: int, replication_n: int, *, loss: float = 0.0,
                 latency: tuple[float, float] = (0.001, 0.05), fail_rate: float = 0.1,
                 slow_rate: float = 0.05, expiry_rate: float = 0.0, long_rate: float = 0.0):
        self.rng = random.Random(seed)
        # its own rng: runs without expiry draw exactly the numbers they drew before it
        self.expiry_rate, self.erng = expiry_rate, random.Random(seed * 7919 + 1)
        self.expired: set[str] = set()
        self.long_rate, self.lrng = long_rate, random.Random(seed * 104729 + 3)
        self.leases: dict[tuple[str, str], float] = {}  # (task, holder) -> its lease's end
        self.now = 0.0
        self.ids = [chr(ord("a") + i) for i in range(n)]
        self.replication = replication_n
        self.loss, self.latency = loss, latency
        self.fail_rate, self.slow_rate = fail_rate, slow_rate
        self.nodes = {i: self._new_node(i) for i in self.ids}
        self.roster: set[str] = set(self.ids)
        self.incs: dict[str, int] = {i: 1 for i in self.ids}  # each node's process count
        self.groups: list[set[str]] | None = None  # a partition: the groups that can talk
        self.unreachable_since: dict[str, float] = {}
        self.reachable_since: dict[str, float] = {}
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.cursor = 0
        self.acked: dict[str, float] = {}
        self.cancelled: set[str] = set()
        # task -> [(node, start, will succeed)]: every delivery attempt
        self.deliveries: dict[str, list[tuple[str, float, bool]]] = {}
        self.inflight_at_fault: set[tuple[str, str]] = set()  # (task, node): crash, pause
        self.inflight_at_cut: set[tuple[str, str, str]] = set()  # (task, node, cut off from)
        self.outlived: set[tuple[str, str]] = set()
        self.news_arrived: dict[tuple[str, str, str], float] = {}  # (task, from, to) -> last
        self.news_lost: set[tuple[str, str]] = set()  # (task, from): a DONE/FAILED lost
        self.excused: dict[str, int] = {"in flight at a fault": 0, "outlived its lease": 0,
                                        "its news was lost": 0}
        for i in self.ids:
            self._at(self.rng.uniform(0, TICK), "tick", i)
        self._at(TICK, "oracle", None)

    # ------------------------------------------------------------ plumbing
    def _new_node(self, node_id: str) -> SimNode:
        return SimNode(node_id, Siblings(node_id, TIMING, self.ids))

    def _step(self, nd: SimNode, event: ev.Event) -> fx.Ready:
        return nd.machine.step(event, self.now)

    def _at(self, when: float, kind: str, data: Any) -> None:
        heapq.heappush(self.events, (when, next(self.seq), kind, data))

    def connected(self, a: str, b: str) -> bool:
        return self.groups is None or any(a in g and b in g for g in self.groups)

    def majority_side(self) -> set[str]:
        """The nodes that can reach a majority of the roster (the side the leader is on)."""
        live = [i for i in self.ids if self.nodes[i].up and not self.nodes[i].paused]
        groups = self.groups or [set(self.ids)]
        for g in groups:
            side = {i for i in live if i in g}
            if len(side & self.roster) * 2 > len(self.roster):
                return side
        return set()

    def send(self, src: str, to: str, msg: Any) -> None:
        if to == src:
            return
        if not self.connected(src, to):
            return
        if self.rng.random() < self.loss:
            if isinstance(msg, (m.Done, m.Failed)):
                self.news_lost.add((msg.id, src))
            return
        self._at(self.now + self.rng.uniform(*self.latency), "msg", (src, to, msg))

    # ------------------------------------------------------------ the client
    def enqueue(self, at_node: str, countdown: float) -> str | None:
        nd = self.nodes[at_node]
        if not nd.up or nd.paused or at_node not in nd.machine.members or not nd.contact:
            return None
        ring = sorted(nd.machine.members)
        expires_at = None
        if self.expiry_rate and self.erng.random() < self.expiry_rate:
            expires_at = self.now + countdown + self.erng.uniform(0.05, 3.0)
        task = Task(id=f"t{len(self.acked) + len(self.cancelled)}-{self.rng.randrange(10**6)}",
                    queue="q", url="http://w/", eta=self.now + countdown, created=self.now,
                    expires_at=expires_at)
        replicas = replication.place(ring, self.replication, task, self.cursor)
        self.cursor += 1
        stored = 0
        for c in replication.copies(task, replicas, OFFSET):
            holder = self.nodes[c.replicas[c.replica]]
            if holder.up and not holder.paused and self.connected(at_node, holder.id):
                if holder.id == at_node or stored == 0:
                    self._store(holder, c)
                else:  # the others travel: a sibling's news may overtake them
                    self._at(self.now + self.rng.uniform(*self.latency), "store", (holder.id, c))
                stored += 1
        if stored:
            self.acked[task.id] = self.now
            return task.id
        return None

    def cancel(self, task_id: str) -> None:
        """A client's DELETE: cancel every copy it can reach; counted only if all were."""
        holders = [nd for nd in self.nodes.values() if task_id in nd.copies]
        if holders and all(nd.up and not nd.paused for nd in holders):
            for nd in holders:
                self._apply(nd, [fx.CancelCopy(task_id)])
            self.cancelled.add(task_id)

    # ------------------------------------------------------------ faults
    def pause(self, node_id: str, duration: float) -> None:
        nd = self.nodes[node_id]
        if nd.up and not nd.paused:
            nd.paused = True
            self._in_flight(node_id)
            self._at(self.now + duration, "resume", node_id)

    def crash(self, node_id: str, down: float) -> None:
        nd = self.nodes[node_id]
        if not nd.up:
            return
        self._in_flight(node_id)
        nd.up, nd.paused, nd.inbox, nd.running = False, False, [], {}
        self._at(self.now + down, "restart", node_id)

    def partition(self, *groups: set[str], duration: float) -> None:
        self.groups = [set(g) for g in groups]
        for i in self.ids:  # deliveries running now, on either side of the cut
            apart = {j for j in self.ids if not self.connected(i, j)}
            for task_id in self.nodes[i].running:
                self.inflight_at_cut.update((task_id, i, j) for j in apart)
        for _, _, kind, data in self.events:  # a go on its way across the cut clears its copy
            if kind == "msg" and isinstance(data[2], m.Answer) and \
                    data[2].verdict in (m.GO, m.UNKNOWN) and not self.connected(data[0], data[1]):
                self.inflight_at_cut.update((data[2].id, data[1], j) for j in self.ids
                                            if not self.connected(data[1], j))
        self._at(self.now + duration, "heal", None)

    def _in_flight(self, node_id: str) -> None:
        for task_id in self.nodes[node_id].running:
            self.inflight_at_fault.add((task_id, node_id))

    # ------------------------------------------------------------ running
    def run(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            self.now, _, kind, data = heapq.heappop(self.events)
            getattr(self, "_on_" + kind)(data)
        self.now = until

    def _on_tick(self, node_id: str) -> None:
        nd = self.nodes[node_id]
        if nd.up and not nd.paused:
            self._fire_due(nd)
            self._apply(nd, self._step(nd, ev.Tick(nd.contact, LiveView(nd.copies))).effects)
        if nd.up:
            self._at(self.now + TICK, "tick", node_id)

    def _on_msg(self, data: tuple[str, str, Any]) -> None:
        src, to, msg = data
        nd = self.nodes[to]
        if not nd.up:
            return
        if isinstance(msg, (m.Done, m.Failed, m.Retry)):
            self.news_arrived[(msg.id, src, to)] = self.now
        if nd.paused:
            nd.inbox.append((src, msg))
        else:
            self._receive(nd, src, msg)

    def _receive(self, nd: SimNode, src: str, msg: Any) -> None:
        if isinstance(msg, tuple) and msg[0] == "members":
            self._apply(nd, self._step(nd, ev.Members(tuple(msg[1]), tuple(self._live(nd)), {},
                                                      msg[2])).effects)
            return
        if isinstance(msg, tuple) and msg[0] == "store":
            self._store(nd, msg[1])
            return
        if isinstance(msg, m.Handoff):
            self._apply(nd, self._step(nd, ev.HandoffReceived(src, msg)).effects)
            return
        copy = nd.copies.get(msg.id)
        live = copy if copy is not None and not copy.state.ended else None
        if isinstance(msg, m.Claim) and live is not None:
            nd.claims_seen[msg.id] = (src, self.now + msg.lease)
        elif isinstance(msg, (m.Retry, m.Done, m.Failed)):
            nd.claims_seen.pop(msg.id, None)
        probed = isinstance(msg, m.Answer) and m.news_of_an_end(msg) and \
            msg.id not in nd.machine.asking  # a probe's news of our ended copy, as the layer
        seen = copy if isinstance(msg, m.Ask) or (live is None and probed) else live
        effects = self._step(nd, ev.Received(src, msg, seen)).effects
        if isinstance(msg, m.Ask) and live is not None and any(
                isinstance(e, Send) and isinstance(e.msg, m.Answer) and e.msg.verdict == m.GO
                for e in effects):  # an acknowledged claim
            nd.claims_seen[msg.id] = (src, self.now + TIMING.ask_lease)
        self._apply(nd, effects)

    def _on_store(self, data: tuple[str, Task]) -> None:
        holder, copy = data
        nd = self.nodes[holder]
        if nd.up:
            if nd.paused:
                nd.inbox.append(("client", ("store", copy)))
            else:
                self._store(nd, copy)

    def _store(self, nd: SimNode, copy: Task) -> None:
        if copy.id in nd.copies:
            return
        nd.copies[copy.id] = copy
        self._apply(nd, self._step(nd, ev.Stored(copy.id)).effects)  # news that came first

    def _on_resume(self, node_id: str) -> None:
        nd = self.nodes[node_id]
        if not nd.up or not nd.paused:
            return
        nd.paused = False
        inbox, nd.inbox = nd.inbox, []
        steps = ["fire", "inbox", "tick"]
        self.rng.shuffle(steps)
        for s in steps:  # the order a resumed process happens to run things in
            if s == "fire":
                self._fire_due(nd)
            elif s == "inbox":
                for src, msg in inbox:
                    self._receive(nd, src, msg)
            else:
                self._apply(nd, self._step(nd, ev.Tick(nd.contact, LiveView(nd.copies))).effects)

    def _on_restart(self, node_id: str) -> None:
        nd = self.nodes[node_id]
        fresh = self._new_node(node_id)
        fresh.copies = Copies({i: (t.evolve(state=State.SCHEDULED, fire_at=self.now)
                                   if t.state == State.RUNNING else t)
                               for i, t in nd.copies.items()})
        self.incs[node_id] += 1  # a new process: its siblings void its earlier claims
        self._step(fresh, ev.Members(tuple(sorted(self.roster)), (), {}, self._incarnations()))
        fresh.contact = False
        self._step(fresh, ev.Reloaded(tuple(self._live(fresh)), start=True))
        self.nodes[node_id] = fresh
        self._at(self.now + TICK, "tick", node_id)

    def _on_heal(self, _: Any) -> None:
        self.groups = None

    def _on_oracle(self, _: Any) -> None:
        """Roster changes and contact, as membership would have them."""
        side = self.majority_side()
        for i in self.ids:
            nd = self.nodes[i]
            if i in side:
                self.unreachable_since.pop(i, None)
                self.reachable_since.setdefault(i, self.now)
                nd.cut_at = None
            else:
                self.reachable_since.pop(i, None)
                self.unreachable_since.setdefault(i, self.now)
                if nd.cut_at is None:  # its lease lapses a little later, before it is dropped
                    nd.cut_at = self.now + self.rng.uniform(0, FAILURE_TIMEOUT * 0.5)
            nd.contact = i in side or (nd.cut_at is not None and self.now < nd.cut_at)
        new = set(self.roster)
        if side:
            new -= {i for i, t in self.unreachable_since.items() if self.now - t > FAILURE_TIMEOUT}
            new |= {i for i, t in self.reachable_since.items() if self.now - t > REJOIN}
        if new != self.roster:
            self.roster = new
        incs = self._incarnations()
        for i in side:  # the leader's roster reaches the nodes it can hear
            nd = self.nodes[i]
            if nd.machine.members != frozenset(self.roster) or nd.incs_heard != incs:
                nd.incs_heard = incs
                self._on_msg(("leader", i, ("members", sorted(self.roster), incs)))
        self._at(self.now + TICK, "oracle", None)

    def _incarnations(self) -> dict[str, str]:
        """The roster's incarnations, as the leader's roster names them."""
        return {i: f"{i}.{self.incs[i]}" for i in sorted(self.roster)}

    # ------------------------------------------------------------ the node's engine
    def _live(self, nd: SimNode) -> dict[str, Task]:
        return {i: t for i, t in nd.copies.items() if not t.state.ended}

    def _fire_due(self, nd: SimNode) -> None:
        copies = nd.copies
        due = sorted((t.fire_at, i) for i in copies.scheduled
                     if (t := copies[i]).fire_at <= self.now)
        for _, task_id in due:
            t = nd.copies[task_id]
            if t.state != State.SCHEDULED or t.fire_at > self.now:
                continue
            self._fire(nd, task_id)

    def _fire(self, nd: SimNode, task_id: str) -> None:
        t = nd.copies.get(task_id)
        if t is None or t.state != State.SCHEDULED or t.fire_at > self.now + 1e-9:
            return
        if t.expires_at is not None and self.now >= t.expires_at + t.replica * OFFSET:
            ready = self._step(nd, ev.Expiring(t))  # as Engine._expires
            if ready.go:
                self._end_expired(nd, t)
            else:  # a sibling may be delivering it: pushed back past its claim
                self._apply(nd, ready.effects)
            return
        ready = self._step(nd, ev.Due(t, DEADLINE))
        self._apply(nd, ready.effects)
        t = nd.copies.get(task_id)
        if ready.go and t is not None and t.state == State.SCHEDULED and t.fire_at <= self.now + 1e-9:
            self._start(nd, t)

    def _end_expired(self, nd: SimNode, t: Task) -> None:
        claim = nd.claims_seen.get(t.id)
        if claim is not None and claim[1] > self.now:
            claimer = self.nodes[claim[0]]
            if claimer.up and t.id in claimer.running:
                raise SafetyViolation(f"{nd.id} expires {t.id} under {claim[0]}'s live claim")
        t = t.evolve(state=State.EXPIRED, finished=self.now)
        nd.copies[t.id] = t
        self.expired.add(t.id)
        self._apply(nd, self._step(nd, ev.Outcome(t)).effects)

    def _start(self, nd: SimNode, t: Task) -> None:
        self.check_start(nd, t)
        nd.copies[t.id] = t.evolve(state=State.RUNNING)
        nd.running[t.id] = self.now
        slow = self.rng.random() < self.slow_rate
        took = self.rng.uniform(2.0, 8.0) if slow else self.rng.uniform(0.005, 0.1)
        if self.long_rate and self.lrng.random() < self.long_rate:  # a 202, then the work
            took = self.lrng.uniform(8.0, 15.0)
            self._at(self.now + 0.05, "heartbeat", (nd.id, t.id, nd.machine))
        elif took > DEADLINE + TIMING.claim_lease:
            self.outlived.add((t.id, nd.id))
        ok = self.rng.random() >= self.fail_rate
        self.deliveries.setdefault(t.id, []).append((nd.id, self.now, ok))
        self._at(self.now + took, "finish", (nd.id, t.id, nd.machine, ok))

    def _on_heartbeat(self, data: tuple[str, str, Siblings]) -> None:
        """A long task's worker takes LEASE more seconds (its 202's, then a heartbeat's);
        a paused node reads it when it resumes, a crashed one never."""
        node_id, task_id, machine = data
        nd = self.nodes[node_id]
        if not nd.up or nd.machine is not machine or task_id not in nd.running:
            return
        self._at(self.now + HEARTBEAT, "heartbeat", data)
        t = nd.copies.get(task_id)
        if nd.paused or t is None or t.state != State.RUNNING:
            return
        if all(self.connected(node_id, r) and self._same_copies(self.nodes[r], t)
               for r in t.replicas):  # its CLAIM reaches copies that know it as the holder
            self.leases[(task_id, node_id)] = self.now + LEASE
        self._apply(nd, self._step(nd, ev.LeaseExtended(t, LEASE)).effects)

    @staticmethod
    def _same_copies(nd: SimNode, t: Task) -> bool:
        """``nd``'s copy of ``t`` has the same replicas (not restored elsewhere meanwhile)."""
        mine = nd.copies.get(t.id)
        return mine is not None and mine.replicas == t.replicas

    def _on_finish(self, data: tuple[str, str, Siblings, bool]) -> None:
        node_id, task_id, machine, ok = data
        nd = self.nodes[node_id]
        if not nd.up or nd.machine is not machine or task_id not in nd.running:
            return  # the node crashed meanwhile
        if nd.paused:  # the answer waits in the socket
            self._at(self.now + TICK, "finish", data)
            return
        del nd.running[task_id]
        t = nd.copies.get(task_id)
        if t is None:  # dropped (re-homed) while it ran, as the engine's drop does
            return
        attempts = t.attempts + 1
        if t.state.ended:  # a sibling ended it (or it was cancelled) while it ran
            nd.copies[task_id] = t.evolve(attempts=attempts)
            return
        if ok:
            t = t.evolve(state=State.SUCCEEDED, attempts=attempts, finished=self.now)
        elif attempts >= MAX_ATTEMPTS:
            t = t.evolve(state=State.FAILED, attempts=attempts, finished=self.now)
        elif t.expires_at is not None and self.now + 0.5 >= t.expires_at:  # retry.decide
            t = t.evolve(state=State.EXPIRED, attempts=attempts, finished=self.now)
            self.expired.add(t.id)
        else:
            t = t.evolve(state=State.SCHEDULED, attempts=attempts, fire_at=self.now + 0.5)
        nd.copies[task_id] = t
        self._apply(nd, self._step(nd, ev.Outcome(t)).effects)

    def _apply(self, nd: SimNode, effects: Iterable[fx.Effect]) -> None:
        for e in effects:
            match e:
                case Send():
                    self.send(nd.id, e.to, e.msg)
                case fx.Update():
                    self._update(nd, e)
                case fx.Fire():
                    self._fire(nd, e.id)
                case fx.CancelCopy():
                    t = nd.copies.get(e.id)
                    if t is not None and not t.state.ended:
                        nd.copies[e.id] = t.evolve(state=State.CANCELLED)
                        nd.ended_by_news.add(e.id)
                case fx.Drop():
                    nd.copies.pop(e.id, None)
                case fx.SetReplicas():
                    t = nd.copies.get(e.id)
                    if t is not None and nd.id in e.replicas:
                        nd.copies[e.id] = t.evolve(replicas=e.replicas,
                                                   replica=e.replicas.index(nd.id))
                case fx.Restore():
                    self._restore(nd, e)
                case fx.RestoreLost():  # every simulated copy is in memory: one page
                    page = ev.LostPage(e.lost, tuple(self._live(nd).values()))
                    self._apply(nd, self._step(nd, page).effects)
                case fx.AskWhenPaged():
                    pass  # no copy is outside memory to page in
                case fx.Reconcile():  # every simulated copy, ended ones too: one page
                    page = ev.Reconciling(tuple(nd.copies.values()))
                    self._apply(nd, self._step(nd, page).effects)
                case fx.TakeEnd():
                    t = nd.copies.get(e.id)
                    if t is not None and t.state.ended and t.reruns < e.reruns:
                        nd.copies[e.id] = t.evolve(state=e.state, reruns=e.reruns,
                                                   attempts=e.attempts, finished=e.finished)
                case fx.JoinRun():
                    t = nd.copies.get(e.id)
                    if t is not None and t.state.ended and t.reruns < e.reruns:
                        nd.copies[e.id] = t.evolve(state=State.SCHEDULED, reruns=e.reruns,
                                                   attempts=0, fire_at=self.now)
                case fx.Replay():
                    self._receive(nd, e.sender, e.msg)
                case _:  # MoveLone among them: no simulated node stops gracefully
                    raise TypeError(f"the simulator does not carry out {e!r}")

    def _update(self, nd: SimNode, e: fx.Update) -> None:
        t = nd.copies.get(e.id)
        if t is None or t.state.ended:
            return
        changes: dict[str, Any] = {}
        if e.attempts is not None and e.attempts > t.attempts:
            changes["attempts"] = e.attempts
        if e.state is not None and e.state.ended:
            nd.ended_by_news.add(e.id)
            nd.copies[e.id] = t.evolve(state=e.state, **changes)
            return
        if e.at is not None and t.state == State.SCHEDULED:
            at = {fx.Move.LATER: max(e.at, t.fire_at),
                  fx.Move.EARLIER: min(e.at, t.fire_at)}.get(e.how, e.at)
            changes["fire_at"] = at
        if changes:
            nd.copies[e.id] = t.evolve(**changes)

    def _restore(self, nd: SimNode, r: fx.Restore) -> None:
        for c in r.copies:
            holder = self.nodes[c.replicas[c.replica]]
            if not (holder.up and not holder.paused and self.connected(nd.id, holder.id)):
                return  # not every new copy could be stored: keep the old replica set
        for c in r.copies:
            self._store(self.nodes[c.replicas[c.replica]], c)
        self._apply(nd, self._step(nd, ev.Restored(r, nd.copies.get(r.id), DEADLINE)).effects)

    # ------------------------------------------------------------ the checker
    def check_start(self, nd: SimNode, t: Task) -> None:
        if t.expires_at is not None and self.now >= t.expires_at + t.replica * OFFSET:
            raise SafetyViolation(f"{nd.id} starts {t.id} after its expiry")
        if t.id in nd.ended_by_news:
            raise SafetyViolation(f"{nd.id} starts {t.id} after applying a sibling's end of it")
        out = nd.id not in nd.machine.members or \
            (not nd.contact and self.now - (nd.cut_at or 0.0) > 2 * TICK + 1e-9)
        if out and len(t.replicas) > 1:  # a lone copy has no sibling to collide with
            raise SafetyViolation(f"{nd.id} starts {t.id} out of contact or out of the roster")
        claim = nd.claims_seen.get(t.id)
        if claim is not None and claim[1] > self.now:
            # a claim heard is honoured until its lease ends, whoever holds it: its holder
            # paused, cut off or dropped from the roster may still be delivering
            claimer = self.nodes[claim[0]]
            if claimer.up and t.id in claimer.running:
                raise SafetyViolation(f"{nd.id} starts {t.id} under {claim[0]}'s live claim")
        for (task_id, holder), until in self.leases.items():
            h = self.nodes[holder]
            if task_id == t.id and holder != nd.id and until > self.now and h.up \
                    and t.id in h.running:
                raise SafetyViolation(f"{nd.id} starts {t.id} under {holder}'s long lease")
        latest: dict[str, float] = {}
        for other, start, ok in self.deliveries.get(t.id, []):
            if other != nd.id and ok:  # a failed attempt is retried, not duplicated
                latest[other] = start
        for other, start in latest.items():
            if (t.id, other) in self.inflight_at_fault or \
                    (t.id, other, nd.id) in self.inflight_at_cut:
                self.excused["in flight at a fault"] += 1
            elif (t.id, other) in self.outlived:
                self.excused["outlived its lease"] += 1
            elif self._news_lost(t.id, other, nd, start):
                self.excused["its news was lost"] += 1
            else:
                raise SafetyViolation(f"{nd.id} delivers {t.id} again: {other} started it at "
                                      f"{start:.2f} and its news reached {nd.id}")

    def _news_lost(self, task_id: str, other: str, nd: SimNode, start: float) -> bool:
        """``other``'s outcome never reached us, and the network lost it on its way to
        us or to a sibling (which may have restored the copy we hold from what it knew)."""
        return self.news_arrived.get((task_id, other, nd.id), -1.0) < start and \
            (task_id, other) in self.news_lost

    def heal_all(self) -> None:
        self.groups = None
        for i, nd in self.nodes.items():
            if nd.paused:
                self._on_resume(i)
            if not nd.up:
                self._on_restart(i)

    def check_delivered(self) -> None:
        missing = [i for i in self.acked if i not in self.cancelled and i not in self.deliveries
                   and i not in self.expired]
        if missing:
            raise SafetyViolation(f"acknowledged tasks never delivered: {missing[:5]}")
        for nd in self.nodes.values():
            for t in nd.copies.values():
                if t.state == State.FAILED and t.attempts < MAX_ATTEMPTS:
                    raise SafetyViolation(f"{nd.id} ended {t.id} as failed after {t.attempts} "
                                          "attempts: an expiry heard as a failure")

    def duplicates(self) -> int:
        """Deliveries of a task after its first successful one."""
        dups = 0
        for d in self.deliveries.values():
            ok = [i for i, (_, _, good) in enumerate(d) if good]
            if ok:
                dups += len(d) - ok[0] - 1
        return dups


def random_run(seed: int, expiry_rate: float = 0.0, long_rate: float = 0.0) -> Sim:
    """One seeded run: 2-5 nodes, replication 1-3, loss, faults; checked throughout."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    sim = Sim(seed, n, rng.randint(1, 3), loss=rng.choice([0.0, 0.01, 0.05]),
              latency=(0.001, rng.choice([0.01, 0.05, 0.2])), expiry_rate=expiry_rate,
              long_rate=long_rate)
    faults = sorted(rng.uniform(2, 25) for _ in range(rng.randint(1, 4)))
    for t in range(0, 250):  # enqueues over the first 25 s
        at = t * 0.1
        while faults and faults[0] <= at:
            sim.run(faults.pop(0))
            _fault(sim, rng)
        sim.run(at)
        if rng.random() < 0.3:
            task = sim.enqueue(rng.choice(sim.ids), rng.choice([0.0, 0.0, 0.5, 3.0]))
            if task is not None and rng.random() < 0.03:
                sim.cancel(task)
    sim.run(40.0)
    sim.heal_all()
    sim.run(80.0)
    sim.check_delivered()
    return sim


def random_runs(seeds: range) -> tuple[int, int]:
    """``random_run`` of each seed: the tasks acknowledged, and the excused duplicates."""
    acked = dups = 0
    for seed in seeds:
        sim = random_run(seed)
        dups += sim.duplicates()
        acked += len(sim.acked)
    return acked, dups


def _fault(sim: Sim, rng: random.Random) -> None:
    kind = rng.choice(["pause", "pause", "partition", "crash"])
    victim = rng.choice(sim.ids)
    duration = rng.uniform(0.2, 3 * OFFSET)
    if kind == "pause":
        sim.pause(victim, duration)
    elif kind == "crash":
        sim.crash(victim, rng.uniform(0.2, 4.0))
    elif len(sim.ids) > 2:
        cut = set(rng.sample(sim.ids, rng.randint(1, (len(sim.ids) - 1) // 2)))
        sim.partition(cut, set(sim.ids) - cut, duration=duration)
