"""Queue settings through the API on real nodes: a PUT on one node is in effect on the
others and survives a restart of every node (the pieces in process:
tests/unit/cluster/test_queuesettings.py; the merge in the definitions simulator:
tests/unit/definitions/test_definitions.py)."""

from __future__ import annotations

import pytest

from helpers import definition_write, wait_converged, wait_until


def _queue(node, name: str) -> dict:
    r = node.get(f"/queues/{name}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.timeout(120)
def test_a_put_on_one_node_holds_on_every_node_and_through_a_full_restart(
        cluster_factory, sink) -> None:
    a, b, c = nodes = cluster_factory(3)
    r = definition_write(a, "PUT", "/queues/held",
                         json={"paused": True, "max_attempts": 2, "timeout": 4})
    assert r.status_code == 200, r.text
    assert r.json()["sources"]["paused"] == "api" and r.json()["paused"] is True

    def everywhere() -> bool:
        return all(_queue(n, "held")["paused"] and _queue(n, "held")["config"]["timeout"] == 4
                   for n in nodes)
    wait_until(everywhere, timeout=20, what="every node to hold queue held's settings")
    task_id = c.enqueue("held", url=sink.url_for("/held"))["id"]  # held on every copy

    for n in nodes:  # a full restart: every process killed, then started again
        n.kill()
    for n in nodes:
        n.start()
    for n in nodes:
        n.wait_ready(30)
    wait_converged(nodes, timeout=30)
    got = _queue(b, "held")
    assert got["paused"] is True and got["config"]["max_attempts"] == 2
    assert got["sources"]["max_attempts"] == "api" and got["sources"]["burst"] == "default"
    assert sink.count("/held") == 0  # due since before the restart, and still held

    # back to the config's: running
    r = definition_write(b, "PUT", "/queues/held", json={"paused": None})
    assert r.status_code == 200 and r.json()["paused"] is False, r.text
    sink.wait_for(count=1, path="/held", timeout=20)
    assert c.wait_task_state(task_id, "succeeded", timeout=20)
