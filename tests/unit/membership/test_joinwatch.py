"""When a joiner that hears nothing says so (``JoinWatch``), on a fake clock."""

from __future__ import annotations

from miyamoto.membership.joinwatch import JoinWatch, Unanswered

SEEDS = ("tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002")


def test_silence_is_reported_after_first_then_every_few_seconds():
    w = JoinWatch(SEEDS, 100.0, first=5.0, every=5.0)
    assert w.check(True, 104.9) is None
    assert w.check(True, 105.0) == Unanswered(SEEDS, 5.0)
    assert w.check(True, 107.0) is None  # rate-limited
    assert w.check(True, 110.0) == Unanswered(SEEDS, 10.0)


def test_anything_heard_or_a_done_join_ends_the_silence():
    w = JoinWatch(SEEDS, 0.0, first=5.0, every=5.0)
    w.heard(4.0)
    assert w.check(True, 8.0) is None and w.check(True, 9.0) == Unanswered(SEEDS, 5.0)
    assert w.check(False, 20.0) is None  # a member now: nothing to say
    assert w.check(True, 24.0) is None  # joining again (dropped): the clock starts anew
    assert w.check(True, 25.0) == Unanswered(SEEDS, 5.0)


def test_a_node_without_seeds_never_warns():
    w = JoinWatch((), 0.0)
    assert all(w.check(True, t) is None for t in (10.0, 100.0))


def test_by_default_silence_is_reported_after_five_seconds_then_every_five():
    w = JoinWatch(SEEDS, 0.0)
    assert w.check(True, 4.9) is None
    assert w.check(True, 5.0) == Unanswered(SEEDS, 5.0)
    assert w.check(True, 9.9) is None
    assert w.check(True, 10.0) == Unanswered(SEEDS, 10.0)
