"""The roster (miyamoto.membership.roster, as the machine exports it): one incarnation per
member, and the empty roster."""

from __future__ import annotations

import pytest

from miyamoto.membership import machine as mb


def test_membership_roster_needs_one_incarnation_per_member():
    a, b = mb.Member("a", "tcp://127.0.0.1:1", "127.0.0.1:2"), \
        mb.Member("b", "tcp://127.0.0.1:3", "127.0.0.1:4")
    assert mb.Roster(1, 1, "a", (b, a), ("ib", "ia")).incarnations == ("ia", "ib")
    with pytest.raises(ValueError):
        mb.Roster(1, 1, "a", (a, b), ("ia",))
    assert mb.EMPTY.version == 0 and mb.EMPTY.term == 0 and mb.EMPTY.members == ()
