"""What a node process costs: RSS and CPU from /proc, journal bytes on disk, the load.

Linux only, plain stdlib; every reader returns None when the process or file is gone.
"""

from __future__ import annotations

import os
import resource
from typing import Any, Sequence


def proc_status(pid: int | None, *keys: str) -> dict[str, int] | None:
    """The integer values of ``keys`` in /proc/<pid>/status (a ``VmXXX`` in kB, a count);
    None if the process is gone or one of them is missing."""
    if pid is None:
        return None
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in keys:
                    values[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return values if len(values) == len(keys) else None


def proc_status_kb(pid: int | None, key: str) -> int | None:
    """A `VmXXX:` value (kB) from /proc/<pid>/status."""
    values = proc_status(pid, key)
    return None if values is None else values[key]


def dir_bytes(path: str | None) -> int | None:
    """Total size of the files under `path` (None for no data dir)."""
    if not path or path == ":memory:":
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def loadavg() -> float | None:
    """The box's 1-minute load average: other work on it skews every number."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


def proc_cpu_s(pid: int | None) -> float | None:
    """utime + stime of a process, seconds (/proc/<pid>/stat)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_switches(pid: int | None) -> tuple[int, int] | None:
    """(voluntary, involuntary) context switches of a process's main thread, a node's
    hub: each voluntary one is a sleep it was woken from, each involuntary one a
    preemption by another runnable process on its core (/proc/<pid>/status)."""
    values = proc_status(pid, "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
    if values is None:
        return None
    return values["voluntary_ctxt_switches"], values["nonvoluntary_ctxt_switches"]


def switch_snapshot(nodes: Sequence[Any]) -> dict[str, tuple[int, int] | None]:
    """Each node's hub's context switches so far (``proc_switches``)."""
    return {n.node_id: proc_switches(n.pid) for n in nodes}


def switch_delta(before: dict[str, tuple[int, int] | None],
                 after: dict[str, tuple[int, int] | None]) -> dict[str, dict[str, int]] | None:
    """Each node's wakes and preemptions between two snapshots; None if one is unread
    (--server: a process not ours). On a box with fewer cores than processes the
    preemptions, and the cold caches every wake starts with, are co-location's cost."""
    out: dict[str, dict[str, int]] = {}
    for key, end in after.items():
        start = before.get(key)
        if start is None or end is None:
            return None
        out[key] = {"woke": end[0] - start[0], "preempted": end[1] - start[1]}
    return out


def cpu_snapshot(nodes: Sequence[Any]) -> dict[str, float | None]:
    """CPU seconds used so far by the bench itself and by each node."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    snap: dict[str, float | None] = {"bench": usage.ru_utime + usage.ru_stime}
    snap.update({n.node_id: proc_cpu_s(n.pid) for n in nodes})
    return snap


def cpu_delta(before: dict[str, float | None],
              after: dict[str, float | None]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, end in after.items():
        start = before.get(key)
        out[key] = None if start is None or end is None else round(end - start, 2)
    return out

