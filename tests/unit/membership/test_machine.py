"""miyamoto.membership.machine: rules at their edges (the rule tests and the simulators are
in test_membership.py, whose helpers these use)."""

from __future__ import annotations

import pytest

from test_membership import T, cluster_of, tick, verbs
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
