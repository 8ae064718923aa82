"""What a node process costs: RSS and CPU from /proc, journal bytes on disk, the load.

Linux only, plain stdlib; every reader returns None when the process or file is gone.
"""

from __future__ import annotations

import os
import resource
from typing import Any, Sequence


def proc_status_kb(pid: int | None, key: str) -> int | None:
    """A `VmXXX:` value (kB) from /proc/<pid>/status."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


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

