"""Cluster-wide definitions: the pure machine (fake time), its simulator with a planted
bug, and the file. Real nodes converging after one was down during a write:
tests/nodes/test_definitions_node.py."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from definitions_sim import LivenessViolation, SafetyViolation, Sim
from miyamoto.wire import messages as m
from miyamoto.definitions import messages as dm
from miyamoto.wire import verbs as protocol
from miyamoto.definitions.machine import CHUNK, Definitions, Finished, NotLeader, Persist, Received, \
    Tick, View, Write
from miyamoto.wire.messages import Send
from miyamoto.wire.verbs import DecodeError, Verb


def sends(effects: list[Any], cls: type | None = None) -> list[Send]:
    return [e for e in effects if isinstance(e, Send) and (cls is None or isinstance(e.msg, cls))]


# the machine's one door, step(event, now), in the shapes these tests read
def dview(d: Definitions, leader: str | None, term: int, members: tuple[str, ...],
          now: float) -> list[Any]:
    return d.step(View(leader, term, tuple(members)), now).effects


def dwrite(d: Definitions, changes: list, now: float) -> tuple[int | None, list[Any]]:
    r = d.step(Write(tuple(changes)), now)
    return r.wid, r.effects


def drecv(d: Definitions, sender: str, msg: Any, now: float) -> list[Any]:
    return d.step(Received(sender, msg), now).effects


def dtick(d: Definitions, now: float) -> list[Any]:
    return d.step(Tick(), now).effects


def wire(msg: Any) -> Any:
    """Through the real encoding and the typed decoder, as a peer would get it."""
    verb, payload = protocol.decode(protocol.encode(msg.verb, msg.payload()))
    return m.decode(verb, payload)


def ready_leader(members: tuple[str, ...] = ("a", "b", "c")) -> Definitions:
    d = Definitions("a")
    dview(d, "a", 1, members, 0.0)
    for mem in members[1:]:
        drecv(d, mem, dm.DefsDigest(1, d.digest(), "a"), 0.0)  # promised term 1 to a
    assert d.ready and d.dterm == 1
    return d


# ---------------------------------------------------------------- the machine

def test_a_node_alone_writes_at_once_persisting_first() -> None:
    d = Definitions("a")
    dview(d, "a", 1, ("a",), 0.0)
    assert d.ready
    wid, effects = dwrite(d, [("topic", "t", {"urls": ["http://x/"]})], 0.0)
    assert isinstance(effects[0], Persist) and effects[-1] == Finished(wid, True)
    assert effects[0].entries[0].value == {"urls": ["http://x/"]}
    assert d.get("topic", "t") == {"urls": ["http://x/"]}


def test_a_write_finishes_once_a_majority_acked() -> None:
    d = ready_leader()
    wid, effects = dwrite(d, [("topic", "t", {"urls": []})], 0.0)
    puts = sends(effects, dm.DefsPut)
    assert {s.to for s in puts} == {"b", "c"} and not any(isinstance(e, Finished)
                                                           for e in effects)
    assert drecv(d, "b", wire(dm.DefsAck(1, wid)), 0.1) == [Finished(wid, True)]
    # an unacked write is resent, then given up at its deadline
    wid2, _ = dwrite(d, [("topic", "u", None)], 1.0)
    assert {s.to for s in sends(dtick(d, 1.0 + d.resend))} >= {"b", "c"}
    assert Finished(wid2, False, "a majority did not confirm in time") in dtick(d, 1.0 + d.timeout)


@pytest.mark.parametrize("members,needed", [(("a", "b"), 2), (("a", "b", "c", "d"), 3),
                                             (("a", "b", "c", "d", "e", "f"), 4)])
def test_an_even_cluster_needs_more_than_half(members: tuple[str, ...], needed: int) -> None:
    """A majority of n is n // 2 + 1 (the leader counted): half of an even cluster is not
    one, or two halves could each take writes the other never saw."""
    d = Definitions("a")
    dview(d, "a", 1, members, 0.0)
    for mem in members[1:needed - 1]:
        drecv(d, mem, dm.DefsDigest(1, d.digest(), "a"), 0.0)
    assert not d.ready  # a promise majority is needed before any write, too
    drecv(d, members[needed - 1], dm.DefsDigest(1, d.digest(), "a"), 0.0)
    assert d.ready
    wid, _ = dwrite(d, [("topic", "t", {"urls": []})], 0.0)
    for mem in members[1:needed - 1]:
        assert drecv(d, mem, dm.DefsAck(1, wid), 0.1) == []
    assert drecv(d, members[needed - 1], dm.DefsAck(1, wid), 0.1) == [Finished(wid, True)]


def test_followers_redirect_and_a_new_leader_waits_for_a_majority() -> None:
    f = Definitions("b")
    dview(f, "a", 1, ("a", "b", "c"), 0.0)
    with pytest.raises(NotLeader) as e:
        dwrite(f, [("topic", "t", None)], 0.0)
    assert e.value.leader == "a"
    d = Definitions("a")
    offers = dview(d, "a", 2, ("a", "b", "c"), 0.0)
    assert {s.to for s in sends(offers) if s.msg.want} == {"b", "c"} and not d.ready
    with pytest.raises(NotLeader):
        dwrite(d, [("topic", "t", None)], 0.0)
    # b answers the offer with its whole set, which holds a write we lacked
    old = dm.Entry("topic", "x", 1, 7, {"urls": ["http://x/"]})
    b = Definitions("b", entries={("topic", "x"): old})
    dview(b, "a", 2, ("a", "b", "c"), 0.0)
    answer = drecv(b, "a", wire(sends(offers)[0].msg), 0.0)
    assert [s.msg.last for s in sends(answer)] == [True]
    for s in sends(answer):
        drecv(d, "b", wire(s.msg), 0.1)
    assert d.ready and d.get("topic", "x") == old.value
    wid, _ = dwrite(d, [("topic", "y", {})], 0.2)
    # the stamp's term is the definitions' own (1: a's first claim), not membership's 2
    assert (d.entries[("topic", "y")].term, d.entries[("topic", "y")].seq) == (1, 8)


def test_a_lost_chunk_does_not_count_as_synced() -> None:
    many = {("topic", f"t{i}"): dm.Entry("topic", f"t{i}", 1, i + 1, {}) for i in range(CHUNK + 3)}
    b = Definitions("b", entries=dict(many))
    dview(b, "a", 2, ("a", "b", "c"), 0.0)
    answer = sends(drecv(b, "a", dm.DefsPut(2, (), want=True), 0.0))
    assert len(answer) == 2
    d = Definitions("a")
    d.load([], 1)  # so that a claims term 2, the one b promised it
    dview(d, "a", 2, ("a", "b", "c"), 0.0)
    drecv(d, "b", wire(answer[1].msg), 0.0)  # the first chunk was lost
    assert not d.ready
    drecv(d, "b", wire(answer[0].msg), 0.1)
    drecv(d, "b", wire(answer[1].msg), 0.1)
    assert d.ready


def test_merge_is_last_writer_wins_and_stale_terms_get_no_ack() -> None:
    b = Definitions("b")
    dview(b, "a", 3, ("a", "b", "c"), 0.0)
    new = dm.Entry("topic", "t", 3, 5, None)  # a deletion
    assert any(isinstance(e, Persist) for e in drecv(b, "a", dm.DefsPut(3, (new,), wid=1), 0.0))
    old = dm.Entry("topic", "t", 2, 9, {"urls": ["http://x/"]})
    out = drecv(b, "z", dm.DefsPut(2, (old,), wid=4), 0.0)  # a deposed leader's write
    assert b.entries[("topic", "t")] == new and not sends(out, dm.DefsAck)
    assert b.get("topic", "t") is None and b.items("topic") == []


def test_messages_decode_or_raise_naming_the_field() -> None:
    e = dm.Entry("schedule", "s", 1, 2, {"every": 1})
    put = dm.DefsPut(1, (e,), wid=3, want=True, last=True, index=(("schedule", "s", 1, 2),))
    assert wire(put) == put
    w = dm.DefsWrite("r", "tcp://127.0.0.1:1", "pause", "schedule", "s")
    assert wire(w) == w
    for verb, payload in [(Verb.DEFS_PUT, {"term": 1, "entries": [{"kind": "evil"}]}),
                          (Verb.DEFS_PUT, {"term": -1, "entries": []}),
                          (Verb.DEFS_PUT, {"term": 1, "entries": [], "index": [[1]]}),
                          (Verb.DEFS_WRITE, {"req": "r", "reply_to": "x", "op": "drop",
                                             "kind": "topic", "name": "t"}),
                          (Verb.DEFS_WROTE, {"req": "r", "status": 999, "body": {}}),
                          (Verb.DEFS_ACK, {"term": 1})]:
        with pytest.raises(DecodeError):
            m.decode(verb, payload)


# ---------------------------------------------------------------- the simulator

@pytest.mark.timeout(60)
def test_simulated_clusters_lose_no_acked_write_and_converge() -> None:
    acked = restarts = 0
    for seed in range(12):
        sim = Sim(3 if seed % 2 else 5, seed)
        sim.elect()
        sim.run(15)
        sim.heal()
        sim.run(sim.now + 5, faults=False)
        sim.final_check()
        acked += sim.acked_count
        restarts += sim.full_restarts
        assert sim.cursor_tick() > 10  # the schedule's cursor advanced all along
    assert acked > 500  # the runs did write (and change leaders) a lot
    assert restarts >= 5  # and restarted whole clusters, each live again within bound


@pytest.mark.timeout(30)
def test_simulated_full_restarts_with_low_membership_terms_stay_live() -> None:
    for seed in range(6):
        sim = Sim(3, 100 + seed)
        for _ in range(4):  # terms climb, then all restart with membership back at 0-1
            sim.elect()
            sim.run(sim.now + 1.5)
        assert max(st for st in sim.term_writer) >= 3
        sim.full_restart()
        sim.run(sim.now + 1.5 + 5)  # the restart's liveness window is checked inside
        assert sim.live is None and sim.term <= 2


class _MembershipTerm(Definitions):
    """Planted bug (the one this fixes): a leader claims the membership's term."""

    def _next_term(self, above: int = 0) -> int:
        return self.term


@pytest.mark.timeout(30)
def test_the_checker_catches_stamps_taken_from_the_membership_term() -> None:
    caught = 0
    for seed in range(6):
        sim = Sim(3, 100 + seed, factory=_MembershipTerm)
        try:
            for _ in range(4):
                sim.elect()
                sim.run(sim.now + 1.5)
            sim.full_restart()
            sim.run(sim.now + 1.5 + 5)
        except LivenessViolation:
            caught += 1
    assert caught == 6


class _NoAdoption(Definitions):
    """Planted bug: a new leader writes at once, without a majority's set."""

    @property
    def ready(self) -> bool:
        return self.leading


@pytest.mark.timeout(60)
def test_the_checker_catches_a_leader_that_does_not_adopt() -> None:
    caught = 0
    for seed in range(10):
        sim = Sim(3, seed, factory=_NoAdoption)
        sim.elect()
        try:
            sim.run(15)
            sim.heal()
            sim.run(sim.now + 5, faults=False)
            sim.final_check()
        except SafetyViolation:
            caught += 1
    assert caught >= 3


@pytest.mark.timeout(60)
def test_simulated_queue_merges_on_the_leader_lose_no_acked_field() -> None:
    fields = 0
    for seed in range(6):
        sim = Sim(3 if seed % 2 else 5, 200 + seed, merges=True)
        sim.elect()
        sim.run(12)
        sim.heal()
        sim.run(sim.now + 5, faults=False)
        sim.final_check()
        fields += len(sim.acked_fields)
    assert fields > 100  # the runs merged a lot, through leader changes and restarts


@pytest.mark.timeout(60)
def test_the_checker_catches_merges_read_off_the_node_that_took_the_put() -> None:
    caught = 0
    for seed in range(6):
        sim = Sim(3, 200 + seed, stale_merges=True)
        sim.elect()
        try:
            sim.run(12)
            sim.heal()
            sim.run(sim.now + 5, faults=False)
            sim.final_check()
        except SafetyViolation as e:
            assert "merges" in str(e)
            caught += 1
    assert caught >= 4


# ---------------------------------------------------------------- the file

def test_definitions_file_round_trips_and_a_bad_one_is_survived(tmp_path) -> None:
    import gevent

    from miyamoto.definitions.sync import FILE, DefSync

    sent: list[Any] = []
    one = DefSync("a", str(tmp_path), lambda *a, **k: sent.append(a) or True, "tcp://x:1",
                  monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
    one.tick("a", 4, ("a",))
    assert one.op("put", "topic", "t", {"urls": ["http://x/"]}) == (
        200, {"value": {"urls": ["http://x/"]}})
    assert one.op("pause", "topic", "nope")[0] == 404
    data = json.loads((tmp_path / FILE).read_text())
    assert data["term"] == 1 and data["owner"] == "a" and data["entries"][0]["name"] == "t"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".definitions.")]
    two = DefSync("a", str(tmp_path), lambda *a, **k: True, "tcp://x:1",
                  monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
    two.load()
    assert two.machine.get("topic", "t") == {"urls": ["http://x/"]} and two.machine.seen_term == 1
    two.tick("a", 1, ("a",))  # membership starts again at 1: the definitions' term climbs
    assert two.machine.ready and two.machine.dterm == 2
    assert json.loads((tmp_path / FILE).read_text())["term"] == 2
    (tmp_path / FILE).write_text("{not json")
    three = DefSync("a", str(tmp_path), lambda *a, **k: True, "tcp://x:1",
                    monotonic=lambda: 0.0, resend=0.2, timeout=1.0)
    three.load()  # logged, not raised: the cluster's set comes back from the others
    assert three.machine.entries == {}
    gevent.sleep(0)


def test_a_full_map_refuses_new_keys_rather_than_dropping_them(monkeypatch) -> None:
    from miyamoto.definitions import machine as definitions
    from miyamoto.definitions.machine import Full

    monkeypatch.setattr(definitions, "MAX_ENTRIES", 2)
    d = Definitions("a")
    dview(d, "a", 1, ("a",), 0.0)
    dwrite(d, [("topic", "x", {}), ("topic", "y", {})], 0.0)
    with pytest.raises(Full):
        dwrite(d, [("topic", "z", {})], 0.0)
    dwrite(d, [("topic", "x", None)], 0.0)  # an existing key (a delete) still goes
    assert d.get("topic", "z") is None and d.get("topic", "x") is None


def test_a_whole_set_of_the_largest_values_travels_in_frames_a_peer_reads() -> None:
    """Each definition may be MAX_VALUE (512 KiB) as JSON; a whole set is offered in
    chunks, and every chunk must still decode on the other side (7 MiB frames)."""
    big = {"task": {"url": "http://x/", "body": "b" * (dm.MAX_VALUE - 64)}}
    assert len(json.dumps(big)) <= dm.MAX_VALUE
    entries = {("schedule", f"s{i}"): dm.Entry("schedule", f"s{i}", 1, i + 1, big)
               for i in range(20)}
    d = Definitions("a", entries=entries)
    offers = sends(dview(d, "a", 1, ("a", "b"), 0.0))
    assert sum(len(s.msg.entries) for s in offers) == 20
    for s in offers:
        frames = protocol.encode(s.msg.verb, s.msg.payload())
        # a chunk of CHUNK such values is about 4 MiB: half a frame, whatever the JSON adds
        assert sum(len(f) for f in frames) <= 4 * 1024 * 1024 + 64 * 1024
        verb, payload = protocol.decode(frames)
        assert len(m.decode(verb, payload).entries) == len(s.msg.entries)


def test_a_full_map_still_takes_newer_stamps_of_the_keys_it_holds(monkeypatch) -> None:
    from miyamoto.definitions import machine as definitions

    monkeypatch.setattr(definitions, "MAX_ENTRIES", 2)
    b = Definitions("b")
    dview(b, "a", 1, ("a", "b"), 0.0)
    old = [dm.Entry("topic", "x", 1, 1, {"v": 1}), dm.Entry("topic", "y", 1, 2, {"v": 1})]
    drecv(b, "a", dm.DefsPut(1, tuple(old), wid=1), 0.0)
    put = (dm.Entry("topic", "new", 1, 3, {}), dm.Entry("topic", "x", 1, 4, {"v": 2}),
           dm.Entry("topic", "y", 1, 5, {"v": 2}))
    drecv(b, "a", dm.DefsPut(1, put, wid=2), 0.0)  # no room for "new": the rest still merge
    assert b.get("topic", "new") is None
    assert b.get("topic", "x") == {"v": 2} and b.get("topic", "y") == {"v": 2}


def test_the_door_refuses_what_is_not_an_event() -> None:
    with pytest.raises(TypeError):
        Definitions("a").step("tick", 0.0)  # type: ignore[arg-type]


def test_a_refused_offer_is_answered_with_the_promise_that_refused_it() -> None:
    """A member that promised a higher term to another leader says so (term and owner),
    so the offering leader claims a term above it; it sends no set under a refusal."""
    b = Definitions("b")
    b.load([], 5, "x")
    dview(b, "a", 1, ("a", "b", "c"), 0.0)
    out = drecv(b, "a", wire(dm.DefsPut(3, (), want=True)), 0.0)
    assert [s.msg for s in sends(out)] == [dm.DefsDigest(5, b.digest(), "x")]
    a = Definitions("a")
    dview(a, "a", 1, ("a", "b", "c"), 0.0)
    again = drecv(a, "b", wire(sends(out)[0].msg), 0.1)
    assert a.dterm == 6 and {s.to for s in sends(again) if s.msg.want} == {"b", "c"}


def test_a_member_is_offered_the_whole_set_at_most_once_per_resend() -> None:
    """An offer answers a differing digest, but not twice within ``resend``: the answer
    to the first may be on its way (a member that lags would otherwise be flooded)."""
    d = Definitions("a", entries={("topic", "t"): dm.Entry("topic", "t", 1, 1, {})})
    assert len(sends(dview(d, "a", 1, ("a", "b", "c"), 0.0), dm.DefsPut)) == 2
    stale = dm.DefsDigest(1, "0" * 32, "a")
    assert drecv(d, "b", stale, 0.1) == []
    assert drecv(d, "b", stale, d.resend - 0.01) == []
    offer = sends(drecv(d, "b", stale, d.resend), dm.DefsPut)
    assert [(s.to, s.msg.want) for s in offer] == [("b", True)]


def test_an_offer_from_a_rival_claiming_the_same_term_does_not_count_as_its_set() -> None:
    """Two nodes that both took office from seen_term 0 both claim definitions term 1.
    A's offer to b (a want, never a whole-set answer) must not make b count a as synced:
    a promised term 1 to itself, not to b, and two ready leaders of one term would
    stamp different writes alike."""
    a, b = Definitions("a"), Definitions("b")
    offers = sends(dview(a, "a", 1, ("a", "b", "c"), 0.0), dm.DefsPut)
    dview(b, "b", 2, ("a", "b", "c"), 0.0)
    assert a.dterm == b.dterm == 1
    for s in offers:
        if s.to == "b":
            out = drecv(b, "a", wire(s.msg), 0.0)
            assert sends(out, dm.DefsDigest)  # refused: b promised term 1 to itself
    assert not b.ready
    with pytest.raises(NotLeader):
        dwrite(b, [("topic", "t", {})], 0.0)


def test_a_write_is_acked_alone_and_asks_for_no_set_back() -> None:
    """A write's DEFS_PUT is neither an offer nor the end of a whole set: the member
    persists and acks it, and sends nothing else."""
    d = ready_leader()
    wid, effects = dwrite(d, [("topic", "t", {"urls": []})], 0.0)
    put = sends(effects, dm.DefsPut)[0].msg
    b = Definitions("b")
    dview(b, "a", 1, ("a", "b", "c"), 0.0)
    out = drecv(b, "a", wire(put), 0.0)
    assert isinstance(out[0], Persist)
    assert [s.msg for s in sends(out)] == [dm.DefsAck(1, wid)]
    resent = [s.msg for s in sends(dtick(d, d.resend), dm.DefsPut)]
    assert resent and all(not p.want and not p.last and p.index is None for p in resent)
    assert [s.msg for s in sends(drecv(b, "a", wire(resent[0]), d.resend))] == [dm.DefsAck(1, wid)]
