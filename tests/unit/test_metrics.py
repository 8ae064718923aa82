"""A node's /metrics in process (``miyamoto.metrics``): the histograms' buckets, the
bounded label sets, and every series the scrape-time collector reads off a node's
parts, here stand-ins holding known values, parsed back with prometheus_client's
parser. Against real nodes (HELP, TYPE, promtool): tests/nodes/test_metrics_node.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from miyamoto import metrics as mm
from miyamoto.delivery.breaker import Breakers
from miyamoto.metrics import MAX_QUEUES, OTHER, Histogram, Metrics, status_class
from miyamoto.version import __version__

pytestmark = pytest.mark.timeout(30)


def test_histogram_buckets_are_le_and_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 1.0, 7.0):
        h.observe(v)
    assert h.counts == [2, 2, 1]
    assert h.buckets() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert h.total == pytest.approx(8.65)
    assert Histogram((1.0,)).buckets() == [("1.0", 0), ("+Inf", 0)]


def test_status_classes() -> None:
    assert [status_class(s) for s in (100, 200, 204, 302, 404, 503, 599, None, 0, 99, 600,
                                      700)] == \
        ["1xx", "2xx", "2xx", "3xx", "4xx", "5xx", "5xx", "error", "error", "error", "error",
         "error"]


def test_the_queue_label_set_is_bounded() -> None:
    m = Metrics()
    for i in range(MAX_QUEUES + 50):
        m.attempt(f"q{i}", 200, "succeeded", 0.01, 0.0)
    assert len(m.duration) == MAX_QUEUES + 1 and OTHER in m.duration
    assert m.attempts[(OTHER, "succeeded", "2xx")] == 50
    assert m.queue_label("q0") == "q0" and m.queue_label(f"q{MAX_QUEUES - 1}") != OTHER
    assert m.queue_label(f"q{MAX_QUEUES}") == OTHER


def test_an_attempt_is_counted_timed_and_its_first_delay_observed() -> None:
    m = Metrics()
    m.attempt("q", 503, "retry", 0.2, 1.5)
    m.attempt("q", 503, "retry", 0.3, None)  # not a first attempt
    m.attempt("q", None, "failed", 0.4, -2.0)  # a clock step back counts as no delay
    assert m.attempts == {("q", "retry", "5xx"): 2, ("q", "failed", "error"): 1}
    assert m.duration["q"].total == pytest.approx(0.9) and sum(m.duration["q"].counts) == 3
    first = m.first_attempt["q"]
    assert sum(first.counts) == 2 and first.total == pytest.approx(1.5)
    assert first.counts[0] == 1  # the clamped 0.0 is in the first bucket
    assert first.bounds == mm.LATENCY_BUCKETS and m.duration["q"].bounds == mm.DURATION_BUCKETS
    m.journal_commit(0.003)
    assert m.commit.total == 0.003 and m.commit.bounds == mm.COMMIT_BUCKETS


# ---------------------------------------------------------------- the scrape


class _Held(list):
    """The engine's queue registry as metrics reads it: its size and names."""

    def names(self) -> list[str]:
        return list(self)

class Node:
    """The parts of a node the collector reads, holding known values."""

    node_id = "n1"

    def __init__(self, role: Any = "leader") -> None:
        breakers = Breakers(threshold=1, cooldown=5.0)
        breakers.record("http://a:80", True, 0.0)  # open
        breakers.record("http://b:80", False, 0.0)  # closed
        queues = {"mail": SimpleNamespace(ready=[1, 2, 3], paused=True),
                  "web": SimpleNamespace(ready=[], paused=False)}
        self.engine = SimpleNamespace(
            stats=SimpleNamespace(stored=11, succeeded=7, failed=2, retried=3, cancelled=1, expired=4,
                                  attempts=12),
            live=[1, 2, 3, 4],
            dispatcher=SimpleNamespace(breakers=breakers, busy=2, queues=queues),
            queues=_Held(["declared", "mail", "web"]),
            live_depth=lambda: {("mail", "scheduled"): 3, ("mail", "running"): 1,
                                ("extra", "scheduled"): 2},
            oldest_due=lambda: {"mail": 42.5})
        self.journal = SimpleNamespace(commits=42, health=SimpleNamespace(ok=True))
        self.config = SimpleNamespace(queues={"declared": object()})
        transport = SimpleNamespace(stats=SimpleNamespace(
            messages={("STORE", "out"): 5, ("invalid", "dropped"): 1}, handler_errors=2,
            zap_denied=3, auth_refused=4, stale=5))
        self.cluster = SimpleNamespace(
            info=lambda: {"members": [{"id": "n1", "clock_offset": 0.0},
                                      {"id": "n2", "clock_offset": 0.25},
                                      {"id": "n3", "clock_offset": None}],
                          "term": 4, "role": role},
            leader_changes=6, strangers=9, spoofed=8, transport=transport)


def scrape(node: Node, m: Metrics | None = None) -> dict[tuple[str, tuple], float]:
    m = m or Metrics()
    m.watch(node)  # type: ignore[arg-type]
    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_task_counters_and_gauges() -> None:
    got = scrape(Node())
    for name, value in [("miyamoto_tasks_stored_total", 11), ("miyamoto_tasks_succeeded_total", 7),
                        ("miyamoto_tasks_failed_total", 2), ("miyamoto_retries_total", 3),
                        ("miyamoto_tasks_cancelled_total", 1), ("miyamoto_tasks_expired_total", 4),
                        ("miyamoto_attempts_started_total", 12), ("miyamoto_tasks_live", 6),
                        ("miyamoto_tasks_in_memory", 4), ("miyamoto_deliveries_in_flight", 2),
                        ("miyamoto_journal_commits_total", 42), ("miyamoto_journal_healthy", 1),
                        ("miyamoto_cluster_members", 3), ("miyamoto_cluster_term", 4),
                        ("miyamoto_cluster_leader_changes_total", 6),
                        ("miyamoto_cluster_handler_errors_total", 2),
                        ("miyamoto_cluster_zap_denied_total", 3),
                        ("miyamoto_cluster_strangers_total", 9),
                        ("miyamoto_cluster_stale_total", 5),
                        ("miyamoto_cluster_spoofed_total", 8),
                        ("miyamoto_target_breaker_opens_total", 1)]:
        assert got[(name, ())] == value, name
    assert got[("miyamoto_info", (("node", "n1"), ("version", __version__)))] == 1


def test_queues_show_depth_ready_and_paused_and_quiet_ones_their_zeros() -> None:
    got = scrape(Node())
    depth = {k[1]: v for k, v in got.items() if k[0] == "miyamoto_queue_tasks"}
    assert depth == {
        (("queue", q), ("state", s)): v for q, s, v in [
            ("mail", "scheduled", 3), ("mail", "running", 1), ("extra", "scheduled", 2),
            ("extra", "running", 0), ("declared", "scheduled", 0), ("declared", "running", 0),
            ("web", "scheduled", 0), ("web", "running", 0)]}
    assert got[("miyamoto_queue_ready", (("queue", "mail"),))] == 3
    assert got[("miyamoto_queue_ready", (("queue", "web"),))] == 0
    assert got[("miyamoto_queue_paused", (("queue", "mail"),))] == 1
    assert got[("miyamoto_queue_paused", (("queue", "web"),))] == 0
    oldest = {k[1]: v for k, v in got.items() if k[0] == "miyamoto_queue_oldest_due_seconds"}
    assert oldest == {(("queue", q),): v for q, v in
                      [("mail", 42.5), ("extra", 0), ("declared", 0), ("web", 0)]}


def test_queues_past_the_label_cap_add_up_under_other() -> None:
    node, m = Node(), Metrics()
    for i in range(MAX_QUEUES):
        m.queue_label(f"q{i}")
    node.engine.dispatcher.queues = {"x": SimpleNamespace(ready=[1], paused=False),
                                     "y": SimpleNamespace(ready=[1, 2], paused=True)}
    node.engine.live_depth = lambda: {("x", "scheduled"): 1, ("y", "scheduled"): 4}
    node.engine.queues = _Held(["q0", "x", "y"])
    got = scrape(node, m)
    assert got[("miyamoto_queues", ())] == 3
    assert got[("miyamoto_queues_unlabelled", ())] == 2  # x and y: summed under OTHER
    assert got[("miyamoto_queue_ready", (("queue", OTHER),))] == 3
    assert got[("miyamoto_queue_paused", (("queue", OTHER),))] == 1
    assert got[("miyamoto_queue_tasks", (("queue", OTHER), ("state", "scheduled")))] == 5


def test_attempts_and_histograms_by_queue() -> None:
    m = Metrics()
    m.attempt("mail", 200, "succeeded", 0.02, 0.5)
    m.attempt("mail", 500, "retry", 3.0, None)
    m.journal_commit(0.002)
    got = scrape(Node(), m)
    assert got[("miyamoto_attempts_total", (("outcome", "succeeded"), ("queue", "mail"),
                                            ("status_class", "2xx")))] == 1
    assert got[("miyamoto_attempts_total", (("outcome", "retry"), ("queue", "mail"),
                                            ("status_class", "5xx")))] == 1
    dur = "miyamoto_delivery_duration_seconds"
    assert got[(dur + "_count", (("queue", "mail"),))] == 2
    assert got[(dur + "_sum", (("queue", "mail"),))] == pytest.approx(3.02)
    assert got[(dur + "_bucket", (("le", "0.025"), ("queue", "mail")))] == 1
    assert got[(dur + "_bucket", (("le", "+Inf"), ("queue", "mail")))] == 2
    first = "miyamoto_first_attempt_delay_seconds"
    assert got[(first + "_count", (("queue", "mail"),))] == 1
    commit = "miyamoto_journal_commit_duration_seconds"
    assert got[(commit + "_count", ())] == 1 and got[(commit + "_sum", ())] == 0.002


def test_cluster_role_offsets_and_messages() -> None:
    got = scrape(Node())
    roles = {dict(k[1])["role"]: v for k, v in got.items() if k[0] == "miyamoto_cluster_role"}
    assert roles == {r: int(r == "leader") for r in mm.ROLES}
    odd = {dict(k[1])["role"]: v for k, v in scrape(Node(role="weird")).items()
           if k[0] == "miyamoto_cluster_role"}
    assert odd == {**{r: 0 for r in mm.ROLES}, "weird": 1}
    none = {dict(k[1])["role"]: v for k, v in scrape(Node(role=None)).items()
            if k[0] == "miyamoto_cluster_role"}
    assert none == {r: 0 for r in mm.ROLES}
    offsets = {k[1]: v for k, v in got.items() if k[0] == "miyamoto_peer_clock_offset_seconds"}
    assert offsets == {(("peer", "n2"),): 0.25}  # not ourselves, not an unknown offset
    # a view without a clock placing (a cluster of one): placed on its own clock, not skewed
    assert (got[("miyamoto_cluster_clock_placed", ())],
            got[("miyamoto_cluster_clock_skewed", ())]) == (1, 0)
    assert got[("miyamoto_cluster_messages_total", (("direction", "out"),
                                                    ("verb", "STORE")))] == 5
    assert got[("miyamoto_cluster_messages_total", (("direction", "dropped"),
                                                    ("verb", "invalid")))] == 1


def test_breakers_not_closed_first_then_recent_at_most_the_cap(monkeypatch) -> None:
    node = Node()
    got = scrape(node)
    assert got[("miyamoto_target_breaker_state", (("origin", "http://a:80"),
                                                  ("state", "open")))] == 1
    assert got[("miyamoto_target_breaker_state", (("origin", "http://a:80"),
                                                  ("state", "closed")))] == 0
    assert got[("miyamoto_target_breaker_state", (("origin", "http://b:80"),
                                                  ("state", "closed")))] == 1
    assert got[("miyamoto_target_breakers", (("state", "open"),))] == 1
    assert got[("miyamoto_target_breakers", (("state", "closed"),))] == 1
    assert got[("miyamoto_target_breakers", (("state", "half_open"),))] == 0
    monkeypatch.setattr(mm, "MAX_TARGET_LABELS", 2)
    b = Breakers(threshold=1, cooldown=5.0)
    b.record("http://open:80", True, 0.0)
    for o in ("http://c1:80", "http://c2:80", "http://c3:80"):
        b.record(o, False, 0.0)
    node.engine.dispatcher.breakers = b
    shown = {dict(k[1])["origin"] for k in scrape(node)
             if k[0] == "miyamoto_target_breaker_state"}
    assert shown == {"http://open:80", "http://c3:80"}  # the open one, then the most recent


def test_an_unhealthy_journal_and_no_members() -> None:
    node = Node()
    node.journal.health.ok = False
    node.cluster.info = lambda: {"term": None, "role": "joining"}
    got = scrape(node)
    assert got[("miyamoto_journal_healthy", ())] == 0
    assert got[("miyamoto_cluster_members", ())] == 0 and got[("miyamoto_cluster_term", ())] == 0


def test_watching_reads_nothing_the_node_is_read_at_each_scrape_only() -> None:
    """watch() (in Node.__init__, before anything started) only registers: no collect
    at registration (the registry's auto_describe would run one, a full pass over the
    live copies); each render reads the node once."""
    node = Node()
    info, reads = node.cluster.info, []
    node.cluster.info = lambda: reads.append(1) or info()
    m = Metrics()
    m.watch(node)  # type: ignore[arg-type]
    assert reads == []
    m.render()
    assert reads == [1]
    m.render()
    assert reads == [1, 1]


def test_the_process_collector_is_registered() -> None:
    got = scrape(Node())
    assert any(name.startswith("process_") for name, _ in got)


def test_the_bucket_bounds_are_part_of_the_api() -> None:
    """Dashboards and alerts name the ``le`` labels (histogram_quantile, "le=1.0"): the
    bounds change only on purpose."""
    assert mm.LATENCY_BUCKETS == (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                  1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
    assert mm.DURATION_BUCKETS == (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    assert mm.COMMIT_BUCKETS == (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
    assert (mm.MAX_QUEUES, mm.MAX_TARGET_LABELS, mm.OTHER) == (200, 100, "_other")
