"""The memory window in a cluster: a node holding copies that are only in its journal
(due beyond ``memory_window``) is killed; the survivors restore those copies from their
journals (restore walks the journal a page at a time) and each task is delivered once.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from helpers import metric, wait_converged, wait_until

WINDOW = 2.0
COUNTDOWN = 14.0  # due well after the victim is dropped and its copies restored
TOL = 0.05


@pytest.mark.timeout(120)
def test_copies_outside_the_window_of_a_killed_node_are_restored_and_delivered_once(
        cluster_factory, sink):
    nodes = cluster_factory(3, options={"memory_window": WINDOW})
    view = wait_converged(nodes)
    victim = next(n for n in nodes if n.node_id != view["leader"])
    survivors = [n for n in nodes if n is not victim]
    entry = survivors[0]
    answers: list[dict[str, Any]] = []
    for i in range(24):
        # through the victim too: an unnamed task's first copy stays where it was taken
        via = (entry, victim)[i % 2]
        r = via.post("/queue", json={"url": f"{sink.url}/w", "countdown": COUNTDOWN,
                                       "params": {"i": str(i)}})
        assert r.status_code == 200, r.text
        answers.append(r.json())
    held = [a for a in answers if victim.node_id in a["replicas"]]
    assert held, "no task got a copy on the victim"
    assert all(metric(n, "miyamoto_tasks_in_memory") == 0 for n in nodes)  # journals only
    victim.kill()
    wait_converged(survivors, timeout=20)

    def restored() -> bool:
        for a in held:
            copies = entry.task(a["id"])["copies"]
            holders = {c["node"] for c in copies if c["state"] == "scheduled"}
            if len(holders) != 2 or victim.node_id in holders:
                return False
        return True

    wait_until(restored, 20, interval=0.2, what="two scheduled copies of every task the "
               "victim held, on the survivors")
    first_eta = min(a["eta"] for a in answers)
    assert time.time() < first_eta - WINDOW, "restored too late to show it from the journal"
    ids = {a["id"] for a in answers}
    last_eta = max(a["eta"] for a in answers)
    sink.wait_for(lambda reqs: {r.task_id for r in reqs} >= ids, path="/w",
                  timeout=max(5.0, last_eta - time.time()) + 20)
    for a in answers:
        wait_until(lambda: entry.task(a["id"])["state"] == "succeeded", 20,
                   what=f"task {a['id']} to succeed")
    wait_until(lambda: all(metric(n, "miyamoto_tasks_live") == 0 for n in survivors), 20,
               interval=0.2, what="no live copies left")
    by_id = sink.by_task_id("/w")
    assert set(by_id) == ids and all(v == 1 for v in by_id.values()), \
        {k: v for k, v in by_id.items() if v != 1}
    at = {r.task_id: r.time for r in sink.requests("/w")}
    first = [a for a in answers if a["replicas"][0] != victim.node_id]
    for a in first:  # their first copy was never lost: on time
        assert -TOL <= at[a["id"]] - a["eta"] < 1.0, (a["id"], at[a["id"]] - a["eta"])
