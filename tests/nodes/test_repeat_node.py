"""A repeat of a held name on real nodes and a real sink: on_duplicate keep, replace
(refused once the task has started) and debounce (delivered once, late); on three nodes
a replace reaches every copy and a debounced task is delivered once. The decisions:
tests/unit/tasks/test_repeat.py, tests/unit/engine/test_engine_replace.py."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from helpers import NodeProcess, Sink, wait_until


def _repeat(node: NodeProcess, **fields) -> dict:
    r = node.post("/queue", json=fields)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.timeout(60)
def test_keep_replace_and_debounce_on_one_node(node: NodeProcess, sink: Sink) -> None:
    url = sink.url_for("/r")
    first = node.enqueue(url=url, name="n1", params={"v": "1"}, countdown=60)
    assert node.post("/queue", json={"url": url, "name": "n1"}).status_code == 409  # reject
    kept = _repeat(node, url=url, name="n1", params={"v": "2"}, on_duplicate="keep")
    assert (kept["status"], kept["id"]) == ("kept", first["id"])
    assert node.task(first["id"])["params"] == {"v": "1"}
    # replace (a form too): the params and eta are the repeat's, under the first id
    r = node.post("/queue", data={"task.url": url, "task.name": "n1", "v": "3",
                                  "task.on_duplicate": "replace", "task.countdown": "0.2"})
    assert r.status_code == 200 and r.json()["status"] == "replaced", r.text
    assert r.json()["id"] == first["id"]
    (req,) = sink.wait_for(count=1, path="/r")
    assert req.form == {"v": ["3"]} and req.task_id == first["id"]
    node.wait_task_state(first["id"], "succeeded")
    late = node.post("/queue", json={"url": url, "name": "n1", "on_duplicate": "replace"})
    assert late.status_code == 409 and "succeeded" in late.json()["error"], late.text
    bad = node.post("/queue", json={"url": url, "on_duplicate": "keep"})
    assert bad.status_code == 400 and bad.json()["field"] == "on_duplicate"

    # debounce: each repeat pushes the eta back; one delivery, after the last repeat
    d = node.enqueue(url=sink.url_for("/d"), name="d1", countdown=0.6, debounce=0.6)
    for _ in range(3):
        time.sleep(0.3)  # the repeats' spacing is the thing under test, not a wait
        assert _repeat(node, url=sink.url_for("/d"), name="d1", debounce=0.6)["id"] == d["id"]
    last = time.time()
    (req,) = sink.wait_for(count=1, path="/d")
    assert req.time >= last + 0.5, req.time - last
    node.wait_task_state(d["id"], "succeeded")
    assert sink.count("/d") == 1


@pytest.mark.timeout(60)
def test_replace_reaches_every_copy_and_debounce_delivers_once_on_three_nodes(
        cluster_factory: Callable[..., list[NodeProcess]], sink: Sink) -> None:
    nodes = cluster_factory(3)
    url = sink.url_for("/r")
    tid = nodes[0].enqueue(url=url, name="n", params={"v": "1"}, countdown=60)["id"]
    r = _repeat(nodes[1], url=url, name="n", params={"v": "2"}, countdown=60,
                on_duplicate="replace")
    assert (r["status"], r["id"]) == ("replaced", tid)
    holders = [n for n in nodes if n.node_id in r["replicas"]]
    assert len(holders) == 2
    for n in holders:  # GET /tasks/<id> on a holder shows its own copy's request
        assert n.task(tid)["params"] == {"v": "2"}, n.node_id

    d = nodes[2].enqueue(url=sink.url_for("/d"), name="d", countdown=0.5, debounce=1.0)
    time.sleep(0.3)  # a repeat from another node, before the task is due
    assert _repeat(nodes[0], url=sink.url_for("/d"), name="d", debounce=1.0)["id"] == d["id"]
    last = time.time()
    (req,) = sink.wait_for(count=1, path="/d", timeout=15)
    assert req.time >= last + 0.9, req.time - last
    wait_until(lambda: all(c["state"] == "succeeded" for c in nodes[1].task(d["id"])["copies"]),
               10, what="every copy succeeded")
    assert sink.count("/d") == 1
