"""Acknowledged claims: a copy asks its live siblings before it delivers (pure).

Part of the sibling protocol (``miyamoto.siblings``, which holds the state and the rules
in full): this mixin is the asking side and the answering side of one exchange. A copy
about to deliver sends ASK(lease) to every live sibling (a member of the roster holding
a copy); each answers, folded into one ANSWER shape:

- ``go`` (or ``unknown``: no copy here yet; its claim is kept for the copy on its way):
  the acknowledgement. The sibling holds its own copy off for ``lease`` plus its
  distance in offsets, exactly as a CLAIM did, and remembers the claim, so that a loss
  of the claimer releases it;
- ``claimed`` (a copy of it is running here, or another sibling holds a live claim) and
  ``wait`` (two copies asking each other: the lower replica index goes first): stand
  down, look again once the lease ends;
- ``ended`` / ``rehomed``: the task is over, or its copies moved (ours may be dropped).

The copy delivers only once every live sibling has answered. A sibling that does not
answer is asked again every ``ask_timeout``; the copy waits as long as that sibling is
in the roster. Why this costs a round trip on every delivery: a cut between two nodes
that both keep running is seen by neither for a while, and any one-way CLAIM sent in
that while is lost, so the other side delivers the task again. With an acknowledged
claim, no delivery starts after a cut began unless its acknowledgement crossed the cut
before it: only deliveries in flight at the cut (or cleared just then) may repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from miyamoto import messages as m
from miyamoto import replication
from miyamoto.effects import LATER, Drop, Fire, Send, SetReplicas, Update
from miyamoto.task import State, Task

if TYPE_CHECKING:
    from miyamoto.siblings import SiblingTiming

PROBE_MAX = 100_000   # copies probed at once when this node is back in touch


@dataclass
class _Claim:
    claimer: str
    theirs: int   # the claimer's replica index
    until: float  # our clock


@dataclass
class _Asking:
    replica: int
    n: int
    deadline: float
    waiting: set[str]
    lease: float  # what the siblings that answer ``go`` hold their copies off for
    wide: bool = False  # asked every member, not only the copy's siblings
    answers: list[m.Answer] = field(default_factory=list)


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
    def _ask(self, t: Task, siblings: list[str], now: float, lease: float,
             wide: bool = False) -> list[Any]:
        """Ask. The held copy is not rescheduled (nothing is written): it waits, out of
        the engine's schedule, until the last answer fires it (``Fire``) or holds it
        off; an unanswered ask is sent again at its deadline (``tick``)."""
        a = _Asking(t.replica, len(t.replicas), now + self.t.ask_timeout, set(siblings), lease,
                    wide)
        self.asking[t.id] = a
        ask = m.Ask(t.id, t.replica, lease=lease)
        return [Send(r, ask) for r in siblings]

    def _ask_again(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        a.waiting &= self.members
        if not a.waiting:
            return self._decide(task_id, a, now)
        a.deadline = now + self.t.ask_timeout
        ask = m.Ask(task_id, a.replica, lease=a.lease)
        return [Send(r, ask) for r in sorted(a.waiting)]

    def _decide(self, task_id: str, a: _Asking, now: float) -> list[Any]:
        """Every live sibling answered (or left): go, or stand down until a lease ends.

        A copy that must ask (its node was away) and heard no one who knows the task
        (its siblings left the roster, or dropped their copies) asks every member: the
        task may have been re-homed to any of them and delivered there. If none knows
        either, it waits, asking again, for one of its siblings to come back (the one
        that delivered it while we were away may be just that), at most ``claim_lease``:
        a sibling gone for good must not hold the task forever."""
        if task_id in self.must_ask and a.n > 1 and \
                all(x.verdict == m.UNKNOWN for x in a.answers):
            others = self._everyone_else()
            if not a.wide and others:
                a.wide, a.waiting, a.deadline = True, set(others), now + self.t.ask_timeout
                ask = m.Ask(task_id, a.replica, lease=a.lease)
                return [Send(r, ask) for r in others]
            since = self.stale_since.setdefault(task_id, now)
            if others and now - since < self.t.claim_lease:
                del self.asking[task_id]
                return [Update(task_id, at=now + self.t.ask_timeout, how=LATER)]
        self.stale_since.pop(task_id, None)
        del self.asking[task_id]
        holds = [x.lease for x in a.answers if x.verdict in (m.WAIT, m.CLAIMED)]
        if holds:
            return [Update(task_id, at=now + max(holds), how=LATER)]
        self.must_ask.discard(task_id)
        self.cleared[task_id] = now + self.t.ask_lease / 2
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
            return [Send(sender, m.Answer(msg.id, verdict, **kw))]
        if t is None:
            if msg.probe:
                return []
            # our copy may still be on its way (STORE and ASK travel apart): it holds
            # for this claim once stored
            self._keep_early(sender, m.Claim(msg.id, msg.replica, self._lease(msg)), now)
            return answer(m.UNKNOWN)
        if t.state.ended:
            return answer(m.ENDED, state=t.state.value, attempts=t.attempts, last=t.last)
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
        # the asker goes: hold our copy off as for its claim
        n, lease = len(t.replicas), self._lease(msg)
        if 0 <= msg.replica < n:
            self._note_claim(t.id, _Claim(sender, msg.replica, now + lease))
        self.cleared.pop(t.id, None)
        at = replication.sibling_fire_at(now + lease, t.replica, msg.replica, n, self.t.offset)
        return [Update(t.id, at=at, how=LATER)] + answer(m.GO)

    def _lease(self, msg: m.Ask) -> float:
        return msg.lease if msg.lease is not None else self.t.ask_lease

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
        if sender not in a.waiting:
            return []
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
