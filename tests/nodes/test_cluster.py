"""The cluster: real node processes (``python -m miyamoto serve``) on OS-assigned ports,
each seeded with every node's cluster address, and a real HTTP sink.

Timings are the fast test ones (conftest.FAST_OPTIONS): heartbeat 0.1 s, failure
timeout 1 s, elections 0.3-0.6 s, replica_offset 1 s. Every wait is a condition with a
deadline. Where a test must show that something did NOT happen (a duplicate delivery,
a sibling firing), it waits past the moment that thing would have happened (the last
replica's offset plus a margin) and then counts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import requests

from helpers import (metric, NodeProcess, as_member, dealer, Reply, cluster_view, member_ids, run_cli,
                     wait_converged, wait_until)

OFFSET = 1.0  # FAST_OPTIONS replica_offset


def enqueue(node: NodeProcess, **fields: Any) -> dict[str, Any]:
    return node.enqueue(**fields)


def others(nodes: list[NodeProcess], *exclude: NodeProcess) -> list[NodeProcess]:
    return [n for n in nodes if n not in exclude]


def by_id(nodes: list[NodeProcess], node_id: str) -> NodeProcess:
    (n,) = [n for n in nodes if n.node_id == node_id]
    return n


def duplicates(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v > 1}


# ================================================================ 1. one roster, one leader


@pytest.mark.timeout(60)
def test_three_nodes_agree_on_roster_and_leader(cluster_factory):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    views = [cluster_view(n) for n in nodes]
    assert {v["leader"] for v in views} == {view["leader"]}
    assert {v["term"] for v in views} == {view["term"]}
    assert view["term"] >= 1
    for n, v in zip(nodes, views):
        assert v["node"] == n.node_id
        assert member_ids(v) == ["a", "b", "c"]
        # the members carry their addresses, and exactly one is flagged leader
        assert {m["id"]: m["http"] for m in v["members"]} == {x.node_id: x.http_addr for x in nodes}
        assert {m["id"]: m["cluster"] for m in v["members"]} == \
            {x.node_id: x.cluster_addr for x in nodes}
        assert [m["id"] for m in v["members"] if m["leader"]] == [view["leader"]]
    roles = Counter(v["role"] for v in views)
    assert roles == {"leader": 1, "follower": 2}, roles
    leader_view = [v for v in views if v["role"] == "leader"]
    assert leader_view[0]["node"] == view["leader"]

    for n in nodes:
        cp = run_cli("status", "--json", "--server", n.url)
        assert cp.returncode == 0, cp.stderr
        out = json.loads(cp.stdout)
        assert out["cluster"]["leader"] == view["leader"]
        assert out["cluster"]["term"] == view["term"]
        assert member_ids(out["cluster"]) == ["a", "b", "c"]
        assert isinstance(out["queues"], list)


# ================================================================ 2. 1,000 tasks, each once


def wait_no_live_copies(nodes: list[NodeProcess], timeout: float = 20.0) -> None:
    """Every copy on every node has ended: nothing can be delivered any more."""
    def idle() -> bool:
        return all(metric(n, "miyamoto_tasks_live") == 0 for n in nodes if n.running)

    seen: dict[str, float] = {}
    try:
        wait_until(idle, timeout, interval=0.1, what="no live copies on any node")
    except AssertionError as e:
        stuck: list[Any] = []
        for n in nodes:
            if n.running:
                seen[n.node_id] = metric(n, "miyamoto_tasks_live")
                for state in ("scheduled", "running"):
                    r = n.get(f"/queues/default/tasks?state={state}&limit=20")
                    if r.status_code == 200:
                        stuck += [(n.node_id, t["id"], t["state"], t["replicas"], t["replica"],
                                   t["next_attempt"], t["attempts"]) for t in r.json()["tasks"]]
        raise AssertionError(f"{e}; live copies: {seen}; at {time.time():.3f} the queue lists "
                             f"(node, id, state, replicas, replica, next, attempts): "
                             f"{stuck[:20]}") from None


def spread_enqueues(nodes: list[NodeProcess], count: int, clients: int,
                    make: Any) -> list[dict[str, Any]]:
    """POST ``count`` tasks (``make(i)`` -> JSON fields), round robin over the nodes'
    HTTP ports, from ``clients`` threads with their own connections. Asserts every 200."""
    answers: list[Any] = [None] * count
    errors: list[str] = []

    def client(k: int) -> None:
        with requests.Session() as s:
            for i in range(k, count, clients):
                n = nodes[i % len(nodes)]
                try:
                    r = s.post(n.url + "/queue", json=make(i), timeout=15)
                except requests.RequestException as e:
                    errors.append(f"{i}: {e!r}")
                    continue
                if r.status_code != 200:
                    errors.append(f"{i} via {n.node_id}: {r.status_code} {r.text[:200]}")
                else:
                    answers[i] = dict(r.json(), via=n.node_id)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:10]
    return answers


@pytest.mark.timeout(120)
def test_thousand_tasks_over_three_nodes_each_delivered_once(cluster_factory, sink):
    nodes = cluster_factory(3)
    n_tasks = 1000
    t0 = time.monotonic()
    answers = spread_enqueues(nodes, n_tasks, 4,
                              lambda i: {"url": f"{sink.url}/spread", "params": {"i": str(i)}})
    ids = {a["id"] for a in answers}
    assert len(ids) == n_tasks
    # replication 2 on a ring of 3: two distinct replicas each, spread over all nodes
    assert all(len(a["replicas"]) == 2 and len(set(a["replicas"])) == 2 for a in answers)
    firsts = Counter(a["replicas"][0] for a in answers)
    assert set(firsts) == {"a", "b", "c"}, firsts
    print(f"enqueued {n_tasks} in {time.monotonic() - t0:.2f}s; first replicas {dict(firsts)}")

    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/spread", timeout=60)
    print(f"all delivered {time.monotonic() - t0:.2f}s after the first enqueue")
    wait_no_live_copies(nodes, timeout=30)
    counts = sink.by_task_id("/spread")
    dups = duplicates(counts)
    print(f"duplicates: {len(dups)}")
    assert set(counts) == ids, f"unknown task ids delivered: {set(counts) - ids}"
    assert not dups, f"{len(dups)} tasks delivered more than once: {list(dups.items())[:10]}"
    assert sink.count("/spread") == n_tasks
    # the queue's counts are the cluster's: each task once, whichever node is asked
    for n in nodes:
        wait_until(lambda: n.counts("default")["succeeded"] == n_tasks, 10,
                   what=f"{n.node_id} to count {n_tasks} succeeded")
        assert n.counts("default") == {"scheduled": 0, "running": 0, "succeeded": n_tasks,
                                       "failed": 0, "cancelled": 0, "expired": 0}

    # a node that holds no copy answers for the task, from its siblings
    checked = 0
    for a in answers[:60]:
        outsider = [n for n in nodes if n.node_id not in a["replicas"]]
        assert len(outsider) == 1
        t = outsider[0].task(a["id"])
        assert t["id"] == a["id"] and t["state"] == "succeeded", t
        assert t["attempts"] == 1 and t["last_response"]["status"] == 200, t
        assert {c["node"] for c in t["copies"]} == set(a["replicas"]), t["copies"]
        assert {c["state"] for c in t["copies"]} == {"succeeded"}, t["copies"]
        checked += 1
    assert checked == 60


# ================================================================ 3. the leader dies


@pytest.mark.timeout(60)
def test_kill_9_leader_elects_a_new_leader_and_survivors_serve(cluster_factory, sink):
    nodes = cluster_factory(3)
    before = wait_converged(nodes)
    old = by_id(nodes, before["leader"])
    survivors = others(nodes, old)

    t_kill = time.monotonic()
    old.kill()
    seen: dict[str, Any] = {}

    def new_leader() -> str | None:
        views = [cluster_view(n, timeout=1) for n in survivors]
        seen.update({v["node"]: (v["leader"], v["term"], v["role"]) for v in views})
        leaders = {v["leader"] for v in views}
        if len(leaders) != 1 or None in leaders or old.node_id in leaders:
            return None
        if not all(v["term"] > before["term"] for v in views):
            return None
        if sum(v["role"] == "leader" for v in views) != 1:
            return None
        return leaders.pop()

    try:
        leader = wait_until(new_leader, 5.0, interval=0.01, what="a new leader on the survivors")
    except AssertionError as e:
        raise AssertionError(f"{e}; survivors saw (leader, term, role): {seen}") from None
    elapsed = time.monotonic() - t_kill
    print(f"\nleader {old.node_id} killed -> new leader {leader} after {elapsed:.3f}s "
          f"(term {before['term']} -> {seen[leader][1]})")
    assert leader != old.node_id and leader in {n.node_id for n in survivors}

    # enqueue at once on both survivors (the dead leader may still be in the roster)
    ids = set()
    for i in range(20):
        a = enqueue(survivors[i % 2], url=f"{sink.url}/after", params={"i": str(i)})
        ids.add(a["id"])
    view = wait_converged(survivors, timeout=10)  # the dead leader is dropped
    assert view["leader"] == leader and old.node_id not in member_ids(view)
    for i in range(20):
        a = enqueue(survivors[i % 2], url=f"{sink.url}/after", params={"i": str(20 + i)})
        assert set(a["replicas"]) == {n.node_id for n in survivors}, a
        ids.add(a["id"])
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/after", timeout=20)
    wait_no_live_copies(survivors)
    assert not duplicates(sink.by_task_id("/after"))


# ================================================================ 4. the first replica dies


def batch_enqueue(node: NodeProcess, tasks: list[dict[str, Any]],
                  queue: str = "default") -> list[dict[str, Any]]:
    r = node.post(f"/queue/{queue}/batch", json=tasks, timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:500])
    results = r.json()["tasks"]
    assert all(x["status"] == "scheduled" for x in results), \
        [x for x in results if x["status"] != "scheduled"][:5]
    return results


@pytest.mark.timeout(90)
@pytest.mark.parametrize("who", ["follower", "leader"])
def test_kill_9_first_replica_of_delayed_tasks_loses_none(cluster_factory, sink, who):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    victim = by_id(nodes, view["leader"]) if who == "leader" else \
        next(n for n in nodes if n.node_id != view["leader"])
    entry = others(nodes, victim)
    countdown = 2.0

    answers: list[dict[str, Any]] = []
    mine: list[dict[str, Any]] = []  # the victim fires these first
    k = 0
    while len(mine) < 200:
        # an unnamed task's first copy stays on the node that took it: every other
        # batch goes through the victim
        via = victim if k % 2 == 0 else entry[k // 2 % 2]
        got = batch_enqueue(via, [{"url": f"{sink.url}/first", "countdown": countdown,
                                   "params": {"k": str(k), "i": str(i)}}
                                  for i in range(100)])
        answers += got
        mine += [a for a in got if a["replicas"][0] == victim.node_id]
        k += 1
    victim.kill()
    killed_at = time.time()
    first_eta = min(a["eta"] for a in mine)
    print(f"\n{len(answers)} tasks, {len(mine)} first on the {who} {victim.node_id}; "
          f"killed {first_eta - killed_at:.2f}s before the first eta")
    assert killed_at < first_eta - 0.2, "too slow to enqueue: the victim was killed too late"
    assert all(len(set(a["replicas"])) == 2 for a in answers)

    ids = {a["id"] for a in answers}
    mine_ids = {a["id"] for a in mine}
    last_eta = max(a["eta"] for a in answers)
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/first",
                  timeout=max(5.0, last_eta - time.time()) + 15)
    delivered_at = {r.task_id: r.time for r in sink.requests("/first")}
    late = max(delivered_at[a["id"]] - a["eta"] for a in mine)
    wait_no_live_copies(entry)
    counts = sink.by_task_id("/first")
    assert set(counts) == ids
    dups = duplicates(counts)
    dups_mine = {k: v for k, v in dups.items() if k in mine_ids}
    print(f"delivered all {len(ids)} (latest of the victim's {late:.2f}s after its eta); "
          f"duplicates: {len(dups)} ({len(dups_mine)} of the victim's tasks)")
    assert len(dups) <= 2, f"{len(dups)} duplicates: {list(dups.items())[:10]}"
    # the sibling fired them: about one offset after the eta, not much later
    assert late < 2 * OFFSET + 3.0, late


# ================================================================ 5. a node dies mid-stream


@pytest.mark.timeout(90)
def test_kill_9_member_during_enqueue_stream_loses_no_acknowledged_task(cluster_factory, sink):
    # a copy that the victim had claimed (CLAIM sent, DONE not) would hold its siblings off
    # for the queue timeout plus claim_lease (60 s here); the survivors must release it as
    # soon as the victim leaves the roster, or this test times out
    nodes = cluster_factory(3, options={"claim_lease": 60})
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][-1]
    entry = others(nodes, victim)

    acked: dict[str, dict[str, Any]] = {}
    refused: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    sent = Counter()

    def client(k: int) -> None:
        n = entry[k % 2]
        i = 0
        deadline = time.monotonic() + 20  # bounded even if the main thread dies
        with requests.Session() as s:
            while not stop.is_set() and time.monotonic() < deadline:
                i += 1
                fields = {"url": f"{sink.url}/stream", "params": {"c": str(k), "i": str(i)}}
                if i % 3 == 0:
                    fields["countdown"] = 0.5
                try:
                    r = s.post(n.url + "/queue", json=fields, timeout=15)
                except requests.RequestException as e:
                    with lock:
                        errors.append(repr(e))
                    continue
                with lock:
                    sent[n.node_id] += 1
                    if r.status_code == 200:
                        acked[r.json()["id"]] = r.json()
                    elif r.status_code == 503:
                        refused.append(r.text)
                    else:
                        errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 300, 20, what="300 acknowledged enqueues")
        victim.kill()
        with lock:
            at_kill = len(acked)
        wait_until(lambda: len(acked) >= at_kill + 300, 30,
                   what="300 more acknowledged enqueues after the kill")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:10]
    on_victim = sum(1 for a in acked.values() if victim.node_id in a["replicas"])
    print(f"\nacked {len(acked)} ({at_kill} before the kill, {on_victim} with a copy on "
          f"{victim.node_id}), 503: {len(refused)}, sent per node {dict(sent)}")
    assert on_victim > 100  # the victim held copies of many acknowledged tasks

    ids = set(acked)
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/stream", timeout=30)
    wait_no_live_copies(entry)
    counts = sink.by_task_id("/stream")
    missing = ids - set(counts)
    assert not missing
    dups = duplicates(counts)
    print(f"duplicates: {len(dups)} of {len(ids)}; 503 answers: {len(refused)}")
    for d in list(dups)[:5]:
        times = [round(r.time - acked[d]["eta"], 3) for r in sink.requests("/stream")
                 if r.task_id == d]
        print(f"  {d} replicas {acked[d]['replicas']} delivered at eta + {times}")
    assert len(dups) <= max(3, len(ids) // 100), f"{len(dups)} duplicates"
    # what was refused was not delivered either, apart from a best-effort cancel race
    assert len(set(counts) - ids) <= len(refused)


# ================================================================ 6. a node comes back


@pytest.mark.timeout(90)
def test_restarted_node_rejoins_serves_and_does_not_redeliver(cluster_factory, sink):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][0]
    entry = others(nodes, victim)

    answers = []
    for k in range(2):
        answers += batch_enqueue(entry[k], [{"url": f"{sink.url}/held", "countdown": 1.5,
                                             "params": {"k": str(k), "i": str(i)}}
                                            for i in range(60)])
    held = {a["id"] for a in answers if victim.node_id in a["replicas"]}
    assert len(held) >= 40, len(held)  # 2 of 3 nodes hold each task
    victim.kill()
    assert time.time() < min(a["eta"] for a in answers), "killed too late"

    ids = {a["id"] for a in answers}
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/held", timeout=20)
    wait_no_live_copies(entry)
    view = wait_converged(entry)
    assert victim.node_id not in member_ids(view)
    assert not duplicates(sink.by_task_id("/held"))
    before = sink.count("/held")

    victim.start().wait_ready(20)
    view = wait_converged(nodes, timeout=20)  # in every node's roster again
    assert cluster_view(victim)["leader"] == view["leader"]
    assert member_ids(cluster_view(victim)) == sorted(n.node_id for n in nodes)

    # it serves: enqueue through it, and it answers for tasks it held
    fresh = {enqueue(victim, url=f"{sink.url}/back", params={"i": str(i)})["id"]
             for i in range(12)}
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= fresh, path="/back", timeout=15)
    some = next(iter(held))
    assert victim.task(some)["state"] == "succeeded"

    # the copies it reloaded from its journal were delivered by its siblings while it was
    # away: after it came back they must not go out a second time
    wait_no_live_copies(nodes)
    assert sink.count("/held") == before, \
        f"redelivered after the restart: {duplicates(sink.by_task_id('/held'))}"
    assert not duplicates(sink.by_task_id("/back"))


# ================================================================ 7. garbage on the cluster port


def roster_state(node: NodeProcess) -> tuple:
    v = cluster_view(node)
    return (v["leader"], v["term"], v["version"], tuple(member_ids(v)))


def envelope(node_id: str, term: Any = 0, **extra: Any) -> dict[str, Any]:
    """What every membership message carries (stale term 0 unless told)."""
    p = {"term": term, "inc": "0123456789abcdef",
         "from": {"id": node_id, "cluster": "tcp://127.0.0.1:9", "http": "127.0.0.1:9"}}
    p.update(extra)
    return p


def malformed_messages(target: NodeProcess, member: str, live_id: str) -> list[list[bytes]]:
    """Frames (after the identity) that a node must log and drop, whatever they claim."""
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    roster = {"version": 1, "term": 0, "leader": member, "floor": 0,
              "members": [{"id": member, "cluster": "tcp://127.0.0.1:9", "http": "h:1"}]}
    me = target.node_id
    task = {"id": "t-" + uuid.uuid4().hex, "queue": "default", "url": "http://127.0.0.1:9/",
            "method": "POST", "eta": time.time(), "fire_at": time.time(),
            "replicas": [me], "replica": 0}
    return [
        # framing
        [b"JOIN"], [b"JOIN", b"{}", b"extra"], [b"JOIN", b"{}", b"x", b"y", b"z"],
        [b""], [b"", b""], [b"NOPE", b"{}"], [b"join", b"{}"], [b"\xff\xfe", b"{}"],
        [b"JOIN", b""], [b"JOIN", b"\xff\xfe not json"], [b"JOIN", b"{\"a\": "],
        [b"JOIN", b"[1, 2, 3]"], [b"JOIN", b"null"], [b"HEARTBEAT", b"\"string\""],
        [b"ROSTER", b"42"], [b"STORE", b"[" * 100_000 + b"]" * 100_000],
        [b"STORE", b"{\"x\": \"" + b"a" * (4 * 1024 * 1024 + 10) + b"\"}"],
        # membership: missing keys, wrong types
        [b"JOIN", j({})], [b"JOIN", j({"term": 0})], [b"JOIN", j(envelope(member, term="1"))],
        [b"JOIN", j(envelope(member, term=-1))], [b"JOIN", j(envelope(member, term=True))],
        [b"JOIN", j(envelope(member, term=2**60))], [b"JOIN", j(dict(envelope(member), inc=5))],
        [b"JOIN", j(dict(envelope(member), **{"from": {"id": 7}}))],
        [b"JOIN", j(dict(envelope(member), **{"from": "a"}))],
        [b"JOIN", j(envelope("someone-else"))],  # payload names another node than the identity
        [b"HEARTBEAT", j(envelope(member))],  # no roster
        [b"HEARTBEAT", j(envelope(member, roster="members"))],
        [b"HEARTBEAT", j(envelope(member, roster=dict(roster, members="a,b")))],
        [b"HEARTBEAT", j(envelope(member, roster=dict(roster, version="2")))],
        [b"HEARTBEAT", j(envelope(member, roster=dict(roster, members=[1, 2])))],
        [b"HEARTBEAT", j(envelope(member, roster=dict(roster, leader="nobody")))],
        [b"ROSTER", j(envelope(member, roster=None))],
        [b"ROSTER", j(envelope(member, roster=dict(roster, members=[roster["members"][0]] * 2)))],
        [b"ROSTER", j(envelope(member, roster=dict(roster, floor="x")))],
        [b"HEARTBEAT_ACK", j(envelope(member, ok="yes", rterm=0, version=0))],
        [b"VOTE_REQUEST", j(envelope(member, rterm="x", version=None))],
        [b"VOTE_REQUEST", j(envelope(member, boot="all", rterm=0, version=0))],
        [b"VOTE", j(envelope(member, granted="yes"))],
        [b"REDIRECT", j(envelope(member, leader=None, address=5))],
        [b"LEAVE", j({"term": 0})],
        # replication: missing keys, wrong types
        [b"STORE", j({})], [b"STORE", j({"req": "r", "task": "t"})],
        [b"STORE", j({"req": "r", "task": dict(task, url=None)})],
        [b"STORE", j({"req": "r", "task": dict(task, replicas="abc")})],
        [b"STORE", j({"req": "r", "task": dict(task, replica="0")})],
        [b"STORE", j({"req": "r", "task": dict(task, method="BREW")})],
        [b"STORE", j({"req": "r", "task": dict(task, state="exploded")})],
        [b"STORE", j({"req": "r", "task": dict(task, unknown_field=1)})],
        [b"STORE", j({"req": "r", "task": dict(task, replicas=["not-me"])})],
        [b"STORE", j({"req": 5, "task": task})], [b"STORE", j({"task": task})],
        [b"STORED", j({"req": ["x"]})], [b"REPLY", j({"req": None, "ok": True})],
        [b"DONE", j({})], [b"DONE", j({"id": 5})], [b"DONE", j({"id": ""})],
        [b"DONE", j({"id": live_id})], [b"DONE", j({"id": live_id, "attempts": "1"})],
        [b"DONE", j({"id": live_id, "attempts": 1, "last": "ok"})],
        [b"FAILED", j({"id": live_id, "attempts": None})],
        [b"RETRY", j({"id": live_id, "replica": 0, "fire_at": "later", "attempts": 1})],
        [b"RETRY", j({"id": live_id, "replica": "0", "fire_at": 1.0, "attempts": 1})],
        [b"CLAIM", j({"id": live_id, "replica": 0})],
        [b"CLAIM", j({"id": live_id, "replica": 0, "until": "forever"})],
        [b"CLAIM", j({"id": live_id, "replica": 0.5, "until": 1.0})],
        [b"CANCEL", j({"id": [live_id]})], [b"CANCEL", j({})],
        [b"HANDOFF", j({"tasks": "all"})], [b"HANDOFF", j({})],
        [b"HANDOFF", j({"tasks": [[live_id], [5, 1.0], [live_id, "now"], "x"]})],
        [b"REPLICAS", j({"id": live_id, "replicas": "ab"})],
        [b"REPLICAS", j({"id": live_id, "replicas": [1, 2]})],
        [b"REQUEST", j({})], [b"REQUEST", j({"req": "r", "op": "drop-everything"})],
        [b"REQUEST", j({"req": "r", "op": "cancel", "args": {"id": 5}})],
        [b"REQUEST", j({"req": "r", "op": "control", "args": {"queue": "default",
                                                             "action": "purge-all"}})],
        [b"REQUEST", j({"req": "r", "op": "list", "args": {"queue": "default", "state": "x",
                                                          "limit": 1}})],
        [b"REQUEST", j({"req": "r", "op": "get", "args": [1]})],
    ]


@pytest.mark.timeout(90)
def test_garbage_on_the_cluster_port_changes_nothing(cluster_factory, sink):
    # timeouts that outlast the stall a flood of multi-MiB frames causes on a loaded box
    # (seen: 1.5 s): the roster must stay as it was because of what the garbage says,
    # not be changed by an election the load alone set off
    nodes = cluster_factory(3, options={"failure_timeout": 4.0, "election_timeout_min": 3.0,
                                        "election_timeout_max": 4.0})
    wait_converged(nodes)
    before = {n.node_id: roster_state(n) for n in nodes}
    assert len({s for s in before.values()}) == 1, before
    # a delayed task with copies on every node it names: the malformed DONE/CANCEL/CLAIM
    # messages aimed at it must not end it, push it back or pull it in
    marker = enqueue(nodes[0], url=f"{sink.url}/marker", countdown=4)
    t_enq = time.time()

    # 1. raw TCP: random bytes, a ZMTP greeting followed by junk, a connection left open
    import os

    held_open = []
    for n in nodes:
        for blob in (os.urandom(64 * 1024), b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00NULL" + b"\x00" * 16
                     + os.urandom(4096), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
            s = socket.create_connection(("127.0.0.1", n.cluster_port), timeout=5)
            s.sendall(blob)
            s.close()
        s = socket.create_connection(("127.0.0.1", n.cluster_port), timeout=5)
        s.sendall(os.urandom(7))
        held_open.append(s)

    # 2. a raw DEALER: no identity, made-up identities (a member's: see the next test)
    sent = 0
    for n in nodes:
        for identity in (None, b"intruder", b"z" * 255):
            s = dealer(n.cluster_addr, identity)
            who = identity.decode() if identity else "anonymous"
            for frames in malformed_messages(n, who, marker["id"]):
                s.send_multipart(frames)
                sent += 1
            s.close()
    # 3. the same from a DEALER with a member's routing id (as a member's own DEALER
    # spells it), ending with a valid CANCEL of a control task: a message that must
    # take effect, sent after the garbage on the same connection, so once it has, the
    # garbage before it has been read (the positive control for "nothing changed")
    control = enqueue(nodes[0], url=f"{sink.url}/control", countdown=4)
    for n in nodes:
        m = next(m for m in nodes if m is not n)
        member = m.node_id  # its own key: a member is heard only from the key it joined with
        s = dealer(n.cluster_addr, member.encode() + b"\x00" + os.urandom(8), **as_member(m))
        for frames in malformed_messages(n, member, marker["id"]):
            s.send_multipart(frames)
            sent += 1
        s.send_multipart([b"CANCEL", json.dumps({"id": control["id"]}).encode()])
        s.close()
    for s in held_open:
        s.close()
    print(f"\nsent {sent} malformed messages")

    def control_cancelled() -> bool:
        got = nodes[1].task(control["id"])
        return got["state"] == "cancelled" and \
            [c["state"] for c in got["copies"]] == ["cancelled"] * len(control["replicas"])

    wait_until(control_cancelled, 15, what="the control task cancelled on every copy")
    for n in nodes:
        assert n.running, f"{n.node_id} died:\n{n.log_text(60)}"
    after = {n.node_id: roster_state(n) for n in nodes}
    assert after == before, (before, after)
    wait_converged(nodes, timeout=5)

    # nothing a peer sent raised out of a handler, and the bad input was noticed
    for n in nodes:
        text = n.log_text()
        assert "Traceback" not in text and "on_message failed" not in text, \
            f"{n.node_id}:\n{n.log_text(80)}"
        assert "dropped" in text

    # the cluster still works: the marker fires at its eta (not earlier, not later),
    # once, and new tasks are delivered
    t = nodes[1].task(marker["id"])
    assert t["state"] == "scheduled", t
    ids = {enqueue(n, url=f"{sink.url}/after-garbage")["id"] for n in nodes for _ in range(5)}
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/after-garbage", timeout=15)
    (m,) = sink.wait_for(count=1, path="/marker", timeout=15)
    assert m.task_id == marker["id"]
    assert marker["eta"] - 0.05 <= m.time < marker["eta"] + OFFSET - 0.1, \
        (m.time - marker["eta"], m.time - t_enq)
    wait_no_live_copies(nodes)
    assert sink.count("/marker") == 1
    assert sink.count("/control") == 0
    assert not duplicates(sink.by_task_id("/after-garbage"))


@pytest.mark.timeout(60)
def test_a_dealer_spoofing_a_member_id_changes_nothing(cluster_factory, sink):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    leader = by_id(nodes, view["leader"])
    follower = next(n for n in nodes if n is not leader)
    before = {n.node_id: roster_state(n) for n in nodes}
    for _ in range(3):
        s = dealer(leader.cluster_addr, follower.node_id.encode())
        s.send_multipart([b"NOPE", b"{}"])
        time.sleep(0.3)  # the spoofing connection stays up across a few heartbeats
        s.close()
        time.sleep(0.5)
    # positive controls: the leader read the spoofed frames (and dropped them) ...
    wait_until(lambda: "NOPE" in leader.log_text(), 5, what="the leader to log the NOPE")
    # ... and the follower's own traffic to the leader still works: tasks enqueued on it
    # now, due after two failure timeouts (when a cut-off follower would have been
    # dropped), are stored on the leader too and delivered
    tasks = [enqueue(follower, url=f"{sink.url}/after-spoof", countdown=2 * 1.0 + 0.5)
             for _ in range(4)]
    assert any(leader.node_id in t["replicas"] for t in tasks), tasks
    for t in tasks:
        got = follower.task(t["id"])
        assert sorted(c["node"] for c in got["copies"]) == sorted(t["replicas"]), got
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= {t["id"] for t in tasks},
                  path="/after-spoof", timeout=15)
    for n in nodes:
        assert n.running, f"{n.node_id} died:\n{n.log_text(20)}"
    after = {n.node_id: roster_state(n) for n in nodes}
    assert after == before
    heard = {m["id"]: m["last_heard"] for m in cluster_view(leader)["members"]}
    assert heard[follower.node_id] < 1.0, heard


# ================================================================ 8. CurveZMQ


def keygen() -> tuple[str, str]:
    cp = run_cli("keygen")
    assert cp.returncode == 0, cp.stderr
    keys = dict(line.split(" = ", 1) for line in cp.stdout.splitlines() if " = " in line)
    assert "[miyamoto]" in cp.stdout.splitlines()  # after a comment line that names --env-file
    assert len(keys["curve_public"]) == 40 and len(keys["curve_secret"]) == 40
    return keys["curve_public"], keys["curve_secret"]


@pytest.mark.timeout(90)
def test_curve_cluster_admits_only_its_key(cluster_factory, node_factory, sink):
    public, secret = keygen()
    other_public, other_secret = keygen()
    assert public != other_public
    nodes = cluster_factory(3, options={"curve_public": public, "curve_secret": secret})
    view = wait_converged(nodes)
    seeds = [n.cluster_addr for n in nodes]
    for n in nodes:
        assert "(CurveZMQ)" in n.log_text()

    # a fourth node with another key pair, and a fifth with none, seed at them
    wrong_key = node_factory("d", seeds=seeds, ready=False,
                             options={"curve_public": other_public, "curve_secret": other_secret})
    no_key = node_factory("e", seeds=seeds, ready=False,
                          options={"curve_public": "", "curve_secret": "",
                                   "insecure_cluster": "true"})

    # a task to cancel, and the cluster's copies of it (countdown long enough to try)
    target = enqueue(nodes[0], url=f"{sink.url}/curve", countdown=3)
    control = enqueue(nodes[0], url=f"{sink.url}/control", countdown=3)

    # raw DEALERs: no CURVE at all, and CURVE with the server's public key but a client
    # key pair that is not the cluster's (CURVE alone would admit it; ZAP must not)
    import zmq

    for n in nodes:
        for curve in (None, (other_public.encode(), other_secret.encode(), public.encode())):
            s = dealer(n.cluster_addr, b"intruder", curve)
            s.setsockopt(zmq.LINGER, 500)
            s.send_multipart([b"CANCEL", json.dumps({"id": target["id"]}).encode()])
            s.send_multipart([b"HANDOFF", json.dumps({"tasks": [[target["id"], 0]]}).encode()])
            s.close()
    # the positive control: a member's own key pair, under its id, with the proof of the
    # cluster's secret, gets a CANCEL through (under another id, or from another key, it
    # would be dropped: only members are obeyed, each from its own key)
    for n in nodes:
        o = next(o for o in nodes if o is not n)
        member = o.node_id.encode() + b"\x00" + os.urandom(8)
        s = dealer(n.cluster_addr, member, **as_member(o, public.encode()),
                   cluster=(public, secret))
        s.send_multipart([b"CANCEL", json.dumps({"id": control["id"]}).encode()])
        s.close()

    (req,) = sink.wait_for(count=1, path="/curve", timeout=15)
    assert req.task_id == target["id"]
    assert req.time >= target["eta"] - 0.05, "pulled in by a HANDOFF without the key"
    assert nodes[1].wait_task_state(target["id"], "succeeded")["attempts"] == 1
    assert nodes[1].wait_task_state(control["id"], "cancelled")
    assert sink.count("/control") == 0

    # neither outsider was admitted, after several join retries and failure timeouts,
    # while a node with the cluster's key pair, started after them with the same seeds,
    # joins (the positive control: joining works in that window)
    insider = node_factory("f", seeds=seeds, ready=False,
                           options={"curve_public": public, "curve_secret": secret})
    wait_converged(nodes + [insider], timeout=20)
    assert insider.get("/readyz").status_code == 200
    for n in nodes:
        leader, term, version, members = roster_state(n)
        assert (term, members) == (view["term"], ("a", "b", "c", "f")), cluster_view(n)
        assert version > view["version"], cluster_view(n)
    for outsider in (wrong_key, no_key):
        assert outsider.running
        assert outsider.get("/readyz").status_code == 503
        v = cluster_view(outsider)
        assert v["leader"] is None and set(member_ids(v)) <= {outsider.node_id}, v
    denied = [n for n in nodes if "not the cluster key" in n.log_text()]
    assert denied, "no node logged a refused CURVE client"
    assert sink.count("/control") == 0


# ================================================================ 9. one name, three nodes, same moment


@pytest.mark.timeout(90)
def test_named_duplicates_on_different_nodes_at_once(cluster_factory, sink):
    nodes = cluster_factory(3)
    names = [f"order-{uuid.uuid4().hex[:8]}-{i}" for i in range(10)]
    winners: dict[str, str] = {}
    for name in names:
        barrier = threading.Barrier(len(nodes))
        results: list[Any] = [None] * len(nodes)

        def post(k: int) -> None:
            with requests.Session() as s:
                body = {"url": f"{sink.url}/named", "name": name, "countdown": 0.5,
                        "params": {"via": nodes[k].node_id}}
                s.get(nodes[k].url + "/healthz", timeout=5)  # connected before the barrier
                barrier.wait(10)
                r = s.post(nodes[k].url + "/queue/names", json=body, timeout=15)
                results[k] = (r.status_code, r.json())

        threads = [threading.Thread(target=post, args=(k,)) for k in range(len(nodes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        statuses = sorted(r[0] for r in results)
        assert statuses == [200, 409, 409], (name, results)
        (ok,) = [r[1] for r in results if r[0] == 200]
        assert ok["status"] == "scheduled" and ok["name"] == name
        for code, body in results:
            if code == 409:
                assert body == {"status": "duplicate", "id": ok["id"]}, (name, results)
        winners[name] = ok["id"]

    ids = set(winners.values())
    assert len(ids) == len(names)
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/named", timeout=15)
    wait_no_live_copies(nodes)
    counts = sink.by_task_id("/named")
    assert counts == {i: 1 for i in ids}, counts
    for r in sink.requests("/named"):
        assert winners[r.headers["X-Task-Name"]] == r.task_id
    # and later enqueues of those names, on any node, are refused with the same id
    for i, name in enumerate(names[:3]):
        r = nodes[i].post("/queue/names", json={"url": f"{sink.url}/named", "name": name})
        assert r.status_code == 409 and r.json() == {"status": "duplicate", "id": winners[name]}


# ================================================================ 10. cancel, pause, purge cluster-wide


@pytest.mark.timeout(90)
def test_cancel_from_a_non_replica_cancels_every_copy(cluster_factory, sink):
    nodes = cluster_factory(3)
    tasks = [enqueue(nodes[i % 3], url=f"{sink.url}/cancel", countdown=2.0) for i in range(6)]
    keep = enqueue(nodes[0], url=f"{sink.url}/kept", countdown=2.0)
    # due after every copy's fire time (eta + offset): once it arrived, they would have
    late = enqueue(nodes[1], url=f"{sink.url}/late",
                   eta=max(t["eta"] for t in tasks) + OFFSET + 0.5)
    assert len({tuple(t["replicas"]) for t in tasks}) > 1
    for t in tasks:
        outsider = next(n for n in nodes if n.node_id not in t["replicas"])
        r = outsider.delete(f"/tasks/{t['id']}")
        assert r.status_code == 200, r.text
        assert r.json()["id"] == t["id"] and r.json()["state"] == "cancelled", r.json()
    for t in tasks:
        for n in nodes:
            got = n.task(t["id"])
            assert got["state"] == "cancelled", (n.node_id, got)
            assert [c["state"] for c in got["copies"]] == ["cancelled"] * 2, got["copies"]
    # past every copy's fire time (eta + offset) and the marker's delivery: nothing went out
    sink.wait_for(count=1, path="/kept", timeout=10)
    (req,) = sink.wait_for(count=1, path="/late", timeout=10)
    assert req.task_id == late["id"]
    assert sink.count("/cancel") == 0
    # cancelling again is idempotent; a finished task cannot be cancelled
    assert nodes[0].delete(f"/tasks/{tasks[0]['id']}").status_code == 200
    nodes[0].wait_task_state(keep["id"], "succeeded")
    assert nodes[1].delete(f"/tasks/{keep['id']}").status_code == 409
    wait_no_live_copies(nodes)


@pytest.mark.timeout(90)
def test_pause_and_resume_on_one_node_act_cluster_wide(cluster_factory, sink):
    nodes = cluster_factory(3, queues={"pq": {}})  # declared: a pause creates no queue
    r = nodes[0].post("/queues/pq/pause")
    assert r.status_code == 200 and r.json()["action"] == "pause", r.text
    for n in nodes:
        assert n.get("/queues/pq").json()["paused"] is True, n.node_id
    ids = {enqueue(nodes[i % 3], url=f"{sink.url}/paused", queue="pq")["id"] for i in range(30)}
    marker = enqueue(nodes[1], url=f"{sink.url}/unpaused")  # another queue still runs
    # due once both copies of every paused task have been due for a while: when it has
    # arrived, they would have too (the positive control for "nothing was delivered")
    late = enqueue(nodes[2], url=f"{sink.url}/unpaused", countdown=OFFSET + 1.5)
    sink.wait_for(lambda reqs: {x.task_id for x in reqs} >= {marker["id"], late["id"]},
                  path="/unpaused", timeout=15)
    assert sink.count("/paused") == 0
    counts = nodes[2].counts("pq")
    assert counts["scheduled"] == len(ids) and counts["succeeded"] == 0, counts

    r = nodes[2].post("/queues/pq/resume")
    assert r.status_code == 200, r.text
    for n in nodes:
        assert n.get("/queues/pq").json()["paused"] is False, n.node_id
    sink.wait_for(lambda reqs: {x.task_id for x in reqs} >= ids, path="/paused", timeout=15)
    wait_no_live_copies(nodes)
    dups = duplicates(sink.by_task_id("/paused"))
    assert not dups, f"{len(dups)} of {len(ids)} delivered twice after the resume: {dups}"
    assert marker["id"] in sink.by_task_id("/unpaused")


@pytest.mark.timeout(90)
def test_purge_on_one_node_cancels_the_queue_everywhere(cluster_factory, sink):
    nodes = cluster_factory(3)
    doomed = [enqueue(nodes[i % 3], url=f"{sink.url}/purged", queue="pg", countdown=2.5)
              for i in range(24)]
    kept = [enqueue(nodes[i % 3], url=f"{sink.url}/other", queue="other", countdown=2.5)
            for i in range(6)]
    assert {t["replicas"][0] for t in doomed} == {"a", "b", "c"}
    # due after every doomed copy's fire time: once it arrived, they would have
    late = enqueue(nodes[0], url=f"{sink.url}/late", queue="other",
                   eta=max(t["eta"] for t in doomed) + OFFSET + 0.5)
    r = nodes[1].post("/queues/pg/purge")
    assert r.status_code == 200, r.text
    assert r.json()["purged"] == len(doomed), r.json()
    for t in doomed[:6]:
        got = nodes[(doomed.index(t) + 2) % 3].task(t["id"])
        assert got["state"] == "cancelled" and {c["state"] for c in got["copies"]} == {"cancelled"}
    counts = nodes[0].counts("pg")
    assert counts["scheduled"] == 0 and counts["cancelled"] == len(doomed), counts
    sink.wait_for(lambda reqs: {x.task_id for x in reqs} >= {t["id"] for t in kept},
                  path="/other", timeout=15)
    (req,) = sink.wait_for(count=1, path="/late", timeout=15)
    assert req.task_id == late["id"]
    assert sink.count("/purged") == 0
    wait_no_live_copies(nodes)
    # the queue still takes and delivers new tasks
    after = enqueue(nodes[2], url=f"{sink.url}/purged", queue="pg")
    (req,) = sink.wait_for(count=1, path="/purged", timeout=10)
    assert req.task_id == after["id"]


# ================================================================ 11. graceful stop hands off


@pytest.mark.timeout(90)
@pytest.mark.parametrize("who", ["leader", "follower"])
def test_sigterm_of_first_replica_hands_its_tasks_to_a_sibling(cluster_factory, sink, who):
    offset = 10.0
    nodes = cluster_factory(3, options={"replica_offset": offset})
    view = wait_converged(nodes)
    victim = by_id(nodes, view["leader"]) if who == "leader" else \
        next(n for n in nodes if n.node_id != view["leader"])
    rest = others(nodes, victim)
    # through the victim (its first copies stay there) and through another node
    answers = batch_enqueue(victim, [{"url": f"{sink.url}/handoff", "countdown": 1.5,
                                      "params": {"i": str(i)}} for i in range(25)])
    answers += batch_enqueue(rest[0], [{"url": f"{sink.url}/handoff", "countdown": 1.5,
                                        "params": {"i": str(i)}} for i in range(25, 45)])
    mine = [a for a in answers if a["replicas"][0] == victim.node_id]
    assert len(mine) >= 10, Counter(a["replicas"][0] for a in answers)
    code = victim.stop(timeout=20)
    stopped = time.time()
    assert code == 0, victim.log_text(40)
    assert stopped < min(a["eta"] for a in mine), "stopped too late: the tasks were due already"
    assert "handed" in victim.log_text(), victim.log_text(40)

    ids = {a["id"] for a in answers}
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/handoff", timeout=15)
    at = {r.task_id: r.time for r in sink.requests("/handoff")}
    lateness = sorted(at[a["id"]] - a["eta"] for a in mine)
    print(f"\n{len(mine)} tasks handed off by the {who} {victim.node_id}: delivered "
          f"{lateness[0]:+.2f}..{lateness[-1]:+.2f}s from their eta (offset {offset:g}s)")
    assert lateness[0] >= -0.05, "delivered before its eta"
    assert lateness[-1] < 2.0, "the sibling waited for its offset: no hand-off"
    view = wait_converged(rest, timeout=10)
    assert victim.node_id not in member_ids(view)
    wait_no_live_copies(rest, timeout=20)
    assert not duplicates(sink.by_task_id("/handoff"))
    assert set(sink.by_task_id("/handoff")) == ids


# ================================================================ 12. a queue's rate is the cluster's


@pytest.mark.timeout(90)
def test_queue_rate_is_shared_by_the_cluster(cluster_factory, sink):
    rate, n_tasks = 6.0, 36
    nodes = cluster_factory(3, queues={"shared": {"rate": rate, "burst": 1}})
    for n in nodes:
        assert n.get("/queues/shared").json()["config"]["rate"] == rate
    t0 = time.time()
    answers = spread_enqueues(nodes, n_tasks, 3,
                              lambda i: {"url": f"{sink.url}/rate", "queue": "shared"})
    ids = {a["id"] for a in answers}
    assert {a["replicas"][0] for a in answers} == {"a", "b", "c"}
    reqs = sink.wait_for(lambda rs: {r.task_id for r in rs} >= ids, path="/rate",
                         timeout=n_tasks / rate * 4 + 10)
    times = sorted(r.time for r in reqs)
    elapsed = times[-1] - times[0]
    # the busiest one-second window
    busiest = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
    print(f"\n{n_tasks} tasks at a cluster rate of {rate:g}/s took {elapsed:.2f}s "
          f"(ideal {(n_tasks - 3) / rate:.2f}s); busiest second: {busiest}; enqueue took "
          f"{times[0] - t0:.2f}s to the first delivery")
    # each node may burst one token at the start; after that, rate/3 each
    assert elapsed >= (n_tasks - 3) / rate * 0.85, "the nodes did not share the queue's rate"
    assert busiest <= rate + 3 + 1, busiest
    # and the rate is not wasted (e.g. on the siblings' skipped copies) either
    assert elapsed <= (n_tasks / rate) * 2.0 + 2.0, "far slower than the queue's rate"
    wait_no_live_copies(nodes)
    assert not duplicates(sink.by_task_id("/rate"))


# ================================================================ 13. retries in a cluster


@pytest.mark.timeout(90)
def test_retries_in_a_cluster_deliver_exactly_the_attempts_needed(cluster_factory, sink):
    # "slow" retries wait longer than the replica offset: the siblings must follow the
    # RETRY's time (not their own eta + offset) and must not fire alongside
    nodes = cluster_factory(3, queues={"slow": {"min_backoff": 1.5, "max_backoff": 1.5}})
    tasks = []
    for i in range(6):
        queue = "slow" if i % 2 else "default"
        path = f"/retry/{i}"
        sink.reply(path, 500, 500, 200)
        tasks.append((path, enqueue(nodes[i % 3], url=sink.url + path, queue=queue,
                                    countdown=0.3)))
    for path, t in tasks:
        reqs = sink.wait_for(count=3, path=path, timeout=20)
        assert [r.headers["X-Task-Retry-Count"] for r in reqs] == ["0", "1", "2"], path
        assert {r.task_id for r in reqs} == {t["id"]}
    wait_no_live_copies(nodes)
    for path, t in tasks:
        assert sink.count(path) == 3, (path, [(r.time - t["eta"]) for r in sink.requests(path)])
        for n in nodes:
            got = n.task(t["id"])
            assert got["state"] == "succeeded", (n.node_id, got)
            assert got["attempts"] == 3 and got["last_response"]["status"] == 200, got
            copies = {c["node"]: c["state"] for c in got["copies"]}
            assert copies == {r: "succeeded" for r in t["replicas"]}, (n.node_id, got["copies"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change", [
    "lost",
    "joined",
])
def test_named_task_still_refused_after_the_roster_changes(cluster_factory, node_factory,
                                                           sink, change):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    names = [f"keep-{i}" for i in range(30)]
    first = {nm: enqueue(nodes[i % 3], url=f"{sink.url}/once", name=nm)["id"]
             for i, nm in enumerate(names)}
    sink.wait_for(count=len(names), path="/once", timeout=10)
    wait_no_live_copies(nodes)
    if change == "lost":
        victim = next(n for n in nodes if n.node_id != view["leader"])
        victim.kill()
        now = others(nodes, victim)
    else:
        now = nodes + [node_factory("d", seeds=[n.cluster_addr for n in nodes])]
    wait_converged(now, timeout=15)
    accepted = []
    for i, nm in enumerate(names):
        r = now[i % len(now)].post("/queue", json={"url": f"{sink.url}/once", "name": nm})
        assert r.status_code in (200, 409), r.text
        if r.status_code == 200:
            accepted.append(nm)
        else:
            assert r.json() == {"status": "duplicate", "id": first[nm]}
    assert not accepted, f"{len(accepted)} of {len(names)} names accepted a second time"


# ================================================================ a claimer dies mid-delivery


def _claimed_by(victim: NodeProcess, sink: Sink, path: str, count: int = 5) -> list[str]:
    """Tasks the victim took (and holds the first copy of) whose attempts hang at ``path``."""
    ids = []
    for i in range(40):
        if len(ids) >= count:
            break
        got = enqueue(victim, url=sink.url_for(path), params={"i": str(i)})
        if got["replicas"][0] == victim.node_id:
            ids.append(got["id"])
    assert len(ids) >= 3, "the victim never held the first copy of a task it took"
    wait_until(lambda: len({r.task_id for r in sink.requests(path)} & set(ids)) == len(ids),
               timeout=10, what="the victim's attempts reach the sink")
    return ids


@pytest.mark.timeout(90)
def test_a_killed_and_restarted_claimer_voids_its_claims_at_once(cluster_factory, sink):
    # the victim claims (CLAIM with a 60 s lease + the 5 s queue timeout) and is killed while
    # its deliveries hang at the sink, then restarted: its new incarnation voids the old
    # claims, so the siblings do not wait out that lease
    nodes = cluster_factory(3, options={"claim_lease": 60})
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][-1]
    sink.reply("/slow", Reply(200, delay=3.0))
    ids = _claimed_by(victim, sink, "/slow")
    sink.reply("/slow", Reply(200))
    killed_at = time.monotonic()
    victim.kill()
    victim.start()
    survivor = others(nodes, victim)[0]
    for task_id in ids:
        survivor.wait_task_state(task_id, "succeeded", timeout=30)
    assert time.monotonic() - killed_at < 30  # far sooner than the 65 s lease


@pytest.mark.timeout(90)
def test_a_claimer_paused_past_the_failure_timeout_is_not_run_over(cluster_factory, sink):
    """The trust issue's slow-worker case, in small: a worker answers after 4 s (under
    the 5 s queue timeout) while the delivering node is stopped for 3 s (three failure
    timeouts) in the middle; the roster drops it, but its claims stand until their lease
    ends, so no task is delivered twice (every one was, before: the claim went with the
    roster entry)."""
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][-1]
    sink.reply("/slow", Reply(200, delay=4.0))
    ids = _claimed_by(victim, sink, "/slow")
    victim.pause()
    survivor = others(nodes, victim)[0]
    wait_until(lambda: victim.node_id not in member_ids(cluster_view(survivor)), 10,
               what="the roster to drop the paused node")
    time.sleep(2.0)  # the pause lasts 3 s or more in all: the fault itself, not a wait
    victim.resume()
    for task_id in ids:
        survivor.wait_task_state(task_id, "succeeded", timeout=30)
    sink.wait_idle(timeout=15)
    counts = sink.by_task_id("/slow")
    assert all(counts.get(t) == 1 for t in ids), {t: counts.get(t) for t in ids}


# ================================================================ pause reaches late members


@pytest.mark.timeout(60)
def test_a_node_that_was_away_takes_the_clusters_pauses(cluster_factory, sink):
    nodes = cluster_factory(3, queues={"held": {}})  # declared: a pause creates no queue
    view = wait_converged(nodes)
    late = [n for n in nodes if n.node_id != view["leader"]][-1]
    assert late.stop() == 0
    wait_converged(others(nodes, late))
    entry = others(nodes, late)[0]
    assert entry.post("/queues/held/pause").status_code == 200
    assert entry.post("/queues/held/pause").json()["status"] == "ok"
    late.start().wait_ready()
    wait_converged(nodes)
    wait_until(lambda: late.get("/queues/held").json()["paused"] is True, timeout=10,
               what="the returning node to hold the queue paused")
    # and a resume made while it was away is taken too
    assert late.stop() == 0
    wait_converged(others(nodes, late))
    assert entry.post("/queues/held/resume").status_code == 200
    late.start().wait_ready()
    wait_converged(nodes)
    wait_until(lambda: late.get("/queues/held").json()["paused"] is False, timeout=10,
               what="the returning node to run the queue again")


# ================================================================ leaders killed in a row


@pytest.mark.timeout(120)
def test_leaders_killed_in_a_row_with_restarts_are_always_replaced(cluster_factory, sink):
    # each round: kill -9 the leader, the survivors elect, the dead node restarts and is
    # readmitted; a follower that never heard the restarted node's JOIN must not, once it
    # leads, drop that node's live incarnation as "restarted" (that left a 2-member roster
    # with a dead member: no quorum, no leader, for ever)
    nodes = cluster_factory(3)
    for round_ in range(4):
        before = wait_converged(nodes, timeout=20)
        old = by_id(nodes, before["leader"])
        old.kill()
        survivors = others(nodes, old)

        def replaced() -> bool:
            views = [cluster_view(n, timeout=1) for n in survivors]
            return all(v["leader"] not in (None, old.node_id) and v["term"] > before["term"]
                       for v in views) and len({v["leader"] for v in views}) == 1

        wait_until(replaced, 10, what=f"a new leader in round {round_}")
        old.start().wait_ready()
    view = wait_converged(nodes, timeout=20)
    got = enqueue(by_id(nodes, view["leader"]), url=sink.url_for("/rounds"))
    sink.wait_for(count=1, path="/rounds", timeout=10)
    assert sink.requests("/rounds")[0].task_id == got["id"]


# ================================================================ copies restored


@pytest.mark.timeout(60)
def test_survivors_restore_n_copies_when_a_member_is_dropped(cluster_factory, node_factory):
    nodes = cluster_factory(4)
    view = wait_converged(nodes)
    victim = [n for n in nodes if n.node_id != view["leader"]][-1]
    entry = others(nodes, victim)[0]
    held = []
    for i in range(30):
        got = enqueue(entry, url="http://127.0.0.1:9/never", countdown=600,
                      params={"i": str(i)})
        if victim.node_id in got["replicas"]:
            held.append(got["id"])
    assert held, "no task got a copy on the victim"
    victim.kill()
    wait_converged(others(nodes, victim), timeout=15)

    def restored() -> bool:
        for task_id in held:
            copies = entry.task(task_id)["copies"]
            holders = {c["node"] for c in copies if c["state"] == "scheduled"}
            if len(holders) != 2 or victim.node_id in holders:
                return False
        return True

    wait_until(restored, 15, what="two live scheduled copies of every task the victim held")
