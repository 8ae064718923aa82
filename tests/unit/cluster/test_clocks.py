"""Clocks that disagree: peers' offsets estimated from round trips, and when a peer's
clock counts as skewed. A node 30 s ahead under libfaketime, firing copies by its own
clock, is tests/nodes/test_clocks_node.py."""

from __future__ import annotations

import pytest

from miyamoto.cluster.clocks import Placement, PeerClocks


def test_offset_from_round_trips_takes_the_narrowest_sample():
    c = PeerClocks(max_skew=1.0)
    assert c.estimate("b", 100.0) is None and c.to_local("b", 150.0, 100.0) == 150.0
    # the peer is 30 s ahead; round trips of 0.2 s, 0.02 s and 2 s
    c.sample("b", 100.0, 130.1, 100.2)
    c.sample("b", 101.0, 131.01, 101.02)
    c.sample("b", 102.0, 133.0, 104.0)  # waited in a queue on the way back: 1 s off
    est = c.estimate("b", 104.0)
    assert est.offset == pytest.approx(30.0) and est.error == pytest.approx(0.01)
    assert c.to_local("b", 1000.0, 104.0) == pytest.approx(970.0)
    assert c.view("b", 104.0)["clock_skewed"] is True
    # crossing is reported once each way
    assert c.check("b", 104.0) == (True, est)
    assert c.check("b", 104.5) is None
    for i in range(8):  # the peer's clock is fixed: the old samples age out of the window
        c.sample("b", 110.0 + i, 110.0 + i + 0.3 + 0.01, 110.0 + i + 0.02)
    skewed, est2 = c.check("b", 120.0)
    assert skewed is False and est2.offset == pytest.approx(0.3)
    # an offset within its error, or under 50 ms, is not corrected: it would add noise
    d = PeerClocks(max_skew=1.0)
    d.sample("b", 100.0, 100.03, 100.002)
    assert d.to_local("b", 500.0, 100.1) == 500.0
    d.sample("b", 101.0, 101.3, 101.001)  # narrower: it wins
    assert d.to_local("b", 500.0, 101.1) == pytest.approx(499.7005)
    # answers that cannot be ours, and stale estimates, are not used
    assert c.sample("c", 200.0, 210.0, 199.0) is None
    assert c.sample("c", 200.0, 210.0, 200.0 + 61) is None
    c.sample("c", 200.0, 210.0, 200.1)
    assert c.estimate("c", 200.1 + 61) is None


def test_within_the_error_is_not_skew():
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 100.0, 101.4, 101.0)  # offset 0.9 ± 0.5
    assert c.check("b", 101.0) is None
    c.sample("b", 102.0, 104.7, 102.4)  # offset 2.5 ± 0.2: 2.3 > 1 even at best
    assert c.check("b", 103.0)[0] is True


def test_the_kept_estimate_goes_stale_and_a_wider_newer_one_takes_over():
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 100.0, 105.0, 100.02)   # +4.99 +- 0.01
    c.sample("b", 130.0, 135.5, 131.0)    # +5.0 +- 0.5, newer and wider
    assert c.estimate("b", 131.0).error == pytest.approx(0.01)  # read: kept
    assert c.estimate("b", 150.0).error == pytest.approx(0.01)
    # the narrow one is 60 s old at 160.03: the newer one is all that is left
    assert c.estimate("b", 160.1).error == pytest.approx(0.5)
    assert c.estimate("b", 191.1) is None  # both stale
    c.sample("b", 200.0, 205.0, 200.02)
    c.forget("b")
    assert c.estimate("b", 200.1) is None


def _probe(c: PeerClocks, peer: str, offset: float, at: float) -> None:
    """One answered probe, a 10 ms round trip, of a peer ``offset`` s from us."""
    c.sample(peer, at, at + 0.005 + offset, at + 0.01)


def _placings(clocks: dict[str, float]) -> dict:
    """Each member's placing, from one probe of every other member (``clocks``: each
    member's clock, in s from true time)."""
    out = {}
    for me, mine in clocks.items():
        c = PeerClocks(max_skew=1.0)
        for peer, theirs in clocks.items():
            if peer != me:
                _probe(c, peer, theirs - mine, 100.0)
        out[me] = c.place(list(clocks), me, 100.1)
    return out


def test_cluster_time_is_the_low_median_of_the_members_offsets():
    """A node 30 s ahead places itself 30 s off the cluster's clock; the others are
    placed at 0, however far the one runs. Every node picks the same clock."""
    clocks = {"a": 0.0, "b": 0.0, "fast": 30.0}
    offsets = {}
    for me, p in _placings(clocks).items():
        assert p.placed
        offsets[me] = p.offset
        assert p.skewed == (me == "fast")
    assert offsets == {"a": 0.0, "b": 0.0, "fast": pytest.approx(-30.0)}
    # four clocks 0, 0.5, 60, -8: each lands on the second lowest (0)
    four = {"a": 0.0, "b": 0.5, "c": 60.0, "d": -8.0}
    for me, p in _placings(four).items():
        assert four[me] + p.offset == pytest.approx(0.0) and p.skewed == (me in "cd")


def test_two_clocks_that_disagree_place_nobody_and_noise_is_not_an_offset():
    """Two clocks 8 s apart (a cluster of two, or two of three known at a start) have no
    majority clock: neither node guesses it is the one that is off. Within max_skew
    they agree on the slower."""
    a, b = PeerClocks(max_skew=1.0), PeerClocks(max_skew=1.0)
    _probe(a, "b", 8.0, 100.0)
    _probe(b, "a", -8.0, 100.0)
    for c, me in ((a, "a"), (b, "b")):
        assert c.place(["a", "b"], me, 100.1) == Placement(0.0, False, False)
        assert not c.place(["a", "b", "x"], me, 100.1).placed
    _probe(a, "x", 8.0, 100.0)  # the third clock sides with b: a is the one off
    p = a.place(["a", "b", "x"], "a", 100.1)
    assert p.placed and p.skewed and p.offset == pytest.approx(8.0)
    d, e = PeerClocks(max_skew=1.0), PeerClocks(max_skew=1.0)
    _probe(d, "e", 0.5, 100.0)
    _probe(e, "d", -0.5, 100.0)
    assert d.place(["d", "e"], "d", 100.1).offset == 0.0
    assert e.place(["d", "e"], "e", 100.1).offset == pytest.approx(-0.5)
    c = PeerClocks(max_skew=1.0)
    _probe(c, "b", 0.03, 100.0)  # under NEGLIGIBLE: one host's noise
    _probe(c, "d", 0.04, 100.0)
    assert c.place(["b", "c", "d"], "c", 100.1).offset == 0.0


def test_a_node_without_a_majority_of_estimates_is_not_placed():
    c = PeerClocks(max_skew=1.0)
    assert c.place([], "a", 0.0).placed and c.place(["a"], "a", 0.0).offset == 0.0
    members = ["a", "b", "c", "d", "e"]
    _probe(c, "b", 30.0, 100.0)
    p = c.place(members, "a", 100.1)  # ourselves and b: 2 of 5
    assert (p.placed, p.offset, p.skewed) == (False, 0.0, False)
    _probe(c, "c", 30.0, 100.0)
    p = c.place(members, "a", 100.1)  # 3 of 5: the median of 0, 30, 30 is 30
    assert p.placed and p.offset == pytest.approx(30.0) and p.skewed
    assert not c.place(members, "a", 100.1 + 61).placed  # every estimate went stale
    # half is no majority, even when the two clocks agree: 2 of 4
    d = PeerClocks(max_skew=1.0)
    _probe(d, "b", 0.5, 100.0)
    assert not d.place(["a", "b", "c", "d"], "a", 100.1).placed
    assert d.place(["a", "b", "c"], "a", 100.1).placed  # 2 of 3


def test_a_sample_is_used_for_sixty_seconds_inclusive():
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 99.5, 130.0, 100.0)  # +30.25 s (+- 0.25), read at 100
    assert c.estimate("b", 160.0).offset == pytest.approx(30.25)  # first read: 60 s old
    d = PeerClocks(max_skew=1.0)
    d.sample("b", 99.5, 130.0, 100.0)
    assert d.estimate("b", 160.5) is None  # older than 60 s: not used
    assert d.to_local("b", 1000.0, 160.5) == 1000.0


def test_every_set_time_is_corrected_even_one_just_past_the_epoch():
    """0 is a time not set and stays 0; any other is on the peer's clock, however early
    (a client's eta may be any unix time from 0 on: validate only refuses one below)."""
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 100.0, 130.1, 100.2)  # b is 30 s ahead
    assert c.to_local("b", 0.0, 100.2) == 0.0
    assert c.to_local("b", 0.5, 100.2) == pytest.approx(-29.5)
    assert c.to_local("b", 1.0, 100.2) == pytest.approx(-29.0)


def test_an_offset_exactly_its_error_is_not_corrected_and_a_bit_more_is():
    c = PeerClocks(max_skew=1.0)
    c.sample("b", 100.0, 101.0, 101.0)  # offset 0.5 +- 0.5: b may agree with us
    assert c.to_local("b", 500.0, 101.0) == 500.0
    c.sample("b", 102.0, 103.0, 102.75)  # offset 0.625 +- 0.375: narrower, beyond it
    assert c.to_local("b", 500.0, 103.0) == 499.375
