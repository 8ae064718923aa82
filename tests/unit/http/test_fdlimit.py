"""The open-file limit a node raises for its HTTP connections, and the connection cap
where the hard limit is still short; on a fake ``resource`` module, so no test changes
this process's limits, but for the last, which raises and restores its own."""

from __future__ import annotations

import resource

import pytest

from miyamoto.http import fdlimit

pytestmark = pytest.mark.timeout(10)

INF = -1


class Resource:
    """getrlimit/setrlimit over a (soft, hard) pair; ``refuse`` makes setrlimit fail."""
    RLIMIT_NOFILE = 7
    RLIM_INFINITY = INF

    def __init__(self, soft: int, hard: int, refuse: bool = False):
        self.limits = (soft, hard)
        self.refuse = refuse
        self.set: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == self.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == self.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed")
        self.set.append(limits)
        self.limits = limits


@pytest.fixture
def res(monkeypatch: pytest.MonkeyPatch):
    def make(soft: int, hard: int, refuse: bool = False) -> Resource:
        r = Resource(soft, hard, refuse)
        monkeypatch.setattr(fdlimit, "resource", r)
        return r
    return make


def test_a_soft_limit_high_enough_is_left_alone(res) -> None:
    r = res(4096, 8192)
    assert fdlimit.raise_nofile(4096) == 4096 and r.set == []
    r = res(INF, INF)
    assert fdlimit.raise_nofile(10**6) == INF and r.set == []


def test_a_low_soft_limit_is_raised_to_the_hard_one(res) -> None:
    r = res(1024, 8192)
    assert fdlimit.raise_nofile(1025) == 8192 and r.set == [(8192, 8192)]
    r = res(1024, INF)  # no hard limit: only as far as needed
    assert fdlimit.raise_nofile(5000) == 5000 and r.set == [(5000, INF)]


def test_a_refused_raise_keeps_the_soft_limit(res) -> None:
    res(1024, 8192, refuse=True)
    assert fdlimit.raise_nofile(5000) == 1024


def test_without_the_resource_module_the_need_is_taken_as_met(monkeypatch) -> None:
    monkeypatch.setattr(fdlimit, "resource", None)
    assert fdlimit.raise_nofile(5000) == 5000
    assert fdlimit.connection_cap(1000, 50) == 1000


def test_connections_are_capped_below_the_limit(res) -> None:
    res(1024, 8192)
    assert fdlimit.connection_cap(1000, 100) == 1000  # raised to 8192: room for all
    res(1024, 1024)
    assert fdlimit.connection_cap(1000, 100) == 1024 - 100 - fdlimit.RESERVE
    res(1024, 1024)  # a limit exactly big enough takes them all
    assert fdlimit.connection_cap(1024 - 100 - fdlimit.RESERVE, 100) == 1024 - 100 - fdlimit.RESERVE
    res(300, 300)  # never fewer than 16, however short the limit
    assert fdlimit.connection_cap(1000, 100) == 16
    res(300, 300)
    assert fdlimit.connection_cap(10, 100) == 10


def test_raise_nofile_in_process() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2048:
        pytest.skip("needs a finite hard limit of at least 2048")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert fdlimit.raise_nofile(2000) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
        assert fdlimit.connection_cap(hard + 10, other_fds=100) == hard - 100 - fdlimit.RESERVE
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_cap_is_said_once_with_the_numbers_and_no_cap_says_nothing(res, caplog) -> None:
    """256 descriptors are kept for the journal, the cluster and the logs."""
    res(1024, 1024)
    with caplog.at_level("WARNING", logger="miyamoto.http.fdlimit"):
        assert fdlimit.connection_cap(1000, 100) == 668
    assert [r.getMessage() for r in caplog.records] == [
        "max_connections 1000 does not fit the open-file limit 1024: serving at most "
        "668 HTTP connections"]
    caplog.clear()
    for soft, hard, wanted in ((1024, 1024, 668), (4096, 4096, 1000), (1024, 8192, 1000)):
        res(soft, hard)
        with caplog.at_level("WARNING", logger="miyamoto.http.fdlimit"):
            assert fdlimit.connection_cap(wanted, 100) == wanted
    assert caplog.records == []
