"""A node back after it may have been dropped reconciles its copies (miyamoto.replicas.siblings,
"Back after a drop"), driven through the machine's door: when ``Reconcile`` comes, what a
page of copies probes, how a sibling answers a rejoin's numbered probe, and what the
rejoiner makes of the answers (a move drops even an ended copy, a later run's end is
taken)."""

from __future__ import annotations

from typing import Mapping

from miyamoto.replicas import effects as fx
from miyamoto.replicas import events as ev
from miyamoto.replicas import messages as m
from miyamoto.replicas.siblings import Siblings, SiblingTiming
from miyamoto.tasks.task import State, Task
from miyamoto.wire.messages import Send
from miyamoto.wire.verbs import Verb

T = SiblingTiming(offset=5.0, claim_lease=60.0, ask_timeout=2.0, ask_lease=5.0,
                  stall_gap=1.5, away_after=3.0)


def task(task_id: str = "t1", replica: int = 0, replicas: tuple[str, ...] = ("a", "b"),
         state: State = State.SCHEDULED, **kw) -> Task:
    return Task(id=task_id, queue="q", url="http://w/", replicas=replicas, replica=replica,
                fire_at=1000.0, state=state, **kw)


def tick(s: Siblings, now: float, contact: bool = True,
         live: Mapping[str, Task] = ev.EMPTY) -> list:
    return list(s.step(ev.Tick(contact, live), now).effects)


def recv(s: Siblings, sender: str, msg, t: Task | None, now: float = 100.0) -> list:
    return list(s.step(ev.Received(sender, msg, t), now).effects)


def sends(effects: list) -> list[tuple[str, object]]:
    return [(e.to, e.msg) for e in effects if isinstance(e, Send)]


def restarted(me: str = "a", members: tuple[str, ...] = ("a", "b", "c")) -> Siblings:
    """A node whose start reloaded its journal, in the roster, not in touch yet."""
    s = Siblings(me, T, members)
    tick(s, 99.0, False)
    assert s.step(ev.Reloaded(("t1",), start=True), 99.5) == fx.Ready()
    return s


def test_a_restart_reconciles_once_back_in_touch_and_only_once():
    s = restarted()
    assert s.rejoining
    assert not any(isinstance(e, fx.Reconcile) for e in tick(s, 99.9, False))
    back = tick(s, 100.0, True)
    assert fx.Reconcile() in back and fx.AskWhenPaged() in back
    assert not s.rejoining
    tick(s, 100.1, False)  # a short lapse later: the old probes of memory's copies only
    assert not any(isinstance(e, fx.Reconcile) for e in tick(s, 100.2, True, {}))


def test_a_page_fill_or_a_first_start_does_not_reconcile():
    s = Siblings("a", T, ("a", "b"))
    tick(s, 99.0, False)
    s.step(ev.Reloaded(("t1",)), 99.5)  # copies paged in: they ask when due
    assert not s.rejoining
    assert not any(isinstance(e, fx.Reconcile) for e in tick(s, 100.0, True))


def test_a_joiners_first_roster_without_it_is_no_drop():
    s = Siblings("a", T)
    s.step(ev.Members(("b", "c")), 99.0)  # the roster as a joiner first hears it
    s.step(ev.Members(("a", "b", "c")), 99.5)
    assert not s.rejoining
    assert not any(isinstance(e, fx.Reconcile) for e in tick(s, 100.0, True))


def test_a_drop_from_the_roster_or_a_long_absence_reconciles():
    s = Siblings("a", T, ("a", "b", "c"))
    s.step(ev.Members(("a", "b", "c")), 99.0)
    tick(s, 100.0, True)
    s.step(ev.Members(("b", "c")), 100.5)  # the others dropped us
    assert s.rejoining
    tick(s, 101.0, True)  # out of the roster: not in touch
    s.step(ev.Members(("a", "b", "c")), 101.5)
    assert fx.Reconcile() in tick(s, 102.0, True)
    # out of touch longer than away_after: the others may have dropped and re-admitted us
    for now in (103.0, 104.0, 105.0, 106.0):
        tick(s, now, False)
    assert fx.Reconcile() in tick(s, 106.5, True)


def test_a_page_probes_every_copy_live_or_ended_with_its_run_numbered():
    s = restarted()
    tick(s, 100.0, True)
    page = (task("t1"), task("t2", state=State.SUCCEEDED, reruns=2),
            task("t3", replicas=("a",)),  # no sibling to ask
            task("t4", state=State.RUNNING),  # its own attempt tells them
            task("t5", replica=1, replicas=("c", "a"), revision="r1"))
    out = sends(list(s.step(ev.Reconciling(page), 100.1).effects))
    n = out[0][1].n
    assert n > 0
    assert out == [("b", m.Ask("t1", 0, probe=True, n=n)),
                   ("b", m.Ask("t2", 0, probe=True, n=n, reruns=2)),
                   ("c", m.Ask("t5", 1, probe=True, n=n, revision="r1"))]


def test_a_rejoins_probe_is_answered_news_or_not():
    s = Siblings("b", T, ("a", "b", "c"))
    tick(s, 100.0, True)
    probe = m.Ask("t1", 0, probe=True, n=7)
    mine = task(replica=1)
    assert sends(recv(s, "a", probe, mine)) == [("a", m.Answer("t1", m.SAME, n=7))]
    assert sends(recv(s, "a", probe, None)) == [("a", m.Answer("t1", m.UNKNOWN, n=7))]
    moved = task(replica=0, replicas=("b", "c"))
    assert sends(recv(s, "a", probe, moved)) == \
        [("a", m.Answer("t1", m.REHOMED, replicas=("b", "c"), n=7))]
    ended = task(replica=1, state=State.SUCCEEDED, reruns=1, attempts=2, finished=90.0)
    assert sends(recv(s, "a", probe, ended)) == [("a", m.Answer(
        "t1", m.ENDED, state="succeeded", attempts=2, n=7, reruns=1, ago=10.0))]
    # an old-style probe (unnumbered) hears only news, as before
    assert recv(s, "a", m.Ask("t1", 0, probe=True), mine) == []
    assert recv(s, "a", m.Ask("t1", 0, probe=True), None) == []
    # a probe of a later run than our end: no news for it
    assert sends(recv(s, "a", m.Ask("t1", 0, probe=True, n=7, reruns=2), ended)) == \
        [("a", m.Answer("t1", m.SAME, n=7))]


def test_the_rejoiner_drops_an_ended_copy_moved_away_and_takes_a_later_end():
    s = restarted()
    tick(s, 100.0, True)
    old = task(state=State.SUCCEEDED, reruns=0, finished=50.0)
    assert recv(s, "b", m.Answer("t1", m.REHOMED, replicas=("b", "c"), n=3), old) == \
        [fx.Drop("t1")]
    assert recv(s, "b", m.Answer("t1", m.REHOMED, replicas=("a", "b"), n=3), old) == []
    later = m.Answer("t1", m.ENDED, state="succeeded", attempts=1, n=3, reruns=1, ago=4.0)
    assert recv(s, "b", later, old, 100.0) == \
        [fx.TakeEnd("t1", State.SUCCEEDED, 1, 1, None, 96.0)]
    same_run = m.Answer("t1", m.ENDED, state="succeeded", attempts=1, n=3, reruns=0)
    assert recv(s, "b", same_run, old) == []
    assert recv(s, "b", m.Answer("t1", m.SAME, n=3), old) == []
    assert recv(s, "c", later, old) == []  # not a holder of the task: no word on it
    # a later run still under way there: our copy joins it (its DONE will end ours)
    assert recv(s, "b", m.Answer("t1", m.SAME, n=3, reruns=2), old) == [fx.JoinRun("t1", 2)]
    assert recv(s, "b", m.Answer("t1", m.SAME, n=3, reruns=2), task()) == []  # live: no


def test_a_sibling_says_which_run_is_under_way():
    s = Siblings("b", T, ("a", "b"))
    tick(s, 100.0, True)
    rerun = task(replica=1, reruns=2, state=State.RUNNING)
    assert sends(recv(s, "a", m.Ask("t1", 0, probe=True, n=5), rerun)) == \
        [("a", m.Answer("t1", m.SAME, n=5, reruns=2))]


def test_the_rejoiner_ends_or_drops_a_live_copy_on_news():
    s = restarted()
    tick(s, 100.0, True)
    live = task()
    assert recv(s, "b", m.Answer("t1", m.REHOMED, replicas=("c", "b"), n=3), live) == \
        [fx.Drop("t1")]
    ended = m.Answer("t1", m.ENDED, state="failed", attempts=3, n=3)
    assert recv(s, "b", ended, live) == \
        [fx.Update("t1", state=State.FAILED, attempts=3, last=None)]
    assert recv(s, "b", m.Answer("t1", m.SAME, n=3), live) == []


def test_an_answer_carries_its_run_and_age_and_same_decodes():
    a = m.Answer("t1", m.ENDED, state="succeeded", attempts=1, n=2, reruns=3, ago=1.5)
    assert m.Answer.from_payload(a.payload()) == a
    assert "reruns" not in m.Answer("t1", m.GO).payload()  # left out when nothing to say
    assert m.Answer.from_payload({"id": "t1", "verdict": "same", "n": 4}) == \
        m.Answer("t1", m.SAME, n=4)
    assert m.Answer.verb == Verb.ANSWER
