"""What the cluster layer does with a new roster (cluster/layer.py ``_roster_changed``):
it shares each queue's rate among the members, and keeps hearing the members that left
(their HANDOFF or DONE may trail the roster without them), the latest MAX_FORMER of them;
and what it does with the siblings' plan to restore a task's lost copies (``_restore``).
A real Cluster on a real journal in the test's tmp dir, its transport a recorder, the
rosters handed in as membership would; the composed cluster is tests/sim/cluster_sim.py."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from miyamoto.cluster import layer
from miyamoto.cluster.layer import Cluster
from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.membership.roster import Member, Roster
from miyamoto.replicas.effects import Restore
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task
from miyamoto.wire.transport import TransportStats
from miyamoto.wire.verbs import Verb

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class Transport:
    """Records the addresses the layer connects to and forgets."""

    def __init__(self, node_id, bind, on_message, *, curve, boot, node_key):
        self.stats = TransportStats()
        self.connected: list[str] = []
        self.forgotten: list[str] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def send(self, *args, **kwargs) -> bool:
        return False

    def connect(self, address: str) -> bool:
        self.connected.append(address)
        return True

    def forget(self, address: str) -> None:
        self.forgotten.append(address)


def _member(name: str) -> Member:
    return Member(name, f"tcp://127.0.0.1:7{ord(name[0]) % 100:03d}", f"127.0.0.1:8{ord(name[0]) % 100:03d}",
                  key=f"key-{name}")


def _roster(version: int, *names: str) -> Roster:
    return Roster(version, 1, "a", tuple(_member(n) for n in ("a", *names)))


@pytest.fixture
def cluster(tmp_path):
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path), "node": "a",
                                         "insecure_cluster": "true"})
    journal = Journal(str(tmp_path))
    journal.open()
    c = Cluster(cfg, journal, functools.partial(Engine, cfg, journal, None),
                clock=lambda: NOW, monotonic=lambda: 100.0, rng=random.Random(1),
                transport=Transport)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        journal.close()


def _heard(c: Cluster, sender: str) -> bool:
    """Whether a task message from ``sender`` (with its own key) is acted on, not dropped
    as a stranger's."""
    before = c.strangers
    c._receive(sender, Verb.DONE, {}, f"key-{sender}")  # (a bad payload: a logged drop)
    return c.strangers == before


def test_a_queue_rate_is_shared_among_the_roster_members(cluster):
    q = cluster.engine.dispatcher.queue("q")
    cluster._roster_changed(_roster(2, "b", "c"))
    q.config = dataclasses.replace(q.config, rate=30.0)
    cluster._roster_changed(_roster(3, "b", "c"))
    assert q.bucket.rate == pytest.approx(10.0)  # 30/s for the cluster: 10/s on each of 3
    cluster._roster_changed(_roster(4, "b"))
    assert q.bucket.rate == pytest.approx(15.0)


def test_members_that_left_stay_heard_and_strangers_do_not(cluster):
    cluster._roster_changed(_roster(2, "b", "c"))
    assert _heard(cluster, "b") and _heard(cluster, "c")
    assert not _heard(cluster, "x")
    cluster._roster_changed(_roster(3, "c"))  # b left: its trailing messages still count
    assert _heard(cluster, "b")
    assert "tcp://127.0.0.1:7098" in cluster.transport.forgotten


def test_only_the_latest_max_former_departed_members_stay_heard(cluster, monkeypatch):
    monkeypatch.setattr(layer, "MAX_FORMER", 2)
    cluster._roster_changed(_roster(2, "b", "c", "d", "e"))
    for version, left in enumerate(("b", "c", "d"), start=3):  # they leave one by one
        rest = [n for n in ("b", "c", "d", "e") if n > left]
        cluster._roster_changed(_roster(version, *rest))
    assert not _heard(cluster, "b")  # the oldest departure is forgotten
    assert _heard(cluster, "c") and _heard(cluster, "d") and _heard(cluster, "e")


def _copy(**kw) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 30, replicas=("a", "b"), replica=0)
    base.update(kw)
    return Task(**base)


def test_a_restore_stores_the_new_copies_of_a_live_task_only(cluster, monkeypatch):
    stored: list[list[Task]] = []
    monkeypatch.setattr(cluster.coordinator, "store",
                        lambda copies, hold=False: stored.append(copies) or copies)
    cluster.engine.add(_copy(), wait=True)
    new = _copy(replica=1, replicas=("a", "c"))
    cluster._restore(Restore("t1", ("a", "c"), (new,)))
    assert stored == [[new]]  # the live task's new copy goes to its new holder
    cluster._restore(Restore("t9", ("a", "c"), (_copy(id="t9", replica=1),)))
    assert len(stored) == 1  # no copy here: nothing to restore
    cluster.engine.cancel("t1")
    cluster._restore(Restore("t1", ("a", "c"), (new,)))
    assert len(stored) == 1  # ended meanwhile: its copies are not made again


def test_no_task_may_target_a_member_s_api_or_cluster_port() -> None:
    members = [Member("a", "tcp://127.0.0.1:7001", "127.0.0.1:8001"),
               Member("b", "tcp://[::1]:7002", "[::1]:8002"),
               Member("c", "tcp://:7003", "no-port:http")]  # unusable: left out
    assert layer._endpoints(members) == [("127.0.0.1", 8001), ("127.0.0.1", 7001),
                                         ("::1", 8002), ("::1", 7002)]
