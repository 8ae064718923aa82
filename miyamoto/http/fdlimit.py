"""The open-file limit a node needs for its HTTP connections (RLIMIT_NOFILE).

Every HTTP connection is a file descriptor; so are deliveries in flight, the journal and
the cluster's sockets. A process that runs out gets EMFILE from accept(), which gevent
logs as a traceback on every attempt, so the node raises its soft limit as far as the
hard limit allows and, where that is still short, caps its connections below the limit
instead of failing at accept.
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # not on this platform: nothing to raise
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

RESERVE = 256  # descriptors beyond connections and deliveries: journal, cluster, logs


def raise_nofile(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit if it is below ``needed``; the
    soft limit in force afterwards (``needed`` where it cannot be read)."""
    if resource is None:
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, e)
        return soft
    log.info("open-file limit raised from %d to %d", soft, target)
    return target


def connection_cap(max_connections: int, other_fds: int) -> int:
    """``max_connections``, or fewer if the open-file limit cannot hold them besides
    ``other_fds`` descriptors (logged)."""
    limit = raise_nofile(max_connections + other_fds + RESERVE)
    cap = min(max_connections, max(16, limit - other_fds - RESERVE))
    if cap < max_connections:
        log.warning("max_connections %d does not fit the open-file limit %d: serving at "
                    "most %d HTTP connections", max_connections, limit, cap)
    return cap
