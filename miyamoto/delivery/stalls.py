"""This node's own stalls, as its deliveries see them: our pause is not the target's fault.

A SIGSTOP, a VM freeze or a starved loop holds every delivery in flight. When the node
runs again, the timeouts of those that ran past their deadline fire at once, and each
attempt ends with no HTTP answer. Counted against the target's breaker (``breaker``),
ten of them (the default ``breaker_failures``) open a healthy target's breaker, and its
tasks wait a cooldown for a fault that was ours. The task's own retry still counts the
attempt: its worker may or may not have run it.

A ticker tells ``Stalls`` the time every ``interval``; a gap beyond ``threshold``
between two ticks is a stall. ``spanned(began, now)`` says whether an attempt that ran
from ``began`` to ``now`` ran across one: the last stall ended after the attempt began,
or the ticker has not run for longer than ``threshold`` (the stall ends now: the
attempt's timeout fired before the ticker had its turn). A loop starved that long is a
stall too: its timeouts are as much ours. Pure: monotonic times are passed in.
"""

from __future__ import annotations

INTERVAL = 0.2  # seconds between the ticker's looks
THRESHOLD = 1.0  # a gap between two looks beyond this is a stall of ours


class Stalls:
    def __init__(self, now: float, threshold: float = THRESHOLD):
        self.threshold = threshold
        self.last = now  # the ticker's last look
        self.ended = float("-inf")  # when the last stall ended (the look after the gap)
        self.length = 0.0  # how long it was
        self.forgiven = 0  # failed attempts not counted against their targets

    def note(self, now: float) -> float:
        """The ticker's look; the length of the stall it ends, or 0.0."""
        gap = now - self.last
        self.last = max(self.last, now)
        if gap <= self.threshold:
            return 0.0
        self.ended, self.length = now, gap
        return gap

    def spanned(self, began: float, now: float) -> bool:
        """Whether an attempt from ``began`` to ``now`` ran across a stall of ours."""
        if now - self.last > self.threshold:  # one that ends now: note it here
            self.note(now)
        return self.ended >= began
