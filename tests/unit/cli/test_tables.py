"""The CLI's plain-text tables (``miyamoto status``, ``tasks``, ``failed list``): the
lines an operator reads, from the API's JSON."""

from __future__ import annotations

import pytest

from miyamoto.cli import tables

pytestmark = pytest.mark.timeout(30)


def test_columns_are_padded_to_the_widest_cell_and_a_missing_value_is_a_dash() -> None:
    assert tables.table(("A", "LONGER"), [("xyz", None), (1, "b")]) == [
        "A    LONGER",
        "xyz  -",
        "1    b"]


def test_status_names_the_node_the_members_and_the_queues() -> None:
    cluster = {"node": "n1", "role": "leader", "leader": "n1", "term": 4, "version": 7,
               "members": [{"id": "n1", "leader": True, "zone": "z1", "http": "h1:1",
                            "cluster": "c1:2", "last_heard": 0.25, "clock_offset": -0.0015},
                           {"id": "n2", "leader": False, "zone": "z2", "http": "h2:1",
                            "cluster": "c2:2", "last_heard": None, "clock_offset": 2.5,
                            "clock_skewed": True}]}
    queues = [{"name": "mail", "paused": True, "counts": {"scheduled": 3, "failed": 1},
               "copies": {"n1": 2, "n2": 5}},
              {"name": "default", "paused": False}]
    lines = tables.status_lines(cluster, queues)
    assert lines[0] == "node n1 (leader), leader n1, term 4, roster version 7"
    assert lines[1] == "" and lines[5] == ""
    assert lines[2].split() == ["MEMBER", "LEADER", "ZONE", "HTTP", "CLUSTER", "LAST", "HEARD",
                                "CLOCK", "OFFSET"]
    assert lines[3].split() == ["n1", "*", "z1", "h1:1", "c1:2", "0.250", "s", "-0.002", "s"]
    assert lines[4].split() == ["n2", "z2", "h2:1", "c2:2", "-", "2.500", "s", "SKEWED"]
    assert lines[6].split() == ["QUEUE", "PAUSED", "SCHEDULED", "RUNNING", "SUCCEEDED",
                                "FAILED", "CANCELLED", "EXPIRED", "COPIES"]
    assert lines[7].split() == ["mail", "yes", "3", "0", "0", "1", "0", "0", "7"]
    assert lines[8].split() == ["default", "no", "0", "0", "0", "0", "0", "0", "0"]
    assert len(lines) == 9


def test_tasks_show_the_time_that_matters_for_the_state() -> None:
    now = 1_700_000_000.0
    lines = tables.task_lines([
        {"id": "t1", "state": "scheduled", "attempts": 0, "next_attempt": now + 5,
         "finished": now - 100, "name": "a", "url": "http://w/1"},
        {"id": "t2", "state": "succeeded", "attempts": 2, "finished": now - 3.25,
         "ordering_key": "k7", "url": "http://w/2"},
        {"id": "t3", "state": "cancelled"}], now=now)
    assert lines[0].split() == ["ID", "STATE", "ATTEMPTS", "WHEN", "NAME", "KEY", "URL"]
    assert lines[1].split() == ["t1", "scheduled", "0", "in", "5.0", "s", "a", "-",
                                "http://w/1"]
    assert lines[2].split() == ["t2", "succeeded", "2", "3.2", "s", "ago", "-", "k7",
                                "http://w/2"]
    assert lines[3].split() == ["t3", "cancelled", "-", "-", "-", "-", "-"]


def test_the_failed_list_says_what_the_last_attempt_got_cut_short() -> None:
    now = 1_700_000_000.0
    long = "x" * 40
    lines = tables.failed_lines([
        {"id": "t1", "attempts": 3, "finished": now - 10, "last_response": {"status": 503},
         "name": "n", "url": "u"},
        {"id": "t2", "attempts": 1, "last_response": {"status": None,
                                                      "error": "refused\nsecond line"}},
        {"id": "t3", "last_response": {"error": long}},
        {"id": "t4", "last_response": {"error": long + "y"}},
        {"id": "t5", "last_response": {"error": ""}},
        {"id": "t6", "last_response": "odd"}], now=now)
    assert lines[0].split() == ["ID", "ATTEMPTS", "FAILED", "LAST", "NAME", "URL"]
    assert lines[1].split() == ["t1", "3", "10.0", "s", "ago", "HTTP", "503", "n", "u"]
    assert lines[2].split() == ["t2", "1", "-", "refused", "-", "-"]
    assert lines[3].split() == ["t3", "-", "-", long, "-", "-"]
    assert lines[4].split() == ["t4", "-", "-", "x" * 37 + "...", "-", "-"]
    assert lines[5].split() == ["t5", "-", "-", "-", "-", "-"]
    assert lines[6].split() == ["t6", "-", "-", "-", "-", "-"]
