"""Ordered tasks and refusals through the coordinator (cluster/coordinator.py) between two
nodes in one process, each a real engine on an in-memory journal: the key's owner
numbers the first copy and every copy carries that place in the key's line, wherever
the enqueue came in; a name already taken refuses the task on every copy; a peer that
cannot store its copy, or answers with no STORED, refuses it; a stopping node says how
many lone copies it moved. The plain enqueue: test_coordinator.py."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import Iterator

import gevent
import pytest

from enginekit import memory_engine
from miyamoto.cluster.coordinator import Coordinator
from miyamoto.cluster.requests import Requests
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.replicas import messages as m
from miyamoto.tasks.task import Task

pytestmark = pytest.mark.timeout(30)

NOW = 1_000_000.0


class Members:
    def __init__(self, ring: tuple[str, ...]):
        self._ring = ring
        self.zones: dict[str, str] = {}
        self.sent: list[tuple[str, object]] = []

    def ring(self) -> tuple[str, ...]:
        return self._ring

    def send(self, member_id: str, msg: object) -> bool:
        self.sent.append((member_id, msg))
        return True

    def await_contact(self, timeout: float) -> bool:
        return True

    def replay(self, task_id: str) -> None:
        pass

    def fold(self, copy: Task) -> tuple[int, float]:
        return (0, 0.0)

    def clock_shift(self, peer: str) -> float:
        return 0.0


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
def pair() -> Iterator[dict[str, Node]]:
    with ExitStack() as stack:
        a = Node("a", stack, ("a", "b"), replication=2, min_replicas=2)
        b = Node("b", stack, ("a", "b"), replication=2, min_replicas=2)
        a.peers["b"], b.peers["a"] = b, a
        yield {"a": a, "b": b}


def _task(i: int, **kw) -> Task:
    return Task(**dict(dict(id=f"t{i}", queue="q", url="http://w.example/x", eta=NOW + 30,
                            created=NOW, fire_at=NOW + 30, ordering_key="cust-1"), **kw))


def test_every_copy_carries_the_place_its_key_s_owner_gave(pair) -> None:
    first = pair["a"].coordinator.enqueue(_task(1))
    owner = first.replicas[0]
    other = "b" if owner == "a" else "a"
    assert first.replica == 0 and first.ordering_seq
    # the next one comes in at the owner, then the one after at the other node
    second = pair[owner].coordinator.enqueue(_task(2))
    third = pair[other].coordinator.enqueue(_task(3))
    assert (second.replica, third.replica) == (0, 0)
    seqs = [first.ordering_seq, second.ordering_seq, third.ordering_seq]
    assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2], seqs
    for n in pair.values():
        for t, seq in zip(("t1", "t2", "t3"), seqs):
            copy = n.engine.get(t)
            assert copy.ordering_seq == seq, (n.me, t, copy)
            assert copy.replica == (0 if n.me == owner else 1), (n.me, t, copy)


def test_a_taken_name_refuses_an_ordered_task_on_every_copy(pair) -> None:
    first = pair["a"].coordinator.enqueue(_task(1, name="inv-1"))
    for n in pair.values():  # at the owner or not: the original is named
        with pytest.raises(Duplicate) as info:
            n.coordinator.enqueue(_task(int(n.me == "b") + 8, name="inv-1"))
        assert info.value.original_id == first.id
    for n in pair.values():
        for t in ("t8", "t9"):
            assert n.engine.get(t) is None or n.engine.get(t).state.ended


def test_a_peer_that_cannot_store_its_copy_refuses_it(pair, monkeypatch) -> None:
    a, b = pair["a"], pair["b"]

    def full_disk(copy):
        raise OSError("No space left on device")

    monkeypatch.setattr(b.engine, "admit", full_disk)
    with pytest.raises(Unavailable, match="stored on 1 of 2"):
        a.coordinator.enqueue(_task(1, ordering_key=None))
    assert a.engine.get("t1") is None or a.engine.get("t1").state.ended  # undone here
    assert b.engine.get("t1") is None


def test_a_reply_to_a_store_that_is_no_stored_counts_as_a_refusal(pair) -> None:
    a, b = pair["a"], pair["b"]

    def confused(member_id: str, msg: object, *, on_fail) -> bool:
        a.requests.answer(m.Reply(msg.req, True, {"odd": 1}))  # a REPLY, not a STORED
        return True

    a.requests = a.coordinator.requests = Requests(confused, reply_to="a")
    with pytest.raises(Unavailable, match="stored on 1 of 2"):
        a.coordinator.enqueue(_task(1, ordering_key=None))


def test_a_stopping_node_says_how_many_lone_copies_it_moved(pair, caplog) -> None:
    a, b = pair["a"], pair["b"]
    lone = [_task(i, ordering_key=None, replicas=("a",), replica=0) for i in (1, 2)]
    for t in lone:
        a.engine.add(t)
    caplog.set_level(logging.INFO, logger="miyamoto.cluster.coordinator")
    a.coordinator.move_lone_copies(lone)
    assert b.engine.get("t1") is not None and b.engine.get("t2") is not None
    assert "moved 2 of 2 tasks" in caplog.text, caplog.text


def test_a_name_taken_only_on_the_second_copys_node_undoes_the_first_copy(pair) -> None:
    """The key's owner numbers and stores copy 0; the other node refuses copy 1 for a
    name it holds: the enqueue is refused and the owner's copy undone."""
    owner = pair["a"].coordinator.enqueue(_task(1)).replicas[0]
    other = pair["b" if owner == "a" else "a"]
    other.engine.add(_task(7, ordering_key=None, name="inv-1", replicas=(other.me,)))
    with pytest.raises(Duplicate):
        pair[owner].coordinator.enqueue(_task(5, name="inv-1"))
    copy = pair[owner].engine.get("t5")
    assert copy is None or copy.state.ended, copy


def test_a_stopping_node_with_nothing_lone_or_no_one_to_take_it_moves_nothing(
        caplog) -> None:
    with ExitStack() as stack:
        a = Node("a", stack, ("a", "b"))
        alone = Node("z", stack, ("z",))
        caplog.set_level(logging.INFO, logger="miyamoto.cluster.coordinator")
        a.coordinator.move_lone_copies([])
        lone = _task(1, ordering_key=None, replicas=("z",), replica=0)
        alone.engine.add(lone)
        alone.coordinator.move_lone_copies([lone])
        assert "moved" not in caplog.text, caplog.text
        assert alone.engine.get("t1").state == lone.state


def test_a_stopping_node_stops_moving_lone_copies_at_shutdown_timeout(caplog,
                                                                      monkeypatch) -> None:
    """A peer that does not answer keeps the copies here (they stay in the journal) and
    the stop goes on after shutdown_timeout: no error."""
    with ExitStack() as stack:
        a = Node("a", stack, ("a", "b"), shutdown_timeout=0.2)
        lone = _task(1, ordering_key=None, replicas=("a",), replica=0)
        a.engine.add(lone)
        monkeypatch.setattr(a.coordinator, "store", lambda copies: gevent.sleep(5))
        caplog.set_level(logging.INFO, logger="miyamoto.cluster.coordinator")
        took = time.monotonic()
        a.coordinator.move_lone_copies([lone])
        assert time.monotonic() - took < 3
        assert "moved 0 of 1 tasks" in caplog.text and a.engine.get("t1") is not None
