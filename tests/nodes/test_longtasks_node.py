"""Long tasks on real nodes and a real sink: a worker answers 202, heartbeats and reports
at the URL its delivery carried; another's lease runs out and its task is retried; on
three nodes a report reaches a node that holds no running copy, while the sibling copy
waits on the lease's claim. The decisions: tests/unit/engine/test_engine_leases.py,
tests/unit/delivery/test_completion.py; the siblings: tests/sim/siblings_sim.py."""

from __future__ import annotations

import time
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests

from helpers import NodeProcess, Sink, wait_until
from miyamoto import Client


def _accepted(node: NodeProcess, sink: Sink, path: str, **fields) -> tuple[str, str, str]:
    """Enqueue a long task its worker takes with a 202: (id, complete url, heartbeat url)."""
    sink.reply(path, 202)
    tid = node.enqueue(url=sink.url_for(path), **fields)["id"]
    (req,) = sink.wait_for(count=1, path=path)
    wait_until(lambda: node.task(tid)["lease_until"] is not None, 10, what="accepted")
    return tid, req.headers["X-Task-Complete-Url"], req.headers["X-Task-Heartbeat-Url"]


@pytest.mark.timeout(60)
def test_a_worker_takes_a_task_with_202_and_reports_later(node: NodeProcess,
                                                          sink: Sink) -> None:
    tid, done_url, beat_url = _accepted(node, sink, "/long", **{"async": True})
    got = node.task(tid)
    assert got["state"] == "running" and got["attempts"] == 1 and got["lease"] == 300
    until = got["lease_until"]
    beat = requests.post(beat_url, json={"lease": 600}, timeout=10)
    assert beat.status_code == 200 and beat.json()["lease_until"] > until + 250, beat.text
    forged = requests.post(done_url[:-3] + "AAA", json={"state": "succeeded"}, timeout=10)
    assert forged.status_code == 403 and forged.json()["field"] == "token"
    with Client(node.url) as client:  # the Python client, given the URL as it came
        assert client.complete(done_url, "succeeded", {"rows": 3})["state"] == "succeeded"
    got = node.wait_task_state(tid, "succeeded")
    assert got["attempts"] == 1 and got["last_response"]["body"] == '{"rows":3}'
    again = requests.post(done_url, json={"state": "failed"}, timeout=10)
    assert again.status_code == 409, again.text
    assert sink.count("/long") == 1

    # a lease that runs out: the attempt failed, the task is retried (and this time a 200)
    sink.reply("/short", 202, 200)
    sid = node.enqueue(url=sink.url_for("/short"), lease=1)["id"]
    got = node.wait_task_state(sid, "succeeded", timeout=15)
    assert got["attempts"] == 2 and sink.count("/short") == 2
    assert [a["status"] for a in got["history"]] == [200, 202]  # newest first


@pytest.mark.timeout(90)
def test_a_report_reaches_another_node_while_the_sibling_waits_on_the_lease(
        cluster_factory: Callable[..., list[NodeProcess]], sink: Sink) -> None:
    nodes = cluster_factory(3, options={"completion_secret": "s3cret-shared-by-all-nodes"})
    tid, done_url, _ = _accepted(nodes[0], sink, "/long", lease=30)
    holder = urlsplit(done_url).netloc
    other = next(n for n in nodes if n.http_addr != holder)
    # the sibling's copy came due (a replica_offset later) and waits on the claim
    def sibling_held() -> bool:
        copies = other.task(tid)["copies"]
        later = [c["next_attempt"] for c in copies if c["state"] == "scheduled"]
        return bool(later) and min(later) > time.time() + 20
    wait_until(sibling_held, 15, what="the sibling copy held by the lease")
    there = urlunsplit(urlsplit(done_url)._replace(netloc=other.http_addr))
    r = requests.post(there, json={"state": "succeeded"}, timeout=10)
    assert r.status_code == 200, r.text
    wait_until(lambda: all(c["state"] == "succeeded" for c in other.task(tid)["copies"]), 10,
               what="every copy succeeded")
    assert sink.count("/long") == 1
