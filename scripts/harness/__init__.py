"""The one harness that starts Miyamoto nodes and sinks, for tests and scripts alike.

Why here: ``tests/`` imports it (``tests/helpers.py`` puts ``scripts/`` on ``sys.path``
and re-exports these names), and so do ``scripts/bench.py``, ``failover.py`` and
``chaos.py``, which are run from a checkout and already import their neighbours this way.
It is not under ``miyamoto/`` because the server must not ship its own test rig, and not
under ``tests/`` because the scripts are tools of their own, not tests.

Plain stdlib, threads and ``requests``, no gevent and no monkey-patching, so it runs the
same in pytest and under a script's ``monkey.patch_all()``. The one gevent piece,
``harness.fastsink`` (a counting sink fast enough for the benchmark), is imported only
by the programs that use it.

- ``waits``: ``wait_until``, ``free_ports``, ``HarnessError``/``NodeDied``
- ``nodes``: ``NodeProcess`` (start, kill -9, SIGSTOP/SIGCONT, restart), ``plan_cluster``,
  ``stop_all``, ``ProcessRegistry``, ``run_cli``, ``write_ini``
- ``views``: GET /cluster and /metrics, ``wait_converged``
- ``sink``: the scriptable recording sink (threads); ``fastsink``: the counting one (gevent)
- ``traffic``/``chaos``: a paced enqueue stream and the pause / kill -9 scenarios
- ``netns``: hosts in network namespaces whose links can be cut, split and healed (root);
  ``partition``: the partition scenarios on them (imported by their users only)
"""

from .nodes import (CLUSTER_KEYS, PROGRAM, REPO, NodeProcess, ProcessRegistry, child_env, plan_cluster, run_cli,
                    stop_all, write_ini)
from .sink import Reply, Request, Sink
from .views import (cluster_view, http_get, http_get_json, is_counter, member_ids, metrics,
                    parse_metrics, probe_view, server_metrics, wait_converged)
from .waits import (LOCALHOST, HarnessError, NodeDied, free_port, free_ports, port_refuses,
                    wait_until)

__all__ = [
    "CLUSTER_KEYS", "LOCALHOST", "PROGRAM", "REPO", "HarnessError", "NodeDied", "NodeProcess", "ProcessRegistry",
    "Reply", "Request", "Sink", "child_env", "cluster_view", "free_port", "free_ports",
    "http_get", "http_get_json", "is_counter", "member_ids", "metrics", "parse_metrics", "plan_cluster", "port_refuses",
    "probe_view", "run_cli", "server_metrics", "stop_all", "wait_converged", "wait_until",
    "write_ini",
]
