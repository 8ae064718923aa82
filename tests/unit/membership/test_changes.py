"""miyamoto.membership.changes alone: what a leader counts as acknowledged, the one next
roster change (restarted, then silent, then leaving members out; then one admission),
when a roster is dead, and whom a leaving leader hands over to."""

from __future__ import annotations

from miyamoto.membership.changes import RosterChanges
from miyamoto.membership.roster import Member, Roster

M = {i: Member(i, f"tcp://{i}:1", f"{i}:2") for i in "abcde"}


def roster(ids: str = "abc", version: int = 3, term: int = 2, floor: int = 0) -> Roster:
    return Roster(version, term, "a", tuple(M[i] for i in ids), tuple("i" + i for i in ids),
                  quorum_floor=floor)


def acked(*ids: str, r: Roster | None = None) -> RosterChanges:
    ch = RosterChanges("a")
    r = r or roster()
    for i in ids:
        ch.ack((i, "i" + i), r.key)
    return ch


NOBODY = lambda i: False  # noqa: E731


def test_an_ack_keeps_the_newest_roster_key_of_each_voter():
    ch = RosterChanges("a")
    ch.ack(("b", "ib"), (2, 5))
    ch.ack(("b", "ib"), (2, 4))
    ch.ack(("b", "ib"), (1, 9))
    assert ch.acked[("b", "ib")] == (2, 5)
    ch.ack(("b", "ib"), (3, 0))
    assert ch.acked[("b", "ib")] == (3, 0)
    ch.ack(("c", "ic"), (0, 0))  # anything beats no ack at all
    assert ch.acked[("c", "ic")] == (0, 0)


def test_a_roster_is_committed_once_a_quorum_counting_me_acked_it_or_a_newer_one():
    r = roster()
    assert not RosterChanges("a").committed(r)
    assert acked("b").committed(r)
    assert RosterChanges("a").committed(roster("a"))  # alone: my own word is a quorum
    ch = RosterChanges("a")
    ch.ack(("b", "ib"), (2, 2))  # an older version
    assert not ch.committed(r)
    ch.ack(("b", "ib"), (3, 0))  # a newer term
    assert ch.committed(r)
    ch = RosterChanges("a")
    ch.ack(("b", "ix"), r.key)  # another incarnation of b
    assert not ch.committed(r)
    assert not acked("b", r=roster(floor=3)).committed(roster(floor=3))
    assert acked("b", "c", r=roster(floor=3)).committed(roster(floor=3))


def test_nothing_changes_until_the_roster_is_committed():
    ch = RosterChanges("a")
    ch.leaving.add("b")
    assert ch.next_change(roster(), 2, 0.0, NOBODY) is None
    ch.ack(("b", "ib"), roster().key)
    change = ch.next_change(roster(), 2, 0.0, NOBODY)
    assert change.removed == M["b"] and change.roster.ids() == ("a", "c")


def test_a_restarted_member_goes_first_then_a_silent_one_then_a_leaving_one():
    r = roster("abcd")
    ch = acked("b", "c", "d", r=r)
    ch.leaving.add("b")
    ch.saw_join("d", "id2")  # d restarted
    silent = lambda i: i == "c"  # noqa: E731
    change = ch.next_change(r, 4, 0.0, silent)
    assert change.removed == M["d"] and change.admitted is None
    assert change.roster.ids() == ("a", "b", "c") and change.roster.key == (4, 4)
    assert change.roster.incarnations == ("ia", "ib", "ic") and change.roster.leader == "a"
    ch.saw_join("d", "id")  # (as if it had not)
    change = ch.next_change(r, 4, 0.0, silent)
    assert change.removed == M["c"]
    change = ch.next_change(r, 4, 0.0, NOBODY)
    assert change.removed == M["b"] and "b" not in ch.leaving
    assert ch.next_change(r, 4, 0.0, NOBODY) is None


def test_a_silent_member_goes_only_while_a_majority_of_the_rest_is_heard():
    r = roster("abcde")
    ch = acked("b", "c", "d", r=r)
    # c, d and e silent: the rest without c is a, b, d, e: a and b heard, 2 of 4
    assert ch.next_change(r, 2, 0.0, lambda i: i in "cde") is None
    # c and d silent: a, b and e heard, 3 of 4
    assert ch.next_change(r, 2, 0.0, lambda i: i in "cd").removed == M["c"]
    # c alone silent: a, b, d, e all heard
    assert ch.next_change(r, 2, 0.0, lambda i: i == "c").removed == M["c"]
    r = roster("abc")
    ch = acked("b", r=r)
    # of three, c silent: a and b are a majority of the two left
    assert ch.next_change(r, 2, 0.0, lambda i: i == "c").removed == M["c"]
    # both silent: a alone is not a majority of a and c (nor of a and b)
    assert ch.next_change(r, 2, 0.0, lambda i: i in "bc") is None
    # of two, b silent: alone, a is its own majority
    r = roster("ab")
    assert acked("b", r=r).next_change(r, 2, 0.0, lambda i: i == "b").removed == M["b"]
    # and never itself, however silent
    assert acked("b", "c").next_change(roster(), 2, 0.0, lambda i: True) is None


def test_one_admission_at_a_time_in_id_order_until_its_deadline():
    r = roster("ab")
    ch = acked("b", r=r)
    ch.ask_in(M["d"], "id", until=5.0)
    ch.ask_in(M["c"], "ic", until=5.0)
    change = ch.next_change(r, 2, 5.0, NOBODY)  # at its deadline: still in time
    assert change.admitted == "c" and change.removed is None
    assert change.roster.ids() == ("a", "b", "c") and change.roster.incarnation("c") == "ic"
    assert change.roster.key == (2, 4) and ch.latest_inc["c"] == "ic"
    assert list(ch.pending) == ["d"]
    assert ch.next_change(r, 2, 5.01, NOBODY) is None  # d's deadline passed
    assert not ch.pending


def test_a_member_already_in_is_not_admitted_again():
    r = roster("ab")
    ch = acked("b", r=r)
    ch.ask_in(M["b"], "ib", until=9.0)  # the same incarnation: nothing to do
    assert ch.next_change(r, 2, 0.0, NOBODY) is None and not ch.pending
    ch.ask_in(M["b"], "ib2", until=9.0)  # a new one: kept until the old one is out
    assert ch.next_change(r, 2, 0.0, NOBODY) is None and "b" in ch.pending


def test_reset_forgets_acks_joins_and_leaves_but_not_incarnations():
    ch = acked("b")
    ch.ask_in(M["d"], "id", 9.0)
    ch.leaving.add("c")
    ch.saw_join("e", "ie")
    ch.reset()
    assert not ch.acked and not ch.pending and not ch.leaving
    assert ch.latest_inc == {"e": "ie"}


def test_adopt_takes_the_rosters_incarnations():
    ch = RosterChanges("a")
    ch.saw_join("b", "old")
    ch.adopt(roster())
    assert ch.latest_inc == {"a": "ia", "b": "ib", "c": "ic"}


def test_a_roster_whose_quorum_restarted_is_dead():
    r = roster("abc")
    ch = RosterChanges("a")
    assert not ch.config_dead(r, leader=False)  # nothing heard: every incarnation live
    ch.saw_join("b", "ib2")
    assert not ch.config_dead(r, leader=False)  # a and c: a quorum
    ch.saw_join("c", "ic2")
    assert ch.config_dead(r, leader=False) and ch.config_dead(r, leader=True)
    r4 = roster("abcd")
    ch = RosterChanges("a")
    ch.saw_join("b", "ib2")
    ch.saw_join("c", "ic2")
    assert ch.config_dead(r4, leader=True)  # a and d of four, and not committed
    for i in "bcd":
        ch.ack((i, "i" + i), r4.key)
    # committed, and a and d are a majority of the three a removal leaves: it can shrink
    assert not ch.config_dead(r4, leader=True)
    assert ch.config_dead(r4, leader=False)
    r5 = roster("abcde")
    ch = acked("b", "c", "d", "e", r=r5)
    for i in "bcd":
        ch.saw_join(i, "new")
    assert ch.config_dead(r5, leader=True)  # a and e: not a majority of four
    ch.saw_join("d", "id")
    assert not ch.config_dead(r5, leader=True)  # a, d and e: a quorum of five


def test_a_leader_alone_with_a_restarted_member_can_still_shrink():
    r = roster("ab")
    ch = acked("b", r=r)
    ch.saw_join("b", "ib2")
    assert not ch.config_dead(r, leader=True)  # two: a is a majority of one
    assert ch.config_dead(r, leader=False)
    assert not RosterChanges("a").config_dead(roster("a"), leader=True)


def test_the_successor_is_the_best_acknowledged_then_the_latest_heard():
    r = roster("abcd")
    ch = RosterChanges("a")
    ch.ack(("c", "ic"), (2, 3))
    ch.ack(("b", "ib"), (2, 2))
    assert ch.successor(r, {"b": 9.0, "d": 9.0}) == M["c"]
    ch.ack(("b", "ib"), (2, 3))
    assert ch.successor(r, {"b": 2.0, "c": 1.0}) == M["b"]
    assert ch.successor(r, {"b": 1.0, "c": 2.0}) == M["c"]
    assert RosterChanges("a").successor(r, {"d": 0.5}) == M["d"]
    assert RosterChanges("a").successor(roster("ab"), {}) == M["b"]  # never itself


def test_an_expired_or_present_asker_does_not_hold_up_the_next_one():
    r = roster("ab")
    ch = acked("b", r=r)
    ch.ask_in(M["b"], "ib", until=9.0)  # already in
    ch.ask_in(M["c"], "ic", until=1.0)  # expired
    ch.ask_in(M["d"], "id", until=9.0)
    change = ch.next_change(r, 2, 2.0, NOBODY)
    assert change.admitted == "d" and not ch.pending
