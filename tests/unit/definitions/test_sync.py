"""DefSync (``miyamoto.definitions.sync``) in process: two members' definitions wired
through the real encoding, a write sent to a follower forwarded to the leader and its
answer carried back, the ops' answers (404, 409, 503), a schedule's cursor dropped with
it, the tick loop, and the file (written whole or not at all, read back or survived).
The machine alone: test_definitions.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import gevent
import pytest

from miyamoto.definitions import machine as dmachine
from miyamoto.definitions import messages as dm
from miyamoto.definitions import sync as dsync
from miyamoto.definitions.sync import FILE, DefSync
from miyamoto.errors import Unavailable
from miyamoto.wire import messages as m
from miyamoto.wire import verbs as protocol

pytestmark = pytest.mark.timeout(30)

TOPIC = {"urls": ["http://127.0.0.1:9/x"]}
SCHEDULE = {"name": "s", "every": 10, "task": {"url": "http://127.0.0.1:9/x"}}


def wire(msg: Any) -> Any:
    verb, payload = protocol.decode(protocol.encode(msg.verb, msg.payload()))
    return m.decode(verb, payload)


def wait_for(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        gevent.sleep(0.002)


class Net:
    """Members' DefSyncs joined by a network that delivers each message (through the
    real encoding) in its own greenlet; a member in ``down`` cannot be sent to."""

    def __init__(self, members: tuple[str, ...], data_dir: str = ":memory:",
                 timeout: float = 0.5):
        self.members = members
        self.down: set[str] = set()
        self.sent: list[tuple[str, str, Any, str | None]] = []
        self.nodes = {me: DefSync(me, data_dir, self._send_from(me), f"tcp://{me}:1",
                                  monotonic=time.monotonic, resend=0.05, timeout=timeout)
                      for me in members}

    def _send_from(self, me: str) -> Any:
        def send(to: str, msg: Any, address: str | None = None) -> bool:
            self.sent.append((me, to, msg, address))
            if to in self.down or to not in self.nodes:
                return False
            gevent.spawn(self.nodes[to].on_message, me, wire(msg))
            return True
        return send

    def tick(self, leader: str = "a", term: int = 1) -> None:
        for node in self.nodes.values():
            node.tick(leader, term, self.members)

    def ready(self, leader: str = "a") -> DefSync:
        lead = self.nodes[leader]
        for _ in range(100):
            self.tick(leader)
            gevent.sleep(0.001)
            if lead.machine.ready:
                return lead
        raise AssertionError("no ready leader")


def test_a_write_to_a_follower_is_forwarded_and_answered() -> None:
    net = Net(("a", "b", "c"))
    lead = net.ready()
    b = net.nodes["b"]
    assert b.op("put", "topic", "t", TOPIC) == (200, {"value": TOPIC})
    assert lead.machine.get("topic", "t") == TOPIC
    wait_for(lambda: b.machine.get("topic", "t") == TOPIC)
    wrote = [(s, to, msg, addr) for s, to, msg, addr in net.sent if isinstance(msg, dm.DefsWrote)]
    assert [(s, to, addr) for s, to, _, addr in wrote] == [("a", "b", "tcp://b:1")]
    assert b._asks == {}  # the ask is gone once answered
    assert b.op("pause", "topic", "nope")[0] == 404  # answered by the leader, through b


def test_ops_answer_404_503_or_the_new_value() -> None:
    net = Net(("a",))
    a = net.ready()
    assert a.op("delete", "topic", "t") == (404, {"status": "error", "field": "name",
                                                  "error": "name names no known topic"})
    a.op("put", "schedule", "s", SCHEDULE)
    assert a.op("pause", "schedule", "s") == (200, {"value": dict(SCHEDULE, paused=True)})
    assert a.op("resume", "schedule", "s") == (200, {"value": dict(SCHEDULE, paused=False)})
    assert a.op("delete", "schedule", "s") == (200, {"value": dict(SCHEDULE, paused=False)})
    assert a.machine.get("schedule", "s") is None
    alone = DefSync("z", ":memory:", lambda *x, **k: True, "tcp://z:1",
                    monotonic=time.monotonic, resend=0.05, timeout=0.5)
    status, body = alone.op("put", "topic", "t", TOPIC)  # no leader known at all
    assert status == 503 and "no leader" in body["error"] and "field" not in body


def test_a_schedules_cursor_goes_with_a_put_or_delete_of_it() -> None:
    a = Net(("a",)).ready()
    a.op("put", "schedule", "s", SCHEDULE)
    a.write([("cursor", "s", {"tick": 10.0, "ids": ["t1"]})])
    a.op("pause", "schedule", "s")  # a pause keeps the cursor: the same ticks
    assert a.machine.get("cursor", "s") is not None
    a.op("put", "schedule", "s", dict(SCHEDULE, every=20))  # a new schedule starts afresh
    assert a.machine.get("cursor", "s") is None
    a.write([("cursor", "s", {"tick": 20.0, "ids": ["t2"]})])
    a.op("delete", "schedule", "s")
    assert a.machine.get("cursor", "s") is None
    a.write([("cursor", "t", {"tick": 1.0, "ids": []})])
    a.op("put", "topic", "t", TOPIC)  # only a schedule has a cursor
    assert a.machine.get("cursor", "t") is not None


def test_a_full_map_is_409_naming_the_name(monkeypatch) -> None:
    monkeypatch.setattr(dmachine, "MAX_ENTRIES", 1)
    a = Net(("a",)).ready()
    assert a.op("put", "topic", "t", TOPIC)[0] == 200
    status, body = a.op("put", "topic", "u", TOPIC)
    assert status == 409 and body["field"] == "name" and "holds 1 definitions" in body["error"]


def test_a_write_no_majority_confirms_is_503() -> None:
    net = Net(("a", "b", "c"), timeout=0.2)
    a = net.ready()
    net.down |= {"b", "c"}
    ticking = gevent.spawn(lambda: [net.tick() or gevent.sleep(0.01) for _ in range(200)])
    try:
        status, body = a.op("put", "topic", "t", TOPIC)
        assert status == 503 and "a majority did not confirm" in body["error"]
        with pytest.raises(Unavailable, match="definition not confirmed"):
            a.write([("topic", "u", TOPIC)])
    finally:
        ticking.kill()


def test_a_forward_the_leader_cannot_take_or_answer_is_503() -> None:
    net = Net(("a", "b", "c"), timeout=0.2)
    net.ready()
    b = net.nodes["b"]
    net.down.add("a")
    status, body = b.op("put", "topic", "t", TOPIC)
    assert (status, body["error"]) == (503, "the leader cannot be reached")
    net.down.discard("a")
    net.nodes["a"].on_message = lambda sender, msg: None  # takes it, never answers
    b.timeout = -1.8  # a forward waits the write's timeout and 2 s more: 0.2 s here
    started = time.monotonic()
    status, body = b.op("put", "topic", "t", TOPIC)
    assert (status, body["error"]) == (503, "the leader did not answer in time")
    assert 0.2 <= time.monotonic() - started < 1.0 and b._asks == {}


def test_a_forwarded_write_to_a_node_that_no_longer_leads_is_503() -> None:
    net = Net(("a", "b", "c"))
    net.ready()
    c = net.nodes["c"]
    answers: list[Any] = []
    c._send = lambda to, msg, address=None: answers.append((to, msg, address)) or True
    c._serve_write("b", dm.DefsWrite("r1", "tcp://b:1", "put", "topic", "t", TOPIC))
    (to, msg, address), = answers
    assert (to, address, msg.req, msg.status) == ("b", "tcp://b:1", "r1", 503)
    assert "not the ready leader" in msg.body["error"]
    assert net.nodes["b"].op("put", "topic", "t", TOPIC)[0] == 200
    net.nodes["b"].on_message("a", dm.DefsWrote("unknown-req", 200, {}))  # late: ignored


def test_a_leader_names_itself_while_not_ready_so_no_forward_loop() -> None:
    net = Net(("a", "b", "c"))
    a = net.nodes["a"]
    a.tick("a", 1, ("a", "b", "c"))  # leads, but no member has answered yet
    status, body = a.op("put", "topic", "t", TOPIC)
    assert status == 503 and "no leader" in body["error"]
    assert not [x for x in net.sent if isinstance(x[2], dm.DefsWrite)]


def test_the_loop_ticks_with_the_views_it_is_given() -> None:
    views = [("a", 1, ("a",))]
    a = DefSync("a", ":memory:", lambda *x, **k: True, "tcp://a:1", monotonic=time.monotonic,
                resend=0.04, timeout=0.5, view=lambda: views[0])
    assert a.period == 0.01
    a.start()
    try:
        wait_for(lambda: a.machine.ready)
        views[0] = None  # type: ignore[assignment]  # a view that fails: logged, not fatal
        gevent.sleep(0.03)
        views[0] = ("b", 2, ("a", "b"))
        wait_for(lambda: a.machine.leader == "b")
    finally:
        a.group.kill()
    assert DefSync("a", ":memory:", lambda *x, **k: True, "x", monotonic=time.monotonic,
                   resend=10.0, timeout=1.0).period == 0.1


def test_an_effect_it_does_not_know_is_an_error() -> None:
    a = Net(("a",)).ready()
    with pytest.raises(TypeError, match="no way to carry out"):
        a.carry_out([object()])


# ---------------------------------------------------------------- the file

def test_the_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    net = Net(("a",), data_dir=str(tmp_path))
    a = net.ready()
    a.op("put", "topic", "t", TOPIC)
    data = json.loads((tmp_path / FILE).read_text())
    assert data["owner"] == "a" and [e["name"] for e in data["entries"]] == ["t"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".definitions.")]
    again = DefSync("a", str(tmp_path), lambda *x, **k: True, "x", monotonic=time.monotonic,
                    resend=0.05, timeout=0.5)
    again.load()
    assert again.machine.get("topic", "t") == TOPIC and again.machine.owner == "a"
    memory = DefSync("a", ":memory:", lambda *x, **k: True, "x", monotonic=time.monotonic,
                     resend=0.05, timeout=0.5)
    assert memory.path is None
    memory.load()  # nothing to read
    DefSync("a", str(tmp_path / "none"), lambda *x, **k: True, "x",
            monotonic=time.monotonic, resend=0.05, timeout=0.5).load()  # no file yet


@pytest.mark.parametrize("text", [
    "{not json", '{"entries": [5]}', '{"term": 1}', '{"entries": [], "owner": 5}',
    '{"entries": [], "term": "x"}'])
def test_an_unreadable_file_is_survived(tmp_path: Path, text: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / FILE).write_text(text)
    d = DefSync("a", str(tmp_path), lambda *x, **k: True, "x", monotonic=time.monotonic,
                resend=0.05, timeout=0.5)
    d.load()
    assert d.machine.entries == {} and d.machine.owner is None
    assert "is unreadable" in caplog.text


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / FILE)
    dsync._atomic_write(path, b'{"old": 1}')

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(dsync.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        dsync._atomic_write(path, b'{"new": 2}')
    assert (tmp_path / FILE).read_bytes() == b'{"old": 1}'
    assert os.listdir(tmp_path) == [FILE]


def test_the_bytes_are_in_the_file_when_it_is_synced(tmp_path: Path, monkeypatch) -> None:
    """What fsync makes durable is what was written: the write is flushed before it."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real(fd)
    monkeypatch.setattr(dsync.os, "fsync", fsync)
    dsync._atomic_write(str(tmp_path / FILE), b'{"entries": []}')
    assert synced[0] == len(b'{"entries": []}')  # the file's, then the directory's
    assert len(synced) == 2


def test_on_change_is_told_once_per_change_after_it_is_on_disk(tmp_path) -> None:
    """settle() calls on_change once for each batch of changes (a load, a persisted
    merge), never when nothing changed, and a failing on_change is logged, not raised."""
    calls: list[int] = []
    node = DefSync("a", str(tmp_path), lambda *a, **k: True, "tcp://a:1",
                   monotonic=time.monotonic, resend=0.05, timeout=0.5,
                   on_change=lambda: calls.append(1))
    node.settle()
    assert calls == []  # nothing changed yet
    node.tick("a", 1, ("a",))  # takes office alone: a promise persisted
    node.settle()
    node.settle()
    assert len(calls) == 1
    node.write([("topic", "t", TOPIC)])
    node.tick("a", 1, ("a",))  # nothing new
    node.settle()
    assert len(calls) == 2
    node.settle()
    assert len(calls) == 2
    again = DefSync("a", str(tmp_path), lambda *a, **k: True, "tcp://a:1",
                    monotonic=time.monotonic, resend=0.05, timeout=0.5,
                    on_change=lambda: calls.append(2))
    again.load()
    again.settle()
    assert calls[-1] == 2 and again.machine.get("topic", "t") == TOPIC

    def broken() -> None:
        raise RuntimeError("boom")

    bad = DefSync("b", ":memory:", lambda *a, **k: True, "tcp://b:1",
                  monotonic=time.monotonic, resend=0.05, timeout=0.5, on_change=broken)
    bad.tick("b", 1, ("b",))
    bad.settle()  # logged


def test_a_merge_keeps_the_fields_it_does_not_name_and_a_null_drops_one() -> None:
    node = DefSync("a", ":memory:", lambda *a, **k: True, "tcp://a:1",
                   monotonic=time.monotonic, resend=0.05, timeout=0.5)
    node.tick("a", 1, ("a",))
    assert node.op("put", "queue", "q", {"rate": 5.0, "burst": 3})[0] == 200
    status, body = node.op("merge", "queue", "q", {"burst": 10, "rate": None})
    assert status == 200 and node.machine.get("queue", "q") == {"burst": 10}
    node.op("merge", "queue", "q", {"max_attempts": 4})
    assert node.machine.get("queue", "q") == {"burst": 10, "max_attempts": 4}
