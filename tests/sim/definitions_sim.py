"""A deterministic simulator for ``miyamoto.definitions.machine``: nodes, a lossy network,
crashes, and leader changes that reach each node at its own time.

Time is fake. Every message goes through ``protocol.encode``/``decode`` and the typed
decoders, so payloads must be real JSON. Leadership is played by the simulator with
Raft's one guarantee: at most one leader per term; each node learns of a new term after
its own random delay, so an old leader may go on acting in its old term for a while (as
a cut-off or slow one does). A crash throws the machine away; a restart builds a new
one from what its last ``Persist`` wrote. A full-cluster restart crashes every node at
once, drops everything in flight, and starts the membership's terms again low (as
``miyamoto.membership.machine`` does: its state lives in memory). Clients write at random to
whichever node thinks it leads, and a ready leader advances a schedule's cursor (kind
"cursor", its tick + 1) every ``CURSOR_EVERY`` seconds, as ``miyamoto.definitions.schedules`` does. With
``merges``, clients also PUT queue settings: the ready leader reads the queue's value,
adds one field and writes the whole value back, as ``DefSync`` does for a "merge"
(``miyamoto.definitions.queues``); ``stale_merges`` is the planted bug of reading the
value on whichever node took the PUT instead.

The checker, after every event:

* no acknowledged write lost: a node that is ``ready`` (a leader allowed to write)
  holds, for every write acknowledged so far, that entry or a newer one;
* no two nodes have writes acknowledged in one definitions term;
* acknowledged cursors never go back: in stamp order their ticks do not decrease (a
  cursor that went back would fire a schedule's tick twice);
* no acknowledged merge lost: a ready leader's queue value holds every field an
  acknowledged merge added (fields are only ever added, so a missing one is a lost update);
* liveness after a full restart: within ``LIVE_WITHIN`` seconds (no other fault meanwhile
  but message loss) a write is acknowledged again and the cursor advances;

and at the end, after the faults stop and the network heals, every live node holds the
same set, and every acknowledged write is in it (or overwritten by a newer one).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from miyamoto.wire import messages as m
from miyamoto.definitions import messages as dm
from miyamoto.wire import verbs as protocol
from miyamoto.definitions.machine import Definitions, Finished, Persist, Received, Tick, View, Write
from miyamoto.wire.messages import Send


CURSOR_EVERY = 0.25
LIVE_WITHIN = 5.0


class SafetyViolation(AssertionError):
    pass


class LivenessViolation(AssertionError):
    pass


@dataclass
class SimNode:
    id: str
    machine: Definitions | None = None
    disk: tuple[tuple[dm.Entry, ...], int, str | None] = ((), 0, None)


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)
    data: Any = field(compare=False)


class Sim:
    def __init__(self, n: int = 3, seed: int = 0, *, loss: float = 0.1,
                 delay: tuple[float, float] = (0.001, 0.05), factory: type = Definitions,
                 merges: bool = False, stale_merges: bool = False):
        self.rng = random.Random(seed)
        self.ids = [f"n{i}" for i in range(n)]
        self.nodes = {i: SimNode(i) for i in self.ids}
        self.loss, self.delay, self.factory = loss, delay, factory
        self.now = 0.0
        self.events: list[_Event] = []
        self.seq = 0
        self.term = 0
        self.leader: str | None = None
        self.acked: dict[tuple[str, str], tuple[int, int]] = {}  # newest acked stamp
        self.writes: dict[tuple[str, int], list[dm.Entry]] = {}  # (node, wid) -> entries
        self.acked_count = 0
        self.term_writer: dict[int, str] = {}  # definitions term -> the node acked in it
        self.cursors: list[tuple[int, int, int]] = []  # acked (term, seq, tick)
        self.next_cursor = 0.0
        self.full_restarts = 0
        self.quiet_until = 0.0  # no faults but loss before this (a liveness window)
        self.live: tuple[float, int, int] | None = None  # (deadline, acked, cursor) to beat
        self.merges, self.stale_merges = merges or stale_merges, stale_merges
        self.merge_fields: dict[tuple[str, int], str] = {}  # (node, wid) -> the field added
        self.acked_fields: set[str] = set()
        self.merge_seq = 0
        for i in self.ids:
            self._start(i)

    # ------------------------------------------------------------ plumbing
    def _push(self, at: float, kind: str, data: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, _Event(at, self.seq, kind, data))

    def _start(self, node_id: str) -> None:
        node = self.nodes[node_id]
        node.machine = self.factory(node_id, resend=0.2, timeout=1.5)
        node.machine.load(*node.disk)
        self._view(node_id, None, 0)

    def _view(self, node_id: str, leader: str | None, term: int) -> None:
        mc = self.nodes[node_id].machine
        if mc is not None:
            self._carry(node_id, mc.step(View(leader, term, tuple(self.ids)), self.now).effects)

    def _carry(self, node_id: str, effects: list[Any]) -> None:
        node = self.nodes[node_id]
        for e in effects:
            if isinstance(e, Persist):
                node.disk = (e.entries, e.term, e.owner)
            elif isinstance(e, Send):
                if self.rng.random() < self.loss:
                    continue
                verb, payload = protocol.decode(protocol.encode(e.msg.verb, e.msg.payload()))
                self._push(self.now + self.rng.uniform(*self.delay), "msg",
                           (node_id, e.to, verb, payload))
            elif isinstance(e, Finished):
                entries = self.writes.pop((node_id, e.wid), None)
                added = self.merge_fields.pop((node_id, e.wid), None)
                if e.ok and added is not None:
                    self.acked_fields.add(added)
                if e.ok and entries is not None:
                    self.acked_count += 1
                    self._acked(node_id, entries)
                    for en in entries:
                        key = (en.kind, en.name)
                        if (en.term, en.seq) > self.acked.get(key, (-1, -1)):
                            self.acked[key] = (en.term, en.seq)

    # ------------------------------------------------------------ faults and clients
    def elect(self) -> None:
        """A new term with a random live leader; each node hears of it after a delay."""
        live = [i for i in self.ids if self.nodes[i].machine is not None]
        if not live:
            return
        self.term += 1
        self.leader = self.rng.choice(live)
        for i in self.ids:
            lag = 0.0 if i == self.leader else self.rng.uniform(0, 0.5)
            self._push(self.now + lag, "view", (i, self.leader, self.term))

    def crash(self, node_id: str) -> None:
        self.nodes[node_id].machine = None

    def full_restart(self) -> None:
        """Every node dies at once (kill -9 of them all); they come back a moment later
        with a membership whose terms start again low."""
        for i in self.ids:
            self.crash(i)
        self.events.clear()  # nothing in flight survives
        self.full_restarts += 1
        self.term, self.leader = self.rng.randrange(0, 2), None
        self._push(self.now + self.rng.uniform(0.2, 1.0), "restart_all", None)

    def _acked(self, node_id: str, entries: list[dm.Entry]) -> None:
        for en in entries:
            writer = self.term_writer.setdefault(en.term, node_id)
            if writer != node_id:
                raise SafetyViolation(f"t={self.now:.2f}: writes of {writer} and {node_id} "
                                      f"both acked in definitions term {en.term}")
            if en.kind == "cursor" and en.value is not None:
                self.cursors.append((en.term, en.seq, en.value["tick"]))
        ticks = [t for _, _, t in sorted(self.cursors)]
        if ticks != sorted(ticks):
            raise SafetyViolation(f"t={self.now:.2f}: an acked cursor went back: {ticks}")

    def cursor_tick(self) -> int:
        return max((t for _, _, t in self.cursors), default=0)

    def cursor_write(self) -> None:
        """The ready leader's schedule round: its cursor's tick + 1, majority-acked."""
        for i in self.ids:
            mc = self.nodes[i].machine
            if mc is not None and mc.ready:
                tick = (mc.get("cursor", "s") or {"tick": 0})["tick"] + 1
                r = mc.step(Write((("cursor", "s", {"tick": tick}),)), self.now)
                wid, effects = r.wid, r.effects
                self.writes[(i, wid)] = [mc.entries[("cursor", "s")]]
                self._carry(i, effects)

    def client_write(self) -> None:
        for i in self.ids:
            mc = self.nodes[i].machine
            if mc is not None and mc.ready:
                key = self.rng.choice(["a", "b", "c", "d"])
                value = None if self.rng.random() < 0.2 else {"v": self.rng.randrange(1000)}
                r = mc.step(Write((("topic", key, value),)), self.now)
                wid, effects = r.wid, r.effects
                self.writes[(i, wid)] = [mc.entries[("topic", key)]]
                self._carry(i, effects)

    def queue_merge(self) -> None:
        """A PUT of one queue setting, merged on the ready leader (or, planted bug, on
        the value a random live node holds)."""
        for i in self.ids:
            mc = self.nodes[i].machine
            if mc is None or not mc.ready:
                continue
            reader = mc
            if self.stale_merges:
                reader = self.rng.choice([n.machine for n in self.nodes.values()
                                          if n.machine is not None])
            self.merge_seq += 1
            added = f"f{self.merge_seq}"
            value = dict(reader.get("queue", "q") or {}, **{added: self.merge_seq})
            r = mc.step(Write((("queue", "q", value),)), self.now)
            self.writes[(i, r.wid)] = [mc.entries[("queue", "q")]]
            self.merge_fields[(i, r.wid)] = added
            self._carry(i, r.effects)

    def _lost_fields(self, mc: Definitions) -> set[str]:
        return self.acked_fields - set(mc.get("queue", "q") or {})

    # ------------------------------------------------------------ running
    def run(self, until: float, *, faults: bool = True, dt: float = 0.05) -> None:
        next_tick = self.now
        while self.now < until:
            if self.events and self.events[0].at <= next_tick:
                ev = heapq.heappop(self.events)
                self.now = max(self.now, ev.at)
                self._event(ev)
            else:
                self.now = next_tick
                next_tick += dt
                self._tick_all(faults)
            self.check()

    def _event(self, ev: _Event) -> None:
        if ev.kind == "view":
            node_id, leader, term = ev.data
            self._view(node_id, leader, term)
        elif ev.kind == "msg":
            sender, to, verb, payload = ev.data
            mc = self.nodes[to].machine
            if mc is not None:
                self._carry(to, mc.step(Received(sender, m.decode(verb, payload)), self.now).effects)
        elif ev.kind == "elect":
            self.elect()
        elif ev.kind == "restart_all":
            for i in self.ids:
                self._start(i)
            self.elect()
            self.quiet_until = self.now + LIVE_WITHIN
            self.live = (self.now + LIVE_WITHIN, self.acked_count, self.cursor_tick())
        elif ev.kind == "restart":
            self._start(ev.data)
            if self.leader is not None:
                self._push(self.now + 0.1, "view", (ev.data, self.leader, self.term))

    def _tick_all(self, faults: bool) -> None:
        for i in self.ids:
            mc = self.nodes[i].machine
            if mc is not None:
                self._carry(i, mc.step(Tick(), self.now).effects)
        if not faults:  # healing: no new writes, so that the end state settles
            return
        if self.now >= self.next_cursor:
            self.next_cursor = self.now + CURSOR_EVERY
            self.cursor_write()
        if self.merges and self.rng.random() > 0.8:
            self.queue_merge()
        if self.now < self.quiet_until:
            if self.rng.random() > 0.7:
                self.client_write()
            return
        r = self.rng.random()
        if r < 0.004:
            self.full_restart()
        elif r < 0.01:
            self.elect()
        elif r < 0.015:
            victim = self.rng.choice(self.ids)
            if self.nodes[victim].machine is not None:
                self.crash(victim)
                self._push(self.now + self.rng.uniform(0.2, 2.0), "restart", victim)
                if victim == self.leader:
                    self._push(self.now + self.rng.uniform(0.5, 1.0), "elect", None)
        if r > 0.7:
            self.client_write()

    def heal(self) -> None:
        """Stop losing messages, bring every node back, and elect a leader they all see."""
        self.loss = 0.0
        self.live = None  # liveness is checked while writes go on, not while healing
        self.events = [ev for ev in self.events if ev.kind != "restart_all"]
        heapq.heapify(self.events)
        for i in self.ids:
            if self.nodes[i].machine is None:
                self._start(i)
        self.elect()

    # ------------------------------------------------------------ checks
    def check(self) -> None:
        if self.live is not None:
            deadline, acked, cursor = self.live
            if self.acked_count > acked and self.cursor_tick() > cursor:
                self.live = None
            elif self.now >= deadline:
                raise LivenessViolation(
                    f"t={self.now:.2f}: {LIVE_WITHIN}s after a full restart, acked writes "
                    f"{acked} -> {self.acked_count}, cursor {cursor} -> {self.cursor_tick()}")
        for i in self.ids:
            mc = self.nodes[i].machine
            if mc is None or not mc.ready:
                continue
            for key, stamp in self.acked.items():
                e = mc.entries.get(key)
                if e is None or (e.term, e.seq) < stamp:
                    raise SafetyViolation(f"t={self.now:.2f}: ready leader {i} (term "
                                          f"{mc.term}) lacks acked {key} {stamp}; has {e}")
            lost = self._lost_fields(mc)
            if lost:
                raise SafetyViolation(f"t={self.now:.2f}: ready leader {i}'s queue lost the "
                                      f"acked merges of {sorted(lost)[:5]}")

    def converged(self) -> bool:
        sets = {self.nodes[i].machine.digest() for i in self.ids
                if self.nodes[i].machine is not None}
        return len(sets) == 1

    def final_check(self) -> None:
        if not self.converged():
            raise SafetyViolation("members did not converge: " + ", ".join(
                f"{i}={self.nodes[i].machine.digest()}" for i in self.ids))
        any_node = self.nodes[self.ids[0]].machine
        if self._lost_fields(any_node):
            raise SafetyViolation(f"acked merges lost at the end: "
                                  f"{sorted(self._lost_fields(any_node))[:5]}")
        for key, stamp in self.acked.items():
            e = any_node.entries.get(key)
            if e is None or (e.term, e.seq) < stamp:
                raise SafetyViolation(f"acked write {key} {stamp} lost at the end: {e}")
