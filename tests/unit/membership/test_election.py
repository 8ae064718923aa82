"""miyamoto.membership.election alone: a node's election timers and the votes of the
round under way (pre-vote, then vote)."""

from __future__ import annotations

import random

from miyamoto.membership.election import Campaign
from miyamoto.membership.roster import Member, Timing

M = [Member(i, f"tcp://{i}:1", f"{i}:2") for i in "abc"]


def test_the_timeout_is_drawn_between_the_bounds_from_now():
    c = Campaign(Timing(election_timeout_min=1.5, election_timeout_max=3.0), random.Random(1))
    assert c.timeout_at == c.resend_at == float("inf") and not c.transfer and not c.pre
    drawn = set()
    for _ in range(200):
        c.reset_timeout(10.0)
        assert 11.5 <= c.timeout_at <= 13.0
        drawn.add(round(c.timeout_at, 1))
    assert len(drawn) > 5  # random, to keep candidates apart
    fixed = Campaign(Timing(election_timeout_min=2.0, election_timeout_max=2.0), random.Random(1))
    fixed.reset_timeout(1.0)
    assert fixed.timeout_at == 3.0


def test_a_pre_vote_then_a_vote_each_count_their_own_round():
    c = Campaign(Timing(), random.Random(1))
    assert c.unasked(M) == M
    c.start_pre("a")
    assert c.pre and c.unasked(M) == M[1:]
    assert c.add("b", pre=True) == 2 and c.add("b", pre=True) == 2
    assert c.unasked(M) == [M[2]]
    assert c.start("a", transfer=True) == 1
    assert not c.pre and c.transfer and c.unasked(M) == M[1:]  # the pre-votes do not carry
    assert c.add("c", pre=False) == 2 and c.unasked(M) == [M[1]]
    assert c.start("a", transfer=False) == 1 and not c.transfer


def test_drop_pre_and_clear():
    c = Campaign(Timing(), random.Random(1))
    c.start("a", False)
    c.add("b", False)
    c.start_pre("a")
    c.drop_pre()
    assert not c.pre and c.unasked(M) == [M[2]]  # the vote round's count is back in view
    c.clear()
    assert not c.pre and c.unasked(M) == M
    c.start_pre("a")
    c.clear()
    assert not c.pre
