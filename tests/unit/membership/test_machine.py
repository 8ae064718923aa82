"""miyamoto.membership.machine: rules at their edges (the rule tests and the simulators are
in test_membership.py, whose helpers these use)."""

from __future__ import annotations

import pytest

from test_membership import T, cluster_of, node, payload, recv, tick, verbs
from miyamoto.membership.machine import Roster
from miyamoto.wire.verbs import Verb


@pytest.mark.timeout(10)
def test_a_follower_campaigns_at_the_tick_that_reaches_its_election_timeout():
    """next_deadline() promises a tick then has something to do: at its election timeout,
    not a heartbeat later."""
    wire, now = cluster_of("a", "b", "c")
    b = wire.nodes["b"]
    at = b._election.timeout_at
    assert b.next_deadline() <= at
    t = now
    while t + T.heartbeat_interval < at:  # the leader is silent from now on
        t += T.heartbeat_interval
        assert Verb.VOTE_REQUEST not in verbs(tick(b, t))
    assert at - t <= T.heartbeat_interval
    assert Verb.VOTE_REQUEST in verbs(tick(b, at))


@pytest.mark.timeout(10)
def test_a_second_leader_of_our_term_changes_nothing():
    """Two leaders in one term cannot be (one vote per term): a leader that hears one
    anyway (a bug elsewhere, or a forgery by a key holder) keeps its roster and its lead."""
    wire, now = cluster_of("a", "b", "c")
    a, b = wire.nodes["a"], wire.nodes["b"]
    roster = a.roster
    theirs = Roster(roster.version + 1, a.term, "b", roster.members, roster.incarnations)
    hb = payload(b, Verb.HEARTBEAT, roster=theirs, term=a.term)
    assert recv(a, "b", Verb.HEARTBEAT, hb, now) == []
    assert a.is_leader and a.leader == "a" and a.roster == roster


def _seed_pair(redirected: bool) -> list:
    """x joins with seeds y and z; y, a fellow fresh joiner, says so; z (maybe) points x
    to a leader. What x sends over the next failure timeout."""
    x, y, z = (node(n, seeds=[s for s in "xyz" if s != n]) for n in "xyz")
    recv(x, "y", Verb.JOIN, payload(y, Verb.JOIN, boot=x._boot.boot, fresh=True), 0.0)
    if redirected:
        recv(x, "z", Verb.REDIRECT, payload(z, Verb.REDIRECT, leader="L",
                                            address="tcp://L:6000"), 0.0)
    sent = []
    t = 0.0
    while t < T.failure_timeout:
        t = round(t + 0.1, 1)
        sent += tick(x, t)
    return sent


@pytest.mark.timeout(10)
def test_a_joiner_pointed_to_a_leader_does_not_bootstrap_another_cluster():
    assert Verb.VOTE_REQUEST in verbs(_seed_pair(redirected=False))  # the bootstrap runs
    sent = _seed_pair(redirected=True)
    assert Verb.VOTE_REQUEST not in verbs(sent)
    assert any(s.msg.verb is Verb.JOIN and s.address == "tcp://L:6000" for s in sent)


@pytest.mark.timeout(10)
def test_a_joiner_that_backs_a_bootstrap_candidate_gives_it_an_election_timeout():
    x, y = node("x", seeds=["y", "z"]), node("y", seeds=["x", "z"])
    own = x._boot.at  # when x would try its own bootstrap
    t = round(own - 0.1, 2)
    recv(x, "y", Verb.JOIN, payload(y, Verb.JOIN, boot=x._boot.boot, fresh=True), t)
    ask = payload(y, Verb.VOTE_REQUEST, rterm=0, version=0, boot=x._boot.boot, fresh=True,
                  term=1)
    (vote,) = recv(x, "y", Verb.VOTE_REQUEST, ask, t)
    assert vote.msg.verb is Verb.VOTE and vote.msg.granted
    sent = []
    while t < own + T.election_timeout_min - 0.2:  # past its own time, short of a timeout
        t = round(t + 0.05, 2)
        sent += tick(x, t)
    assert Verb.VOTE_REQUEST not in verbs(sent)


@pytest.mark.timeout(10)
def test_a_member_that_held_a_roster_joins_again_as_no_first_start():
    """A node that was a member is no fresh seed when it joins again: its word must not
    let a majority of the seed set bootstrap a second cluster beside the first."""
    wire, now = cluster_of("a", "b", "c")
    a, b = wire.nodes["a"], wire.nodes["b"]
    r = a.roster
    keep = [(m, i) for m, i in r.pairs() if m.id != "b"]
    without_b = Roster(r.version + 1, r.term, "a", tuple(m for m, _ in keep),
                       tuple(i for _, i in keep))
    sent = recv(b, "a", Verb.ROSTER, payload(a, Verb.ROSTER, roster=without_b), now)
    assert b.role == "joining"
    sent += tick(b, now + 1.0) + tick(b, now + 2.0)
    joins = [s.msg for s in sent if s.msg.verb is Verb.JOIN]
    assert joins and not any(j.fresh for j in joins)


@pytest.mark.timeout(10)
def test_an_election_after_a_pre_vote_is_no_handover():
    """Only a leaving leader's successor asks with ``transfer`` (which a voter that still
    hears its leader grants anyway); an election won by a pre-vote never does."""
    wire, now = cluster_of("a", "b", "c")
    del wire.nodes["a"]
    asked = []
    while not any(n.is_leader for n in wire.nodes.values()):
        now += 0.05
        for n in list(wire.nodes.values()):
            asked += [s.msg for s in wire.settle(n, tick(n, now), now)
                      if s.msg.verb is Verb.VOTE_REQUEST]
    real = [m for m in asked if not m.pre]
    assert real and not any(m.transfer for m in real)
    assert any(m.pre for m in asked)


@pytest.mark.timeout(10)
def test_a_leader_whose_clock_is_off_hands_over_and_does_not_campaign_while_off():
    """ClockSkew(off=True) on the leader: it steps down at once and names a successor
    (ROSTER elect), which campaigns without an election timeout; while off, the old
    leader starts no election, however long it hears no leader; back within, it may."""
    from miyamoto.membership.machine import ClockSkew
    wire, now = cluster_of("a", "b", "c")
    a = wire.nodes["a"]
    assert a.is_leader
    for off in (True, False):  # a follower: nothing to send
        assert wire.nodes["b"].step(ClockSkew(off), now) == []
    sent = a.step(ClockSkew(True), now)
    assert not a.is_leader and a.leader is None
    assert {s.to for s in sent} == {"b", "c"} and {s.msg.elect for s in sent} <= {"b", "c"}
    wire.settle(a, sent, now)
    now = wire.run(now, now + 0.2)
    leaders = {n.leader for n in wire.nodes.values()}
    assert len(leaders) == 1 and leaders.pop() in ("b", "c")
    # the others go silent: a alone hears no leader for many election timeouts
    t = now
    for _ in range(int(4 * T.election_timeout_max / T.heartbeat_interval)):
        t += T.heartbeat_interval
        assert Verb.VOTE_REQUEST not in verbs(tick(a, t))
    a.step(ClockSkew(False), t)
    sent = []
    for _ in range(int(2 * T.election_timeout_max / T.heartbeat_interval)):
        t += T.heartbeat_interval
        sent += tick(a, t)
    assert Verb.VOTE_REQUEST in verbs(sent)


@pytest.mark.timeout(10)
def test_a_candidate_whose_clock_goes_off_gives_up_its_election():
    """Off mid-election (its pre-vote or its vote under way): it must not win it."""
    from miyamoto.membership.machine import ClockSkew
    wire, now = cluster_of("a", "b", "c")
    b = wire.nodes["b"]
    at, t = b._election.timeout_at, now
    while t + T.heartbeat_interval < at:  # the leader is silent from now on
        t += T.heartbeat_interval
        tick(b, t)
    t = at
    assert Verb.VOTE_REQUEST in verbs(tick(b, t))  # b asks for pre-votes
    b.step(ClockSkew(True), t)
    for n in ("a", "c"):  # a pre-vote granted by both: it would campaign
        grant = payload(wire.nodes[n], Verb.VOTE, granted=True, pre=True, fresh=False)
        assert recv(b, n, Verb.VOTE, grant, t) == []
    assert b.role == "follower" and not b.is_leader


@pytest.mark.timeout(10)
def test_unanswered_vote_requests_are_sent_again_once_a_heartbeat_interval():
    """A pre-vote whose requests are lost is asked again a heartbeat interval later (not
    at every tick before, not never), to those that have not answered."""
    wire, now = cluster_of("a", "b", "c")
    b = wire.nodes["b"]
    t = now
    while Verb.VOTE_REQUEST not in verbs(first := tick(b, t)):  # the leader went silent
        t += 0.05
        assert t < now + 10
    assert sorted(s.to for s in first) == ["a", "c"]
    assert tick(b, t + 0.1) == [] and tick(b, t + T.heartbeat_interval - 0.01) == []
    again = tick(b, t + T.heartbeat_interval)
    assert verbs(again) == [Verb.VOTE_REQUEST] * 2 and sorted(s.to for s in again) == ["a", "c"]
