"""miyamoto.wire.freshness: the highest boot per sender, the last seq per connection."""

from __future__ import annotations

import pytest

from miyamoto.wire.freshness import STAMP_SIZE, Freshness, Verdict, read_stamp, stamp
from miyamoto.wire.verbs import DecodeError

A, B = ("a", "key-a"), ("a", "key-b")
C1, C2 = b"a\0conn-1", b"a\0conn-2"


@pytest.mark.timeout(10)
def test_growing_sequences_pass_and_anything_seen_or_older_does_not():
    f = Freshness()
    assert f.check(A, C1, 5, 1) is Verdict.FRESH
    assert f.check(A, C1, 5, 3) is Verdict.FRESH  # gaps are fine (a failed send)
    assert f.check(A, C1, 5, 3) is Verdict.OLD_SEQ
    assert f.check(A, C1, 5, 2) is Verdict.OLD_SEQ
    assert f.check(A, C1, 4, 99) is Verdict.EARLIER_BOOT
    assert f.last(C1) == (5, 3) and f.boot(A) == 5


@pytest.mark.timeout(10)
def test_a_new_boot_shuts_the_old_one_out_on_every_connection():
    f = Freshness()
    f.check(A, C1, 5, 1000)
    assert f.check(A, C2, 6, 1) is Verdict.FRESH  # restarted: a new connection
    assert f.check(A, C1, 5, 1001) is Verdict.EARLIER_BOOT  # the old one's, late
    assert f.check(A, C2, 6, 2) is Verdict.FRESH


@pytest.mark.timeout(10)
def test_two_connections_of_one_sender_interleave_freely():
    f = Freshness()
    assert f.check(A, C1, 5, 10) is Verdict.FRESH
    assert f.check(A, C2, 5, 7) is Verdict.FRESH  # sent earlier, on the slower one
    assert f.check(A, C1, 5, 11) is Verdict.FRESH


@pytest.mark.timeout(10)
def test_another_key_under_the_same_id_cannot_move_the_members_entry():
    f = Freshness()
    f.check(A, C1, 5, 10)
    assert f.check(B, C2, 2**63, 2**63) is Verdict.FRESH  # its own entry only
    assert f.check(A, C1, 5, 11) is Verdict.FRESH
    assert f.boot(A) == 5


@pytest.mark.timeout(10)
def test_memory_is_bounded_oldest_first():
    f = Freshness(max_senders=3)
    for i in range(5):
        f.check((f"n{i}", ""), b"c%d" % i, 1, 1)
    assert f.boot(("n0", "")) is None and f.last(b"c0") is None
    assert f.boot(("n4", "")) == 1 and f.last(b"c4") == (1, 1)
    f.check(("n4", ""), b"c4", 1, 2)  # a known sender evicts nobody
    assert f.boot(("n2", "")) == 1 and f.last(b"c2") == (1, 1)


@pytest.mark.timeout(10)
def test_the_stamp_is_sixteen_bytes_both_ways():
    raw = stamp(2**64 - 1, 0)
    assert len(raw) == STAMP_SIZE == 16 and read_stamp(raw) == (2**64 - 1, 0)
    for bad in (b"", raw[:15], raw + b"\0"):
        with pytest.raises(DecodeError):
            read_stamp(bad)


def test_at_most_max_senders_are_remembered_the_oldest_first_out() -> None:
    f = Freshness(max_senders=3)
    for i in range(4):
        assert f.check(("n", f"s{i}"), b"c%d" % i, 5, 1) is Verdict.FRESH
    assert f.boot(("n", "s0")) is None and f.last(b"c0") is None  # the oldest went
    assert [f.boot(("n", f"s{i}")) for i in (1, 2, 3)] == [5, 5, 5]
    assert [f.last(b"c%d" % i) for i in (1, 2, 3)] == [(5, 1)] * 3
