"""What a node logs about a join that does not happen (cluster/joinlog.py): a joiner's
silence, and another live node that uses our id or a live member's. Fake clock; the log
lines are what an operator reads. The real two-process clash is tests/nodes/."""

from __future__ import annotations

import logging

import pytest

from miyamoto.cluster.joinlog import MAX_CLASHES, JoinLog
from miyamoto.membership import messages as mm
from miyamoto.membership.roster import Member

pytestmark = pytest.mark.timeout(30)

SEEDS = ("tcp://127.0.0.1:6001", "tcp://127.0.0.1:6002")


def join(node: str, cluster: str, inc: str) -> mm.Join:
    return mm.Join(term=1, inc=inc, sender=Member(node, cluster, "127.0.0.1:8088"),
                   boot=SEEDS, fresh=True)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    got = [r.getMessage() for r in caplog.records
           if r.name == "miyamoto.cluster.joinlog" and r.levelno == level]
    caplog.clear()
    return got


@pytest.fixture
def caplog_on(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="miyamoto.cluster.joinlog")
    return caplog


def test_a_silent_join_warns_after_five_seconds_naming_the_seeds_then_every_five(caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    jl.tick(True, 104.9)
    assert lines(caplog_on, logging.WARNING) == []
    jl.tick(True, 105.0)
    (warning,) = lines(caplog_on, logging.WARNING)
    assert "no answer for 5 s" in warning and ", ".join(SEEDS) in warning
    jl.tick(True, 107.0)
    assert lines(caplog_on, logging.WARNING) == []  # once per five seconds
    jl.tick(True, 110.0)
    (again,) = lines(caplog_on, logging.WARNING)
    assert "no answer for 10 s" in again


def test_any_membership_message_ends_the_silence_and_so_does_joining(caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    jl.heard("b", join("b", "tcp://127.0.0.1:6001", "b1"), "a1", 104.0)
    jl.tick(True, 108.0)
    assert lines(caplog_on, logging.WARNING) == []  # 4 s since b spoke
    jl.tick(True, 109.0)
    assert len(lines(caplog_on, logging.WARNING)) == 1
    # a member (not joining) that hears nothing does not warn about joining
    member = JoinLog("a", SEEDS, now=100.0)
    member.tick(False, 200.0)
    assert lines(caplog_on, logging.WARNING) == []
    # nor does a first node that has no seeds to join
    alone = JoinLog("a", (), now=100.0)
    alone.tick(True, 200.0)
    assert lines(caplog_on, logging.WARNING) == []


def test_a_message_in_our_own_id_from_another_incarnation_is_an_error_naming_its_address(
        caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    jl.heard("a", join("a", "tcp://10.0.0.9:6000", "a1"), "a1", 100.0)  # our own echo
    assert lines(caplog_on, logging.ERROR) == []
    jl.heard("a", join("a", "tcp://10.0.0.9:6000", "x7"), "a1", 100.0)
    (error,) = lines(caplog_on, logging.ERROR)
    assert "tcp://10.0.0.9:6000" in error and "this node's id 'a'" in error
    # a message in our id is no answer from the cluster: the join is still silent
    jl.tick(True, 105.0)
    assert len(lines(caplog_on, logging.WARNING)) == 1


def test_a_clash_is_logged_once_per_address_every_ten_seconds(caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    other = join("a", "tcp://10.0.0.9:6000", "x7")
    jl.heard("a", other, "a1", 100.0)
    assert len(lines(caplog_on, logging.ERROR)) == 1
    jl.heard("a", other, "a1", 109.9)
    assert lines(caplog_on, logging.ERROR) == []
    jl.heard("a", join("a", "tcp://10.0.0.8:6000", "y1"), "a1", 101.0)  # another address
    assert len(lines(caplog_on, logging.ERROR)) == 1
    jl.heard("a", other, "a1", 110.0)  # ten seconds on
    assert len(lines(caplog_on, logging.ERROR)) == 1


def test_a_join_that_takes_a_live_members_id_is_an_error_naming_both(caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    live = Member("b", "tcp://127.0.0.1:6002", "127.0.0.1:8090")
    jl.heard("b", join("b", "tcp://10.0.0.7:6000", "b9"), "a1", 100.0, namesake=live)
    (error,) = lines(caplog_on, logging.ERROR)
    assert "tcp://10.0.0.7:6000" in error
    assert "the id 'b' of the live member at tcp://127.0.0.1:6002" in error
    # a peer's ordinary message is no clash
    jl.heard("b", join("b", "tcp://127.0.0.1:6002", "b1"), "a1", 100.0)
    assert lines(caplog_on, logging.ERROR) == []


def test_the_rate_limit_remembers_a_bounded_number_of_addresses(caplog_on):
    jl = JoinLog("a", SEEDS, now=100.0)
    first = join("a", "tcp://10.0.1.0:6000", "x")
    jl.heard("a", first, "a1", 100.0)
    for i in range(1, MAX_CLASHES):
        jl.heard("a", join("a", f"tcp://10.0.1.{i}:6000", "x"), "a1", 100.0)
    assert len(lines(caplog_on, logging.ERROR)) == MAX_CLASHES
    jl.heard("a", first, "a1", 101.0)  # still remembered: quiet
    assert lines(caplog_on, logging.ERROR) == []
    # one more address fills the table: it starts afresh, so the first is logged again
    jl.heard("a", join("a", "tcp://10.0.2.0:6000", "x"), "a1", 101.0)
    jl.heard("a", first, "a1", 101.0)
    assert len(lines(caplog_on, logging.ERROR)) == 2
