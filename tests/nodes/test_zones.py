"""Failure domains with real processes: copies of every task in distinct zones, so that
killing every node of one zone loses nothing.

Five nodes, not four: zones of 2 and 3 nodes. Killing a whole zone of a 2 + 2 cluster
leaves no majority, and a node that cannot hear a majority delivers nothing (the
partition rule), so the tasks would wait, not be delivered, until the zone is back.
"""

from __future__ import annotations

import pytest

from helpers import cluster_view, plan_cluster, wait_converged

ZONES = {"a": "rack-1", "b": "rack-1", "c": "rack-2", "d": "rack-2", "e": "rack-2"}


@pytest.mark.timeout(120)
def test_killing_a_whole_zone_loses_nothing(tmp_path, proc_registry, sink):
    from conftest import write_node_config

    nodes = plan_cluster(tmp_path, list(ZONES), config=write_node_config(
        tmp_path / "n.ini", {"replication": 2}), registry=proc_registry)
    for n in nodes:
        n.raw_env["MIYAMOTO_ZONE"] = ZONES[n.node_id]
        n.start()
    for n in nodes:
        n.wait_ready(20)
    wait_converged(nodes, timeout=30)
    view = cluster_view(nodes[0])
    assert {m["id"]: m["zone"] for m in view["members"]} == ZONES

    answers = []
    for i, n in enumerate(nodes[2:] * 2):
        batch = [{"url": f"{sink.url}/zoned", "countdown": 3, "params": {"i": str(j)}}
                 for j in range(50)]
        batch += [{"url": f"{sink.url}/zoned", "countdown": 3, "name": f"order-{i}-{j}"}
                  for j in range(10)]
        r = n.post("/queue/default/batch", json=batch, timeout=15)
        assert r.status_code == 200, r.text
        answers += r.json()["tasks"]
    assert len(answers) == 360 and all(a["status"] == "scheduled" for a in answers), answers[:3]
    for a in answers:
        assert {ZONES[r] for r in a["replicas"]} == {"rack-1", "rack-2"}, a

    for n in nodes[:2]:  # the whole of rack-1, before any task is due
        n.kill()
    ids = {a["id"] for a in answers}
    reqs = sink.wait_for(lambda rs: {r.task_id for r in rs} >= ids, path="/zoned", timeout=40)
    delivered = {r.task_id for r in reqs}
    print(f"\n{len(ids)} tasks, rack-1 killed: {len(ids & delivered)} delivered, "
          f"{len(ids - delivered)} lost")
    assert ids <= delivered
