"""A deterministic simulator for ``miyamoto.membership.machine``: nodes, a network, faults.

Time is fake: the clock advances in steps of ``dt`` and every message is delivered at
its own (randomly delayed) time. The network loses messages at a settable rate, splits
into partitions, and drops whatever is sent to a crashed node. A crash throws the
node's ``Membership`` away; a restart builds a fresh one with the same id and address
(``first_start=False``, as the node does when its data directory already exists).
A pause (SIGSTOP, a VM freeze) stops a node: it neither ticks nor steps, and what is
sent to it waits in its inbox; on resume it gets a tick and its inbox, in either order,
all at the resume time. Every message goes through ``protocol.encode``/``decode`` and
is decoded into its type, as the cluster layer does, so payloads must be real JSON; a
send is addressed as the layer addresses it (its ``address``, else the sender's roster).

While it runs, the simulator checks after every event:

* election safety: two different leaders in one term is a violation unless every
  process that voted for the first one has since crashed (without stable storage
  nobody remembers such a term; see the ``membership`` docstring). It records those
  harmless reuses in ``forgotten_terms``;
* a node back from a pause acts on nothing stale: until it has processed messages
  *sent after its resume* from a quorum of its roster (itself counted), it makes no
  roster change (admission or removal), and it reports ``in_contact`` only once it has
  heard so from a quorum (a leader) or from its leader (a follower).

A ``Byzantine`` sender can join the network (``attack_run``): a key holder that is not a
current member, which replays what it heard, inflates terms and speaks for members. Its
runs check that the honest nodes keep, or within a few election timeouts regain, a
leader they all agree on (``Sim.agreed``), and that no term jumps.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from miyamoto.membership import messages as mm
from miyamoto.membership.machine import EMPTY, MAX_TERM, VERBS, Leave, Member, Membership, \
    Received, Roster, Send, Tick, Timing
from miyamoto.wire import messages as msgs
from miyamoto.wire import verbs as protocol
from miyamoto.wire.verbs import DecodeError, Verb


class SafetyViolation(AssertionError):
    pass


@dataclass
class Node:
    id: str
    member: Member
    proc: Membership | None = None
    generation: int = 0  # bumped at every (re)start: identifies the process
    started: bool = False
    paused: bool = False
    inbox: list = field(default_factory=list)  # what arrived while paused
    resumed_at: float | None = None  # the last resume, after a pause beyond Timing.stall
    paused_at: float = 0.0
    settled: bool = False  # in contact after that resume, rightly: no need to check more
    fresh: set = field(default_factory=set)  # senders heard with a message sent after it
    last_roster: Roster = EMPTY  # the roster after its previous event
    deadline: float = 0.0  # its next_deadline() after its previous event


@dataclass(order=True)
class _Msg:
    at: float
    seq: int
    src: str = field(compare=False)
    dst: str = field(compare=False)
    frames: list = field(compare=False)
    sent: float = field(compare=False, default=0.0)


class Sim:
    def __init__(self, seed: int, n: int, timing: Timing = Timing(), *,
                 delay: tuple[float, float] = (0.001, 0.02), dt: float = 0.05,
                 membership: type[Membership] = Membership):
        self.seed = seed
        self.rng = random.Random(seed)
        self.timing = timing
        self.delay = delay
        self.dt = dt
        self.membership = membership
        self.trace: list[tuple[str, str, Verb, dict]] | None = None  # set to a list to record
        self.now = 0.0
        self.loss = 0.0
        self.groups: dict[str, int] = {}  # node id -> partition; absent = group 0
        self.nodes = {f"n{i}": Node(f"n{i}", Member(f"n{i}", f"tcp://n{i}:6000",
                                                    f"n{i}:8000")) for i in range(n)}
        self.by_address = {nd.member.cluster: nd.id for nd in self.nodes.values()}
        self.seeds = sorted(self.by_address)
        self.queue: list[_Msg] = []
        self.resumes: list[tuple[float, str, bool]] = []  # (at, node id, tick first)
        self.seq = 0
        self.delivered = 0
        # safety bookkeeping
        self.leaders: dict[int, dict[str, set[tuple[str, int]]]] = {}  # term -> id -> voters
        self.votes: dict[tuple[int, str], set[tuple[str, int]]] = {}
        self.forgotten_terms: list[int] = []
        self.max_term_seen = 0
        # with a Byzantine sender about: honest nodes answer it at addresses of its choice
        self.hostile = False
        self.undecodable = 0  # dropped as the cluster layer drops them (absurd terms, ...)
        self.discarded = 0  # sent to an address no node has (the attacker's)

    # ------------------------------------------------------------- node control
    def start(self, node_id: str, *, first_start: bool | None = None) -> None:
        nd = self.nodes[node_id]
        if first_start is None:
            first_start = not nd.started
        nd.generation += 1
        nd.started = True
        self._forget(nd)
        nd.proc = self.membership(nd.member, self.seeds, self.timing,
                             random.Random(self.rng.getrandbits(64)), self.now,
                             first_start=first_start)
        self._after(nd, nd.proc.step(Tick(), self.now))

    def crash(self, node_id: str) -> None:
        nd = self.nodes[node_id]
        nd.proc = None
        self._forget(nd)

    def _forget(self, nd: Node) -> None:
        nd.paused, nd.inbox, nd.resumed_at, nd.fresh = False, [], None, set()
        nd.settled = False
        nd.last_roster = EMPTY
        self.resumes = [r for r in self.resumes if r[1] != nd.id]

    def pause(self, node_id: str, duration: float | None = None, *,
              tick_first: bool = True) -> None:
        """Stop a node (its inbox fills); resume it after ``duration``, if given."""
        nd = self.nodes[node_id]
        if nd.proc is None or nd.paused:
            return
        nd.paused, nd.paused_at = True, self.now
        if duration is not None:
            self.resumes.append((self.now + duration, node_id, tick_first))

    def resume(self, node_id: str, *, tick_first: bool = True) -> None:
        """Wake a paused node: a tick and its inbox (in the order asked), all at ``now``."""
        nd = self.nodes[node_id]
        self.resumes = [r for r in self.resumes if r[1] != node_id]
        if nd.proc is None or not nd.paused:
            return
        # A shorter pause looks like a busy loop to the node: the rule is not for it.
        long = self.now - nd.paused_at > self.timing.stall
        nd.paused, nd.fresh, nd.settled = False, set(), False
        nd.resumed_at = self.now if long else None
        inbox, nd.inbox = nd.inbox, []
        if tick_first:
            self._after(nd, nd.proc.step(Tick(), self.now))
        for msg in inbox:
            if nd.proc is not None and not nd.paused:
                self._step(nd, msg, self.now)
        if not tick_first and nd.proc is not None:
            self._after(nd, nd.proc.step(Tick(), self.now))

    def paused(self) -> list[Node]:
        return [nd for nd in self.nodes.values() if nd.paused]

    def leave(self, node_id: str) -> None:
        nd = self.nodes[node_id]
        if nd.proc is not None and not nd.paused:
            self._after(nd, nd.proc.step(Leave(), self.now))

    def alive(self) -> list[Node]:
        return [nd for nd in self.nodes.values()
                if nd.proc is not None and nd.proc.role != "left"]

    def down(self) -> list[Node]:
        return [nd for nd in self.nodes.values()
                if nd.proc is None or nd.proc.role == "left"]

    # ------------------------------------------------------------------ network
    def partition(self, *groups: list[str]) -> None:
        self.groups = {nid: g for g, members in enumerate(groups) for nid in members}

    def heal(self) -> None:
        self.groups = {}

    def _connected(self, a: str, b: str) -> bool:
        return self.groups.get(a, 0) == self.groups.get(b, 0)

    def _send(self, src: str, roster: Roster, s: Send) -> None:
        address = s.address
        if address is None:  # then ``to`` must be in the sender's roster
            member = roster.get(s.to) if s.to is not None else None
            assert member is not None, f"{src} sent {s.msg.verb} to {s.to} without an address"
            address = member.cluster
        dst = self.by_address.get(address)
        if self.hostile and (dst is None or s.to not in (None, dst)):
            self.discarded += 1  # an answer to a forged sender, at the address it gave
            return
        assert dst is not None, f"send to unknown address {address}"
        assert s.to in (None, dst), f"{s.to} is not at {address}"
        payload = s.msg.payload()
        frames = protocol.encode(s.msg.verb, payload)  # must be JSON-serialisable
        if self.trace is not None:
            self.trace.append((src, dst, s.msg.verb, payload))
        if self.rng.random() < self.loss:
            return
        self.seq += 1
        heapq.heappush(self.queue, _Msg(self.now + self.rng.uniform(*self.delay),
                                        self.seq, src, dst, frames, self.now))

    # --------------------------------------------------------------------- time
    def run(self, duration: float, until=None) -> bool:
        """Advance ``duration`` seconds; stop early (True) once ``until(self)`` holds."""
        end = self.now + duration
        while self.now < end:
            step_end = min(self.now + self.dt, end)
            while self.queue and self.queue[0].at <= step_end:
                msg = heapq.heappop(self.queue)
                self.now = max(self.now, msg.at)
                self._deliver(msg)
            self.now = step_end
            for at, nid, tick_first in sorted(self.resumes):
                if at <= self.now:
                    self.resume(nid, tick_first=tick_first)
            for nd in self.nodes.values():
                if (nd.proc is not None and not nd.paused
                        and nd.deadline <= self.now):
                    self._after(nd, nd.proc.step(Tick(), self.now))
            if until is not None and until(self):
                return True
        return until is not None and until(self)

    def _deliver(self, msg: _Msg) -> None:
        nd = self.nodes[msg.dst]
        if nd.proc is None or not self._connected(msg.src, msg.dst):
            return
        if nd.paused:
            nd.inbox.append(msg)
            return
        self._step(nd, msg, msg.at)

    def inject(self, src: str, dst: str, verb: Verb, payload: dict) -> None:
        """A message from outside the simulated nodes (``src``: its routing id)."""
        self.seq += 1
        frames = protocol.encode(verb, payload)
        heapq.heappush(self.queue, _Msg(self.now + self.rng.uniform(*self.delay),
                                        self.seq, src, dst, frames, self.now))

    def _step(self, nd: Node, msg: _Msg, now: float) -> None:
        assert nd.proc is not None
        verb, payload = protocol.decode(msg.frames)
        assert verb in VERBS
        try:
            typed = msgs.decode(verb, payload)
        except DecodeError:
            assert self.hostile, f"an honest node sent what does not decode: {payload}"
            self.undecodable += 1
            return
        self.delivered += 1
        if nd.resumed_at is not None and msg.sent > nd.resumed_at:
            nd.fresh.add(msg.src)
        self._after(nd, nd.proc.step(Received(msg.src, typed), now))

    def _after(self, nd: Node, sends: list[Send]) -> None:
        proc = nd.proc
        assert proc is not None
        if nd.resumed_at is not None:
            self._check_resumed(nd, proc)
        nd.last_roster = proc.roster
        nd.deadline = proc.next_deadline()  # it changes only when the node acts
        for s in sends:
            if isinstance(s.msg, mm.Vote) and s.msg.granted:
                key = (s.msg.term, s.to)
                self.votes.setdefault(key, set()).add((nd.id, nd.generation))
            self._send(nd.id, proc.roster, s)
        self.max_term_seen = max(self.max_term_seen, proc.term)
        if proc.is_leader:
            self._record_leader(nd, proc.term)

    def _record_leader(self, nd: Node, term: int) -> None:
        seen = self.leaders.setdefault(term, {})
        if nd.id in seen:
            return
        voters = self.votes.get((term, nd.id), set()) | {(nd.id, nd.generation)}
        for other, other_voters in seen.items():
            living = [v for v in other_voters if self.nodes[v[0]].generation == v[1]
                      and self.nodes[v[0]].proc is not None]
            if living:
                raise SafetyViolation(
                    f"seed {self.seed}: {other} and {nd.id} both led term {term} "
                    f"(voters of {other} still alive: {sorted(living)}) at t={self.now:.2f}")
            self.forgotten_terms.append(term)
        seen[nd.id] = voters

    def _check_resumed(self, nd: Node, proc: Membership) -> None:
        """A node back from a pause acts on nothing stale (see the module docstring).

        Checked from the resume until the node has heard, by messages sent after it,
        from a quorum of its roster (or, a follower, from its leader): ``settled``.
        """
        if nd.settled:
            return
        old, new = nd.last_roster, proc.roster
        heard = (nd.fresh & set(old.ids())) | {nd.id}
        # its own change: from a roster it led to another it leads (a roster adopted from
        # another leader, then won in the same event, is that leader's change)
        if (old.leader == new.leader == nd.id and new.key > old.key
                and set(new.ids()) != set(old.ids()) and len(heard) < old.quorum()):
            raise SafetyViolation(
                f"seed {self.seed}: {nd.id} resumed at t={nd.resumed_at:.2f} and changed "
                f"the roster {sorted(old.ids())} -> {sorted(new.ids())} in term {new.term} "
                f"at t={self.now:.2f}, having heard only {sorted(nd.fresh)} since")
        quorate = any(len((nd.fresh & set(r.ids())) | {nd.id}) >= r.quorum() and r.members
                      for r in (old, new))  # the roster it heard from may have just changed
        if ((proc.is_leader and len(new.members) == 1) or quorate
                or (not proc.is_leader and proc.leader in nd.fresh)):
            nd.settled = True
        elif proc.in_contact(self.now):
            raise SafetyViolation(
                f"seed {self.seed}: {nd.id} resumed at t={nd.resumed_at:.2f} and is in "
                f"contact at t={self.now:.2f} as {proc.role}, having heard only "
                f"{sorted(nd.fresh)} since")

    # ------------------------------------------------------------------- checks
    def leader(self) -> Node | None:
        """The leader that a majority of the live nodes follow, if any."""
        live = self.alive()
        for nd in live:
            p = nd.proc
            if p is not None and p.is_leader:
                followers = [o for o in live if o.proc is not None
                             and o.proc.term == p.term and o.proc.leader == nd.id]
                if len(followers) >= len(live) // 2 + 1:
                    return nd
        return None

    def agreed(self) -> Node | None:
        """The leader every live, running node follows in its term, with a roster that
        names each of them (by its current incarnation); None if there is none."""
        live = [nd for nd in self.alive() if not nd.paused]
        chiefs = [nd for nd in live if nd.proc is not None and nd.proc.is_leader]
        if len(chiefs) != 1:
            return None
        chief = chiefs[0].proc
        assert chief is not None
        for nd in live:
            p = nd.proc
            assert p is not None
            if (p.term != chief.term or p.leader != chief.me.id
                    or not chief.roster.has(nd.id, p.incarnation)):
                return None
        return chiefs[0]

    def current(self) -> set[tuple[str, str]]:
        """(id, incarnation) of every live process and every member a live roster names:
        what an attacker without a member's key cannot speak as (point 2's keys)."""
        out = set()
        for nd in self.alive():
            assert nd.proc is not None
            out.add((nd.id, nd.proc.incarnation))
            out.update((m.id, i) for m, i in nd.proc.roster.pairs())
        return out

    def top_term(self) -> int:
        return max((nd.proc.term for nd in self.alive() if nd.proc is not None), default=0)

    def converged(self) -> bool:
        """Every node alive, one leader, one roster that names every live process."""
        live = self.alive()
        if len(live) != len(self.nodes):
            return False
        first = live[0].proc
        assert first is not None
        r = first.roster
        if r.leader is None or sorted(r.ids()) != sorted(self.nodes):
            return False
        for nd in live:
            p = nd.proc
            assert p is not None
            if (p.roster != r or p.leader != r.leader or p.term != first.term
                    or not r.has(nd.id, p.incarnation)):
                return False
            if p.role != ("leader" if nd.id == r.leader else "follower"):
                return False
        return True

    def describe(self) -> str:
        lines = [f"t={self.now:.2f} loss={self.loss} groups={self.groups}"]
        for nd in self.nodes.values():
            p = nd.proc
            if p is None:
                lines.append(f"  {nd.id}: down")
            elif nd.paused:
                lines.append(f"  {nd.id}#{nd.generation}: paused ({len(nd.inbox)} waiting)")
            else:
                r = p.roster
                lines.append(f"  {nd.id}#{nd.generation}: {p.role} term={p.term} "
                             f"leader={p.leader} roster=({r.term},{r.version}) "
                             f"{list(r.ids())} inc={p.incarnation[:4]}")
        return "\n".join(lines)


def chaos_run(seed: int, *, max_leader_wait: float = 15.0,
              max_converge: float = 30.0, pauses: bool = False,
              membership: type[Membership] = Membership) -> dict:
    """One random run: bootstrap, faults for a while, then heal and check liveness.

    ``pauses`` adds pauses of any node, often the leader, of up to three failure
    timeouts, resumed tick first or inbox first. Returns timings for the report; raises
    AssertionError (with the seed) on a failure, SafetyViolation on a broken invariant.
    """
    rng = random.Random(seed ^ 0x5EED)
    n = rng.randint(3, 7)
    # A slow network reorders messages; narrow election timeouts split votes (on a fast
    # network only: Raft needs the timeout spread to exceed a round trip).
    delay = rng.choice([(0.001, 0.01), (0.001, 0.02), (0.001, 0.05), (0.005, 0.1)])
    narrow = delay[1] <= 0.02 and rng.random() < 0.4
    timing = Timing(election_timeout_min=1.5, election_timeout_max=1.6 if narrow else 3.0)
    sim = Sim(seed, n, timing, delay=delay, membership=membership)
    late = rng.choice(list(sim.nodes)) if rng.random() < 0.25 else None
    for nid in sim.nodes:
        if nid != late:
            sim.start(nid)
    chaos = rng.uniform(3.0, 25.0)
    sim.loss = rng.choice([0.0, 0.0, 0.01, 0.05, 0.2])
    mean_gap = rng.uniform(0.3, 3.0)
    events = 0
    while sim.now < chaos:
        sim.run(min(rng.expovariate(1 / mean_gap), chaos - sim.now))
        events += 1
        ids = list(sim.nodes)
        kinds, weights = ["split", "isolate", "heal", "crash", "restart", "leave", "loss",
                          "late", "depose"], [3, 2, 3, 3, 3, 1, 1, 1, 3]
        if pauses:
            kinds, weights = kinds + ["pause", "pause-leader"], weights + [3, 4]
        kind = rng.choices(kinds, weights)[0]
        leader = sim.leader()
        if kind == "depose" and leader is not None:  # cut the leader off, or kill it
            kind = rng.choice(["isolate-leader", "crash-leader"])
        if kind in ("pause", "pause-leader"):
            up = [nd.id for nd in sim.alive() if not nd.paused]
            victim = leader.id if kind == "pause-leader" and leader is not None else (
                rng.choice(up) if up else None)
            if victim is not None:
                sim.pause(victim, rng.uniform(0.5, 3 * timing.failure_timeout),
                          tick_first=rng.random() < 0.5)
        elif kind == "split":
            rng.shuffle(ids)
            cut = rng.randint(1, len(ids) - 1)
            sim.partition(ids[:cut], ids[cut:])
        elif kind == "isolate":
            victim = rng.choice(ids)
            sim.partition([i for i in ids if i != victim], [victim])
        elif kind == "isolate-leader":
            sim.partition([i for i in ids if i != leader.id], [leader.id])
        elif kind == "crash-leader":
            sim.crash(leader.id)
        elif kind == "heal":
            sim.heal()
        elif kind == "crash":
            up = [nd.id for nd in sim.alive()]
            if up:
                sim.crash(rng.choice(up))
        elif kind == "restart":
            down = [nd.id for nd in sim.down() if nd.id != late]
            if down:
                sim.start(rng.choice(down))
        elif kind == "leave":
            up = [nd.id for nd in sim.alive() if not nd.paused]
            if up:
                sim.leave(rng.choice(up))
        elif kind == "loss":
            sim.loss = rng.choice([0.0, 0.01, 0.05, 0.2, 0.5])
        elif kind == "late" and late is not None:
            sim.start(late)
            late = None
    # Heal: no more faults from here on.
    sim.heal()
    sim.loss = 0.0
    for nd in sim.paused():
        sim.resume(nd.id, tick_first=rng.random() < 0.5)
    healed_at = sim.now
    for nd in sim.down():
        sim.start(nd.id)
    got_leader = sim.run(max_leader_wait, until=lambda s: s.leader() is not None)
    assert got_leader, (f"seed {seed}: no leader {max_leader_wait}s after healing\n"
                        + sim.describe())
    leader_after = sim.now - healed_at
    done = sim.run(max_converge - leader_after, until=Sim.converged)
    assert done, (f"seed {seed}: no agreement {max_converge}s after healing\n"
                  + sim.describe())
    converge_after = sim.now - healed_at
    # Timers armed before the heal may still fire once (a follower that was cut off
    # from the leader starts a pre-vote); after that the cluster must stay quiet.
    sim.run(sim.timing.election_timeout_max)
    assert sim.run(max_converge, until=Sim.converged), (
        f"seed {seed}: agreement did not come back\n" + sim.describe())
    leader = sim.leader()
    assert leader is not None and leader.proc is not None
    term = leader.proc.term
    sim.run(5.0)
    assert sim.converged() and sim.leader() is leader and leader.proc.term == term, (
        f"seed {seed}: agreement did not last\n" + sim.describe())
    return {"n": n, "chaos": chaos, "events": events, "leader_after": leader_after,
            "converge_after": converge_after, "sim_time": sim.now,
            "forgotten": len(sim.forgotten_terms), "delivered": sim.delivered}


def majority_run(seed: int, *, max_leader_wait: float = 15.0,
                 max_converge: float = 20.0) -> dict:
    """A formed cluster loses a minority (crashed or cut off, often the leader).

    The connected majority must have a leader within ``max_leader_wait`` and agree on a
    roster of exactly its own members within ``max_converge``; once the minority is
    back, everyone must agree again.
    """
    rng = random.Random(seed ^ 0xBEEF)
    n = rng.randint(3, 7)
    sim = Sim(seed, n, delay=rng.choice([(0.001, 0.01), (0.001, 0.05)]))
    for nid in sim.nodes:
        sim.start(nid)
    assert sim.run(30.0, until=Sim.converged), f"seed {seed}: no cluster\n" + sim.describe()
    sim.run(rng.uniform(0.0, 3.0))
    ids = list(sim.nodes)
    rng.shuffle(ids)
    lost = ids[:rng.randint(1, (n - 1) // 2)]
    leader = sim.leader()
    assert leader is not None
    if leader.id not in lost and rng.random() < 0.5:
        lost[0] = leader.id
    crashed = [x for x in lost if rng.random() < 0.5]
    cut = [x for x in lost if x not in crashed]
    for x in crashed:
        sim.crash(x)
    if cut:
        sim.partition([x for x in ids if x not in cut], cut)
    majority = sorted(x for x in ids if x not in lost)
    t0 = sim.now

    def led(s: Sim) -> bool:
        procs = [s.nodes[x].proc for x in majority]
        chief = [p for p in procs if p is not None and p.is_leader]
        return len(chief) == 1 and all(p is not None and p.leader == chief[0].me.id
                                       and p.term == chief[0].term for p in procs)

    def agreed(s: Sim) -> bool:
        procs = [s.nodes[x].proc for x in majority]
        r = procs[0].roster if procs[0] is not None else None
        return (led(s) and r is not None and sorted(r.ids()) == majority
                and all(p is not None and p.roster == r for p in procs))

    assert sim.run(max_leader_wait, until=led), (
        f"seed {seed}: majority {majority} without a leader\n" + sim.describe())
    leader_after = sim.now - t0
    assert sim.run(max_converge - leader_after, until=agreed), (
        f"seed {seed}: majority {majority} did not drop {lost}\n" + sim.describe())
    converge_after = sim.now - t0
    sim.heal()
    for x in crashed:
        sim.start(x)
    assert sim.run(30.0, until=Sim.converged), (
        f"seed {seed}: {lost} did not rejoin\n" + sim.describe())
    return {"n": n, "lost": len(lost), "leader_after": leader_after,
            "converge_after": converge_after}


# ----------------------------------------------------------------------- attacks
_ATTACK_VERBS = (Verb.VOTE_REQUEST, Verb.VOTE, Verb.HEARTBEAT, Verb.ROSTER,
                 Verb.HEARTBEAT_ACK, Verb.LEAVE)


class Byzantine:
    """A Byzantine-lite sender: a key holder that is not a current member.

    ``me`` is who it says it is: an outsider, or a member that left or was dropped (its
    id and the incarnation it had). ``forge_routing``: it may send under any member's
    routing id (a key holder can pick its DEALER identity), but never as a member's
    *current* incarnation, which is what the per-node keys of point 2 of the trust issue
    make unforgeable; without it, every frame goes under ``me.id``. ``recorded`` is what
    it heard earlier, to replay. Each ``burst`` sends every live node ``k`` frames, a
    random mix of: replays verbatim; replays with terms inflated (one above the cluster's,
    a step, a step and one, 2**52 and beyond) and re-signed as itself or kept in the
    sender's name; and forged VOTE_REQUEST (pre, transfer), VOTE, HEARTBEAT, ROSTER,
    HEARTBEAT_ACK and LEAVE in its own name or a member's. JOIN and REDIRECT it leaves
    alone: claiming to be a restarted member, or pointing a joiner at itself, needs an
    identity that only point 2 can check (see the membership docstring, Terms).
    """

    def __init__(self, rng: random.Random, me: Member, inc: str,
                 recorded: list[tuple[Verb, dict]], *, forge_routing: bool = False):
        self.rng = rng
        self.me = me
        self.inc = inc
        self.recorded = [(v, p) for v, p in recorded if v in _ATTACK_VERBS]
        self.forge_routing = forge_routing
        self.sent = 0

    def burst(self, sim: Sim, k: int) -> None:
        current = sim.current()
        members = sorted({m for nd in sim.alive() if nd.proc is not None
                          for m in nd.proc.roster.members}, key=lambda m: m.id)
        for nd in sim.alive():
            for _ in range(k):
                verb, payload = self._frame(sim.top_term(), sim.timing.term_step, members)
                sender = payload["from"]["id"]
                src = self.me.id
                if self.forge_routing and (sender, payload["inc"]) not in current:
                    src = sender  # its routing id matches the payload: only the inc can tell
                sim.inject(src, nd.id, verb, payload)
                self.sent += 1

    def _frame(self, top: int, step: int, members: list[Member]) -> tuple[Verb, dict]:
        r = self.rng.random()
        if r < 0.2 and self.recorded:
            return self.rng.choice(self.recorded)
        if r < 0.55 and self.recorded:
            verb, p = self.rng.choice(self.recorded)
            p = dict(p, term=self._term(top, step, p["term"]))
            if self.rng.random() < 0.5:
                p.update({"from": self.me.to_payload(), "inc": self.inc})
                if "roster" in p:  # a roster must name its sender as leader
                    return verb, dict(p, roster=self._roster(p["term"], members).to_payload())
            if verb is Verb.VOTE_REQUEST and self.rng.random() < 0.5:
                p.update(rterm=p["term"], version=self.rng.choice([1, 10**6, MAX_TERM]))
            return verb, p
        return self._forged(top, step, members)

    def _term(self, top: int, step: int, was: int) -> int:
        return self.rng.choice([was + 1, top + 1, top + 2, top + step, top + step + 1,
                                top + 50, MAX_TERM - 1, MAX_TERM, MAX_TERM + 1])

    def _forged(self, top: int, step: int, members: list[Member]) -> tuple[Verb, dict]:
        term = self._term(top, step, top)
        who, inc = self.me, self.inc
        if members and self.rng.random() < 0.5:  # in a member's name, a guessed process
            who, inc = self.rng.choice(members), f"{self.rng.getrandbits(64):016x}"
        env = {"term": term, "inc": inc, "sender": who}
        verb = self.rng.choice(_ATTACK_VERBS)
        big = self.rng.choice([top, term, MAX_TERM])
        msg: mm.MembershipMessage
        if verb is Verb.VOTE_REQUEST:
            msg = mm.VoteRequest(**env, rterm=min(big, term), version=big,
                                 pre=self.rng.random() < 0.3,
                                 transfer=self.rng.random() < 0.3)
        elif verb is Verb.VOTE:
            msg = mm.Vote(**env, granted=True, pre=self.rng.random() < 0.3)
        elif verb in (Verb.HEARTBEAT, Verb.ROSTER):
            cls = mm.Heartbeat if verb is Verb.HEARTBEAT else mm.RosterUpdate
            roster = self._roster(term, members, leader=who, inc=inc)
            msg = cls(**env, roster=roster, elect=self.rng.choice([None, who.id]))
        elif verb is Verb.HEARTBEAT_ACK:
            msg = mm.HeartbeatAck(**env, ok=self.rng.random() < 0.5, rterm=min(big, term),
                                  version=big)
        else:
            msg = mm.Leave(**env)
        return verb, msg.payload()

    def _roster(self, term: int, members: list[Member], leader: Member | None = None,
                inc: str | None = None) -> Roster:
        """A roster led by ``leader`` (itself by default) naming members, with guessed
        incarnations for all but itself, and a version far ahead."""
        leader = leader or self.me
        others = [m for m in members if m.id != leader.id]
        return Roster(self.rng.choice([1, 10**6, MAX_TERM]), min(term, MAX_TERM), leader.id,
                      (leader, *others),
                      (inc or self.inc, *(f"{self.rng.getrandbits(64):016x}" for _ in others)))


def _form(sim: Sim) -> None:
    for nid in sim.nodes:
        sim.start(nid)
    assert sim.run(30.0, until=Sim.converged), f"seed {sim.seed}: no cluster\n" + sim.describe()


def attack_run(seed: int, *, forge_routing: bool = False, former: bool = False,
               faults: bool = False, duration: float = 15.0,
               membership: type[Membership] = Membership) -> dict:
    """A formed cluster under a ``Byzantine`` sender for ``duration`` seconds.

    ``former``: the attacker is a member that left (or crashed and was dropped), with
    its id and last incarnation; else an outsider, "mallory". ``faults``: meanwhile the
    leader is killed (and restarted 2 s later) once, and a follower is cut off for 2 s.
    Checked: safety at every event (the simulator's); no leaderless stretch (no
    ``Sim.agreed`` leader) longer than three election timeouts; without faults, the
    leader and its term never change; with them, no term beyond a few steps. Raises
    AssertionError with the seed.
    """
    rng = random.Random(seed ^ 0xBAD)
    n = rng.randint(4 if former else 3, 5)  # a quorum outlives the attacker and a fault
    sim = Sim(seed, n, delay=rng.choice([(0.001, 0.01), (0.001, 0.05)]),
              membership=membership)
    sim.trace = []
    _form(sim)
    again = rng.choice(list(sim.nodes))  # history: an incarnation that is gone
    sim.crash(again)
    sim.start(again)
    assert sim.run(30.0, until=Sim.converged), f"seed {seed}: no rejoin\n" + sim.describe()
    recorded = [(verb, p) for _, _, verb, p in sim.trace]
    sim.trace = None
    sim.hostile = True
    me, inc = Member("mallory", "tcp://mallory:6000", "mallory:8000"), "0badc0de0badc0de"
    if former:  # a member goes (for good: the attacker speaks as it now)
        gone = sim.nodes[rng.choice(list(sim.nodes))]
        assert gone.proc is not None
        me, inc = gone.proc.me, gone.proc.incarnation
        sim.leave(gone.id) if rng.random() < 0.5 else sim.crash(gone.id)
        assert sim.run(30.0, until=lambda s: s.agreed() is not None
                       and (me.id, inc) not in s.current()), sim.describe()
    attacker = Byzantine(random.Random(seed), me, inc, recorded, forge_routing=forge_routing)
    start = sim.agreed()
    assert start is not None and start.proc is not None
    term0 = start.proc.term
    budget = 3 * sim.timing.election_timeout_max
    events = _faults(sim, rng, duration - budget) if faults else []
    t0 = last_led = sim.now
    worst = 0.0
    while sim.now < t0 + duration:
        while events and sim.now - t0 >= events[0][0]:
            events.pop(0)[1]()
        attacker.burst(sim, rng.randint(1, 4))
        sim.run(rng.uniform(0.02, 0.3))
        chief = sim.agreed()
        if chief is not None:
            last_led = sim.now
        worst = max(worst, sim.now - last_led)
        assert worst <= budget, (f"seed {seed}: no agreed leader for {worst:.1f}s under "
                                 f"attack\n" + sim.describe())
        if not faults:
            assert chief is start and chief.proc is not None and chief.proc.term == term0, (
                f"seed {seed}: the attack moved the leader or its term (was {start.id} "
                f"in term {term0})\n" + sim.describe())
    bound = term0 + (3 * sim.timing.term_step if faults else 0)
    assert sim.max_term_seen <= bound, (f"seed {seed}: a term rose to {sim.max_term_seen} "
                                        f"(from {term0})\n" + sim.describe())
    return {"n": n, "sent": attacker.sent, "worst_leaderless": worst,
            "undecodable": sim.undecodable, "terms": (term0, sim.max_term_seen)}


def _faults(sim: Sim, rng: random.Random, within: float) -> list[tuple[float, object]]:
    """(seconds into the attack, action): the leader killed and restarted 2 s later, and
    a follower cut off for 2 s, at random times, apart."""
    killed: list[str] = []

    def kill() -> None:
        chief = sim.agreed()
        if chief is not None:
            killed.append(chief.id)
            sim.crash(chief.id)

    def restart() -> None:
        for x in killed:
            sim.start(x)

    def cut() -> None:
        chief = sim.agreed()
        victim = rng.choice([x for x in sim.alive() if chief is None or x is not chief])
        sim.partition([x for x in sim.nodes if x != victim.id], [victim.id])

    a = rng.uniform(0.5, within / 2 - 2.0)
    b = rng.uniform(within / 2, within - 2.0)
    first, second = ((kill, restart), (cut, sim.heal))[::rng.choice([1, -1])]
    return [(a, first[0]), (a + 2.0, first[1]), (b, second[0]), (b + 2.0, second[1])]


def glitch_run(seed: int, *, verb: Verb | None = None,
               membership: type[Membership] = Membership) -> dict:
    """One frame from a current member (its own id and incarnation: a bug or a corrupted
    disk, not an attacker) with term 2**52, to every node: a VOTE_REQUEST, a VOTE or a
    HEARTBEAT_ACK (``verb``, else one at random). The others must drop it: a leader
    agreed by all within three election timeouts, and no term beyond a step."""
    rng = random.Random(seed ^ 0x6117C4)
    sim = Sim(seed, rng.randint(3, 5), membership=membership)
    _form(sim)
    sim.hostile = True
    chief = sim.agreed()
    assert chief is not None and chief.proc is not None
    term0 = chief.proc.term
    x = sim.nodes[rng.choice(list(sim.nodes))]
    assert x.proc is not None
    env = {"term": MAX_TERM, "inc": x.proc.incarnation, "sender": x.proc.me}
    r = x.proc.roster
    frames = [mm.VoteRequest(**env, rterm=r.term, version=r.version),
              mm.Vote(**env, granted=False),
              mm.HeartbeatAck(**env, ok=False, rterm=r.term, version=r.version)]
    frame = rng.choice([f for f in frames if verb in (None, f.verb)])
    for nd in sim.alive():
        if nd is not x:
            sim.inject(x.id, nd.id, frame.verb, frame.payload())
    budget = 3 * sim.timing.election_timeout_max
    sim.run(1.0)
    assert sim.run(budget, until=lambda s: s.agreed() is not None), (
        f"seed {seed}: no agreed leader after {frame.verb.value} with term 2**52 from "
        f"member {x.id}\n" + sim.describe())
    assert sim.max_term_seen <= term0 + sim.timing.term_step, sim.describe()
    return {"verb": frame.verb, "terms": (term0, sim.max_term_seen)}
