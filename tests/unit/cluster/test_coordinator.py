"""Storing copies (cluster/coordinator.py) between two nodes in one process: each a real
engine on an in-memory journal and its coordinator, their STORE/STORED carried by a
send that hands each STORE straight to the other node's coordinator. The roster, the
contact check and the clocks are a stand-in for the cluster layer (``Members``); the
whole composed layer under faults is tests/sim/cluster_sim.py."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from typing import Iterator

import pytest

from enginekit import memory_engine
from miyamoto.cluster.coordinator import Coordinator
from miyamoto.cluster.requests import Requests
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.replicas import messages as m
from miyamoto.replicas import placement as replication
from miyamoto.tasks.task import State, Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class Members:
    """The cluster layer as the coordinator sees it."""

    def __init__(self, ring: tuple[str, ...], offset: float = 0.0):
        self._ring = ring
        self.zones: dict[str, str] = {}
        self.offset = offset  # every peer's clock is this far ahead of ours
        self.replayed: list[str] = []
        self.sent: list[tuple[str, object]] = []

    def ring(self) -> tuple[str, ...]:
        return self._ring

    def send(self, member_id: str, msg: object) -> bool:
        self.sent.append((member_id, msg))
        return True

    def await_contact(self, timeout: float) -> bool:
        return True

    def replay(self, task_id: str) -> None:
        self.replayed.append(task_id)

    def fold(self, copy: Task) -> tuple[int, float]:
        return (0, 0.0)

    def clock_shift(self, peer: str) -> float:
        return self.offset


class Node:
    def __init__(self, me: str, stack: ExitStack, ring: tuple[str, ...], **flags):
        self.me = me
        self.engine, self.clock = stack.enter_context(memory_engine(NOW, node=me, **flags))
        self.members = Members(ring)
        self.peers: dict[str, Node] = {}
        self.requests = Requests(self._send, reply_to=me)
        self.coordinator = Coordinator(self.engine.config, self.engine, self.requests,
                                       self.members, cursor=0)

    def _send(self, member_id: str, msg: object, *, on_fail) -> bool:
        peer = self.peers.get(member_id)
        if peer is None:
            return False
        assert isinstance(msg, m.Store)
        got = peer.coordinator.admit(self.me, msg)
        if isinstance(got, Task):
            ((_, got),) = peer.coordinator.settle([(msg, got)])
        if got is not None:
            self.requests.answer(got)
        return True


@pytest.fixture
def pair() -> Iterator[tuple[Node, Node]]:
    with ExitStack() as stack:
        a = Node("a", stack, ("a", "b"), replication=2, min_replicas=2)
        b = Node("b", stack, ("a", "b"), replication=2, min_replicas=2)
        a.peers["b"], b.peers["a"] = b, a
        yield a, b


def _task(**kw) -> Task:
    base = dict(id="t1", queue="q", url="http://w.example/x", eta=NOW + 30, created=NOW,
                fire_at=NOW + 30)
    base.update(kw)
    return Task(**base)


def test_an_enqueue_stores_a_copy_here_and_one_on_the_other_node(pair) -> None:
    a, b = pair
    first = a.coordinator.enqueue(_task())
    assert first.replica == 0 and first.replicas == ("a", "b")
    mine, theirs = a.engine.get("t1"), b.engine.get("t1")
    assert (mine.replica, theirs.replica) == (0, 1)
    assert theirs.fire_at == NOW + 30 + a.engine.config.replica_offset  # copy 1 fires later
    assert a.engine.journal.get("t1") is not None and b.engine.journal.get("t1") is not None
    assert a.members.replayed == ["t1"] and b.members.replayed == ["t1"]
    # unnamed tasks go round the ring: the next one's first copy is still ours
    a.coordinator.enqueue(_task(id="t2"))
    assert a.engine.get("t2").replica == 0


def test_a_peers_copy_is_kept_on_our_clock(pair) -> None:
    a, b = pair
    b.members.offset = 7.0  # a's clock is 7 s ahead of b's
    a.coordinator.enqueue(_task(expires_at=NOW + 100))
    theirs = b.engine.get("t1")
    offset = a.engine.config.replica_offset
    assert theirs.fire_at == NOW + 30 + offset - 7.0 and theirs.eta == NOW + 23
    assert theirs.created == NOW - 7.0 and theirs.expires_at == NOW + 93


def test_a_stopping_node_refuses_a_store_and_the_enqueue_is_undone(pair) -> None:
    a, b = pair
    b.coordinator.stop_taking()
    with pytest.raises(Unavailable, match="stored on 1 of 2 replicas, 2 needed"):
        a.coordinator.enqueue(_task())
    assert b.engine.get("t1") is None
    assert a.engine.get("t1").state == State.CANCELLED  # ours undone
    assert ("b", m.Cancel("t1", abort=True)) in a.members.sent


def test_an_abort_undoes_a_copy_restored_on_the_entry_node_placed_elsewhere(pair) -> None:
    """An ordered task's copies sit on its key's members, not always on the entry node;
    a sibling lost while the enqueue waited may have had its copy restored here: the
    refusal undoes that copy too, not only the ones placed."""
    a, b = pair
    a.engine.add(_task(replicas=("b", "a"), replica=1), wait=True)  # restored from b
    placed = [_task(replicas=("b", "c"), replica=i) for i in range(2)]
    a.coordinator.abort(placed)
    assert a.engine.get("t1").state == State.CANCELLED
    assert a.members.sent == [("b", m.Cancel("t1", abort=True)),
                              ("c", m.Cancel("t1", abort=True))]


def _restored_during_the_enqueue(a: Node, monkeypatch, stored: int) -> None:
    """a enqueues t1 (placed on b and c); while it waits, b restores c's copy on a."""
    def store_all(task, copies, out, hold):
        copy = _task(replicas=("b", "a"), replica=1, fire_at=NOW)  # due at once
        store = m.Store("r1", "a", copy.encode())
        ((_, answer),) = a.coordinator.settle([(store, a.coordinator.admit("b", store))])
        assert answer.ok and "t1" in a.engine.live.pinned  # held, not timed
        out += copies[:stored]
    monkeypatch.setattr(a.coordinator, "_store_all", store_all)
    monkeypatch.setattr(replication, "place", lambda *args, **kw: ("b", "c"))


def test_a_copy_restored_here_while_our_enqueue_of_it_waits_fires_only_once_it_is_taken(
        pair, monkeypatch) -> None:
    a, _ = pair
    _restored_during_the_enqueue(a, monkeypatch, stored=2)
    a.coordinator.enqueue(_task())
    assert "t1" not in a.engine.live.pinned and "t1" in a.engine.live.mem
    assert a.engine.get("t1").state == State.SCHEDULED and not a.coordinator.enqueuing


def test_a_copy_restored_here_while_our_enqueue_of_it_waits_is_undone_by_its_refusal(
        pair, monkeypatch) -> None:
    a, _ = pair
    _restored_during_the_enqueue(a, monkeypatch, stored=1)
    with pytest.raises(Unavailable, match="stored on 1 of 2"):
        a.coordinator.enqueue(_task())
    assert a.engine.get("t1").state == State.CANCELLED and not a.coordinator.enqueuing


def test_a_store_from_outside_the_roster_or_for_another_node_is_refused(pair) -> None:
    a, b = pair
    copy = _task(replicas=("a", "b"), replica=1)
    store = m.Store("r1", "z", copy.encode())
    answer = b.coordinator.admit("z", store)  # z is not in b's roster
    assert isinstance(answer, m.Stored) and not answer.ok and answer.error == "not a member"
    assert b.coordinator.admit("a", m.Store("r2", "a", _task(replicas=("a", "b"),
                                                              replica=0).encode())) is None
    assert b.engine.get("t1") is None
    got = b.coordinator.admit("a", store)
    assert isinstance(got, Task) and got.replica == 1
    assert b.coordinator.settle([(store, got)]) == [(store, m.Stored("r1", "t1", True))]
    # the same STORE again (a retransmission): taken, not stored twice
    assert b.coordinator.admit("a", store) == m.Stored("r1", "t1", True)


def test_a_stored_carries_the_answer_to_its_folded_ask_and_a_refused_one_none(
        pair, monkeypatch) -> None:
    """The answer to the ASK a STORE carried rides on its STORED once the copy is
    stored; a copy the journal refused takes its answer out and sends none (an answer
    about a copy we do not hold would let the asker deliver)."""
    _, b = pair
    folded = {"t1": m.Answer("t1", "go", 5.0), "t2": m.Answer("t2", "go", 5.0)}
    store = m.Store("r1", "a", _task(replicas=("a", "b"), replica=1).encode())
    ((_, stored),) = b.coordinator.settle([(store, b.coordinator.admit("a", store))],
                                          folded.pop)
    assert stored == m.Stored("r1", "t1", True, answer=m.Answer("t1", "go", 5.0))
    store = m.Store("r2", "a", _task(id="t2", replicas=("a", "b"), replica=1).encode())
    got = b.coordinator.admit("a", store)

    def full(*args, **kw):
        raise sqlite3.OperationalError("disk full")
    monkeypatch.setattr(b.engine, "settle", full)
    ((_, stored),) = b.coordinator.settle([(store, got)], folded.pop)
    assert not stored.ok and stored.answer is None and not folded


def test_a_taken_name_on_its_owner_refuses_the_enqueue_with_the_original(pair) -> None:
    a, b = pair
    first = a.coordinator.enqueue(_task(name="invoice-7"))
    with pytest.raises(Duplicate) as info:
        b.coordinator.enqueue(_task(id="t9", name="invoice-7"))
    assert info.value.original_id == first.id
    assert a.engine.get("t9") is None or a.engine.get("t9").state.ended
    assert b.engine.get("t9") is None or b.engine.get("t9").state.ended


def test_a_batch_answers_each_task(pair) -> None:
    a, _ = pair
    a.coordinator.enqueue(_task(id="t0", name="n"))
    out = a.coordinator.enqueue_many([_task(id="t1"), _task(id="t2", name="n")])
    assert out[0]["status"] == "scheduled" and out[0]["replicas"] == ["a", "b"]
    assert out[1] == {"status": "duplicate", "id": "t0", "name": "n"}


def test_a_node_out_of_the_ring_takes_no_enqueue() -> None:
    with ExitStack() as stack:
        lone = Node("c", stack, ("a", "b"))
        with pytest.raises(Unavailable, match="not \\(yet\\) a member"):
            lone.coordinator.enqueue(_task())


def test_a_stopping_node_moves_its_lone_copies_to_a_peer(pair) -> None:
    a, b = pair
    lone = _task(replicas=("a",), replica=0)
    a.engine.add(lone)
    a.coordinator.move_lone_copies([lone])
    assert a.engine.get("t1") is None
    moved = b.engine.get("t1")
    assert moved.replicas == ("b",) and moved.replica == 0 and moved.state == State.SCHEDULED


def test_our_own_journal_refusing_fails_the_enqueue_and_undoes_the_others(monkeypatch) -> None:
    with ExitStack() as stack:
        a = Node("a", stack, ("a", "b"), replication=2, min_replicas=1)
        b = Node("b", stack, ("a", "b"), replication=2, min_replicas=1)
        a.peers["b"], b.peers["a"] = b, a

        def disk_error(*args):
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(a.engine.journal, "_commit", disk_error)
        with pytest.raises(Unavailable, match="journal could not store"):  # though b has it
            a.coordinator.enqueue(_task())
        assert ("b", m.Cancel("t1", abort=True)) in a.members.sent
