"""The ordering keys' lines (pure): only a line's head starts, and only while nothing else
of the line runs; an end lets the next go; ``block`` keeps a failed head until it is run
again or removed; seqs count up even across an emptied line."""

from __future__ import annotations

import pytest

from miyamoto.engine.ordering import Lines
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(10)


def _t(i: str, seq: int, key: str = "k", state: State = State.SCHEDULED, q: str = "q") -> Task:
    return Task(id=i, queue=q, url="http://w.example/", ordering_key=key, ordering_seq=seq,
                state=state)


def test_only_the_head_starts_and_an_end_wakes_the_next():
    lines = Lines()
    a, b, c = _t("a", 1), _t("b", 2), _t("c", 3)
    for t in (b, c, a):  # stored out of order: the seq decides
        lines.note(t)
    assert [lines.may_start(t) for t in (a, b, c)] == [True, False, False]
    assert lines.note(a.evolve(state=State.RUNNING)) == []
    assert lines.ahead(b) == "a"
    assert lines.note(a.evolve(state=State.SCHEDULED)) == ["a"]  # a retry: still the head
    assert not lines.may_start(b)
    assert lines.note(a.evolve(state=State.SUCCEEDED)) == ["b"]
    assert lines.may_start(b) and not lines.may_start(c)
    assert lines.note(b.evolve(state=State.CANCELLED)) == ["c"]
    assert lines.remove("c") == [] and len(lines) == 0


def test_a_task_without_a_key_or_in_another_key_is_not_held():
    lines = Lines()
    lines.note(_t("a", 1).evolve(state=State.RUNNING))
    assert lines.may_start(_t("x", 2, key="other"))
    assert lines.may_start(Task(id="n", queue="q", url="http://w.example/"))
    assert lines.may_start(_t("b", 1, q="q2"))  # the same key in another queue


def test_continue_lets_the_next_go_after_a_final_failure():
    lines = Lines()
    lines.note(_t("a", 1))
    lines.note(_t("b", 2))
    assert lines.note(_t("a", 1, state=State.FAILED)) == ["b"]
    assert lines.blocker("q", "k") is None


def test_block_holds_the_key_until_the_failed_task_is_rerun_or_removed():
    lines = Lines(lambda queue: True)
    lines.note(_t("a", 1))
    lines.note(_t("b", 2))
    assert lines.note(_t("a", 1, state=State.FAILED)) == []
    assert lines.blocker("q", "k") == "a" and lines.blocked("q") == [("k", "a")]
    assert not lines.may_start(_t("b", 2)) and lines.ahead(_t("b", 2)) == "a"
    assert lines.note(_t("a", 1)) == ["a"]  # run again: the head, live
    assert lines.blocker("q", "k") is None and not lines.may_start(_t("b", 2))
    lines.note(_t("a", 1, state=State.FAILED))
    assert lines.remove("a") == ["b"]  # deleted


def test_a_queue_that_stops_blocking_releases_its_blockers():
    mode = {"q": True}
    lines = Lines(lambda queue: mode[queue])
    lines.note(_t("a", 1, state=State.FAILED))
    lines.note(_t("b", 2))
    lines.note(_t("x", 1, key="k2", state=State.FAILED))
    lines.note(_t("y", 2, key="k2"))
    assert lines.blocked("q") == [("k", "a"), ("k2", "x")]
    mode["q"] = False  # read when it matters: the blockers hold no more at once
    assert lines.blocked("q") == [] and lines.may_start(_t("b", 2))
    assert sorted(lines.release_failed("q")) == ["b", "y"] and len(lines) == 2


def test_a_rerun_behind_a_running_task_goes_next_not_beside_it():
    lines = Lines()
    lines.note(_t("b", 2, state=State.RUNNING))
    assert lines.note(_t("a", 1)) == []  # a failed task run again: ahead, but b runs
    assert not lines.may_start(_t("a", 1))
    assert lines.note(_t("b", 2, state=State.SUCCEEDED)) == ["a"]


def test_seqs_count_up_across_an_emptied_line_and_above_held_ones():
    lines = Lines()
    s1 = lines.next_seq("q", "k", 100.0)
    s2 = lines.next_seq("q", "k", 100.0)  # the same microsecond
    assert s2 == s1 + 1
    lines.note(_t("a", 10**12))  # a copy numbered by another owner, far ahead
    assert lines.next_seq("q", "k", 100.0) == 10**12 + 1
    lines.remove("a")
    assert lines.next_seq("q", "k", 200.0) >= 200 * 10**6


def test_ahead_of_answers_for_a_task_the_line_does_not_hold_yet():
    """A sibling's ASK may come before its copy: the seq it carries is placed against
    the line (what ``replicas.siblings`` answers ``wait`` to)."""
    lines = Lines()
    lines.note(_t("a", 10))
    assert lines.ahead_of("q", "k", 20, "b") == "a"
    assert lines.ahead_of("q", "k", 5, "z") is None  # numbered before a: it goes first
    assert lines.ahead_of("q", "other", 20, "b") is None
    lines.note(_t("a", 10, state=State.RUNNING))
    assert lines.ahead_of("q", "k", 5, "z") == "a"  # but not beside a running one
    assert lines.ahead_of("q", "k", 10, "a") is None
