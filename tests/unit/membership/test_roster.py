"""The roster (miyamoto.membership.roster, as the machine exports it): one incarnation per
member, and the empty roster."""

from __future__ import annotations

import pytest

from miyamoto.membership import machine as mb
from miyamoto.wire.verbs import DecodeError


def test_membership_roster_needs_one_incarnation_per_member():
    a, b = mb.Member("a", "tcp://127.0.0.1:1", "127.0.0.1:2"), \
        mb.Member("b", "tcp://127.0.0.1:3", "127.0.0.1:4")
    assert mb.Roster(1, 1, "a", (b, a), ("ib", "ia")).incarnations == ("ia", "ib")
    with pytest.raises(ValueError):
        mb.Roster(1, 1, "a", (a, b), ("ia",))
    assert mb.EMPTY.version == 0 and mb.EMPTY.term == 0 and mb.EMPTY.members == ()


A = mb.Member("a", "tcp://10.0.0.1:6000", "10.0.0.1:8000")
B = mb.Member("b", "tcp://10.0.0.2:6000", "10.0.0.2:8000", zone="z2")
C = mb.Member("c", "tcp://10.0.0.3:6000", "10.0.0.3:8000")


def test_majority():
    assert [mb.majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_a_roster_keeps_its_members_in_id_order_with_their_incarnations():
    r = mb.Roster(4, 3, "b", (C, A, B), ("ic", "ia", "ib"), quorum_floor=2)
    assert r.members == (A, B, C) and r.ids() == ("a", "b", "c") and r.ids() is r.ids()
    assert r.incarnations == ("ia", "ib", "ic")
    assert r.pairs() == [(A, "ia"), (B, "ib"), (C, "ic")]
    assert r.key == (3, 4)
    assert r.get("b") is B and r.get("d") is None
    assert r.incarnation("c") == "ic" and r.incarnation("d") is None
    assert r.has("a", "ia") is True
    assert not r.has("a", "ib") and not r.has("d", "ia")
    assert mb.Roster(1, 1, None, (A, B)).incarnations == ("", "")


def test_a_rosters_quorum_is_a_majority_or_its_floor():
    assert mb.Roster(1, 1, "a", (A, B, C)).quorum() == 2
    assert mb.Roster(1, 1, "a", (A, B, C), quorum_floor=3).quorum() == 3
    assert mb.Roster(1, 1, "a", (A, B, C), quorum_floor=1).quorum() == 2
    assert mb.Roster(1, 1, "a", (A,), quorum_floor=1).quorum() == 1
    assert mb.Roster(1, 1, None, (), quorum_floor=1).quorum() == 1  # the floor of no one: 1


@pytest.mark.parametrize("kw, words", [
    ({"members": (A, A)}, "duplicate member id"),
    ({"leader": "d"}, "the leader is not a member"),
    ({"quorum_floor": 3}, "quorum floor out of range"),
    ({"quorum_floor": -1}, "quorum floor out of range"),
    ({"incarnations": ("ia", "ib", "ic")}, "one incarnation per member"),
])
def test_a_bad_roster_is_refused(kw, words):
    args = {"version": 1, "term": 1, "leader": "a", "members": (A, B), **kw}
    with pytest.raises(ValueError, match=words):
        mb.Roster(**args)
    mb.Roster(1, 1, "a", (A, B), quorum_floor=2)  # the floor may be every member


def test_a_roster_round_trips_and_its_payload_is_the_wire_form():
    r = mb.Roster(7, 5, "a", (B, A), ("ib", "ia"), quorum_floor=1)
    p = r.to_payload()
    assert p == {"version": 7, "term": 5, "leader": "a", "floor": 1, "members": [
        {"id": "a", "cluster": A.cluster, "http": A.http, "inc": "ia"},
        {"id": "b", "cluster": B.cluster, "http": B.http, "zone": "z2", "inc": "ib"}]}
    assert r.to_payload() is p  # built once
    back = mb.Roster.from_payload(p)
    assert back == r and back.incarnations == r.incarnations and back.quorum_floor == 1
    assert back.get("b").zone == "z2" and back.get("a").zone == ""
    old = mb.Roster.from_payload({"version": 1, "term": 1, "leader": None,
                                  "members": [A.to_payload()]})  # no inc, no floor
    assert old.incarnations == ("",) and old.quorum_floor == 0 and old.leader is None


@pytest.mark.parametrize("bad", [
    [], "x", {"version": 1, "term": 1, "members": ["a"]},
    {"version": 1, "term": 1, "members": [dict(A.to_payload(), inc=3)]},
    {"version": 1, "term": 1, "members": [dict(A.to_payload(), inc="i" * 513)]},
    {"version": 1, "term": 1, "members": [], "floor": "1"},
    {"version": 1, "term": 1, "members": [], "floor": 1.0},
    {"version": 1, "term": 1, "leader": "a", "members": []},
    {"version": 1, "term": 1, "members": [A.to_payload(), A.to_payload()]},
])
def test_a_malformed_roster_payload_does_not_decode(bad):
    with pytest.raises(DecodeError):
        mb.Roster.from_payload(bad)


def test_an_incarnation_of_the_longest_name_decodes():
    r = mb.Roster.from_payload({"version": 1, "term": 1, "members": [
        dict(A.to_payload(), inc="i" * 512)]})
    assert r.incarnation("a") == "i" * 512


@pytest.mark.parametrize("kw", [
    {"heartbeat_interval": 0}, {"failure_timeout": 0}, {"election_timeout_min": 0},
    {"join_retry": 0}, {"join_retry": -1},
    {"election_timeout_min": 2.0, "election_timeout_max": 1.9},
    {"heartbeat_interval": 1.5},
])
def test_bad_timings_are_refused(kw):
    with pytest.raises(ValueError):
        mb.Timing(**kw)


def test_timing_edges_that_are_allowed_and_what_they_derive():
    t = mb.Timing(election_timeout_min=2.0, election_timeout_max=2.0, heartbeat_interval=1.99)
    assert t.election_timeout_max == t.election_timeout_min
    assert mb.Timing().stall == 1.5  # half the failure timeout
    assert mb.Timing(heartbeat_interval=1.0, failure_timeout=3.0).stall == 2.0  # two beats
    assert mb.Timing().term_step == 6
    assert mb.Timing(failure_timeout=3.1).term_step == 7  # ceil(3.1 / 1.5) = 3


def test_a_roster_is_a_value_whatever_it_has_cached():
    fresh = mb.Roster(2, 1, "a", (A, B), ("ia", "ib"))
    used = mb.Roster(2, 1, "a", (A, B), ("ia", "ib"))
    used.ids(), used.to_payload()
    assert used == fresh and hash(used) == hash(fresh) and {used, fresh} == {fresh}
    assert repr(used) == repr(fresh) and "_payload" not in repr(used) and "_index" not in repr(used)
    assert used != mb.Roster(2, 1, "a", (A, B), ("ia", "ix"))
