"""miyamoto.membership.bootstrap alone: the seed-set election of a joining node (who
counts as up, whose turn it is, the term it asks for, the first roster it wins)."""

from __future__ import annotations

import pytest

from miyamoto.membership.bootstrap import Bootstrap
from miyamoto.membership.roster import Member, Timing

T = Timing()  # election timeout 1.5-3 s, failure timeout 3 s
ADDR = {i: f"tcp://{i}:1" for i in "abcd"}
M = {i: Member(i, ADDR[i], f"{i}:2") for i in "abcd"}
BOOT = (ADDR["a"], ADDR["b"], ADDR["c"])


class Low:
    """The lowest timeout every time."""

    def uniform(self, lo: float, hi: float) -> float:
        return lo


def boot(me: str = "a", now: float = 0.0) -> Bootstrap:
    return Bootstrap(M[me], [ADDR["c"], "", ADDR["b"], ADDR["a"], ADDR["b"]], T, Low(), now)


def test_the_seed_set_is_the_seeds_and_me_sorted_without_blanks_or_repeats():
    b = boot()
    assert b.seeds == (ADDR["b"], ADDR["c"]) and b.boot == BOOT
    assert b.at == 1.5 and not b.running


def test_alone_a_fresh_seed_does_not_start_and_tries_again_a_timeout_later():
    b = boot()
    assert b.start(2.0, fresh=True, inc="ia", term=0) is None
    assert b.at == 3.5 and not b.running and b.unasked() == []


def test_a_majority_of_fresh_seeds_up_starts_an_election_above_every_term_heard():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 7, 0.0)
    assert b.start(1.0, fresh=True, inc="ia", term=3) == 8
    assert b.running and b.unasked() == [ADDR["b"], ADDR["c"]]
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 2, 0.0)
    assert b.start(1.0, fresh=True, inc="ia", term=3) == 4


def test_a_joiner_counts_for_a_failure_timeout_and_only_with_our_seed_set():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    assert b.start(3.0, True, "ia", 0) == 1  # heard exactly a failure timeout ago
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    assert b.start(3.01, True, "ia", 0) is None
    b = boot()
    b.heard_joiner(ADDR["b"], (ADDR["a"], ADDR["b"]), True, 0, 0.0)  # another seed set
    assert b.start(1.0, True, "ia", 0) is None
    b = boot()
    b.heard_joiner(ADDR["d"], BOOT, True, 0, 0.0)  # not a seed
    assert b.start(1.0, True, "ia", 0) is None


def test_restarted_seeds_start_only_when_every_seed_is_up():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, False, 0, 0.0)
    assert b.start(1.0, True, "ia", 0) is None  # one fresh of three, two up of three
    b.heard_joiner(ADDR["c"], BOOT, False, 0, 0.0)
    assert b.start(1.0, False, "ia", 0) == 1  # none fresh, but all three up


def test_news_of_a_leader_holds_off_a_bootstrap_for_a_failure_timeout():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 9.0)
    b.evidence(7.0)
    assert b.start(10.0, True, "ia", 0) is None
    assert not b.may_grant(BOOT, 10.0)
    b.evidence(7.0)
    assert b.start(10.01, True, "ia", 0) == 1
    b.evidence(20.0)
    b.forget_evidence()
    assert b.may_grant(BOOT, 20.0)


def test_may_grant_only_a_candidate_of_the_same_seed_set():
    b = boot()
    assert b.may_grant(BOOT, 0.0)
    assert not b.may_grant((ADDR["a"], ADDR["b"]), 0.0) and not b.may_grant(None, 0.0)
    b.evidence(1.0)
    assert not b.may_grant(BOOT, 4.0) and b.may_grant(BOOT, 4.01)


def test_seeds_take_turns_lowest_address_first():
    b = boot("c")
    b.heard_joiner(ADDR["a"], BOOT, True, 0, 0.0)
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    assert b.start(1.0, True, "ic", 0) is None  # c ranks third: two turns let pass
    assert b.start(1.0, True, "ic", 0) is None
    assert b.start(1.0, True, "ic", 0) == 1
    b.cancel()
    assert not b.running
    # its turn came: counting starts again, two turns let pass before the next
    assert b.start(1.0, True, "ic", 0) is None and b.start(1.0, True, "ic", 0) is None
    assert b.start(1.0, True, "ic", 0) == 1
    b.cancel()
    assert b.start(1.0, True, "ic", 0) is None
    b.granted(1.5)  # we backed another: our turn counts from zero, later
    assert b.at == 3.0
    assert b.start(1.5, True, "ic", 0) is None and b.start(1.5, True, "ic", 0) is None
    assert b.start(1.5, True, "ic", 0) == 1


def test_votes_win_the_first_roster_with_a_majority_of_the_seed_set_as_its_floor():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    assert b.vote(M["b"], "ib", True, 1) is None  # no election under way
    term = b.start(1.0, True, "ia", 0)
    assert b.vote(M["d"], "id", True, term) is None  # not a seed
    assert b.vote(Member("a", ADDR["b"], "x:2"), "ix", True, term) is None  # my id again
    assert b.running
    r = b.vote(M["b"], "ib", True, term)
    assert r is not None and not b.running
    assert (r.version, r.term, r.leader, r.ids()) == (1, term, "a", ("a", "b"))
    assert r.incarnations == ("ia", "ib") and r.quorum_floor == 2 and r.quorum() == 2


def test_a_vote_from_a_restarted_seed_wins_only_with_every_seed():
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    term = b.start(1.0, True, "ia", 0)
    assert b.vote(M["b"], "ib", False, term) is None  # one fresh of three
    assert b.unasked() == [ADDR["c"]]
    r = b.vote(M["c"], "ic", False, term)
    assert r is not None and r.ids() == ("a", "b", "c")


@pytest.mark.parametrize("call", ["restart", "cancel"])
def test_restart_and_cancel_end_the_election(call):
    b = boot()
    b.heard_joiner(ADDR["b"], BOOT, True, 0, 0.0)
    b.start(1.0, True, "ia", 0)
    if call == "restart":
        b.restart(5.0)
        assert b.at == 6.5
    else:
        b.cancel()
        assert b.at == 2.5
    assert not b.running and b.unasked() == []
