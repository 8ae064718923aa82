"""deploy/prometheus (alert rules and their promtool unit tests) and deploy/grafana (the
dashboard): the rules pass ``promtool check rules`` and ``promtool test rules`` (which
fails on a rule made wrong), and every expression of the rules and the dashboard names
only series a node exports, read off a real node's /metrics in this process (a
misspelt name is caught). Without promtool the promtool tests skip, and fail under CI,
whose .ci/run installs Debian's prometheus package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import REPO
from miyamoto.config.settings import load
from miyamoto.node import Node

pytestmark = pytest.mark.timeout(60)

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "miyamoto.json"
ALERTS = {"MiyamotoNoLeader", "MiyamotoLeaderFlapping", "MiyamotoNodeNotInRoster",
          "MiyamotoRosterShort", "MiyamotoJournalUnwritable", "MiyamotoClockSkew",
          "MiyamotoTargetBreakerOpen", "MiyamotoQueueBacklogOld", "MiyamotoTasksFailing"}
_NAME = re.compile(r"(?<![\w\"])((?:miyamoto|process)_[a-zA-Z0-9_]+)")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "gauge": ("",), "info": ("",), "summary": ("", "_sum", "_count")}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing (Debian's prometheus package; .ci/run installs it)")
        pytest.skip("no promtool (apt-get install prometheus)")
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """Every series name a node's /metrics has, from each family's type: a histogram
    with no observation yet is still named, by its type line."""
    data = tmp_path_factory.mktemp("node")
    node = Node(load(env={}, flags={"data_dir": str(data), "http": "127.0.0.1:0"}))
    node.start()
    try:
        text = node.metrics_body().decode()
    finally:
        node.stop()
    names = {f.name + s for f in text_string_to_metric_families(text)
             for s in _SUFFIXES[f.type]}
    assert "miyamoto_attempts_total" in names and "miyamoto_queue_oldest_due_seconds" in names
    yield names


def _rule_exprs(text: str) -> dict[str, str]:
    """alert -> its expression, from the rules file (YAML read as plain text: the file
    keeps one shape, which this reading holds it to)."""
    out: dict[str, str] = {}
    for block in re.split(r"\n\s+- alert: ", text)[1:]:
        name, _, rest = block.partition("\n")
        expr = re.search(r"expr: (?:>-\n)?(.*?)\n\s+(?:for|labels):", rest, re.S)
        assert expr is not None, name
        out[name.strip()] = " ".join(expr.group(1).split())
    return out


def _dashboard_exprs(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def _unknown(exprs: list[str], exported: set[str]) -> list[tuple[str, str]]:
    """(expression, name) for each name not exported; an expression naming no metric at
    all counts as unknown too (a check that names nothing checks nothing)."""
    out = []
    for e in exprs:
        names = _NAME.findall(e)
        out += [(e, "(no metric)")] if not names else [(e, n) for n in names if n not in exported]
    return out


def test_the_rules_pass_promtool_check_and_their_unit_tests(tmp_path):
    check = _run("check", "rules", str(RULES), cwd=RULES.parent)
    assert check.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in check.stdout, \
        check.stdout + check.stderr
    tested = _run("test", "rules", str(RULE_TESTS), cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    for alert in ALERTS:  # each alert is tested firing, not only staying quiet
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts:\n\s+- exp_labels",
                         RULE_TESTS.read_text()), alert


def test_the_rule_tests_fail_on_a_rule_made_wrong(tmp_path):
    _promtool()
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    wrong = RULES.read_text().replace("miyamoto_queue_oldest_due_seconds) > 300",
                                      "miyamoto_queue_oldest_due_seconds) > 3000")
    assert wrong != RULES.read_text()
    (tmp_path / RULES.name).write_text(wrong)
    tested = _run("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "MiyamotoQueueBacklogOld" in tested.stdout + tested.stderr


def test_every_rule_names_only_exported_series(exported):
    exprs = _rule_exprs(RULES.read_text())
    assert set(exprs) == ALERTS
    assert _unknown(list(exprs.values()), exported) == []


def test_every_dashboard_expression_names_only_exported_series(exported):
    dash = json.loads(DASHBOARD.read_text())
    exprs = _dashboard_exprs(dash)
    assert len(exprs) > 30
    assert _unknown(exprs, exported) == []
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    misspelt = [e.replace("miyamoto_tasks_live", "miyamoto_task_live") for e in exprs]
    assert _unknown(misspelt, exported) == [(e, "miyamoto_task_live") for e in misspelt
                                            if "miyamoto_task_live" in e]
    assert _unknown(["sum(rate(x[5m]))"], exported) == [("sum(rate(x[5m]))", "(no metric)")]
