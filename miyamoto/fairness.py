"""Fair delivery slots: per-target limits, and ready lines that a full target does not block.

Found by testing: one queue whose worker took 10 s held all 512 delivery slots, and
another queue's latency went from 3 ms to 13 s. Two limits keep a slow queue or a slow
target from taking every slot: a queue's own share of the pool (``queue_limit``), and
at most ``max_per_host`` deliveries in flight to one target (``HostSlots``).

A target is the URL's origin, ``scheme://host:port`` (``origin``): it is what the
delivery client keeps one keep-alive pool for, and two services on one machine (two
ports) are two targets that are slow or fast on their own. Spellings of one server
(``localhost`` and ``127.0.0.1``) count apart; the limit is for fairness, not a fence.

A task whose target is full must neither block its queue's tasks for other targets
(head-of-line blocking) nor spend an attempt or a token: ``ReadyLine`` sets it aside,
behind its target's earlier tasks (FIFO per queue and target), until the target frees
a slot. Each task is set aside at most once per wait, and a freed slot wakes only the
queues that wait for that target, so a dispatch costs O(1) however long the line is.
Nothing here has a clock, a socket or a greenlet: the dispatcher drives it.
"""

from __future__ import annotations

import collections
import functools
import re
import sys
from typing import Iterable
from urllib.parse import urlsplit

from miyamoto.config import QueueConfig

QUEUE_SHARE = 2  # a queue with max_concurrent = 0 may use 1/QUEUE_SHARE of the pool
PARK_BATCH = 1000  # tasks one look may set aside before the pump yields to other greenlets


def queue_limit(config: QueueConfig, concurrency: int) -> int:
    """The deliveries of a queue that may be in flight on this node.

    ``max_concurrent`` 0 (the default) is half the pool: one queue alone still fills
    the CPU (~0.6 ms per delivery, DESIGN) for targets that answer within ~150 ms,
    while at least half the pool stays free for the other queues whatever it does,
    and it takes two stuck queues, not one, to fill it. A value above the pool means
    "all of it": the pool bounds it anyway (the caller logs it)."""
    if config.max_concurrent <= 0:
        return max(1, concurrency // QUEUE_SHARE)
    return min(config.max_concurrent, concurrency)


_PREFIX = re.compile(r"[^/?#]*//[^/?#]*")  # scheme://netloc, as written


def origin(url: str) -> str:
    """``scheme://host:port`` of a target URL, lower case, default port made explicit.

    Every due task asks, so the answer is memoised by the URL's prefix (~0.4 us instead
    of urlsplit's ~2 us) and interned: a ready line holds one string per target."""
    m = _PREFIX.match(url)
    return _origin(m.group() if m else url)


@functools.lru_cache(maxsize=4096)
def _origin(prefix: str) -> str:
    try:
        parts = urlsplit(prefix)
        scheme = parts.scheme.lower()
        port = parts.port or (443 if scheme == "https" else 80)
        return sys.intern(f"{scheme}://{(parts.hostname or '').lower()}:{port}")
    except ValueError:  # a bad port: validated URLs have none, but never fail a delivery here
        return sys.intern(prefix.lower())


class HostSlots:
    """Deliveries in flight per target, and the queues waiting for each full one."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.busy: dict[str, int] = {}  # only targets with deliveries in flight
        self._waiting: dict[str, dict[str, None]] = {}  # target -> queues (ordered set)

    def full(self, host: str) -> bool:
        return self.busy.get(host, 0) >= self.limit

    def take(self, host: str) -> None:
        self.busy[host] = self.busy.get(host, 0) + 1

    def wait(self, queue: str, host: str) -> None:
        """``queue`` has tasks set aside for the full ``host``: tell it when a slot frees."""
        self._waiting.setdefault(host, {})[queue] = None

    def release(self, host: str) -> Iterable[str]:
        """A delivery to ``host`` ended; return the queues to wake (each once)."""
        n = self.busy[host] - 1  # a release always follows a take
        if n > 0:
            self.busy[host] = n
        else:
            self.busy.pop(host, None)
        return self._waiting.pop(host, None) or ()

    def waiting(self, host: str) -> list[str]:
        return list(self._waiting.get(host, ()))


class ReadyLine:
    """A queue's due tasks: one FIFO line, plus the tasks set aside per full target.

    Invariant: every set-aside line is either registered as waiting in ``HostSlots``
    or listed once in ``_woken`` (its target freed a slot since), never both. A task
    for a target that has set-aside tasks goes behind them, never past them."""

    def __init__(self, name: str):
        self.name = name
        self._line: collections.deque[tuple[str, str]] = collections.deque()
        self._aside: dict[str, collections.deque[str]] = {}
        self._woken: collections.deque[str] = collections.deque()

    def __len__(self) -> int:
        return len(self._line) + sum(len(a) for a in self._aside.values())

    def append(self, task_id: str, host: str) -> None:
        self._line.append((task_id, host))

    def startable(self) -> bool:
        """Whether a look may find a task to start (set-aside tasks wait for a wake)."""
        return bool(self._line or self._woken)

    def waiting_on(self) -> list[str]:
        """The targets this queue has tasks set aside for."""
        return list(self._aside)

    def wake(self, host: str) -> None:
        """``host`` freed a slot: its set-aside tasks may go (HostSlots dropped our wait)."""
        if host in self._aside:
            self._woken.append(host)

    def take(self, hosts: HostSlots) -> tuple[str, str] | None:
        """Remove and return the next task that may start now, as (task_id, host); None
        if none can.

        Woken set-aside tasks come first (they are the older); tasks whose target is
        full are set aside on the way, at most ``PARK_BATCH`` per call (a 100,000-task
        line for one stuck target is moved over several pump passes, not in one)."""
        busy, limit = hosts.busy, hosts.limit
        woken, aside_of = self._woken, self._aside
        while woken:
            host = woken[0]
            if busy.get(host, 0) < limit:
                aside = aside_of[host]
                task_id = aside.popleft()
                if not aside:
                    del aside_of[host]
                    woken.popleft()
                return task_id, host
            woken.popleft()
            hosts.wait(self.name, host)
        line = self._line
        moved = 0
        while line and moved < PARK_BATCH:
            item = line.popleft()
            task_id, host = item
            aside = aside_of.get(host)
            if aside is None:
                if busy.get(host, 0) < limit:
                    return item
                aside_of[host] = collections.deque((task_id,))
                hosts.wait(self.name, host)
            else:  # behind its target's earlier tasks, which wait already
                aside.append(task_id)
            moved += 1
        return None
