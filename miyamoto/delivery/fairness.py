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

A task may wait on other *gates* than a full target: an open circuit breaker
(``breaker``) or a full flow-control key (``flow``). The dispatcher's ``gate`` function
names what blocks a task; the line sets it aside per gate, the same way.

Priorities (0..9, higher first) with aging: a task's place is its *key*, the time it
joined the line minus ``AGING_SECONDS`` per priority level, and the line starts the
smallest key first (FIFO within a priority, where the keys follow arrival). So a task
of priority p goes ahead of every task that arrived before it with a priority below
p, and of those up to (p - q) * 10 s after it with priority q < p; but never of one
that arrived more than that before it. A priority-0 task is passed at most by what
arrives within 90 s after it: no starvation, bounded age. Aging as a static key, not
a rising effective priority, costs no clock at pick time and no re-sorting: the line
keeps one FIFO per priority (keys rise along each) and picks the smallest of the ten
heads, O(1); a gate's set-aside tasks are a heap by key, O(log n).
Nothing here has a clock, a socket or a greenlet: the dispatcher drives it.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import re
import sys
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from miyamoto.config.settings import QueueConfig

QUEUE_SHARE = 2  # a queue with max_concurrent = 0 may use 1/QUEUE_SHARE of the pool
PARK_BATCH = 1000  # tasks one look may set aside before the pump yields to other greenlets
AGING_SECONDS = 10.0  # a wait this long is worth one priority level
DEFAULT_PRIORITY = 5


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
    """Deliveries in flight per target, and the queues waiting for each gate (a full
    target, an open breaker, a full flow key)."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.busy: dict[str, int] = {}  # only targets with deliveries in flight
        self._waiting: dict[str, dict[str, None]] = {}  # gate -> queues (ordered set)

    def full(self, host: str) -> bool:
        return self.busy.get(host, 0) >= self.limit

    def gate(self, host: str, flow: Any) -> str | None:
        """What blocks a task for ``host``: the host if full (the dispatcher's gate adds
        breakers and flow keys)."""
        return host if self.busy.get(host, 0) >= self.limit else None

    def take(self, host: str) -> None:
        self.busy[host] = self.busy.get(host, 0) + 1

    def wait(self, queue: str, gate: str) -> None:
        """``queue`` has tasks set aside for ``gate``: tell it when the gate opens."""
        self._waiting.setdefault(gate, {})[queue] = None

    def release(self, host: str) -> Iterable[str]:
        """A delivery to ``host`` ended; return the queues to wake (each once)."""
        n = self.busy[host] - 1  # a release always follows a take
        if n > 0:
            self.busy[host] = n
        else:
            self.busy.pop(host, None)
        return self._waiting.pop(host, None) or ()

    def opened(self, gate: str) -> Iterable[str]:
        """``gate`` may let tasks through again (a timer, a flow slot): the queues to wake."""
        return self._waiting.pop(gate, None) or ()

    def waiting(self, host: str) -> list[str]:
        return list(self._waiting.get(host, ()))


Gate = Callable[[str, Any], "str | None"]  # (host, flow) -> the gate that blocks, or None
# a line's entry: (key, seq, task_id, host, flow); seq keeps equal keys FIFO
Entry = tuple[float, int, str, str, Any]


class ReadyLine:
    """A queue's due tasks: one FIFO per priority, plus the tasks set aside per gate.

    Invariant: every set-aside heap is either registered as waiting in ``HostSlots``
    or listed once in ``_woken`` (its gate opened since), never both. A task for a
    target (or flow key) that has set-aside tasks goes among them, never past them."""

    def __init__(self, name: str):
        self.name = name
        self._levels: dict[int, collections.deque[Entry]] = {}  # only non-empty ones
        self._aside: dict[str, list[Entry]] = {}  # gate -> heap by (key, seq)
        self._woken: collections.deque[str] = collections.deque()
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(x) for x in self._levels.values()) + sum(len(a) for a in self._aside.values())

    def append(self, task_id: str, host: str, priority: int = DEFAULT_PRIORITY,
               at: float = 0.0, flow: Any = None) -> None:
        """A due task; ``at``: when it became due (its key is ``at`` less its aging)."""
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = collections.deque()
        level.append((at - priority * AGING_SECONDS, next(self._seq), task_id, host, flow))

    def startable(self) -> bool:
        """Whether a look may find a task to start (set-aside tasks wait for a wake)."""
        return bool(self._levels or self._woken)

    def waiting_on(self) -> list[str]:
        """The gates this queue has tasks set aside for."""
        return list(self._aside)

    def wake(self, gate: str) -> None:
        """``gate`` opened: its set-aside tasks may go (HostSlots dropped our wait)."""
        if gate in self._aside:
            self._woken.append(gate)

    def take(self, hosts: HostSlots, gate: Gate | None = None) -> tuple[str, str] | None:
        """Remove and return the next task that may start now, as (task_id, host); None
        if none can (``pick`` gives the whole entry)."""
        entry = self.pick(hosts, gate)
        return None if entry is None else (entry[2], entry[3])

    def pick(self, hosts: HostSlots, gate: Gate | None = None) -> Entry | None:
        """Remove and return the entry of the next task that may start now, or None.

        The smallest key among the line's heads and the first woken gate's goes; tasks
        whose gate is closed are set aside on the way, at most ``PARK_BATCH`` per call
        (a 100,000-task line for one stuck target is moved over several pump passes)."""
        gate = gate or hosts.gate
        levels = self._levels
        for _ in range(PARK_BATCH):
            woken = self._woken_head(hosts, gate) if self._woken else None
            # one priority in use (the usual case): no comparison of heads
            best = next(iter(levels.items())) if len(levels) == 1 else self._best_level()
            if woken is None and best is None:
                return None
            if woken is not None and (best is None or self._aside[woken][0] <= best[1][0]):
                return self._pop_aside(woken)
            assert best is not None
            priority, level = best
            entry = level.popleft()
            if not level:
                del self._levels[priority]
            host, flow = entry[3], entry[4]
            if host in self._aside:  # among its target's earlier tasks, which wait already
                heapq.heappush(self._aside[host], entry)
            elif flow is not None and flow.gate in self._aside:
                heapq.heappush(self._aside[flow.gate], entry)
            else:
                blocked = gate(host, flow)
                if blocked is None:
                    return entry
                self._set_aside(blocked, entry, hosts)
        return None

    def _woken_head(self, hosts: HostSlots, gate: Gate) -> str | None:
        """The first woken gate whose next task may start, with the ones whose gate is
        still closed put back to wait; a head blocked by another gate moves there."""
        woken, aside_of = self._woken, self._aside
        while woken:
            g = woken[0]
            heap = aside_of[g]
            entry = heap[0]
            blocked = gate(entry[3], entry[4])
            if blocked is None:
                return g
            if blocked == g:
                woken.popleft()
                hosts.wait(self.name, g)
                continue
            heapq.heappop(heap)
            if not heap:
                del aside_of[g]
                woken.popleft()
            self._set_aside(blocked, entry, hosts)
        return None

    def _pop_aside(self, g: str) -> Entry:
        heap = self._aside[g]
        entry = heapq.heappop(heap)
        if not heap:
            del self._aside[g]
            self._woken.popleft()
        return entry

    def _set_aside(self, g: str, entry: Entry, hosts: HostSlots) -> None:
        heap = self._aside.get(g)
        if heap is None:
            self._aside[g] = [entry]
            hosts.wait(self.name, g)
        else:
            heapq.heappush(heap, entry)

    def _best_level(self) -> tuple[int, collections.deque[Entry]] | None:
        """The priority whose head has the smallest key, and its FIFO (ten at most)."""
        best = None
        for p, level in self._levels.items():
            if best is None or level[0] < best[1][0]:
                best = (p, level)
        return best
