"""What the cluster layer does with the messages it receives (cluster/layer.py
``_receive``): a JOIN's new roster is taken at once, not at the next tick; a STORE
refused at once is answered at once, a dropped one not at all; an ordered copy's ASK
while another task of its key comes first in our line hears ``wait``; and a rejoin's
walk stops waiting for a sibling that let a page's wait run out. A real Cluster on a
real journal in the test's tmp dir, its transport a recorder, its sends recorded; the
composed cluster is tests/sim/cluster_sim.py."""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any, Iterator

import gevent
import pytest

from miyamoto.cluster import layer
from miyamoto.cluster.layer import Cluster
from miyamoto.config import settings as config_mod
from miyamoto.engine.engine import Engine
from miyamoto.membership import messages as mm
from miyamoto.membership.roster import Member
from miyamoto.replicas import messages as rm
from miyamoto.replicas.effects import Send
from miyamoto.store.journal import Journal
from miyamoto.tasks.task import Task
from miyamoto.wire.transport import TransportStats
from miyamoto.wire.verbs import Verb

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0
KEY_B = "B" * 40  # b's own public key (Z85 length), as its connection authenticated it


class Transport:
    def __init__(self, node_id, bind, on_message, *, curve, boot, node_key):
        self.stats = TransportStats()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def send(self, *args, **kwargs) -> bool:
        return False

    def connect(self, address: str) -> bool:
        return True

    def forget(self, address: str) -> None:
        pass


@pytest.fixture
def made(tmp_path) -> Iterator[tuple[Cluster, list[tuple[str, Any, str | None]]]]:
    """A started Cluster "a" (no seeds: the leader of a roster of one), and what it sends."""
    cfg = config_mod.load(env={}, flags={"data_dir": str(tmp_path), "node": "a",
                                         "insecure_cluster": "true"})
    journal = Journal(str(tmp_path))
    journal.open()
    c = Cluster(cfg, journal, functools.partial(Engine, cfg, journal, None),
                clock=lambda: NOW, monotonic=lambda: 100.0, rng=random.Random(1),
                transport=Transport)
    sent: list[tuple[str, Any, str | None]] = []
    c.send = lambda to, msg, address=None, on_fail=None: sent.append((to, msg, address)) or True
    try:
        yield c, sent
    finally:
        c.stop()
        journal.close()


def _join(c: Cluster, name: str = "b", key: str = KEY_B) -> None:
    member = Member(name, f"tcp://127.0.0.1:7{ord(name) % 100:03d}", "127.0.0.1:8098", key=key)
    join = mm.Join(term=0, inc="inc-" + name, sender=member, boot=(), fresh=True)
    c._receive(name, Verb.JOIN, join.payload(), key)


def test_before_start_no_leader_no_term_and_no_ring(made):
    c, _ = made
    assert c.leader_view() == (None, 0, ())
    c.start()
    assert c.leader_view() == ("a", 1, ("a",))


def test_a_join_s_new_roster_is_taken_at_once_not_at_the_next_tick(made):
    c, _ = made
    c.start()
    assert c.roster.ids() == ("a",) and c.leader_changes == 0
    _join(c)  # no yield since: the tick loop has not run
    assert c.membership.roster.ids() == ("a", "b")
    assert c.roster.ids() == ("a", "b") and c.leader_changes == 1
    assert c.ring() == ("a", "b") and c.others() == ["b"]


def _store(c: Cluster, sender: str, key: str, task: Task) -> None:
    msg = rm.Store("r1", "tcp://127.0.0.1:7555", task.encode())
    c._receive(sender, Verb.STORE, msg.payload(), key)


def test_a_store_refused_at_once_is_answered_at_once_and_a_dropped_one_not_at_all(made):
    c, sent = made
    c.start()
    copy = Task(id="t1", queue="q", url="http://w.example/x", eta=NOW, created=NOW,
                fire_at=NOW, replicas=("x", "a"), replica=1)
    _store(c, "x", "key-x", copy)  # x is in no roster: its copies are not taken
    assert sent == [("x", rm.Stored("r1", "t1", False, error="not a member"),
                     "tcp://127.0.0.1:7555")]
    assert c.engine.get("t1") is None
    sent.clear()
    _store(c, "x", "key-x", dataclasses.replace(copy, replicas=("x", "y")))  # not ours
    assert sent == [] and c.engine.get("t1") is None


def _ordered(task_id: str, seq: int, **kw) -> Task:
    return Task(id=task_id, queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 30, ordering_key="k", ordering_seq=seq, **kw)


@pytest.mark.parametrize("held", [False, True], ids=["no-copy-yet", "copy-held"])
def test_an_ordered_ask_behind_another_task_of_its_key_hears_wait(made, held):
    c, sent = made
    c.start()
    _join(c)
    c.engine.add(_ordered("t1", 5, replicas=("a", "b"), replica=0), wait=True)
    if held:  # our copy of t2, whose first copy is b's
        c.engine.add(_ordered("t2", 6, replicas=("b", "a"), replica=1), wait=True)
    sent.clear()
    ask = rm.Ask("t2", 0, n=3, order=("q", "k", 6))
    c._receive("b", Verb.ASK, ask.payload(), KEY_B)
    answers = [(to, msg.verdict) for to, msg, _ in sent if isinstance(msg, rm.Answer)]
    assert answers == [("b", rm.WAIT)]  # t1 comes first here: b's line may lack it
    sent.clear()
    ahead = rm.Ask("t0", 0, n=4, order=("q", "k", 4))  # before t1: nothing holds it back
    c._receive("b", Verb.ASK, ahead.payload(), KEY_B)
    answers = [(to, msg.verdict) for to, msg, _ in sent if isinstance(msg, rm.Answer)]
    assert answers and answers[0][1] != rm.WAIT, answers


def test_a_sibling_that_let_a_page_s_wait_run_out_is_not_waited_for_again():
    s = layer._Settling()
    s.start(gevent.spawn(lambda: None))

    def page(task_id: str, n: int) -> list[Send]:
        return [Send(to, rm.Ask(task_id, 0, probe=True, n=n)) for to in ("b", "c")]

    gevent.spawn(s.answered, "c", "t1")  # c answers once the wait is under way; b never
    s.wait(page("t1", 1), 0.05)
    assert s.silent == {"b"} and s.waiting == {}
    gevent.spawn(s.answered, "c", "t2")
    with gevent.Timeout(5):  # the next page waits for c alone, who answers at once
        s.wait(page("t2", 2), 60.0)
    assert s.settled.is_set()


def test_every_task_message_type_has_a_handler(made):
    """The layer hands a decoded message to its type's handler: a message type
    registered for the wire but neither membership's nor handled would be dropped as
    "not a task message" (a new verb forgotten here)."""
    from miyamoto.wire import messages as wm
    c, _ = made
    for verb, decoder in wm._DECODERS.items():
        kind = decoder.__self__
        assert (verb in layer._MEMBERSHIP) != (kind in c._handlers), verb


def _stored(sent: list) -> bool:
    return any(isinstance(msg, rm.Stored) and msg.ok for _, msg, _ in sent)


def _until(condition, timeout: float) -> bool:
    """Whether ``condition()`` came true within ``timeout`` s (the hub runs meanwhile)."""
    with gevent.Timeout(timeout, False):
        while not condition():
            gevent.sleep(0.01)
        return True
    return False


def test_a_batchs_messages_are_each_taken_and_a_malformed_one_dropped_alone(made, caplog):
    c, sent = made
    c.start()
    _join(c)
    copy = Task(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 30, replicas=("b", "a"), replica=1)
    store = rm.Store("r1", "tcp://127.0.0.1:7555", copy.encode())
    ask = rm.Ask("t1", 0, n=3)
    batch = {"m": [["STORE", store.payload()], ["DONE", {"id": 5}], ["ASK", ask.payload()]]}
    c._receive("b", Verb.BATCH, batch, KEY_B)
    assert _until(lambda: _stored(sent), 5)  # the STORE's commit, then its STORED
    assert c.engine.get("t1") is not None
    assert any(isinstance(msg, rm.Answer) and msg.id == "t1" for _, msg, _ in sent)
    assert "dropped DONE from 'b'" in caplog.text
    sent.clear()
    c._receive("b", Verb.BATCH, batch, "another key")  # a holder of the join secret as b
    assert c.spoofed == 3
    assert not _until(lambda: sent, 0.5) and sent == []  # no STORED, no answer
