"""miyamoto.membership.liveness alone: stalls, a leader's evidence (rounds it sent and the
acks to them), a follower's heartbeats, and what the node reports from them (in contact,
reachable). Default timing: heartbeat 0.5 s, failure timeout 3 s, stall beyond 1.5 s."""

from __future__ import annotations

from miyamoto.membership.liveness import Liveness
from miyamoto.membership.roster import (CANDIDATE, FOLLOWER, JOINING, LEADER, Member, Roster,
                                        Timing)

T = Timing()
IDS = ("a", "b", "c")
R3 = Roster(1, 1, "a", tuple(Member(i, f"tcp://{i}:1", f"{i}:2") for i in IDS))
R1 = Roster(1, 1, "a", (Member("a", "tcp://a:1", "a:2"),))


def leader(now: float = 0.0) -> Liveness:
    live = Liveness("a", T, now)
    live.lead(IDS, now)
    return live


def test_a_gap_beyond_the_stall_threshold_is_a_stall_and_up_to_it_is_not():
    live = Liveness("a", T, 0.0)
    assert live.observe(1.5) == 0.0 and not live.stalled
    assert live.observe(1.0) == 0.0 and live.last_now == 1.5  # time never goes back
    assert live.observe(3.1) == 1.6 and live.stalled and live.last_now == 3.1


def test_a_stalled_leader_recovers_only_with_acks_to_rounds_sent_after_the_stall():
    live = leader()
    before = live.next_round(0.0)
    live.observe(2.0)  # a stall
    assert not live.recover_as_leader(IDS, 2)
    live.acked(("b", "ib"), before, None)  # an ack to a round from before the stall
    assert not live.recover_as_leader(IDS, 2)
    after = live.next_round(2.0)
    live.acked(("b", "ib"), after, None)
    assert not live.recover_as_leader(IDS, 3)  # me and b: not three
    assert live.recover_as_leader(IDS, 2) and not live.stalled
    assert live.recover_as_leader(IDS, 3)  # not stalled: nothing to recover from


def test_a_leader_counts_silence_from_its_leadership_then_from_the_newest_round_acked():
    live = leader(10.0)
    assert not live.silent("b", 13.0) and live.silent("b", 13.01)
    assert not live.silent("a", 100.0)  # never itself
    r = live.next_round(12.0)
    live.acked(("b", "ib"), r, None)
    assert live.contact["b"] == 12.0
    assert not live.silent("b", 15.0) and live.silent("b", 15.01)
    assert live.silent("c", 15.0)


def test_an_ack_to_an_older_round_moves_no_evidence_back():
    live = leader()
    r1 = live.next_round(0.0)
    r2 = live.next_round(1.0)
    live.acked(("b", "ib"), r2, 5)
    live.acked(("b", "ib"), r1, 3)
    assert live.contact["b"] == 1.0 and live.echo_for(("b", "ib")) == 5
    assert live.echo_for(("c", "ic")) is None
    live.acked(("c", "ic"), None, 2)  # no round: only the echo
    assert "c" not in live.contact and live.echo_for(("c", "ic")) == 2
    live.acked(("c", "ic"), 99, None)  # a round never sent
    assert "c" not in live.contact


def test_rounds_older_than_the_failure_timeout_are_let_go():
    live = leader()
    r1 = live.next_round(0.0)
    live.next_round(3.0)  # r1 sent exactly a failure timeout ago: kept
    live.acked(("b", "ib"), r1, None)
    assert live.contact["b"] == 0.0
    live.next_round(3.01)
    live.acked(("c", "ic"), r1, None)
    assert "c" not in live.contact


def test_a_leader_hears_members_with_evidence_within_the_failure_timeout():
    live = leader()
    live.acked(("b", "ib"), live.next_round(1.0), None)
    assert live.hears(IDS, 4.0) == {"a", "b"}  # exactly a failure timeout old: heard
    assert live.hears(IDS, 4.01) == {"a"}


def test_a_stall_restarts_a_leaders_clocks_of_silence():
    live = leader()
    live.acked(("b", "ib"), live.next_round(0.0), None)
    live.observe(2.0)  # a stall: b's silence counts from the resume
    assert not live.silent("b", 5.0) and live.silent("b", 5.01)
    live.admitted("d", 4.0)
    assert not live.silent("d", 7.0) and live.silent("d", 7.01)
    live.removed("b")
    assert "b" not in live.contact and live.silent("b", 5.0)


def test_a_follower_follows_for_a_failure_timeout_after_a_beat():
    live = Liveness("b", T, 0.0)
    assert not live.follows(0.0)
    live.beat(("a", "b"), None, 1.0)
    assert live.beat_at == 1.0 and live.leader_heard == {"a", "b"}
    assert live.follows(4.0) and not live.follows(4.01)
    live.beat(None, None, 2.0)
    assert live.leader_heard is None


def test_a_stalled_follower_recovers_with_a_beat_echoing_an_ack_sent_after_the_stall():
    live = Liveness("b", T, 0.0)
    assert (live.next_seq(), live.next_seq()) == (1, 2)
    live.observe(2.0)
    live.beat(IDS, 2, 2.0)  # echoes an ack from before the stall
    assert live.stalled
    live.beat(IDS, None, 2.1)
    assert live.stalled
    assert live.next_seq() == 3
    live.beat(IDS, 3, 2.2)
    assert not live.stalled


def test_in_contact():
    alone = Liveness("a", T, 0.0)
    alone.observe(5.0)
    assert alone.stalled and alone.in_contact(R1, LEADER, "a", 5.0)  # alone: always
    live = leader()
    assert not live.in_contact(R3, LEADER, "a", 0.0)  # no ack yet: me alone, quorum 2
    live.acked(("b", "ib"), live.next_round(0.5), None)
    assert live.in_contact(R3, LEADER, "a", 1.0)
    assert not live.in_contact(R3, LEADER, "a", 3.51)
    live.observe(3.4)
    assert live.stalled and live.in_contact(R3, LEADER, "a", 3.4) is False
    f = Liveness("b", T, 0.0)
    assert not f.in_contact(R3, FOLLOWER, "a", 0.0)  # no beat yet
    f.beat(None, None, 0.5)  # an older leader's heartbeat lists no one: trusted
    assert f.in_contact(R3, FOLLOWER, "a", 1.0)
    assert f.in_contact(R3, FOLLOWER, None, 1.0) is False
    assert f.in_contact(R3, CANDIDATE, "a", 1.0) is False
    assert f.in_contact(R3, JOINING, "a", 1.0) is False
    assert not f.in_contact(R3, FOLLOWER, "a", 3.51)
    f.beat(("a", "b"), None, 1.0)
    assert f.in_contact(R3, FOLLOWER, "a", 1.0)
    f.beat(("a", "x", "y"), None, 1.0)  # only the roster's ids count
    assert not f.in_contact(R3, FOLLOWER, "a", 1.0)


def test_reachable():
    live = leader()
    assert live.reachable(R3, LEADER, "a", 0.0) == {"a"}
    live.acked(("c", "ic"), live.next_round(0.5), None)
    assert live.reachable(R3, LEADER, "a", 1.0) == {"a", "c"}
    live.observe(3.0)
    assert live.reachable(R3, LEADER, "a", 3.0) == {"a"}  # stalled: only itself
    alone = Liveness("a", T, 0.0)
    alone.lead(("a",), 0.0)
    alone.observe(5.0)
    assert alone.reachable(R1, LEADER, "a", 5.0) == {"a"}
    f = Liveness("b", T, 0.0)
    f.beat(("a", "c", "x"), None, 1.0)
    assert f.reachable(R3, FOLLOWER, "a", 1.0) == {"a", "b", "c"}
    f.beat(None, None, 1.0)
    assert f.reachable(R3, FOLLOWER, "a", 1.0) == {"a", "b"}
    assert f.reachable(R3, FOLLOWER, "a", 4.01) == {"b"}
    assert f.reachable(R3, FOLLOWER, None, 1.0) == {"b"}
    assert f.reachable(R3, CANDIDATE, "a", 1.0) == {"b"}


def test_a_new_leadership_starts_with_no_evidence():
    live = leader()
    live.acked(("b", "ib"), live.next_round(0.0), None)
    live.lead(IDS, 1.0)  # leading again (a later term)
    assert live.contact == {} and live.hears(IDS, 1.0) == {"a"}
    assert not live.silent("b", 4.0) and live.silent("b", 4.01)  # counted from the new lead


def test_the_last_words_of_the_32_latest_removed_members_are_kept():
    """A removed member's last receipt stays for whoever shows it as down (silence()),
    for the 32 latest removed; one never heard from leaves none."""
    live = leader()
    for i in range(40):
        live.heard[f"m{i}"] = float(i)
        live.removed(f"m{i}")
    live.removed("never-heard")
    assert live.last_words == {f"m{i}": float(i) for i in range(8, 40)}
    assert not any(f"m{i}" in live.heard for i in range(40))
