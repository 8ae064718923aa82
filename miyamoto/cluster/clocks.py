"""Peers' wall clocks, estimated from round trips (pure: every time is passed in).

Copies carry absolute times (a task's eta, a copy's fire time) and each node fires them
by its own clock; a peer whose clock runs 3 s ahead would fire what it was stored 3 s
early. So every node probes every member: CLOCK carries our wall time ``t1``; the peer
answers CLOCK_ECHO with ``t1`` and its own wall time ``t``; we read ours, ``t4``, on
arrival. As in NTP (with the peer's receive and send times taken as one):

    offset = t - (t1 + t4) / 2        (the peer's clock minus ours)
    error  = (t4 - t1) / 2            (the true offset is within offset ± error)

of the last ``SAMPLES`` probes the one with the smallest error wins (a sample that
waited in a queue has a wide round trip and says little). A copy stored from a peer has
its times moved into our clock with ``to_local``. An offset beyond ``max_skew`` (even
after taking the error off) is reported once by ``check`` (and once more when it is
back within), for both sides log it: each probes the other.

Absolute times a client gives (an ``eta``, a schedule's tick) are judged on cluster
time, not on our clock: ``place`` takes the low median of the members' offsets (ours
counted as 0) once a majority of the roster has a fresh estimate. The median, not the
mean: one clock 60 s off moves it not at all; the low one, so that every node picks the
same member's clock (with clocks c1 <= c2 <= ... each node's is c_k - c_own, k =
(n-1)//2). An even count whose two middle offsets are further apart than ``max_skew``
(two clocks of three known, or a cluster of two, that disagree) has no majority clock:
not placed, rather than one node guessing it is the one that is off. A node further
than ``max_skew`` from the cluster's clock is ``skewed``: it still corrects its times,
but does not lead (``membership.machine``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

SAMPLES = 8
STALE = 60.0  # seconds: an estimate older than this is not used
NEGLIGIBLE = 0.05  # seconds: an offset this small is not corrected (half the early bound)


@dataclass(frozen=True)
class Estimate:
    offset: float  # peer minus us, seconds
    error: float   # half the round trip
    at: float      # our wall time of the sample

    def skewed(self, max_skew: float) -> bool:
        return abs(self.offset) - self.error > max_skew


@dataclass(frozen=True)
class Placement:
    """Where our clock stands against the cluster's."""
    offset: float = 0.0    # cluster time minus our clock, seconds
    placed: bool = True    # a majority of the roster has a fresh estimate (else offset 0)
    skewed: bool = False   # placed, and further than max_skew from the cluster's clock


ALONE = Placement()


class PeerClocks:
    def __init__(self, max_skew: float):
        self.max_skew = max_skew
        self._samples: dict[str, collections.deque[Estimate]] = {}
        self._best: dict[str, Estimate] = {}  # the narrowest of the recent samples
        self._flagged: set[str] = set()

    def sample(self, peer: str, t1: float, t: float, t4: float) -> Estimate | None:
        """One CLOCK_ECHO: our send time ``t1`` (echoed), the peer's ``t``, our ``t4``."""
        if not t1 <= t4 or t4 - t1 > STALE:
            return None  # not our probe's answer, or one from before a jump of our clock
        est = Estimate(t - (t1 + t4) / 2, (t4 - t1) / 2, t4)
        self._samples.setdefault(peer, collections.deque(maxlen=SAMPLES)).append(est)
        self._best.pop(peer, None)  # chosen again at the next read
        return est

    def estimate(self, peer: str, now: float) -> Estimate | None:
        """The narrowest sample of the last ``SAMPLES`` that is not stale. Kept until a
        new sample or until it goes stale (every copy stored from a peer reads it; the
        samples newer than it cannot be stale before it is)."""
        best = self._best.get(peer)
        if best is not None and now - best.at <= STALE:
            return best
        samples = [e for e in self._samples.get(peer, ()) if now - e.at <= STALE]
        if not samples:
            self._best.pop(peer, None)
            return None
        best = self._best[peer] = min(samples, key=lambda e: e.error)
        return best

    def to_local(self, peer: str, t: float, now: float) -> float:
        """A time on ``peer``'s clock, on ours: ``t`` less ``shift`` (a time of 0 or less
        is a "not set", and stays)."""
        return t - self.shift(peer, now) if t > 0 else t

    def shift(self, peer: str, now: float) -> float:
        """What to take off a time on ``peer``'s clock to put it on ours: 0 while we know
        no offset, or the offset is within its own error or under ``NEGLIGIBLE``: clocks
        that agree (one host, or NTP) would only get the estimate's noise added to their
        copies."""
        est = self.estimate(peer, now)
        if est is None or abs(est.offset) <= max(est.error, NEGLIGIBLE):
            return 0.0
        return est.offset

    def check(self, peer: str, now: float) -> tuple[bool, Estimate] | None:
        """(skewed, estimate) when the peer just crossed ``max_skew`` either way."""
        est = self.estimate(peer, now)
        if est is None:
            return None
        skewed = est.skewed(self.max_skew)
        if skewed == (peer in self._flagged):
            return None
        (self._flagged.add if skewed else self._flagged.discard)(peer)
        return skewed, est

    def place(self, members: Sequence[str], me: str, now: float) -> Placement:
        """Our offset to the cluster's clock (see the module docstring): the low median
        of the members' offsets, ours 0; an offset within its error, or under
        ``NEGLIGIBLE``, counts as 0 (as in ``to_local``). Not placed while fewer than a
        majority of ``members`` (us included) have a fresh estimate, or while the known
        clocks split in two halves further than ``max_skew`` apart."""
        others = [p for p in members if p != me]
        if not others:
            return ALONE
        known = [(0.0, 0.0)]
        for p in others:
            est = self.estimate(p, now)
            if est is not None:
                small = abs(est.offset) <= max(est.error, NEGLIGIBLE)
                known.append((0.0 if small else est.offset, est.error))
        if 2 * len(known) <= len(others) + (me in members):
            return Placement(0.0, False, False)
        known.sort()
        mid = (len(known) - 1) // 2
        offset, error = known[mid]
        if len(known) % 2 == 0 and known[mid + 1][0] - offset > self.max_skew:
            return Placement(0.0, False, False)  # no majority agrees on a clock
        return Placement(offset, True, abs(offset) - error > self.max_skew)

    def forget(self, peer: str) -> None:
        self._samples.pop(peer, None)
        self._best.pop(peer, None)
        self._flagged.discard(peer)

    def view(self, peer: str, now: float) -> dict:
        est = self.estimate(peer, now)
        if est is None:
            return {"clock_offset": None, "clock_error": None, "clock_skewed": False}
        return {"clock_offset": round(est.offset, 4), "clock_error": round(est.error, 4),
                "clock_skewed": est.skewed(self.max_skew)}
