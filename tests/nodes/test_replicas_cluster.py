"""The copies of a task across a cluster of real nodes: a STORE naming another holder is
not stored, a claim holds the siblings off a slow delivery, restored copies keep one
offset between fire times, and min_replicas refuses what a replica cannot store.

Behavioural only: real node processes, HTTP, the sink, metrics, and raw ZeroMQ frames
on the wire; nothing here knows the cluster layer's internals. Every "nothing happened"
check is paired with an event that must happen in the same window. Each test was shown
to fail with a one-line slip planted in the code it guards.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import pytest

from helpers import as_member as speak_as
from helpers import (metric, NodeProcess, Reply, cluster_view, dealer, member_ids, wait_converged,
                     wait_until)

OFFSET = 1.0  # FAST_OPTIONS replica_offset


def wait_no_live_copies(nodes: list[NodeProcess], timeout: float = 20.0) -> None:
    """Every copy on every running node has ended: nothing can be delivered any more."""
    wait_until(lambda: all(metric(n, "miyamoto_tasks_live") == 0 for n in nodes if n.running),
               timeout, interval=0.1, what="no live copies on any node")


def as_member(member_id: str) -> bytes:
    """A routing id the way a member's own DEALER spells it: its id, NUL, a random tag."""
    return member_id.encode() + b"\x00" + os.urandom(8)


def wire_task(url: str, replicas: list[str], replica: int, **extra: Any) -> dict[str, Any]:
    """A task record as STORE carries it."""
    now = time.time()
    h = os.urandom(16).hex()
    task_id = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"
    d = {"id": task_id, "queue": "default", "url": url, "method": "POST", "eta": now,
         "created": now, "fire_at": now, "state": "scheduled", "replicas": replicas,
         "replica": replica}
    d.update(extra)
    return d


def copies(node: NodeProcess, task_id: str) -> list[dict[str, Any]]:
    return node.task(task_id)["copies"]


# ================================================================ STORE for another holder


@pytest.mark.timeout(60)
def test_a_store_naming_another_node_as_holder_is_not_stored(cluster_factory, sink):
    nodes = cluster_factory(3)
    a, b, c = nodes
    stored_before = metric(b, "miyamoto_tasks_stored_total")
    bad = [wire_task(f"{sink.url}/bad", ["a"], 0),            # not b's at all
           wire_task(f"{sink.url}/bad", ["a", "b"], 0),       # b holds copy 1, not copy 0
           wire_task(f"{sink.url}/bad", ["b", "c"], 1),       # c's copy, sent to b
           wire_task(f"{sink.url}/bad", ["c", "a", "b"], 0)]
    good = wire_task(f"{sink.url}/good", ["b"], 0)  # the positive control: b's own copy
    s = dealer(b.cluster_addr, as_member("a"), **speak_as(a))  # a's own key: as a member
    for i, t in enumerate(bad):
        s.send_multipart([b"STORE", json.dumps({"req": f"bad-{i}", "reply_to": a.cluster_addr,
                                                "task": t}).encode()])
    s.send_multipart([b"STORE", json.dumps({"req": "good", "reply_to": a.cluster_addr,
                                            "task": good}).encode()])
    s.close()

    (req,) = sink.wait_for(count=1, path="/good", timeout=15)
    assert req.task_id == good["id"]
    b.wait_task_state(good["id"], "succeeded")
    wait_no_live_copies(nodes)
    assert metric(b, "miyamoto_tasks_stored_total") == stored_before + 1
    for t in bad:
        for n in nodes:
            r = n.get(f"/tasks/{t['id']}")
            assert r.status_code == 404, (t["replicas"], t["replica"], n.node_id, r.text)
    assert sink.count("/bad") == 0
    assert "dropped STORE" in b.log_text() or "dropped" in b.log_text()


# ================================================================ a claim holds siblings off


@pytest.mark.timeout(60)
def test_a_delivery_slower_than_the_replica_offset_is_delivered_once(cluster_factory, sink):
    nodes = cluster_factory(3)
    sink.reply("/slow", Reply(200, delay=2.5 * OFFSET))
    ids = [nodes[i % 3].enqueue(url=f"{sink.url}/slow", params={"i": str(i)})["id"]
           for i in range(6)]
    for i in ids:
        nodes[0].wait_task_state(i, "succeeded", timeout=20)
    # once every copy has ended nothing more can go out; a sibling not held off by the
    # claim fired one offset after its eta, while the first delivery was still running
    wait_no_live_copies(nodes)
    sink.wait_idle()
    counts = sink.by_task_id("/slow")
    assert counts == {i: 1 for i in ids}, counts


# ================================================================ replication 3: restored copies


@pytest.mark.timeout(90)
def test_restored_copies_keep_one_offset_between_fire_times_with_replication_3(cluster_factory):
    nodes = cluster_factory(4, options={"replication": 3})
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][-1]
    entry = next(n for n in nodes if n is not victim)
    held: dict[str, dict[str, float]] = {}  # task id -> surviving node -> next_attempt
    positions = set()
    for i in range(12):
        # an unnamed task's first copy stays on the node that took it: enqueue through
        # every node, so that the victim holds first copies too
        via = nodes[i % len(nodes)]
        got = via.enqueue(url="http://127.0.0.1:9/never", countdown=120,
                          params={"i": str(i)})
        assert len(got["replicas"]) == 3, got
        assert got["replicas"][0] == via.node_id, got
        if victim.node_id in got["replicas"]:
            positions.add(got["replicas"].index(victim.node_id))
            cs = copies(entry, got["id"])
            held[got["id"]] = {c["node"]: c["next_attempt"] for c in cs
                               if c["node"] != victim.node_id}
            fire = sorted(c["next_attempt"] for c in cs)
            assert [round(y - x, 2) for x, y in zip(fire, fire[1:])] == [OFFSET, OFFSET], cs
    assert positions == {0, 1, 2}, positions  # the victim held first, middle and last copies
    victim.kill()
    wait_converged([n for n in nodes if n is not victim], timeout=15)

    def restored() -> bool:
        for task_id in held:
            live = [c for c in copies(entry, task_id) if c["state"] == "scheduled"]
            if len(live) != 3 or victim.node_id in {c["node"] for c in live}:
                return False
        return True

    wait_until(restored, 20, what="three live copies of every task the victim held")
    for task_id, before in held.items():
        live = [c for c in copies(entry, task_id) if c["state"] == "scheduled"]
        # the survivors' copies did not move
        for c in live:
            if c["node"] in before:
                assert abs(c["next_attempt"] - before[c["node"]]) < 0.01, (c, before)
        # and the new copy fires one offset away from its nearest sibling: no two copies
        # fire together (their claims would cross: a duplicate)
        fire = sorted(c["next_attempt"] for c in live)
        gaps = [y - x for x, y in zip(fire, fire[1:])]
        assert all(abs(g - OFFSET) < 0.1 for g in gaps), (task_id, live, before)


# ================================================================ counts of tasks, not copies


def default_queue(node: NodeProcess) -> dict[str, Any]:
    r = node.get("/queues", timeout=10)
    assert r.status_code == 200, r.text
    return next(q for q in r.json()["queues"] if q["name"] == "default")


@pytest.mark.timeout(90)
def test_queue_counts_count_tasks_not_copies_after_a_replica_is_killed_and_restarted(
        cluster_factory, sink):
    """A node killed after 15 tasks were delivered and before 15 more are due: the
    first copies it holds are not there to count while it is down (the other copies
    count those tasks), the survivors restore its live copies elsewhere, and its own
    come back with it when it restarts (asking, they hear their tasks moved, and are
    dropped). GET /queues on every node says 30 tasks
    throughout (25, then 35, if first copies were added up); copies are counted apart."""
    nodes = cluster_factory(3, options={"replication": 2})
    victim = nodes[1]
    for i in range(15):  # through every node: the victim holds first copies too
        nodes[i % 3].enqueue(url=sink.url_for("/w"))
    sink.wait_for(count=15, path="/w", timeout=20)
    wait_no_live_copies(nodes)
    for i in range(15):
        nodes[i % 3].enqueue(url=sink.url_for("/w"), countdown=4)
    assert default_queue(nodes[0])["counts"]["scheduled"] == 15
    victim.kill()
    sink.wait_for(count=30, path="/w", timeout=40)
    survivors = [n for n in nodes if n is not victim]
    wait_no_live_copies(survivors)
    for n in survivors:
        assert default_queue(n)["counts"]["succeeded"] == 30, n.node_id
    victim.restart().wait_ready()
    wait_no_live_copies(nodes)  # the victim's stale copies asked and were told the end
    for n in nodes:
        q = default_queue(n)
        assert q["counts"] == {"scheduled": 0, "running": 0, "succeeded": 30, "failed": 0,
                               "cancelled": 0, "expired": 0}, (n.node_id, q)
        # two copies per task: the victim's stale ones, told their task moved, are gone
        assert q["copies"]["succeeded"] == 60, (n.node_id, q)


# ================================================================ min_replicas


def _refused_enqueue(cluster_factory, sink, countdown: float) -> tuple[list[NodeProcess], float]:
    """Two nodes, replication 2, min_replicas 2; one replica stopped (SIGSTOP) while a
    task is enqueued: 503. Returns the nodes (both running again) and when the 503 came."""
    # a long failure timeout keeps the stopped node in the roster: it is a replica that
    # does not answer, not a member that left
    nodes = cluster_factory(2, options={"replication": 2, "min_replicas": 2,
                                        "failure_timeout": 10.0})
    view = wait_converged(nodes)
    entry = next(n for n in nodes if n.node_id == view["leader"])
    other = next(n for n in nodes if n is not entry)
    other.signal(signal.SIGSTOP)
    try:
        r = entry.post("/queue", json={"url": f"{sink.url}/refused", "countdown": countdown},
                       timeout=15)
        refused_at = time.time()
        assert r.status_code == 503, (r.status_code, r.text)
        assert member_ids(cluster_view(entry)) == sorted(n.node_id for n in nodes)
    finally:
        other.signal(signal.SIGCONT)
    wait_converged(nodes, timeout=20)
    # the positive control: with both replicas up the same enqueue is taken and delivered
    ok = entry.enqueue(url=f"{sink.url}/taken")
    assert len(ok["replicas"]) == 2
    (req,) = sink.wait_for(count=1, path="/taken", timeout=15)
    assert req.task_id == ok["id"]
    entry.wait_task_state(ok["id"], "succeeded")
    wait_no_live_copies(nodes)
    return nodes, refused_at


@pytest.mark.timeout(60)
def test_min_replicas_refuses_an_enqueue_a_replica_cannot_store(cluster_factory, sink):
    # due after the replication timeout (2 s): the refusal cancels every copy in time
    _, refused_at = _refused_enqueue(cluster_factory, sink, countdown=3.0)
    assert sink.count("/refused") == 0, [(r.task_id, r.time - refused_at)
                                         for r in sink.requests("/refused")]


@pytest.mark.timeout(60)
def test_a_refused_enqueue_due_at_once_is_not_delivered(cluster_factory, sink):
    _, refused_at = _refused_enqueue(cluster_factory, sink, countdown=0)
    assert sink.count("/refused") == 0, [(r.task_id, r.time - refused_at)
                                         for r in sink.requests("/refused")]
