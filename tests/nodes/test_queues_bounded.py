"""Bounded queues on a real node: enqueues create queues up to max_queues (then 400
naming queue), GET /queues pages by name, a control or a look at an unknown queue is a
404 (the CLI's pause exits non-zero), and an idle empty auto-created queue expires."""

from __future__ import annotations

import pytest

from conftest import FAST_QUEUES
from helpers import NodeProcess, metric, run_cli, wait_until

DECLARED = list(FAST_QUEUES)  # the test INI's queues: they count towards max_queues


def _names(node: NodeProcess, limit: int) -> list[str]:
    """Every queue's name, following GET /queues' cursors a page of ``limit`` at a time."""
    out: list[str] = []
    cursor = ""
    while True:
        r = node.get(f"/queues?limit={limit}" + (f"&cursor={cursor}" if cursor else ""))
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["queues"]) <= limit
        out.extend(q["name"] for q in page["queues"])
        cursor = page["next_cursor"]
        if cursor is None:
            return out


@pytest.mark.timeout(60)
def test_queues_are_bounded_paged_and_expire(node_factory, sink) -> None:
    node = node_factory(options={"max_queues": 7, "queue_idle_expiry": 2})  # 4 declared
    for q in ("q1", "q2", "q3"):
        r = node.post(f"/queue/{q}", json={"url": sink.url_for(f"/{q}")})
        assert r.status_code == 200, r.text
    r = node.post("/queue/q4", json={"url": sink.url_for("/q4")})
    assert r.status_code == 400 and r.json()["field"] == "queue", r.text
    assert "max_queues (7)" in r.json()["error"]
    assert _names(node, 1) == _names(node, 1000) == sorted([*DECLARED, "q1", "q2", "q3"])
    assert node.get("/queues?limit=").status_code == 400
    assert node.get("/queues").json()["next_cursor"] is None
    assert metric(node, "miyamoto_queues") == 7
    assert metric(node, "miyamoto_queues_unlabelled") == 0  # under 200: every one labelled

    # an unknown queue: looked at or controlled, a 404; nothing is created
    for action in ("pause", "resume", "purge"):
        r = node.post(f"/queues/nosuchqueue/{action}")
        assert r.status_code == 404 and r.json()["field"] == "queue", r.text
    assert node.get("/queues/nosuchqueue").status_code == 404
    cp = run_cli("pause", "nosuchqueue", env={"MIYAMOTO_SERVER": node.url})
    assert cp.returncode != 0 and "names no queue" in cp.stderr, cp.stdout + cp.stderr
    assert "nosuchqueue" not in _names(node, 1000)
    assert node.post("/queues/q1/pause").status_code == 200  # a known one still is

    # delivered, the queues hold nothing: the idle ones expire, the paused one stays
    sink.wait_for(count=2, timeout=15)
    wait_until(lambda: _names(node, 1000) == sorted([*DECLARED, "q1"]), timeout=20,
               what="the idle empty queues to expire")
    r = node.post("/queue/q4", json={"url": sink.url_for("/q4")})  # room again
    assert r.status_code == 200, r.text
    assert "Traceback" not in node.log_text()


@pytest.mark.timeout(30)
def test_a_bad_queue_bound_exits_2_naming_it(node_factory) -> None:
    for option, value in (("max_queues", 0), ("queue_idle_expiry", -1),
                          ("auto_create_queues", "sometimes"), ("max_queues", 3)):
        n = node_factory(options={option: value}, ready=False)  # 3: below the 4 declared
        assert n.wait_exit(15) == 2, n.log_text(20)
        assert option in n.log_text(), n.log_text(20)
