"""Pull queues on real nodes: tasks without a url wait for a worker, a lease hands them
out with a token, ack / nack / extend answer it (403 for a bad token, 409 once over), a
long poll returns a task enqueued while it waits, ``miyamoto work`` runs a command per
task; on three nodes with two copies a worker of a node that holds no copy gets the
others' tasks, and a kill -9 of the node holding leases loses none: each is leased
again only after its lease (and the siblings' claim) ran out, and acked once.
The decisions: tests/unit/engine/test_engine_pull.py; the cluster: tests/sim/cluster_sim.py."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import requests

from helpers import NodeProcess, run_cli, wait_until
from miyamoto import Client
from miyamoto.client import Conflict, Forbidden, NotFound

PULL = {"jobs": {"mode": "pull", "min_backoff": 0.05, "max_backoff": 0.5}}


@pytest.mark.timeout(90)
def test_lease_ack_nack_extend_on_one_node(node_factory) -> None:
    node = node_factory(queues=PULL)
    tid = node.enqueue("jobs", params={"a": "1"}, headers={"X-Job": "7"})["id"]
    assert node.post("/queue/default", json={"params": {"a": 1}}).json()["field"] == "url"
    with Client(node.url) as c:
        with pytest.raises(Conflict, match="mode push"):
            c.lease("default")
        with pytest.raises(NotFound):
            c.lease("nowhere")
        (t,) = c.lease("jobs", max_tasks=10, lease_s=30)
        assert (t["id"], t["params"], t["headers"], t["attempt"]) == (tid, {"a": "1"},
                                                                       {"X-Job": "7"}, 1)
        assert t["lease_until"] > time.time() + 25 and c.lease("jobs") == []
        assert node.get("/queues/jobs").json()["leased"] == 1
        assert node.task(tid)["lease_until"] == pytest.approx(t["lease_until"], abs=1)
        assert c.extend(t, lease_s=100)["lease_until"] > time.time() + 90
        with pytest.raises(Forbidden):
            c.ack(tid, t["token"][:-3] + "AAA")
        back = c.nack(t, delay=0.5)
        assert back["state"] == "scheduled" and back["attempts"] == 1
        with pytest.raises(Conflict):
            c.ack(t)  # that lease is over
        (t2,) = c.lease("jobs", wait_s=10)  # due again after the nack's delay
        assert t2["attempt"] == 2
        assert c.ack(t2)["state"] == "succeeded"
        # a long poll: a task enqueued while it waits comes back at once
        got: list = []
        poll = threading.Thread(target=lambda: got.extend(c.clone().lease("jobs", wait_s=20)))
        started = time.monotonic()
        poll.start()
        time.sleep(0.5)
        late = node.enqueue("jobs", params={"b": "2"})["id"]
        poll.join(30)
        assert [x["id"] for x in got] == [late] and time.monotonic() - started < 10
        assert c.nack(got[0])["state"] == "scheduled"


@pytest.mark.timeout(120)
def test_miyamoto_work_runs_a_command_per_task(node_factory, tmp_path: Path) -> None:
    node = node_factory(queues={"jobs": {**PULL["jobs"], "max_attempts": 2}})
    ids = [node.enqueue("jobs", params={"n": str(i)})["id"] for i in range(5)]
    bad = node.enqueue("jobs", params={"fail": "1"})["id"]
    out = tmp_path / "ran.jsonl"
    script = ("import json, os, sys; d = json.load(sys.stdin); "
              f"open({str(out)!r}, 'a').write(json.dumps([os.environ['MIYAMOTO_TASK_ID'], "
              "os.environ['MIYAMOTO_ATTEMPT'], d]) + '\\n'); sys.exit(1 if 'fail' in d else 0)")
    r = run_cli("work", "jobs", "--server", node.url, "--concurrency", "2", "--max-tasks", "7",
                "--lease", "10", "--", sys.executable, "-c", script, timeout=90)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert (summary["acked"], summary["nacked"]) == (5, 2), r.stdout
    ran = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(x[0] for x in ran if x[0] != bad) == sorted(ids)
    assert sorted(x[1] for x in ran if x[0] == bad) == ["1", "2"]
    for tid in ids:
        assert node.task(tid)["state"] == "succeeded"
    assert node.wait_task_state(bad, "failed")["attempts"] == 2


def _lease_all(client: Client, n: int, deadline: float) -> list[dict]:
    got: list[dict] = []
    while len(got) < n and time.monotonic() < deadline:
        got += client.lease("jobs", max_tasks=n - len(got), lease_s=5, wait_s=2)
    return got


@pytest.mark.timeout(240)
def test_a_kill_9_of_the_lease_holder_loses_no_task(
        cluster_factory: Callable[..., list[NodeProcess]], tmp_path: Path) -> None:
    """Leases held by node a (its copies 0) when it is killed: the siblings honour them
    until each lease and claim_lease run out, then lease them to the worker on b and c;
    a worker of one node gets the tasks whose copies it does not hold (the lease asks
    the peers); every task is run once by the worker and succeeds."""
    nodes = cluster_factory(3, options={"replication": 2, "claim_lease": 2.0}, queues=PULL)
    a, b, c = nodes
    ids = [a.enqueue("jobs", params={"i": str(i)})["id"] for i in range(20)]
    with Client(a.url) as ca:
        held = _lease_all(ca, 8, time.monotonic() + 30)  # a's own copies first
    assert len(held) == 8 and {t["node"] for t in held} == {"a"}, held
    lease_end = {t["id"]: t["lease_until"] for t in held}
    a.kill()
    killed = time.time()
    out = tmp_path / "ran.jsonl"
    script = ("import json, os, sys, time; sys.stdin.read(); "
              f"open({str(out)!r}, 'a').write(json.dumps([os.environ['MIYAMOTO_TASK_ID'], "
              "time.time()]) + '\\n')")
    worker = run_cli("work", "jobs", "--server", f"{b.url},{c.url}", "--max-tasks", "20",
                     "--lease", "30", "--", sys.executable, "-c", script, timeout=200)
    assert worker.returncode == 0, worker.stderr
    ran = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(x[0] for x in ran) == sorted(ids)  # each once, none lost
    for tid, at in ran:
        if tid in lease_end:  # re-leased only after the lease a held ran out
            assert at > lease_end[tid], (tid, at, lease_end[tid])
    first_again = min(at for tid, at in ran if tid in lease_end)
    print(f"re-leased {first_again - killed:.1f} s after the kill "
          f"({first_again - max(lease_end.values()):.1f} s after the last lease's end)")
    for tid in ids:
        wait_until(lambda: b.task(tid)["state"] == "succeeded", 20, what=f"{tid} succeeded")
