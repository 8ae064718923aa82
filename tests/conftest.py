"""Shared fixtures: a sink, fresh nodes on OS-assigned ports, and the logs of both on failure.

The tree: ``unit/<package>/`` tests one module in one process, ``sim/`` holds the pure
simulators (on ``sys.path`` here, so a machine's tests in ``unit/`` import theirs) and the
runs that only drive them, ``nodes/`` starts real node processes. The shared helpers stay
beside this file, which pytest puts on ``sys.path``.

Every process a test starts goes into its ``proc_registry`` and is killed (SIGKILL) in
the finalizer, whatever the outcome. When a test fails, the tail of each node's log is
added to the failure report.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

SIM = Path(__file__).resolve().parent / "sim"
if str(SIM) not in sys.path:
    sys.path.insert(0, str(SIM))

from helpers import CLUSTER_KEYS, NodeDied, NodeProcess, ProcessRegistry, Sink, write_ini  # noqa: E402
from harness.nodes import port_taken  # noqa: E402,I001  (helpers puts scripts/ on the path)

# Short cluster timings, so that a node (alone or not) is ready fast and replicas of a
# task do not wait 5 s for each other. Option names as in miyamoto/config/settings.py.
FAST_OPTIONS: dict[str, Any] = {
    "replica_offset": 1.0,
    "replication_timeout": 2.0,
    "heartbeat_interval": 0.1,
    "failure_timeout": 1.0,
    "election_timeout_min": 0.3,
    "election_timeout_max": 0.6,
    "shutdown_timeout": 5.0,
    "log_level": "info",
    # the cluster key pair (a cluster needs one); "" for both runs a node without it
    "curve_public": CLUSTER_KEYS[0],
    "curve_secret": CLUSTER_KEYS[1],
}

# Retries come fast: 0.05, 0.1, 0.2, 0.4, 0.5, 0.5 ... s.
FAST_QUEUES: dict[str, dict[str, Any]] = {
    "default": {"min_backoff": 0.05, "max_backoff": 0.5, "max_doublings": 3, "timeout": 5},
    "ratelimited": {"rate": 5, "burst": 1},
    "narrow": {"max_concurrent": 2},
    "patient": {"max_backoff": 5},  # a Retry-After of a few seconds is not capped
}


def write_node_config(path: Path, options: Mapping[str, Any] | None = None,
                      queues: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The test INI: FAST_OPTIONS and FAST_QUEUES, updated by ``options`` / ``queues``."""
    opts = dict(FAST_OPTIONS)
    opts.update(options or {})
    qs = copy.deepcopy(FAST_QUEUES)
    for name, values in (queues or {}).items():
        qs.setdefault(name, {}).update(values)
    sections: dict[str, Mapping[str, Any]] = {"miyamoto": opts}
    for name, values in qs.items():
        sections[f"queue:{name}"] = values
    return write_ini(path, sections)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile`` (pytest.ini) a file runs whole on one worker, so its
    module fixtures and the scenario reports some files keep per module
    (tests/nodes/test_partitions.py) are made once; but the simulators' tests are pure
    CPU and share nothing, and a file of long seeded runs queued on one worker kept the
    suite waiting for it. Each test under ``sim/`` is therefore a unit of its own.
    (xdist's own ``xdist_group`` does not work with pytest 9's node ids.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SimsOneByOne(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith("tests/sim/") else super()._split_scope(nodeid)

    return SimsOneByOne(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any):
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        registries = list(getattr(item, "_miyamoto_registries", []))
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, ProcessRegistry) and value not in registries:
                registries.append(value)
        seen: set[str] = set()
        for reg in registries:
            for title, text in reg.logs(tail=150):
                if title not in seen:
                    seen.add(title)
                    report.sections.append((title, text))


@pytest.fixture
def proc_registry(request: pytest.FixtureRequest) -> ProcessRegistry:
    reg = ProcessRegistry()
    regs = getattr(request.node, "_miyamoto_registries", [])
    regs.append(reg)
    request.node._miyamoto_registries = regs
    request.addfinalizer(reg.kill_all)
    return reg


@pytest.fixture
def sink(request: pytest.FixtureRequest) -> Sink:
    s = Sink().start()
    request.addfinalizer(s.stop)
    return s


@pytest.fixture
def node_factory(tmp_path: Path, proc_registry: ProcessRegistry) -> Callable[..., NodeProcess]:
    """``node_factory(node_id=None, *, options=None, queues=None, config=None, env=None,
    data_dir=None, seeds=(), extra_args=(), start=True, ready=True)`` -> NodeProcess.

    Without ``config`` it writes the fast test INI (FAST_OPTIONS / FAST_QUEUES updated by
    ``options`` and ``queues``). With ``start`` it starts the node, with ``ready`` it
    waits for /healthz and /readyz. The node is killed when the test ends.
    """
    counter = iter(range(1, 1000))

    def make(node_id: str | None = None, *, options: Mapping[str, Any] | None = None,
             queues: Mapping[str, Mapping[str, Any]] | None = None, config: str | None = None,
             env: Mapping[str, Any] | None = None, data_dir: str | None = None,
             seeds: tuple[str, ...] | list[str] = (), extra_args: tuple[str, ...] | list[str] = (),
             start: bool = True, ready: bool = True, ready_timeout: float = 15.0) -> NodeProcess:
        n = next(counter)
        node_id = node_id or f"node{n}"
        if config is None:
            config = write_node_config(tmp_path / f"{node_id}.ini", options, queues)
        proc = NodeProcess(tmp_path, node_id, config=config, env=env, data_dir=data_dir,
                           seeds=seeds, extra_args=extra_args, registry=proc_registry)
        if start:
            proc.start()
            if ready:
                proc.wait_ready(ready_timeout)
        return proc

    return make


@pytest.fixture
def node(node_factory: Callable[..., NodeProcess]) -> NodeProcess:
    """A fresh single node, started and ready, with the fast test INI."""
    return node_factory()


def replan(nodes: list[NodeProcess], tmp_path: Path, ids: list[str]) -> None:
    """Fresh ports for a planned cluster, in place (seeds follow)."""
    from helpers import plan_cluster

    for p, fresh in zip(nodes, plan_cluster(tmp_path, ids), strict=True):
        p.http_port, p.cluster_port, p.seeds = fresh.http_port, fresh.cluster_port, fresh.seeds


@pytest.fixture
def cluster_factory(tmp_path: Path, proc_registry: ProcessRegistry) -> Callable[..., list[NodeProcess]]:
    """``cluster_factory(n=3, *, ids=None, options=None, queues=None, start=True,
    converge=True)`` -> [NodeProcess]: ``n`` nodes on fresh ports, each seeded with all
    ``n`` cluster addresses (itself included, as in cluster.example.ini), each with the
    fast test INI. With ``start`` they are started together and waited for (/readyz);
    with ``converge`` until all agree on one leader and the full roster."""
    from helpers import plan_cluster, wait_converged

    made: list[str] = []

    def make(n: int = 3, *, ids: list[str] | None = None,
             options: Mapping[str, Any] | None = None,
             queues: Mapping[str, Mapping[str, Any]] | None = None,
             start: bool = True, converge: bool = True,
             timeout: float = 20.0) -> list[NodeProcess]:
        ids = list(ids) if ids is not None else [chr(ord("a") + i) for i in range(n)]
        assert len(ids) == n and not set(ids) & set(made), ids
        made.extend(ids)
        nodes = plan_cluster(tmp_path, ids, registry=proc_registry)
        for p in nodes:
            p.config = write_node_config(tmp_path / f"{p.node_id}.ini", options, queues)
        if start:
            for attempt in range(3):
                for p in nodes:
                    p.start()
                try:
                    for p in nodes:
                        p.wait_ready(timeout)
                    break
                except NodeDied:
                    # a port handed out by the OS was taken before a node bound it (a
                    # parallel test's connection): plan the cluster again on fresh ports
                    if attempt == 2 or not any(port_taken(p.log_text(20)) for p in nodes):
                        raise
                    for p in nodes:
                        p.kill()
                    replan(nodes, tmp_path, ids)
            if converge:
                wait_converged(nodes, timeout)
        return nodes

    return make
