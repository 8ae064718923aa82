"""GET /metrics of real nodes (prometheus_client's exposition), and the log output.

Every family must carry HELP and TYPE and parse with prometheus_client's parser (and
pass ``promtool check metrics`` where Debian's prometheus package is installed); the
per-queue attempts and histograms must count what a real sink saw; a 3-node cluster's
role, term, members and leader changes must follow a killed leader (each series off
stand-in parts: tests/unit/test_metrics.py). The logs: with
``log_format = json`` every line is a JSON object; the access log names method, path
and status but never the query string or the Authorization header.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import NodeProcess, dealer, free_port, wait_until
from harness.views import parse_metrics
from miyamoto.metrics import CONTENT_TYPE_LATEST

SUFFIXES = ("_bucket", "_count", "_sum")


def scrape(node: NodeProcess) -> str:
    r = node.get("/metrics", timeout=5)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST
    return r.text


def samples(node: NodeProcess) -> dict[str, float]:
    return parse_metrics(scrape(node))


def check_exposition(text: str) -> None:
    """Every sample's family has a TYPE and a non-empty HELP; the parser reads it all."""
    helped: dict[str, str] = {}
    typed: dict[str, str] = {}
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, doc = line[len("# HELP "):].partition(" ")
            helped[name] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            typed[name] = kind
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    assert names, text[:500]
    for name in names:
        family = name if name in typed else next(
            (name.removesuffix(s) for s in SUFFIXES
             if name.endswith(s) and typed.get(name.removesuffix(s)) == "histogram"), None)
        assert family is not None, f"{name}: no TYPE line"
        assert helped.get(family, "").strip(), f"{family}: no HELP text"
    for name in typed:
        assert name in helped, f"{name}: TYPE without HELP"
    families = list(text_string_to_metric_families(text))  # raises on a malformed line
    assert len(families) == len(typed)


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        return  # the parser above is the check (Debian's prometheus package brings it)
    out = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                         capture_output=True, timeout=30)
    assert out.returncode == 0, (out.returncode, out.stdout.decode(), out.stderr.decode())


def buckets(text: str, family: str, queue: str) -> list[tuple[float, float]]:
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return sorted((float(s.labels["le"]), s.value) for s in fam.samples
                          if s.name.endswith("_bucket") and s.labels.get("queue") == queue)
    return []


@pytest.mark.timeout(60)
def test_every_family_has_help_and_type_and_counts_per_queue(node, sink):
    """Attempts by queue, outcome and status class; the histograms count each delivery
    of the run; promtool (where present) and the parser find nothing wrong."""
    sink.reply("/bad", 500)
    for _ in range(3):
        node.enqueue(queue="alpha", url=sink.url_for("/ok"))
    node.enqueue(queue="beta", url=sink.url_for("/bad"), max_attempts=2)
    node.enqueue(queue="gamma", url=f"http://127.0.0.1:{free_port()}/refused", max_attempts=1)
    node.enqueue(queue="alpha", url=sink.url_for("/later"), countdown=3600)
    sink.wait_for(count=3, path="/ok")
    sink.wait_for(count=2, path="/bad")

    want = {
        'attempts_total{outcome="succeeded",queue="alpha",status_class="2xx"}': 3,
        'attempts_total{outcome="retry",queue="beta",status_class="5xx"}': 1,
        'attempts_total{outcome="failed",queue="beta",status_class="5xx"}': 1,
        'attempts_total{outcome="failed",queue="gamma",status_class="error"}': 1,
        'delivery_duration_seconds_count{queue="alpha"}': 3,
        'delivery_duration_seconds_count{queue="beta"}': 2,
        'first_attempt_delay_seconds_count{queue="alpha"}': 3,
        'first_attempt_delay_seconds_count{queue="beta"}': 1,  # its retry is no first
        'queue_tasks{queue="alpha",state="scheduled"}': 1,
        'queue_tasks{queue="beta",state="scheduled"}': 0,
        # the attempt is counted as it ends, the copy leaves the live gauge a moment later
        "tasks_live": 1,
    }

    def counted() -> dict[str, float] | None:
        got = samples(node)
        return got if all(got.get(k) == v for k, v in want.items()) else None

    try:
        got = wait_until(counted, 10.0, interval=0.05, what="the run counted in /metrics")
    except AssertionError:
        seen = samples(node)
        raise AssertionError({k: seen.get(k) for k in want}) from None
    assert got["attempts_total"] == 6  # the sum over every label set
    assert got['delivery_duration_seconds_sum{queue="alpha"}'] > 0
    assert got["journal_commit_duration_seconds_count"] == got["journal_commits_total"] >= 1
    assert got["tasks_stored_total"] == 6

    text = scrape(node)
    check_exposition(text)
    promtool_check(text)
    alpha = buckets(text, "miyamoto_delivery_duration_seconds", "alpha")
    assert alpha[-1] == (float("inf"), 3)
    assert all(a[1] <= b[1] for a, b in zip(alpha, alpha[1:]))  # cumulative
    assert "task" not in {k for fam in text_string_to_metric_families(text)
                          for s in fam.samples for k in s.labels}  # no per-task labels
    assert "miyamoto.access" not in node.log_text()  # the access log is off by default


def by_id(nodes: list[NodeProcess], node_id: str) -> NodeProcess:
    return next(n for n in nodes if n.node_id == node_id)


def leader_of(views: dict[str, dict[str, float]]) -> str | None:
    leaders = [n for n, v in views.items() if v.get('cluster_role{role="leader"}') == 1]
    return leaders[0] if len(leaders) == 1 else None


def verb_count(view: dict[str, float], verb: str, direction: str) -> float:
    return view.get(f'cluster_messages_total{{direction="{direction}",verb="{verb}"}}', 0)


@pytest.mark.timeout(90)
def test_cluster_role_term_members_and_leader_changes(cluster_factory):
    nodes = cluster_factory(3)
    views = {n.node_id: samples(n) for n in nodes}
    old = leader_of(views)
    assert old is not None, views
    for node_id, v in views.items():
        check_exposition(scrape(by_id(nodes, node_id)))
        assert v["cluster_members"] == 3 and v["cluster_term"] >= 1
        assert v["cluster_leader_changes_total"] >= 1
        role = "leader" if node_id == old else "follower"
        assert v[f'cluster_role{{role="{role}"}}'] == 1 and v["cluster_role"] == 1
    assert verb_count(views[old], "HEARTBEAT", "sent") > 0
    follower = next(n for n in views if n != old)
    # (a member admitted last may not have had a heartbeat yet when first scraped)
    wait_until(lambda: verb_count(samples(by_id(nodes, follower)), "HEARTBEAT", "received")
               > verb_count(views[follower], "HEARTBEAT", "received"), 5.0, interval=0.05,
               what="more heartbeats counted")

    # a malformed message from an insider's socket: counted as dropped, verb "invalid"
    target = by_id(nodes, follower)
    raw = dealer(target.cluster_addr, b"intruder")
    raw.send_multipart([b"NO_SUCH_VERB", b"{}"])
    raw.close()
    wait_until(lambda: verb_count(samples(target), "invalid", "dropped") >= 1, 5.0,
               interval=0.05, what="the malformed message counted as dropped")

    by_id(nodes, old).kill()
    survivors = [n for n in nodes if n.node_id != old]

    def new_leader() -> dict[str, dict[str, float]] | None:
        now = {n.node_id: samples(n) for n in survivors}
        leader = leader_of(now)
        if leader is None or any(v["cluster_members"] != 2 for v in now.values()):
            return None
        return now

    after = wait_until(new_leader, 15.0, interval=0.05, what="a new leader of 2 members")
    for node_id, v in after.items():
        before = views[node_id]
        assert v["cluster_leader_changes_total"] > before["cluster_leader_changes_total"]
        assert v["cluster_term"] > before["cluster_term"]
        assert verb_count(v, "VOTE_REQUEST", "sent") + verb_count(v, "VOTE", "sent") > 0
    promtool_check(scrape(survivors[0]))


def json_lines(node: NodeProcess) -> list[dict[str, Any]]:
    out = []
    for line in node.log_text().splitlines():
        if not line.strip() or line.startswith("===== "):  # the harness's start marker
            continue
        record = json.loads(line)  # fails on any line that is not JSON
        assert {"time", "level", "logger", "message"} <= set(record), record
        out.append(record)
    return out


@pytest.mark.timeout(60)
def test_json_logs_and_access_log_without_query_or_token(node_factory, sink):
    token = "admin-token-0123456789abcdef"
    node = node_factory(options={"log_format": "json", "access_log": True,
                                 "api_tokens": f"admin:{token}"})
    auth = {"Authorization": f"Bearer {token}"}
    assert node.get("/queues?secret=hunter2-in-query", headers=auth).status_code == 200
    assert node.get("/queues").status_code == 401  # no token: a client's fault
    bad = node.post("/queue", data=b"{not json", headers={**auth,
                                                         "Content-Type": "application/json"})
    assert bad.status_code == 400
    assert node.get("/no/such/route", headers=auth).status_code == 404
    r = node.post("/queue", json={"url": sink.url_for("/hook")}, headers=auth)
    assert r.status_code == 200, r.text
    sink.wait_for(count=1, path="/hook")

    def access() -> list[dict[str, Any]] | None:
        lines = [r for r in json_lines(node) if r["logger"] == "miyamoto.access"]
        return lines if len(lines) >= 5 else None

    lines = wait_until(access, 10.0, interval=0.05, what="five access log lines")
    seen = {(r["http"]["method"], r["http"]["path"], r["http"]["status"]) for r in lines}
    assert {("GET", "/queues", 200), ("GET", "/queues", 401), ("POST", "/queue", 400),
            ("GET", "/no/such/route", 404), ("POST", "/queue", 200)} <= seen, seen
    for r in lines:
        assert r["http"]["client"] == "127.0.0.1" and r["http"]["bytes"] > 0
        assert r["http"]["duration_ms"] >= 0 and r["http"]["path"] in r["message"]
    records = json_lines(node)
    assert any(r["logger"].startswith("miyamoto.node") for r in records)  # not only access
    assert not [r for r in records if "exception" in r]  # no traceback for a client's fault
    text = node.log_text()
    assert "hunter2" not in text and token not in text  # no query string, no token
