"""The name lookup and the per-queue totals the dashboard reads, against real nodes:
a task found by its name through HTTP, the client and the CLI, and names and totals
answered cluster-wide. The in-process side is tests/unit/http/test_dashboard.py."""

from __future__ import annotations

import pytest
import ujson

from helpers import NodeProcess, run_cli, wait_until
from miyamoto import Client
from miyamoto.client import NotFound


@pytest.mark.timeout(60)
def test_find_a_task_by_name_through_http_client_and_cli(node, sink) -> None:

    tid = node.enqueue("mail", url=sink.url_for("/later"), countdown=60, name="welcome-7")["id"]
    r = node.get("/tasks", params={"name": "welcome-7", "queue": "mail"})
    assert r.status_code == 200 and r.json()["id"] == tid and r.json()["state"] == "scheduled"
    assert node.get("/tasks", params={"name": "welcome-7"}).status_code == 404  # other queue
    with Client(node.url, timeout=10) as c:
        assert c.find("welcome-7", queue="mail")["id"] == tid
        with pytest.raises(NotFound):
            c.find("welcome-8", queue="mail")
    out = run_cli("find", "welcome-7", "--queue", "mail", env={"MIYAMOTO_SERVER": node.url})
    assert out.returncode == 0 and ujson.loads(out.stdout)["id"] == tid, out.stderr
    out = run_cli("find", "nobody", env={"MIYAMOTO_SERVER": node.url})
    assert out.returncode == 1 and "name" in out.stderr
    totals = {q["name"]: q["totals"] for q in node.get("/queues").json()["queues"]}
    assert totals["mail"] == {"enqueued": 1, "delivered": 0, "failed": 0}


@pytest.mark.timeout(90)
def test_names_and_totals_are_answered_cluster_wide(cluster_factory, sink) -> None:
    """Every node finds a named task, those that hold no copy of it through their peers
    (the REQUEST op ``name``), and every node's totals count the task once."""
    nodes = cluster_factory(3, options={"replication": 2})
    tid = nodes[0].enqueue("mail", url=sink.url_for("/later"), countdown=60,
                           name="welcome-9", params={"lang": "fr"})["id"]
    holders = set(nodes[0].task(tid)["replicas"])
    assert len(holders) == 2
    for n in nodes:
        r = n.get("/tasks", params={"name": "welcome-9", "queue": "mail"}, timeout=10)
        assert r.status_code == 200 and r.json()["id"] == tid, (n.node_id, r.text)
        totals = {q["name"]: q["totals"] for q in n.get("/queues", timeout=10).json()["queues"]}
        assert totals["mail"] == {"enqueued": 1, "delivered": 0, "failed": 0}, n.node_id
    assert any(n.node_id not in holders for n in nodes)  # one of them had to ask
    # browsing and the rate history are cluster-wide too: the task once, from any node
    # (its first copy's node answers), its enqueue counted once in the summed history
    for n in nodes:
        page = n.get("/tasks", params={"state": "scheduled", "name_prefix": "welcome"},
                     timeout=10).json()
        assert [t["id"] for t in page["tasks"]] == [tid], (n.node_id, page)
        assert page["next_cursor"] is None and len(page["nodes"]) == 3
        # (the current second is not in the history yet: wait for it to pass)
        rates = wait_until(lambda: _rates_with_one_enqueue(n), 10, what="the enqueue's second")
        assert len(rates["nodes"]) == 3 and sum(rates["delivered"]) == 0, rates


def _rates_with_one_enqueue(node: NodeProcess) -> dict | None:
    rates = node.get("/rates", params={"seconds": 60}, timeout=10).json()
    assert sum(rates["enqueued"]) <= 1, rates  # one task, counted at its first copy only
    return rates if sum(rates["enqueued"]) == 1 else None
