"""Placement and sibling timing (miyamoto.replicas.placement): pure functions."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, strategies as st

from miyamoto.replicas import placement as replication
from miyamoto.tasks.task import Task

pytestmark = pytest.mark.timeout(30)


def _task(name: str | None = None, queue: str = "default") -> Task:
    return Task(id="t1", queue=queue, url="http://127.0.0.1/", name=name, eta=100.0,
                fire_at=100.0)


def test_named_placement_moves_by_at_most_one_member_when_the_ring_changes():
    ring = tuple(f"m{i}" for i in range(6))
    for i in range(300):
        before = replication.place(ring, 2, _task(f"name-{i}"), 0)
        joined = replication.place(ring + ("m9",), 2, _task(f"name-{i}"), 0)
        lost = replication.place(tuple(m for m in ring if m != before[0]), 2, _task(f"name-{i}"), 0)
        assert len(set(before) & set(joined)) >= 1 and before[0] in joined
        assert before[1] in lost


def test_unnamed_tasks_round_robin_over_the_ring():
    ring = ("a", "b", "c")
    starts = collections.Counter(replication.place(ring, 2, _task(), c)[0] for c in range(300))
    assert starts == {"a": 100, "b": 100, "c": 100}
    assert replication.place(ring, 2, _task(), 2) == ("c", "a")


def test_an_unnamed_tasks_first_copy_stays_on_the_enqueuing_node():
    """``first`` (the node that took the enqueue) holds copy 0, the rest follow the
    cursor's order; a ``first`` outside the ring (not a member yet) changes nothing."""
    ring = ("a", "b", "c", "d")
    assert replication.place(ring, 3, _task(), 1, first="d") == ("d", "b", "c")
    assert replication.place(ring, 2, _task(), 1, first="b") == ("b", "c")
    assert replication.place(ring, 4, _task(), 0, first="c") == ("c", "a", "b", "d")
    assert replication.place(ring, 3, _task(), 1, first="x") == ("b", "c", "d")
    assert replication.place(ring, 3, _task(), 1, first=None) == ("b", "c", "d")
    # in one zone, every member is a second choice: still each holds one copy at most
    one_zone = {m: "z" for m in ring}
    assert replication.place(ring, 4, _task(), 0, one_zone, first="b") == ("b", "a", "c", "d")
    # a named task's set is the name's, wherever it was enqueued
    assert replication.place(ring, 2, _task("n"), 1, first="d") == \
        replication.place(ring, 2, _task("n"), 1)


def test_named_tasks_meet_on_the_same_members_whatever_the_cursor():
    ring = ("a", "b", "c", "d")
    placements = {replication.place(ring, 2, _task("order-17"), c) for c in range(10)}
    assert len(placements) == 1
    other_queue = replication.place(ring, 2, _task("order-17", queue="q2"), 0)
    names = {replication.place(ring, 2, _task(f"n{i}"), 0)[0] for i in range(200)}
    assert names == set(ring)  # names spread over the ring
    assert len(other_queue) == 2


@given(st.integers(1, 7), st.integers(1, 5), st.integers(0, 10_000),
       st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_placement_is_distinct_and_capped(members, n, cursor, name):
    ring = tuple(f"m{i}" for i in range(members))
    placed = replication.place(ring, n, _task(name), cursor)
    assert len(placed) == min(n, members)
    assert len(set(placed)) == len(placed)
    assert set(placed) <= set(ring)


def test_copies_fire_one_offset_apart():
    cps = replication.copies(_task(), ("a", "b", "c"), 5.0)
    assert [c.fire_at for c in cps] == [100.0, 105.0, 110.0]
    assert [c.replica for c in cps] == [0, 1, 2]
    assert all(c.replicas == ("a", "b", "c") for c in cps)


def test_sibling_keeps_its_distance_from_the_claimer():
    # copy 1 of 3 claimed and held until 200: copy 2 fires one offset later, copy 0
    # (which already passed its turn) two offsets later
    assert replication.sibling_fire_at(200.0, 2, 1, 3, 5.0) == 205.0
    assert replication.sibling_fire_at(200.0, 0, 1, 3, 5.0) == 210.0
    assert replication.rank(1, 1, 1) == 0


def test_replacement_and_restorer():
    ring = ("a", "c", "d")  # b was lost
    assert replication.replacement(ring, ("a", "b"), "b") == "c"
    assert replication.replacement(ring, ("d", "b"), "b") == "c"
    assert replication.replacement(("a", "b"), ("a", "b"), "b") is None
    assert replication.restorer(("b", "c", "a"), {"a", "c"}) == "c"
    assert replication.restorer(("b",), {"a"}) is None


ZONED = {"a": "z1", "b": "z1", "c": "z2", "d": "z2", "e": "z3"}


@given(st.integers(0, 1000), st.one_of(st.none(), st.text(min_size=1, max_size=8)),
       st.integers(1, 4))
def test_copies_go_to_distinct_zones_when_there_are_enough(cursor, name, n):
    ring = tuple(sorted(ZONED))
    placed = replication.place(ring, n, _task(name), cursor, ZONED)
    assert len(placed) == len(set(placed)) == n
    assert len({ZONED[m] for m in placed}) == min(n, 3)
    if name is not None:  # the name's owner (top-ranked) keeps its place
        assert placed[0] == replication.place(ring, 1, _task(name), 0)[0]


def test_spread_without_zones_is_the_plain_order_and_restores_keep_zones():
    ring = ("a", "b", "c", "d")
    assert replication.place(ring, 2, _task(), 0) == ("a", "b")
    assert replication.place(ring, 2, _task(), 0, ZONED) == ("a", "c")
    # a lost copy in z2 is replaced in z2, not in the surviving copy's z1
    assert replication.replacement(("a", "b", "d"), ("a", "c"), "c") == "d"
    assert replication.replacement(("a", "b", "d"), ("a", "c"), "c", ZONED) == "d"
    assert replication.replacement(("a", "b", "d", "e"), ("a", "c"), "c",
                                   {"a": "z1", "b": "z2", "d": "z1", "e": "z1"}) == "b"
    # one zone only: any member will do
    assert replication.place(ring, 3, _task(), 1, dict.fromkeys(ring, "z")) == ("b", "c", "d")


URL = "http://worker.example/w"


def test_replication_empty_ring_places_nothing():
    t = Task(id="t1", queue="q", url=URL)
    assert replication.place([], 2, t, 0) == ()


def test_replication_two_copies_fire_one_offset_apart_after_a_claim():
    assert replication.rank(1, 0, 2) == 1 and replication.rank(0, 1, 2) == 1
    assert replication.sibling_fire_at(10.0, 1, 0, 2, 5.0) == 15.0
    assert replication.rank(0, 0, 1) == 0
    assert replication.rank(2, 0, 3) == 2 and replication.rank(0, 2, 3) == 1


def test_replication_replacement_wraps_around_the_ring():
    ring = ["a", "b", "c"]
    # "d" was lost; nothing after it holds no copy: the first free member from the start
    assert replication.replacement(ring, ("c", "d"), "d") == "a"
    assert replication.replacement(ring, ("a", "d"), "d") == "b"
    assert replication.replacement(["a", "b", "c", "e"], ("b", "d"), "d") == "e"


def test_an_ordered_tasks_copies_follow_its_key_not_its_name_or_the_cursor():
    """Every task of one key has copy i on the same member (the key's owner first),
    whatever its name, the cursor or the node that took it."""
    ring = ("a", "b", "c", "d", "e")
    def keyed(key: str, name: str | None = None, queue: str = "default") -> Task:
        return _task(name, queue).evolve(ordering_key=key)
    placed = {replication.place(ring, 2, keyed("acct-1", name), c, first="c")
              for c, name in enumerate([None, "x", "y", None, "z"])}
    assert len(placed) == 1
    (owner, _), = placed
    assert replication.ranked(ring, replication.owner_key(keyed("acct-1")))[0] == owner
    assert replication.owner_key(keyed("k", "n")) != replication.owner_key(_task("n"))
    owners = {replication.place(ring, 2, keyed(f"k{i}"), 0)[0] for i in range(200)}
    assert owners == set(ring)  # keys spread over the ring
    lost = tuple(m for m in ring if m != owner)
    assert replication.place(lost, 2, keyed("acct-1"), 0)[0] == next(iter(placed))[1]
