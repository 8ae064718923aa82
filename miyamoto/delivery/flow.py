"""Flow-control keys: a rate and a concurrency shared by every task that names the key.

A task's ``flow_key`` (with ``flow_rate``, tasks/s, and ``flow_parallelism``, deliveries
in flight) ties it to tasks of any queue that name the same key, as QStash's flow
control does: the key is the downstream resource (a customer's API, a partner's quota)
rather than a queue. Across the cluster the limits are shared like a queue's rate
(``QueueState.set_share``): each node lets through ``rate / members`` tasks/s, and
``max(1, parallelism // members)`` deliveries at once; at least one per node, or a key
with parallelism 1 could never deliver on a node, so the cluster-wide concurrency is
at most ``max(parallelism, members)`` (exactly ``parallelism`` on one node).

The bucket holds one token (no burst): a key's rate is a spacing, so 20 tasks at 5/s
take ~4 s rather than a burst and then the rate. The **last** task seen for a key sets
its limits (a client that changes a key's rate is obeyed by its new tasks at once); a
task without limits of its own (``flow_key`` only) leaves the key's as they are.

Keys live in a bounded LRU (``MAX_FLOWS``); an idle key (nothing in flight) is evicted
first, and a key evicted while its tasks still wait is made again from their fields.
Pure: no clock (``now`` is passed in), no greenlet.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

from miyamoto.delivery.ratelimit import TokenBucket

MAX_FLOWS = 10_000
GATE_PREFIX = "flow:"  # a ready line's gate for a key (origins start with http)


class FlowSpec(NamedTuple):
    """What a task says about its key; carried with the task in its ready line."""

    key: str
    rate: float | None
    parallelism: int | None

    @property
    def gate(self) -> str:
        return GATE_PREFIX + self.key


class Flow:
    """One key's runtime: a token bucket, the deliveries in flight and the node's limit."""

    __slots__ = ("rate", "parallelism", "bucket", "inflight", "limit")

    def __init__(self, spec: FlowSpec, members: int, now: float):
        self.rate = spec.rate
        self.parallelism = spec.parallelism
        self.bucket = TokenBucket(0.0, 1, now)
        self.inflight = 0
        self.limit = 0
        self.share(members)

    def share(self, members: int) -> None:
        members = max(1, members)
        self.bucket.configure((self.rate or 0.0) / members, 1)  # rate 0: unlimited
        self.limit = max(1, self.parallelism // members) if self.parallelism else 0

    def blocked_until(self, now: float) -> float | None:
        """None if a delivery may start; else when to look again (``inf``: a slot frees)."""
        if self.limit and self.inflight >= self.limit:
            return float("inf")
        wait = self.bucket.wait_time(now)
        return None if wait <= 0 else now + wait


class FlowTable:
    """Every key's ``Flow``, bounded."""

    def __init__(self, size: int = MAX_FLOWS):
        self.size = max(1, size)
        self.members = 1
        self._flows: collections.OrderedDict[str, Flow] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._flows)

    def get(self, key: str) -> Flow | None:
        return self._flows.get(key)

    def configure(self, spec: FlowSpec, now: float) -> Flow:
        """The key's flow, made or refreshed; the spec's limits win when it has any."""
        f = self._flows.get(spec.key)
        if f is None:
            f = self._flows[spec.key] = Flow(spec, self.members, now)
            if len(self._flows) > self.size:
                self._evict()
        else:
            self._flows.move_to_end(spec.key)
            if (spec.rate or spec.parallelism) and \
                    (spec.rate, spec.parallelism) != (f.rate, f.parallelism):
                f.rate, f.parallelism = spec.rate, spec.parallelism
                f.share(self.members)
        return f

    def flow(self, spec: FlowSpec, now: float) -> Flow:
        """The key's flow for a dispatch (made from the spec if it was evicted)."""
        f = self._flows.get(spec.key)
        return f if f is not None else self.configure(spec, now)

    def set_share(self, members: int) -> None:
        self.members = max(1, members)
        for f in self._flows.values():
            f.share(self.members)

    def _evict(self) -> None:
        """Drop the least recently used idle key (a busy one is kept, over the bound,
        until it is idle: its in-flight count must be there when its deliveries end)."""
        for key, f in self._flows.items():
            if f.inflight == 0:
                del self._flows[key]
                return


def spec_of(task: Any) -> FlowSpec | None:
    """A task's flow key and limits, or None (``task`` is a ``task.Task``)."""
    key = task.flow_key
    return None if key is None else FlowSpec(key, task.flow_rate, task.flow_parallelism)
