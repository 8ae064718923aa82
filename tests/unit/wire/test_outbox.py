"""Per-peer batching of cluster messages (miyamoto.wire.outbox) and scripts/start.py's mapping."""

from __future__ import annotations

import importlib.util

import gevent
import pytest
import ujson

from helpers import REPO
from dispatchkit import wait_for as wait_until
from miyamoto.wire.outbox import BUSY, MAX_BATCH, URGENT, Outbox, unbatch
from miyamoto.wire.verbs import Verb

pytestmark = pytest.mark.timeout(30)


def _turn() -> None:
    """Let the hub run the flush callback queued by the puts."""
    gevent.sleep(0)
    gevent.sleep(0)


class FakeSend:
    def __init__(self, ok: bool = True):
        self.sent: list[tuple] = []
        self.ok = ok

    def __call__(self, to, address, verb, payload) -> bool:
        self.sent.append((to, address, verb, payload))
        return self.ok


def test_messages_for_one_peer_in_one_turn_leave_as_one_batch():
    send = FakeSend()
    box = Outbox(send)
    for i in range(5):
        box.put("b", "tcp://b", Verb.DONE, {"id": str(i)})
    box.put("c", "tcp://c", Verb.CLAIM, {"id": "x"})
    assert send.sent == []  # nothing leaves before the current greenlet yields
    _turn()
    by_address = {s[1]: s for s in send.sent}
    assert set(by_address) == {"tcp://b", "tcp://c"}
    assert by_address["tcp://c"][2] == Verb.CLAIM  # a single message is sent as itself
    assert by_address["tcp://b"][2] == Verb.BATCH
    inner = unbatch(ujson.loads(by_address["tcp://b"][3]))
    assert [(v, p["id"]) for v, p in inner] == [(Verb.DONE, str(i)) for i in range(5)]


def test_large_bursts_are_split_and_failures_reported():
    send = FakeSend(ok=False)
    box = Outbox(send)
    failed = []
    for i in range(MAX_BATCH + 3):
        box.put(None, "tcp://b", Verb.STORE, {"i": i}, on_fail=lambda i=i: failed.append(i))
    _turn()
    assert len(send.sent) == 2
    assert sorted(failed) == list(range(MAX_BATCH + 3))


@pytest.mark.parametrize("payload", [
    {}, {"m": "x"}, {"m": [1, 2]}, {"m": [["NOPE", {}]]}, {"m": [["DONE", []]]},
    {"m": [["BATCH", {"m": []}]]}, {"m": [["DONE"]]},
])
def test_unbatch_skips_malformed_entries(payload):
    assert unbatch(payload) == []


def test_unbatch_keeps_good_entries_among_bad():
    assert unbatch({"m": [["DONE", {"id": "a"}], 7, ["CLAIM", {"id": "b"}]]}) == [
        (Verb.DONE, {"id": "a"}), (Verb.CLAIM, {"id": "b"})]


def _start_module():
    path = REPO / "scripts" / "start.py"
    spec = importlib.util.spec_from_file_location("start_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_start_script_maps_the_original_environment():
    start = _start_module()
    assert start.argv_from_env({}) == ["serve", "--http", "127.0.0.1:8088",
                                       "--cluster", "tcp://127.0.0.1:6000"]
    argv = start.argv_from_env({"INTERFACE": "10.1.2.3", "LEADER": "10.1.2.4:6000",
                                "REPLICAS": "3", "NODE_ID": "n7", "DATA_DIR": "/d"})
    assert argv == ["serve", "--http", "10.1.2.3:8088", "--cluster", "tcp://10.1.2.3:6000",
                    "--seeds", "tcp://10.1.2.4:6000", "--replication", "3", "--node", "n7",
                    "--data-dir", "/d"]
    gevent.sleep(0)


def test_batches_are_bounded_in_bytes_and_big_messages_travel_alone():
    import ujson

    from miyamoto.wire.outbox import MAX_BATCH_BYTES
    from miyamoto.wire.verbs import decode

    send = FakeSend()
    box = Outbox(send)
    big = "x" * (MAX_BATCH_BYTES + 10)
    box.put("b", "tcp://b", Verb.STORE, {"body": big})
    for i in range(8):
        box.put("b", "tcp://b", Verb.STORE, {"i": i, "body": "y" * 300_000})
    _turn()
    got = []
    for _, _, verb, data in send.sent:
        assert isinstance(data, bytes)
        v, payload = decode([verb.value.encode(), data])
        if v == Verb.BATCH:
            assert len(data) <= MAX_BATCH_BYTES + 64
            got += [p.get("i") for _, p in unbatch(payload)]
        else:
            assert ujson.loads(data)["body"] == big
    assert got == list(range(8))


@pytest.mark.parametrize("ok", [True, False])
def test_each_message_sent_inside_a_batch_is_counted_by_its_verb(ok: bool):
    counted: list[tuple[str, str]] = []
    box = Outbox(FakeSend(ok=ok),
                 lambda verbs, direction: counted.extend((v._value_, direction) for v in verbs))
    box.put("b", "tcp://b", Verb.DONE, {"id": "1"})
    box.put("b", "tcp://b", Verb.STORE, {"id": "2"})
    box.put("c", "tcp://c", Verb.CLAIM, {"id": "3"})  # alone: the transport counts it
    _turn()
    assert counted == ([("DONE", "sent"), ("STORE", "sent")] if ok else [])
def test_a_single_message_that_cannot_leave_says_so():
    box = Outbox(FakeSend(ok=False))
    failed: list[str] = []
    box.put("b", "tcp://b", Verb.ASK, {"id": "x"}, on_fail=lambda: failed.append("x"))
    box.put("c", "tcp://c", Verb.ASK, {"id": "y"})  # no on_fail: nothing to call
    _turn()
    assert failed == ["x"]


def test_a_failing_on_fail_is_logged_and_the_others_still_run(caplog):
    box = Outbox(FakeSend(ok=False))
    failed: list[int] = []

    def boom() -> None:
        raise RuntimeError("planted")
    box.put("b", "tcp://b", Verb.ASK, {"i": 0}, on_fail=boom)
    box.put("b", "tcp://b", Verb.ASK, {"i": 1}, on_fail=lambda: failed.append(1))
    _turn()
    assert failed == [1] and "on_fail callback failed" in caplog.text


def test_a_batch_holds_at_most_max_batch_messages():
    assert MAX_BATCH == 256
    for n, batches in ((256, 1), (257, 2), (2, 1)):
        send = FakeSend()
        box = Outbox(send)
        for i in range(n):
            box.put("b", "tcp://b", Verb.DONE, {"i": i})
        _turn()
        assert len(send.sent) == batches and {s[2] for s in send.sent} == {Verb.BATCH}
        got = [p["i"] for s in send.sent for _, p in unbatch(ujson.loads(s[3]))]
        assert got == list(range(n))
    box = Outbox(FakeSend())
    box.put("b", "tcp://b", Verb.DONE, {"i": 0})
    _turn()
    box.put("b", "tcp://b", Verb.DONE, {"i": 1})  # a later turn schedules its own flush
    _turn()
    assert len(box._send.sent) == 2


def sent_ids(send: FakeSend) -> list[list[int]]:
    """The ids each frame carried, frame by frame."""
    return [[p["i"] for _, p in unbatch(ujson.loads(data))] if verb == Verb.BATCH
             else [data["i"]] for _, _, verb, data in send.sent]


def test_under_load_a_flush_waits_for_the_next_turns_messages():
    """One enqueue a turn, each with its STORE: under load (a flush less than BUSY ago)
    the next flush waits LINGER, and the STOREs of the turns meanwhile leave as one."""
    now = [100.0]
    send = FakeSend()
    box = Outbox(send, monotonic=lambda: now[0])
    box.put("b", "tcp://b", Verb.STORE, {"i": 0})
    _turn()
    assert sent_ids(send) == [[0]]  # idle: at the end of the turn
    now[0] += BUSY / 2
    for i in (1, 2, 3):
        box.put("b", "tcp://b", Verb.STORE, {"i": i})
        _turn()
    assert sent_ids(send) == [[0]]  # under load: waiting for more
    wait_until(lambda: len(send.sent) == 2, timeout=5)
    assert sent_ids(send) == [[0], [1, 2, 3]]
    now[0] += 2 * BUSY  # quiet again: the next one leaves at the end of its turn
    box.put("b", "tcp://b", Verb.STORED, {"i": 4})
    _turn()
    assert sent_ids(send) == [[0], [1, 2, 3], [4]]


@pytest.mark.parametrize("verb", sorted(URGENT))
def test_an_urgent_message_never_waits_and_takes_the_waiting_ones_along(verb):
    """An attempt's end, a claim or a clock probe leaves at the end of its turn even under
    load, and what waited for the linger goes in the same frame, in order."""
    now = [100.0]
    send = FakeSend()
    box = Outbox(send, monotonic=lambda: now[0])
    box.put("b", "tcp://b", Verb.STORE, {"i": 0})
    _turn()
    box.put("b", "tcp://b", Verb.STORE, {"i": 1})  # under load: waits
    box.put("b", "tcp://b", verb, {"i": 2})
    _turn()
    assert sent_ids(send) == [[0], [1, 2]]
    gevent.sleep(0.005)  # past the linger: the stopped timer sends nothing more
    assert len(send.sent) == 2


def test_unbatch_reads_at_most_max_batch_entries():
    items = [["DONE", {"i": i}] for i in range(261)]
    assert [p["i"] for _, p in unbatch({"m": items})] == list(range(256))


def test_a_batch_frame_stays_within_one_mib():
    """Messages are packed until the next would pass 1 MiB (each counted with room for
    its framing), so no BATCH frame is larger than 1 MiB and its wrapper."""
    send = FakeSend()
    box = Outbox(send)
    for i in range(500):
        box.put("b", "tcp://b", Verb.DONE, {"i": i, "pad": "p" * 4980})
    _turn()
    got = []
    for _, _, verb, data in send.sent:
        assert verb == Verb.BATCH and len(data) <= 1024 * 1024 + len(b'{"m":[]}')
        got += [p["i"] for _, p in unbatch(ujson.loads(data))]
    assert got == list(range(500)) and len(send.sent) == 3


def test_every_peer_gets_its_messages_whatever_the_order():
    send = FakeSend()
    box = Outbox(send)
    box.put("c", "tcp://c", Verb.CLAIM, {"id": "x"})  # a single message first
    for i in range(3):
        box.put("b", "tcp://b", Verb.DONE, {"id": str(i)})
    box.put("d", "tcp://d", Verb.ASK, {"id": "y"})
    _turn()
    assert [s[1] for s in send.sent] == ["tcp://c", "tcp://b", "tcp://d"]


def test_unbatch_skips_an_unknown_verb_and_reads_on():
    assert unbatch({"m": [["NOPE", {}], ["DONE", {"id": "a"}], ["BATCH", {}],
                          ["CLAIM", {"id": "b"}]]}) == [(Verb.DONE, {"id": "a"}),
                                                       (Verb.CLAIM, {"id": "b"})]
