"""Acknowledged claims: a copy asks its live siblings before it delivers (pure).

Part of the sibling protocol (``miyamoto.replicas.siblings``, which holds the state and states
the rules in full): this mixin is both sides of one exchange. A copy about to deliver
sends ASK (numbered: its round) to every live sibling (a roster member holding a copy);
each answers, in one ANSWER shape that echoes the round:

- ``go`` (or ``unknown``: no copy here yet; the ASK is kept as a claim for the copy on
  its way): the acknowledgement. The sibling notes the asker's claim, which holds its
  own copy off for ``ask_lease`` from when it read the ASK (``fire`` looks at the claims:
  nothing is written, and on the healthy path the asker's DONE ends the copy before it
  is due). The asker, once cleared, delivers and sends CLAIM(lease) one way, which
  extends the hold to the attempt's deadline plus ``claim_lease``;
- ``claimed`` (a copy is running here, or another sibling holds a live claim) and
  ``wait`` (two copies asking each other: the lower replica index goes first): stand
  down, look again once the lease ends;
- ``ended`` / ``rehomed``: the task is over, or its copies moved (ours may be dropped).

The copy delivers only once every live sibling has answered the round, and only within
``ask_lease / 2`` of the round's first ASK: every hold began after that, so the copy
starts, and its CLAIM arrives, while they all last; a round decided later (a sibling
kept silent until the roster dropped it) is asked again. Answers to an older round are
ignored (but for an end or a move, which are facts). A silent sibling is asked again
every ``ask_timeout``; the copy waits as long as that sibling is in the roster. Why a
round trip before every delivery: a cut between two nodes that both keep running is
seen by neither for a while, and every one-way CLAIM sent meanwhile is lost, so the
other side delivers again. Acknowledged, no delivery starts after a cut began unless
its acknowledgement crossed the cut before it: only deliveries in flight at the cut
(or cleared just then) may repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from miyamoto.replicas import messages as m
from miyamoto.replicas.effects import LATER, Drop, Fire, Send, SetReplicas, Update
from miyamoto.tasks.task import State, Task

if TYPE_CHECKING:
    from miyamoto.replicas.siblings import SiblingTiming

PROBE_MAX = 100_000   # copies probed at once when this node is back in touch


@dataclass
class _Claim:
    claimer: str
    theirs: int   # the claimer's replica index
    until: float  # our clock


@dataclass
class _Asking:
    replica: int
    n: int        # the task's number of copies
    deadline: float
    waiting: set[str]
    wide: bool = False  # asked every member, not only the copy's siblings
    answers: list[m.Answer] = field(default_factory=list)
    started: float = 0.0  # the round's first ASK: every answer's hold began after it
    round: int = 0
    reruns: int = 0  # the copy's Task.reruns, sent with every ASK


class Asking:
    """The ask/answer half of ``Siblings``; the attributes are the machine's own."""
    me: str
    t: "SiblingTiming"
    members: frozenset[str]
    claims: dict[str, _Claim]
    must_ask: set[str]
    asking: dict[str, _Asking]
    cleared: dict[str, float]
    stale_since: dict[str, float]  # a copy that must ask found no one who knows: since
    away: set[str]  # must-ask copies whose node may have been dropped meanwhile
    rounds: int  # ASK rounds started (numbers them)

    def _stalled(self, now: float) -> bool:  # Siblings'
        raise NotImplementedError

    # ------------------------------------------------------------ hooks of Siblings
    def _note_claim(self, task_id: str, claim: _Claim) -> None:
        raise NotImplementedError

    def _forget(self, task_id: str) -> None:
        raise NotImplementedError

    def _keep_early(self, sender: str, msg: Any, now: float) -> None:
        raise NotImplementedError

    def _live_siblings(self, t: Task) -> list[str]:
        raise NotImplementedError

    # ------------------------------------------------------------ asking
    def _ask(self, t: Task, siblings: list[str], now: float, wide: bool = False) -> list[Any]:
        """Ask. The held copy is not rescheduled (nothing is written): it waits, out of
        the engine's schedule, until the last answer fires it (``Fire``) or holds it
        off; an unanswered ask is sent again at its deadline (``tick``)."""
        self.rounds += 1
        a = _Asking(t.replica, len(t.replicas), now + self.t.ask_timeout, set(siblings), wide,
                    started=now, round=self.rounds, reruns=t.reruns)
        self.asking[t.id] = a
        ask = m.Ask(t.id, t.replica, n=a.round, reruns=a.reruns)
        return [Send(r, ask) for r in siblings]

    def _ask_again(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        a.waiting &= self.members
        if not a.waiting:
            return self._decide(task_id, a, now)
        a.deadline = now + self.t.ask_timeout
        ask = m.Ask(task_id, a.replica, n=a.round, reruns=a.reruns)
        return [Send(r, ask) for r in sorted(a.waiting)]

    def _decide(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        """Every live sibling answered (or left): go, or stand down until a lease ends.

        A copy that must ask (its node was away) and has no sibling left in the roster
        (none answered, they all left) asks every member: its task may have been re-homed to any of them and
        delivered there. If none knows it either and this node may have been dropped
        meanwhile (``away``: out of the roster, restarted, or out of touch for longer
        than ``away_after``), it waits, asking again, for one of its siblings to come back (the one that may have delivered it while we were away),
        at most ``claim_lease``: a sibling gone for good must not hold it forever."""
        if task_id in self.must_ask and a.n > 1 and not a.wide and not a.answers:
            others = self._everyone_else()  # its siblings left the roster, none answered
            if others:
                a.wide, a.waiting, a.deadline = True, set(others), now + self.t.ask_timeout
                return [Send(r, m.Ask(task_id, a.replica, n=a.round, reruns=a.reruns)) for r in others]
        if a.wide and task_id in self.away and all(x.verdict == m.UNKNOWN for x in a.answers):
            since = self.stale_since.setdefault(task_id, now)
            if now - since < self.t.claim_lease:
                del self.asking[task_id]
                return [Update(task_id, at=now + self.t.ask_timeout, how=LATER)]
        self.stale_since.pop(task_id, None)
        self.away.discard(task_id)
        del self.asking[task_id]
        holds = [x.lease for x in a.answers if x.verdict in (m.WAIT, m.CLAIMED)]
        if holds:
            return [Update(task_id, at=now + max(holds), how=LATER)]
        # each ``go`` holds its sibling off for ask_lease from when it read our ASK, so
        # at least from ``started``: we must start, and our CLAIM arrive, well within
        # that (a go read long ago, while another sibling kept silent, is stale)
        self.must_ask.discard(task_id)
        self.cleared[task_id] = a.started + self.t.ask_lease / 2
        return [Fire(task_id)]

    def _everyone_else(self) -> list[str]:
        """Whom a copy back from away asks when its own siblings cannot tell."""
        return sorted(self.members - {self.me})

    def _probe(self, live: Mapping[str, Task]) -> list[Any]:
        """Back in touch: ask the siblings of every copy that must ask whether they know
        its end. A copy due later would ask only when it fires, and by then the sibling
        that delivered it may have left the roster, its news lost with it."""
        effects: list[Any] = []
        for task_id in list(self.must_ask)[:PROBE_MAX]:
            t = live.get(task_id)
            if t is not None and task_id not in self.asking:
                probe = m.Ask(task_id, t.replica, probe=True)
                effects += [Send(r, probe) for r in self._live_siblings(t)]
        return effects

    # ------------------------------------------------------------ answering
    def _on_ask(self, sender: str, msg: m.Ask, t: Task | None, now: float) -> list[Any]:
        def answer(verdict: str, **kw: Any) -> list[Any]:
            return [Send(sender, m.Answer(msg.id, verdict, n=msg.n, **kw))]
        # read after our loop stalled, the ASK may be as old as the stall: its asker
        # has long given up on it (and may have delivered since, once the roster dropped
        # us). It is answered, but nothing is held for it: a hold would keep our copy
        # from asking, and so from hearing that the task is over, for an ask_lease. Our
        # copy asks before it delivers instead (must_ask), so an asker that does still
        # wait is not run over by it.
        stale = self._stalled(now)
        if stale and t is not None and not t.state.ended:
            self.must_ask.add(t.id)
        if t is None:
            if msg.probe:
                return []
            # our copy may still be on its way (STORE and ASK travel apart): it holds
            # for this claim once stored
            if not stale:
                self._keep_early(sender, m.Claim(msg.id, msg.replica, self.t.ask_lease), now)
            return answer(m.UNKNOWN)
        if t.state.ended and msg.reruns <= t.reruns:
            return answer(m.ENDED, state=t.state.value, attempts=t.attempts, last=t.last)
        if t.state.ended:
            # the asker's copy was run again after ours ended (a retry of a failed task
            # reaches the copies one by one): our end is of the run before, so the asker
            # goes, as if we had no copy; our own rerun, when it comes, asks in turn
            if msg.probe:
                return []
            if not stale:
                self._note_claim(t.id, _Claim(sender, msg.replica, now + self.t.ask_lease))
            return answer(m.GO)
        if sender not in t.replicas:
            return answer(m.REHOMED, replicas=t.replicas)
        if msg.probe:
            return []  # nothing the prober does not know
        if t.state == State.RUNNING:
            return answer(m.CLAIMED, lease=self.t.ask_lease)
        claim = self.claims.get(t.id)
        if claim is not None and claim.until > now and claim.claimer != sender:
            return answer(m.CLAIMED, lease=claim.until - now)
        if t.id in self.asking and t.replica < msg.replica:
            return answer(m.WAIT, lease=self.t.ask_timeout)
        # the asker goes: our copy is held off by its claim (for ``ask_lease``, then for
        # the lease of the CLAIM it sends as it delivers). Noted, not written: ``fire``
        # looks at the claims, so the healthy path, whose DONE comes long before our
        # copy is due, costs no journal write here
        if 0 <= msg.replica < len(t.replicas) and not stale:
            self._note_claim(t.id, _Claim(sender, msg.replica, now + self.t.ask_lease))
        self.cleared.pop(t.id, None)
        return answer(m.GO)

    def _on_answer(self, sender: str, msg: m.Answer, t: Task | None, now: float) -> list[Any]:
        a = self.asking.get(msg.id)
        if a is None:  # the answer to a probe: only an end or a move is news
            if t is None or t.state != State.SCHEDULED or sender not in t.replicas:
                return []
            if msg.verdict == m.ENDED:
                self._forget(msg.id)
                return [Update(msg.id, state=State(msg.state), attempts=msg.attempts,
                               last=msg.last)]
            if msg.verdict == m.REHOMED:
                return [Drop(msg.id)] if self.me not in msg.replicas else \
                    [SetReplicas(msg.id, msg.replicas)]
            return []
        if sender not in a.waiting or (msg.n != a.round and msg.verdict not in (m.ENDED, m.REHOMED)):
            return []  # an answer to an earlier round: its hold may be over
        a.waiting.discard(sender)
        if msg.verdict == m.ENDED:
            self._forget(msg.id)
            return [Update(msg.id, state=State(msg.state), attempts=msg.attempts, last=msg.last)]
        if msg.verdict == m.REHOMED:
            if self.me not in msg.replicas:
                self._forget(msg.id)
                return [Drop(msg.id)]
            a.waiting &= set(msg.replicas)
            effects: list[Any] = [SetReplicas(msg.id, msg.replicas)]
        else:
            effects = []
        a.answers.append(msg)
        if not a.waiting:
            effects += self._decide(msg.id, a, now)
        return effects
