"""A node without the cluster key is a cluster of one (cluster/layer.py): it binds no
cluster port and never starts its transport; ``insecure_cluster`` is the explicit way
to peers without one. A real Cluster on a real journal in the test's tmp dir, its
transport a recorder; the composed cluster under faults is tests/sim/cluster_sim.py."""

from __future__ import annotations

import functools
import random

import pytest

from miyamoto.cluster.layer import Cluster
from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.store.journal import Journal
from miyamoto.wire.transport import TransportStats

pytestmark = pytest.mark.timeout(30)


class Transport:
    """Records whether the layer started it."""

    def __init__(self, node_id, bind, on_message, *, curve, boot, node_key):
        self.started = False
        self.boot = boot
        self.stats = TransportStats()

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        pass

    def send(self, *args, **kwargs) -> bool:
        return False

    @property
    def running(self) -> bool:
        return self.started

    @property
    def address(self) -> str:
        return "tcp://127.0.0.1:6000"


def _cluster(tmp_path, **flags) -> tuple[Cluster, Journal]:
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path), "node": "a", **flags})
    journal = Journal(str(tmp_path))
    journal.open()
    made = Cluster(cfg, journal, functools.partial(Engine, cfg, journal, None),
                   clock=lambda: 1_000_000.0, monotonic=lambda: 100.0, rng=random.Random(1),
                   transport=Transport)
    return made, journal


@pytest.mark.parametrize("flags, solo", [({}, True), ({"insecure_cluster": "true"}, False)])
def test_without_a_cluster_key_a_node_is_a_cluster_of_one(tmp_path, flags, solo):
    c, journal = _cluster(tmp_path, **flags)
    try:
        assert c.solo is solo
        c.start()
        assert c.transport.started is not solo  # a cluster of one binds no cluster port
        assert (c.transport.boot is None) is solo  # nor keeps an incarnation for peers
    finally:
        c.stop()
        journal.close()
