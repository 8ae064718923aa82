"""The cluster layer: holds the cluster's roles and carries out what the machines decide.

It owns the transport (ZeroMQ), the membership machine (``miyamoto.membership.machine``) and the
sibling machine (``miyamoto.replicas.siblings``), both pure: it feeds them messages and time, and
carries out what they return — sends through the outbox, effects on the engine. The
roles around it: ``coordinator`` stores copies (enqueue, restore, a stopping node's lone
copies), ``queries`` answers what one node cannot alone, ``requests`` pairs requests with
answers. A node with no peers is a cluster of one: the same code paths, all local.
``miyamoto.node`` composes it: it hands in the journal and the recipe of the engine, and
the roles here see the layer only through their own small Protocols.

Peers are untrusted input: every message is decoded into its typed form
(``miyamoto.wire.messages``) before anything acts on it, and one that does not fit is logged
and dropped; nothing a peer sends can raise out of ``_on_message``. Each message comes with
the key its connection authenticated with (``miyamoto.wire.transport``): membership hears
that key as the sender's (so the roster records the key each member joined with), and a
message under a member's id from any other key is dropped (``_spoofed``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
from typing import Any, Callable, Iterable, Protocol

import gevent
import gevent.event
import gevent.pool

from miyamoto.cluster import clockmessages as cm
from miyamoto.cluster.clocks import ALONE, Placement, PeerClocks
from miyamoto.cluster.coordinator import Coordinator
from miyamoto.cluster.joinlog import JoinLog
from miyamoto.cluster.queries import Queries
from miyamoto.cluster.queuesettings import QueueSettings
from miyamoto.cluster.requests import Requests
from miyamoto.config.settings import Config
from miyamoto.definitions import messages as dm
from miyamoto.definitions import queues as queue_defs
from miyamoto.definitions.sync import DefSync
from miyamoto.engine.engine import Engine, Hooks
from miyamoto.errors import Conflict, Duplicate
from miyamoto.membership import messages as mm
from miyamoto.membership.machine import ClockSkew, Leave, Member, Membership, Received, \
                                        Roster, Tick, Timing
from miyamoto.membership.roster import JOINING
from miyamoto.replicas import events as ev
from miyamoto.replicas import messages as rm
from miyamoto.replicas.effects import (AskWhenPaged, CancelCopy, Drop, Effect, Fire, Move,
                                       JoinRun, MoveLone, Ready, Reconcile, Refresh, Replay,
                                       Restore, RestoreLost, SetReplicas, TakeEnd, Update)
from miyamoto.replicas.siblings import Siblings, SiblingTiming
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task
from miyamoto.wire import messages as m
from miyamoto.wire.identity import next_boot, node_key
from miyamoto.wire.messages import Send
from miyamoto.wire.outbox import Outbox, unbatch
from miyamoto.wire.transport import CurveKeys, OnMessage, Transport
from miyamoto.wire.verbs import DecodeError, Verb

log = logging.getLogger(__name__)

_MEMBERSHIP = frozenset({Verb.JOIN, Verb.REDIRECT, Verb.ROSTER, Verb.HEARTBEAT,
                         Verb.HEARTBEAT_ACK, Verb.VOTE_REQUEST, Verb.VOTE, Verb.LEAVE})
# membership runs its own rules for strangers (a joiner is one); a STORE from one gets the
# coordinator's "not a member" answer, so its sender stops waiting
_OPEN = _MEMBERSHIP | {Verb.STORE}
# Former members stay heard (bounded): a leaving node's HANDOFF can arrive after the
# roster without it, and a dropped node's DONE still saves its siblings a duplicate.
MAX_FORMER = 1024
MAX_DOWN = 32  # dropped members GET /cluster still shows, as down (the latest)
_CLOCK_VERBS = frozenset({Verb.CLOCK, Verb.CLOCK_ECHO})


class MakeEngine(Protocol):
    """Builds the node's engine around the cluster's two seams into it. The engine and
    the cluster call each other (the engine asks the siblings before each delivery and
    tells them its outcome; the cluster carries the siblings' effects out on the engine),
    so the node hands the cluster its recipe for the engine, not the engine."""

    def __call__(self, *, hooks: Hooks, spawn_task: Callable[[Task], None]) -> Engine: ...


class ClusterTransport(Protocol):
    """What the cluster layer uses of its transport (``miyamoto.wire.transport``); a
    simulation hands in an in-memory one."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def send(self, to: str | None, address: str, verb: Verb, payload: dict[str, Any]) -> bool: ...
    def connect(self, address: str) -> bool: ...
    def forget(self, address: str) -> None: ...


class TransportFactory(Protocol):
    """Builds a node's transport around the cluster's receive callback (``Transport``)."""

    def __call__(self, node_id: str, bind: str, on_message: OnMessage, *,
                 curve: CurveKeys | None, boot: int | None,
                 node_key: CurveKeys | None) -> ClusterTransport: ...


class Cluster:
    def __init__(self, config: Config, journal: Journal, make_engine: MakeEngine, *,
                 clock: Callable[[], float], monotonic: Callable[[], float],
                 rng: random.Random, transport: TransportFactory = Transport):
        self.config = cfg = config
        self.me = cfg.node
        self.journal = journal
        self.clock = clock          # tasks' times (wall clock): siblings, engine
        self.monotonic = monotonic  # membership's timers
        self.rng = rng
        self.group = gevent.pool.Group()
        self.engine = make_engine(
            hooks=_Hooks(self),
            spawn_task=lambda t: self.group.spawn(self.coordinator.store_quietly, t))
        curve = CurveKeys(cfg.curve_public, cfg.curve_secret) if cfg.curve_public else None
        # without the cluster key a node is a cluster of one: it binds no cluster port
        self.solo = curve is None and not cfg.insecure_cluster
        # this start's incarnation, kept in the data dir, stamped on every frame we send;
        # the node's own key pair, kept there too (the cluster pair is the join secret)
        boot = None if self.solo else next_boot(cfg.data_dir)
        own = node_key(cfg.data_dir) if curve is not None else None
        self.key = own.public if own is not None else ""  # what our roster entry names
        self.transport = transport(cfg.node, cfg.cluster, self._receive, curve=curve,
                                   boot=boot, node_key=own)
        self.strangers = 0  # messages dropped because their sender is not in the roster
        self.spoofed = 0  # messages under a member's id from another key than its own
        self._strangers_seen: set[tuple[Verb, str]] = set()  # logged once each (bounded)
        # answers to the ASKs that STOREs carried, waiting for their STORED (``_settle``)
        self._folded: dict[tuple[str, str], rm.Answer] = {}
        self.leader_changes = 0  # times a new leader was seen (/metrics: alert on flapping)
        self._leader_seen: str | None = None
        self._contact = gevent.event.Event()  # set when a check finds us in contact
        self._members: frozenset[str] = frozenset()  # whose task messages we act on
        self._former: dict[str, str] = {}  # members that left -> their keys, oldest first
        self._keys: dict[str, str] = {}  # member (or former) -> the key it joined with
        self._down: dict[str, dict[str, Any]] = {}  # dropped members as /cluster shows them
        self.zones: dict[str, str] = {}  # member -> failure domain
        self.outbox = Outbox(self.transport.send, self.transport.stats.count_all, monotonic)
        self.requests = Requests(self.send, cfg.advertise)
        self.clocks = PeerClocks(cfg.max_clock_skew)
        self.placement: Placement = ALONE  # our clock against the cluster's, every tick
        self.siblings = Siblings(self.me, SiblingTiming.derive(
            cfg.replica_offset, cfg.claim_lease, cfg.replication_timeout,
            cfg.heartbeat_interval, cfg.failure_timeout))
        self.coordinator = Coordinator(cfg, self.engine, self.requests, self,
                                       rng.randrange(1 << 30))
        self.queries = Queries(self.me, self.engine, self.requests, self,
                               cfg.replication_timeout, cfg.replica_offset, clock, monotonic)
        self._next_probe = 0.0
        self.membership: Membership | None = None
        self.joinlog = JoinLog(self.me, (), monotonic())  # start() gives it the seeds
        self.roster: Roster | None = None
        self._left = False
        self._restores = gevent.pool.Pool(64)
        self._settling = _Settling()  # a rejoin's walk (Reconcile) and its probes unanswered
        # cluster-wide definitions (schedules, topics, queue settings): their own loop, in self.group
        self.defs = DefSync(self.me, cfg.data_dir, self.send, cfg.advertise,
                            monotonic=monotonic, resend=max(0.2, 2 * cfg.heartbeat_interval),
                            timeout=max(2.0, cfg.replication_timeout), view=self.leader_view,
                            group=self.group, on_change=self._definitions_changed)
        self.queue_settings = QueueSettings(self.engine, self.queries.control_local)

    def _definitions_changed(self) -> None:
        """The definitions' set changed: the queue settings it holds take effect here."""
        self.queue_settings.apply(self.defs.machine.items(queue_defs.KIND))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """After the journal is open and the engine has loaded its copies."""
        cfg = self.config
        timing = Timing(heartbeat_interval=cfg.heartbeat_interval,
                        failure_timeout=cfg.failure_timeout,
                        election_timeout_min=cfg.election_timeout_min,
                        election_timeout_max=cfg.election_timeout_max)
        seeds = [s for s in cfg.seeds if s not in (cfg.cluster, cfg.advertise)]
        # a restarted node (its journal existed) must not count as a first start in a
        # bootstrap election
        me = Member(cfg.node, cfg.advertise, cfg.http, cfg.zone, self.key)
        self.membership = Membership(me, seeds, timing,
                                     self.rng, self.monotonic(),
                                     first_start=not self.journal.existed)
        self.joinlog = JoinLog(self.me, seeds, self.monotonic())
        if seeds:  # copies reloaded from the journal ask first: the cluster went on without us
            self._step(ev.Reloaded(tuple(self.engine.live), start=self.journal.existed))
        else:  # none asks: nothing went on without this node
            self.engine.live.ask_mark = 0
        if self.solo:
            log.info("cluster: no cluster key (curve_secret), so no peers: a cluster of one")
        else:
            if cfg.insecure_cluster and not cfg.curve_secret:
                log.warning("cluster: insecure_cluster = true: cluster traffic on %s is plain "
                            "TCP and unauthenticated; anyone who reaches it is a peer",
                            cfg.cluster)
            self.transport.start()
        self._roster_changed(self.membership.roster)
        self.group.spawn(self._tick_loop)

    def stop(self) -> None:
        self._restores.kill()
        self.group.kill()
        self.transport.stop()

    def leave(self) -> None:
        """Graceful stop: hand due copies to their next sibling at once, leave the roster."""
        if self._left or self.membership is None:
            return
        self._left = True
        self.coordinator.stop_taking()
        self.engine.scheduler.stop()
        ready = self._step(ev.Stopping(tuple(self.engine.live.values())))
        handed = sum(len(e.msg.tasks) for e in ready.effects
                     if isinstance(e, Send) and isinstance(e.msg, rm.Handoff))
        if handed:
            log.info("cluster: handed %d copies to siblings", handed)
        self._send_membership(self.membership.step(Leave(), self.monotonic()))
        gevent.sleep(0.05)  # let the sockets flush before the engine drains

    # ------------------------------------------------------------ time and roster
    def _tick_loop(self) -> None:
        period = max(0.01, min(0.1, self.config.heartbeat_interval / 4))
        while True:
            try:
                self._tick()
            except Exception:
                log.exception("cluster: tick failed")
            gevent.sleep(period)

    def _tick(self) -> None:
        assert self.membership is not None
        mono = self.monotonic()
        self._send_membership(self.membership.step(Tick(), mono))
        self._check_roster()
        self.joinlog.tick(self.membership.role == JOINING, mono)
        if mono >= self._next_probe:
            self._next_probe = mono + self.config.heartbeat_interval
            for mem in self.others():
                self.send(mem, cm.Clock(self.clock()))
        self._place()
        self._step(ev.Tick(self.membership.in_contact(mono), self.engine.live))

    def _place(self) -> None:
        """Where our clock stands against the cluster's; a change of ``skewed`` is the
        membership machine's to act on (a leader off the cluster's clock steps down)."""
        assert self.membership is not None
        was, self.placement = self.placement, self.clocks.place(self.ring(), self.me,
                                                                self.clock())
        if was.skewed != self.placement.skewed or was.placed != self.placement.placed:
            p = self.placement
            (log.error if p.skewed or not p.placed else log.info)(
                "cluster: our clock is %s", _placement_words(p, self.clocks.max_skew))
        if was.skewed != self.placement.skewed:
            self._send_membership(self.membership.step(ClockSkew(self.placement.skewed),
                                                       self.monotonic()))
            self._check_roster()

    def clock_offset(self) -> float:
        """Cluster time minus our clock: an absolute time a client gives is on cluster
        time, so its moment on our clock is that time minus this."""
        return self.placement.offset

    def cluster_time(self) -> float:
        return self.clock() + self.placement.offset

    def may_fire(self) -> bool:
        """May this node fire schedules now: it hears a majority and its clock is
        placed within max_clock_skew of the cluster's (the leader check is the ticker's)."""
        p = self.placement
        return p.placed and not p.skewed and self.in_contact()

    def in_contact(self) -> bool:
        """This node hears a majority of the roster now (its lease to act for it)."""
        return self.membership is not None and self.membership.in_contact(self.monotonic())

    def await_contact(self, timeout: float) -> bool:
        """In contact, or back in contact within ``timeout``: a leader just elected (or a
        follower's first heartbeat from it) is a moment away. Wakes on the event that
        every membership step and tick sets once it finds contact; an event left set
        from a contact that has since lapsed is cleared here, and waited on again."""
        if self.in_contact():  # the enqueue path: no timer
            return True
        with gevent.Timeout(timeout, False):
            while not self.in_contact():
                self._contact.clear()
                self._contact.wait()
            return True
        return False

    def _send_membership(self, sends: Iterable[m.Send]) -> None:
        """Membership's messages go to the transport at once, not through the outbox;
        a send without an address is to a member of the machine's roster."""
        assert self.membership is not None
        roster = self.membership.roster
        for s in sends:
            address = s.address
            if address is None:
                mem = roster.get(s.to) if s.to is not None else None
                if mem is None:
                    continue
                address = mem.cluster
            self.transport.send(s.to, address, s.msg.verb, s.msg.payload())

    def _check_roster(self) -> None:
        """After every membership step and tick: count a new leader, take a new roster,
        and wake whoever awaits contact."""
        assert self.membership is not None
        leader = self.membership.leader
        if leader is not None and leader != self._leader_seen:
            self._leader_seen = leader
            self.leader_changes += 1
        if self.membership.roster != self.roster:
            self._roster_changed(self.membership.roster)
        if self.in_contact():  # (the waiters run once this greenlet yields)
            self._contact.set()

    def _roster_changed(self, new: Roster) -> None:
        old, self.roster = self.roster, new
        if old is not None:  # a member that left stays heard: its HANDOFF or DONE may
            self._former.update({mem.id: mem.key for mem in old.members  # trail it
                                 if new.get(mem.id) is None})
            while len(self._former) > MAX_FORMER:
                self._former.pop(next(iter(self._former)))
        self._keys = {**self._former, **{mem.id: mem.key for mem in new.members}}
        self._members = frozenset(self._keys)
        self.zones = {mem.id: mem.zone for mem in new.members if mem.zone}
        # no task may target a member's API or cluster port (targets.TargetGuard)
        self.engine.targets.set_member_endpoints(_endpoints(new.members))
        self.engine.dispatcher.set_share(max(1, len(new.members)))
        for mem in new.members:
            if mem.id != self.me:
                self.transport.connect(mem.cluster)  # a first send to a new DEALER would fail
        self._step(ev.Members(new.ids(), self.engine.live, self.zones,
                              dict(zip(new.ids(), new.incarnations))))
        if old is None:
            return
        log.info("cluster: roster v%d term %d leader %s members %s", new.version, new.term,
                 new.leader, ",".join(new.ids()))
        if self.me not in old.ids() and self.me in new.ids() and len(new.members) > 1:
            source = new.leader if new.leader not in (None, self.me) else self.others()[0]
            self.group.spawn(self.queries.sync_pauses, source)
        if self.me in old.ids() and self.me not in new.ids():
            log.warning("cluster: this node was dropped from the roster")
        for member_id in set(old.ids()) - set(new.ids()) - {self.me}:
            gone = old.get(member_id)
            if gone is not None:
                self.transport.forget(gone.cluster)
                self._went_down(gone)
        for member_id in new.ids():
            self._down.pop(member_id, None)

    def _went_down(self, gone: Member) -> None:
        """Keep a dropped member for GET /cluster: when it was dropped and last heard
        (wall clock; None if this node never heard from it: a follower hears the leader)."""
        assert self.membership is not None
        now = self.clock()
        silent = self.membership.silence(gone.id, self.monotonic())
        self._down[gone.id] = {"id": gone.id, "http": gone.http, "cluster": gone.cluster,
                               "zone": gone.zone or None, "down_since": now,
                               "last_heard_at": None if silent is None else now - silent}
        while len(self._down) > MAX_DOWN:
            self._down.pop(next(iter(self._down)))

    def _restore(self, plan: Restore) -> None:
        """A new copy counts only once its holder answered STORED; until then (or if it
        never does) the task keeps its old replica set."""
        t = self.engine.live.get(plan.id)
        if t is None or t.state.ended:
            return
        try:
            stored = self.coordinator.store(list(plan.copies))
        except Duplicate:  # the new holder has the name reserved: it is not ours
            stored = []
        if len(stored) < len(plan.copies):
            log.warning("cluster: could not restore every copy of %s", plan.id)
            return
        now_copy = self.engine.get(plan.id)
        self._step(ev.Restored(plan, now_copy, self._deadline(now_copy)))

    # ------------------------------------------------------------ carrying out effects
    def send(self, member_id: str, msg: Any, address: str | None = None,
             on_fail: Callable[[], Any] | None = None) -> bool:
        """Queue a message for a member (batched per peer); False if it has no address."""
        address = address or self._address(member_id)
        if address is None:
            return False
        self.outbox.put(member_id, address, msg.verb, msg.payload(), on_fail)
        return True

    def _step(self, event: ev.Event) -> Ready:
        """Hand the sibling machine one event now and carry out what it decides."""
        ready = self.siblings.step(event, self.clock())
        self.carry_out(ready.effects)
        return ready

    def carry_out(self, effects: Iterable[Effect]) -> None:
        engine = self.engine
        for e in effects:
            match e:
                case Send(to=str() as to):  # a sibling is always named (no joiner's address)
                    self.send(to, e.msg, e.address)
                case Update():
                    engine.apply_remote(e.id, state=e.state, fire_at=e.at, attempts=e.attempts,
                                        last=e.last, earliest=e.how == Move.EARLIER,
                                        exact=e.how == Move.EXACT, attempt=e.attempt)
                case Fire():
                    engine.release(e.id)  # its siblings acknowledged: run it (nothing written)
                case CancelCopy(abort=True):
                    engine.abort(e.id)
                case CancelCopy():
                    try:
                        engine.cancel(e.id)
                    except Conflict:
                        pass
                case Drop():
                    log.info("cluster: task %s was re-homed while this node was away", e.id)
                    engine.drop(e.id)
                case SetReplicas():
                    engine.set_replicas(e.id, e.replicas, self.me)
                case Restore():
                    self._restores.spawn(self._restore, e)
                case RestoreLost():
                    self.group.spawn(_restore_lost, self, e.lost)
                case AskWhenPaged():
                    self.group.spawn(_mark_lapse, self)
                case Reconcile():
                    self._settling.start(self.group.spawn(_reconcile, self))
                case TakeEnd():
                    engine.take_end(e.id, e.state, e.reruns, e.attempts, e.last, e.finished)
                case JoinRun():
                    self.group.spawn(self.queries.join_run, e.id, e.reruns)
                case MoveLone():
                    self.coordinator.move_lone_copies(list(e.copies))
                case Replay():
                    self._on_sibling(e.sender, e.msg)
                case Refresh():  # a sibling's copy is older: our version, by "replace"
                    self.group.spawn(self.queries.refresh, e.id, e.to)
                case _:
                    raise TypeError(f"not a sibling effect: {e!r}")

    def replay(self, task_id: str) -> None:
        """Our copy was just stored (or rerun): apply the news that came before it."""
        self._step(ev.Stored(task_id))

    def fold(self, copy: Task) -> tuple[int, float]:
        """The round of the ASK our new copy sends with its siblings' STOREs (0: none),
        and the lease it names (its attempt's deadline plus claim_lease)."""
        deadline = self._deadline(copy)
        n = self.siblings.step(ev.Folded(copy, deadline), self.clock()).n
        return n, deadline + self.siblings.t.claim_lease

    def _deadline(self, t: Task | None) -> float:
        """How long an attempt of ``t`` may take (its dispatch deadline; a long task's or a
        pull lease's span, if longer: a sibling lost before our CLAIM holds that long)."""
        if t is None:
            return self.config.queue("default").timeout
        return max(t.timeout or self.engine.queue_config(t.queue).timeout, t.lease or 0.0)

    # ------------------------------------------------------------ addresses
    def _address(self, member_id: str) -> str | None:
        if member_id == self.me:
            return self.config.advertise
        mem = self.roster.get(member_id) if self.roster is not None else None
        return mem.cluster if mem is not None else None

    def ring(self) -> tuple[str, ...]:
        """The roster's member ids, sorted (empty before the first roster)."""
        return self.roster.ids() if self.roster is not None else ()

    def others(self) -> list[str]:
        """The ring without this node: whom a cluster-wide query asks."""
        return [mem for mem in self.ring() if mem != self.me]

    def leader_view(self) -> tuple[str | None, int, tuple[str, ...]]:
        """(leader, term, ring) as membership sees them now (the definitions' input)."""
        mem = self.membership
        return (None, 0, ()) if mem is None else (mem.leader, mem.term, self.ring())

    def clock_shift(self, peer: str) -> float:
        """What to take off a peer's wall time to put it on our clock
        (``clocks.PeerClocks.shift``)."""
        return self.clocks.shift(peer, self.clock())

    # ------------------------------------------------------------ receiving
    def _receive(self, sender: str, verb: Verb, payload: dict, key: str) -> None:
        """One frame, from the connection that authenticated with ``key``: its STOREs are
        admitted as they are read and settled together, in one greenlet with one waited
        commit (``Coordinator.admit``)."""
        admitted: list[tuple[rm.Store, Task]] = []
        try:
            self._on_message(sender, key, verb, payload, admitted)
        finally:
            if admitted:
                self.group.spawn(self._settle, sender, admitted)

    def _on_message(self, sender: str, key: str, verb: Verb, payload: dict,
                    admitted: list[tuple[rm.Store, Task]]) -> None:
        """A frame's messages (a BATCH's, one at a time), each checked for its sender and
        handed to the handler of its type (``_handlers``)."""
        if verb == Verb.BATCH:
            inner = unbatch(payload)
            self.transport.stats.count_all([v for v, _ in inner], "received")
        else:
            inner = [(verb, payload)]
        for verb, payload in inner:
            try:
                if self._keys.get(sender, key) != key and verb != Verb.JOIN:
                    self._spoofed(sender, verb)  # a JOIN: membership's rule (live_namesake)
                elif verb not in _OPEN and sender not in self._members:
                    self._stranger(sender, verb)
                elif verb in _MEMBERSHIP:
                    self._on_membership(sender, key, m.decode(verb, payload))
                else:
                    msg = m.decode(verb, payload)
                    handler = self._handlers.get(type(msg))
                    if handler is None:
                        log.warning("cluster: dropped %s from %r: not a task message",
                                    verb.value, sender[:64])
                    else:
                        handler(sender, msg, admitted)
            except DecodeError as e:
                log.warning("cluster: dropped %s from %r: %s", verb.value, sender[:64], e)

    def _on_membership(self, sender: str, key: str, msg: mm.MembershipMessage) -> None:
        """Membership hears the sender with the key its connection authenticated with,
        whatever the payload says (the key a JOIN asks in with is the roster's then)."""
        assert self.membership is not None
        if msg.sender.key != key:
            msg = dataclasses.replace(msg, sender=dataclasses.replace(msg.sender, key=key))
        self.joinlog.heard(sender, msg, self.membership.incarnation, self.monotonic(),
                           self.membership.live_namesake(msg, self.monotonic()))
        self._send_membership(self.membership.step(Received(sender, msg), self.monotonic()))
        self._check_roster()

    @functools.cached_property
    def _handlers(self) -> dict[type, Callable[[str, Any, list], None]]:
        """The handler of each task message's type: (sender, message, the frame's
        admitted STOREs); made at the first message, then a plain attribute."""
        def stored(sender: str, msg: rm.Stored, _: list) -> None:
            self.requests.answer(msg)
            if msg.answer is not None and msg.ok:  # to the ASK our STORE carried
                self._on_sibling(sender, msg.answer)
        handlers: dict[type, Callable[[str, Any, list], None]] = {
            rm.Store: self._admit,
            # it may wait on the journal
            rm.Request: lambda sender, msg, _: self.group.spawn(self._serve, sender, msg),
            rm.Stored: stored,
            rm.Reply: lambda sender, msg, _: self.requests.answer(msg),
            rm.Handoff: lambda sender, msg, _: self._step(ev.HandoffReceived(sender, msg)),
            cm.Clock: lambda sender, msg, _: _on_clock(self, sender, msg),
            cm.ClockEcho: lambda sender, msg, _: _on_clock(self, sender, msg),
        }
        for kind in dm.DEFS_MESSAGES:  # schedules, topics, queues (defsync)
            handlers[kind] = lambda sender, msg, _: self.defs.on_message(sender, msg)
        for kind in rm.SIBLING_NEWS:
            handlers[kind] = lambda sender, msg, _: self._on_sibling(sender, msg)
        return handlers

    def _spoofed(self, sender: str, verb: Verb) -> None:
        """A message under a member's id from another key than the one it joined with: a
        holder of the join secret speaking as that member. Dropped; logged like a
        stranger's (first of each (verb, sender), then every 1000th)."""
        self.spoofed += 1
        if self._first_or_every_1000((verb, "key:" + sender[:64]), self.spoofed):
            log.warning("cluster: dropped %s from %r: not the key %s joined with (%d so far)",
                        verb.value, sender[:64], sender[:64], self.spoofed)

    def _stranger(self, sender: str, verb: Verb) -> None:
        """Only the task messages of roster members (current or former) are acted on.

        A joiner hears the members' CLOCK before the roster that admits it: that is a join
        under way, not a stranger, so it is dropped quietly. Otherwise the first drop of each
        (verb, sender) is logged, and every 1000th: one chatty peer cannot hide another.
        """
        if verb in _CLOCK_VERBS and self.me not in self._members:
            log.debug("cluster: %s from %r before our roster: ignored", verb.value, sender[:64])
            return
        self.strangers += 1
        if self._first_or_every_1000((verb, sender[:64]), self.strangers):
            log.warning("cluster: dropped %s from %r: not a roster member (%d so far)",
                        verb.value, sender[:64], self.strangers)

    def _first_or_every_1000(self, key: tuple[Verb, str], count: int) -> bool:
        """Whether to log a drop: the first of each ``key`` (while fewer than MAX_FORMER
        are remembered), and every 1000th drop of its kind (``count``)."""
        first = key not in self._strangers_seen and len(self._strangers_seen) < MAX_FORMER
        if first:
            self._strangers_seen.add(key)
        return first or count % 1000 == 0

    def _on_sibling(self, sender: str, msg: rm.SiblingNews) -> None:
        if not isinstance(msg, rm.Ask):
            if isinstance(msg, rm.Answer):
                self._settling.answered(sender, msg.id)
            copy = self.engine.live.get(msg.id)
            if copy is None and isinstance(msg, rm.Answer) and rm.news_of_an_end(msg) and \
                    msg.id not in self.siblings.asking:
                copy = self.engine.get(msg.id)  # a probe's news of our ended copy
            self._step(ev.Received(sender, msg, copy))
            return
        copy = self.engine.get(msg.id)
        behind = False
        if msg.order is not None and not msg.probe and (copy is None or not copy.state.ended):
            queue, key, seq = msg.order
            behind = self.engine.lines.ahead_of(queue, key, seq, msg.id) is not None
        self._step(ev.Received(sender, msg, copy, behind))

    def _admit(self, sender: str, msg: rm.Store, admitted: list[tuple[rm.Store, Task]]) -> None:
        got = self.coordinator.admit(sender, msg)
        if isinstance(got, Task):
            admitted.append((msg, got))
            if msg.ask and got.replicas[0] == sender:
                self._answer_folded(sender, msg.ask, msg.lease, got)
        elif got is not None:  # refused at once
            self.send(sender, got, address=msg.reply_to)

    def _answer_folded(self, sender: str, n: int, lease: float, copy: Task) -> None:
        """The ASK a STORE carried, stepped as any ASK once the copy is admitted; its
        answer waits for the STORED (``_settle``), the rest is carried out now."""
        ask = rm.Ask(copy.id, 0, n=n, lease=lease)
        ready = self.siblings.step(ev.Received(sender, ask, copy), self.clock())
        rest = []
        for e in ready.effects:
            if isinstance(e, Send) and isinstance(e.msg, rm.Answer) and e.to == sender \
                    and e.msg.id == copy.id:
                self._folded[(sender, copy.id)] = e.msg
            else:
                rest.append(e)
        self.carry_out(rest)

    def _settle(self, sender: str, admitted: list[tuple[rm.Store, Task]]) -> None:
        folded = self._folded
        for msg, stored in self.coordinator.settle(
                admitted, lambda task_id: folded.pop((sender, task_id), None)):
            self.send(sender, stored, address=msg.reply_to)

    def _serve(self, sender: str, msg: rm.Request) -> None:
        try:
            answer = rm.Reply(msg.req, True, self.queries.serve(msg.op, msg.args))
        except DecodeError as e:
            log.warning("cluster: dropped REQUEST from %r: %s", sender[:64], e)
            return
        self.send(sender, answer, address=msg.reply_to)

    # ------------------------------------------------------------ the node's view
    def enqueue(self, task: Task) -> Task:
        return self.coordinator.enqueue(task)

    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]:
        return self.coordinator.enqueue_many(tasks)

    def info(self) -> dict[str, Any]:
        assert self.membership is not None
        r = self.membership.roster
        health = self.membership.health(self.monotonic())
        now = self.clock()
        return {
            "node": self.me, "role": self.membership.role, "leader": r.leader,
            "clock": {"offset": round(self.placement.offset, 4), "placed": self.placement.placed,
                      "skewed": self.placement.skewed},
            "term": self.membership.term, "version": r.version,
            "members": [{"id": mem.id, "http": mem.http, "cluster": mem.cluster, "zone": mem.zone,
                         "key": mem.key,
                         "leader": mem.id == r.leader,
                         "last_heard": 0.0 if mem.id == self.me else health.get(mem.id),
                         **({"clock_offset": 0.0, "clock_error": 0.0, "clock_skewed": False}
                            if mem.id == self.me else self.clocks.view(mem.id, now))}
                        for mem in r.members],
            "down": [dict(d, last_heard=None if d["last_heard_at"] is None
                          else max(0.0, now - d["last_heard_at"]))
                     for d in self._down.values()],
        }

    def ready(self) -> tuple[bool, str]:
        if self.roster is None or self.me not in self.roster.ids():
            return False, "not yet in the cluster roster"
        if self.membership is None or self.membership.leader is None:
            return False, "no leader"
        if self.siblings.rejoining or self._settling.walk is not None:
            # what it reads of its copies may be stale: restored elsewhere, ended
            return False, "back in the cluster: settling its copies with their siblings"
        p = self.placement  # said, not refused: a node just admitted is unplaced for a
        if p.skewed or not p.placed:  # heartbeat, and a skewed one corrects its times
            return True, "ok, but our clock is " + _placement_words(p, self.clocks.max_skew)
        return True, "ok"


class _Settling:
    """A rejoin's walk over our copies (``effects.Reconcile``, ``_reconcile``): its
    greenlet, and the probes of its page that are not answered yet (each is, news or
    not: ``verdict same``), which pace the walk and say when the node is settled. A
    sibling that let a page's wait run out (an older node, a stopped one not dropped
    yet) is not waited for again in that walk: it is still probed."""

    def __init__(self) -> None:
        self.walk: gevent.Greenlet | None = None
        self.waiting: dict[str, set[str]] = {}  # task id -> siblings not answered yet
        self.settled = gevent.event.Event()
        self.silent: set[str] = set()  # in this walk

    def start(self, walk: gevent.Greenlet) -> None:
        if self.walk is not None:  # a later mark reads more
            self.walk.kill(block=False)
        self.walk, self.silent = walk, set()

    def wait(self, sent: Iterable[Effect], timeout: float) -> None:
        """Wait for the answers to the probes ``sent``, at most ``timeout``."""
        self.waiting.clear()
        for e in sent:
            if isinstance(e, Send) and isinstance(e.msg, rm.Ask) and e.to is not None \
                    and e.to not in self.silent:
                self.waiting.setdefault(e.msg.id, set()).add(e.to)
        self.settled.clear()
        if self.waiting and not self.settled.wait(timeout):
            self.silent.update(*self.waiting.values())
        self.waiting.clear()

    def answered(self, sender: str, task_id: str) -> None:
        waiting = self.waiting.get(task_id)
        if waiting is None:
            return
        waiting.discard(sender)
        if not waiting:
            del self.waiting[task_id]
            if not self.waiting:
                self.settled.set()


class _Hooks(Hooks):
    """The engine's view of the siblings: may this copy deliver now, its outcome, and
    the copies it read from the journal that must ask first."""

    def __init__(self, cluster: Cluster):
        self.c = cluster

    def claim(self, t: Task) -> bool:
        return self.c._step(ev.Due(t, self.c._deadline(t))).go

    def may_expire(self, t: Task) -> bool:
        return self.c._step(ev.Expiring(t)).go

    def _outcome(self, t: Task) -> None:
        self.c._step(ev.Outcome(t))

    def paged(self, task_ids: list[str]) -> None:
        # before start() the engine's first fill is read: start() marks those itself
        # (or, with no seeds, none), so nothing is marked twice or against its rule
        if self.c.membership is not None:
            self.c._step(ev.Reloaded(tuple(task_ids)))

    def done(self, t: Task) -> None:
        self._outcome(t)

    def accepted(self, t: Task, lease: float) -> None:
        self.c._step(ev.LeaseExtended(t, lease))

    def retried(self, t: Task) -> None:
        self._outcome(t)

    def failed(self, t: Task) -> None:
        self._outcome(t)


def _on_clock(c: Cluster, sender: str, msg: cm.Clock | cm.ClockEcho) -> None:
    """A clock probe: echo a CLOCK, take an echo as a sample of the sender's offset."""
    now = c.clock()
    if isinstance(msg, cm.Clock):
        c.send(sender, cm.ClockEcho(msg.t1, now))
        return
    c.clocks.sample(sender, msg.t1, msg.t, now)
    crossed = c.clocks.check(sender, now)
    if crossed is not None:
        skewed, est = crossed
        (log.error if skewed else log.info)(
            "cluster: clock of %s is %+.3f s (±%.3f) from ours: %s max_clock_skew %g s",
            sender, est.offset, est.error, "beyond" if skewed else "back within",
            c.clocks.max_skew)


def _placement_words(p: Placement, max_skew: float) -> str:
    if not p.placed:
        return ("not placed: no majority of members has a clock estimate that agrees "
                "within max_clock_skew (absolute etas are judged on our own clock)")
    if p.skewed:
        return (f"{-p.offset:+.3f} s from the cluster's, beyond max_clock_skew {max_skew:g} s "
                "(absolute times are corrected; this node does not lead)")
    return f"within max_clock_skew of the cluster's ({-p.offset:+.3f} s)"


def _mark_lapse(c: Cluster) -> None:
    """Back in touch: every copy written so far asks first when it is paged in."""
    try:
        c.engine.live.ask_mark = c.journal.last_rowid()
    except Exception as e:
        log.warning("cluster: could not mark the journal's copies to ask: %s", e)


def _reconcile(c: Cluster, page: int = 1000) -> None:
    """Every copy written before now, live or ended, a page at a time as the engine
    has it (memory's record is the newer), stepped as ``events.Reconciling``; each
    page's probes leave through the outbox before the next page is read."""
    try:
        mark, after, n = c.journal.last_rowid(), 0, 0
        while True:
            rows = c.journal.rows(after, mark, page)
            if not rows:
                break
            after = rows[-1][0]
            copies = tuple(c.engine.live.mem.get(t.id, t) for _, t in rows)
            n += len(copies)
            c._settling.wait(c._step(ev.Reconciling(copies)).effects, c.siblings.t.ask_timeout)
    except Exception as e:  # a journal that cannot read now: the copies ask when due
        log.warning("cluster: could not reconcile our copies with their siblings: %s", e)
        return
    finally:
        if c._settling.walk is gevent.getcurrent():
            c._settling.walk = None
    if n:
        log.info("cluster: back in the cluster: %d copies probed their siblings", n)


def _restore_lost(c: Cluster, lost: frozenset[str]) -> None:
    """Restores are planned a page of copies at a time (most may be only in the
    journal); the restore pool's bound paces the walk."""
    n = 0
    for page in c.engine.live.pages():
        ready = c._step(ev.LostPage(lost, tuple(page)))
        n += sum(isinstance(e, Restore) for e in ready.effects)
    if n:
        log.info("cluster: restoring copies of %d tasks lost with %s", n, ",".join(sorted(lost)))


def _endpoints(members: Iterable[Member]) -> list[tuple[str, int]]:
    """(host, port) of every member's HTTP address and cluster endpoint."""
    out = []
    for mem in members:
        for addr in (mem.http, mem.cluster.removeprefix("tcp://")):
            host, _, port = addr.rpartition(":")
            if host and port.isdigit():
                out.append((host.strip("[]"), int(port)))
    return out
