"""The cluster: real node processes (``python -m miyamoto serve``) on OS-assigned ports,
each seeded with every node's cluster address, and a real HTTP sink.

Timings are the fast test ones (conftest.FAST_OPTIONS): heartbeat 0.1 s, failure
timeout 1 s, elections 0.3-0.6 s, replica_offset 1 s. Every wait is a condition with a
deadline. Where a test must show that something did NOT happen (a duplicate delivery,
a sibling firing), it waits past the moment that thing would have happened (the last
replica's offset plus a margin) and then counts.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import requests

from helpers import (NodeProcess, Reply, Sink, cluster_view, member_ids, run_cli,
                     wait_converged, wait_until)

OFFSET = 1.0  # FAST_OPTIONS replica_offset


def enqueue(node: NodeProcess, **fields: Any) -> dict[str, Any]:
    return node.enqueue(**fields)


def others(nodes: list[NodeProcess], *exclude: NodeProcess) -> list[NodeProcess]:
    return [n for n in nodes if n not in exclude]


def by_id(nodes: list[NodeProcess], node_id: str) -> NodeProcess:
    (n,) = [n for n in nodes if n.node_id == node_id]
    return n


def duplicates(counts: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v > 1}


# ================================================================ 1. one roster, one leader


@pytest.mark.timeout(60)
def test_three_nodes_agree_on_roster_and_leader(cluster_factory):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    views = [cluster_view(n) for n in nodes]
    assert {v["leader"] for v in views} == {view["leader"]}
    assert {v["term"] for v in views} == {view["term"]}
    assert view["term"] >= 1
    for n, v in zip(nodes, views):
        assert v["node"] == n.node_id
        assert member_ids(v) == ["a", "b", "c"]
        # the members carry their addresses, and exactly one is flagged leader
        assert {m["id"]: m["http"] for m in v["members"]} == {x.node_id: x.http_addr for x in nodes}
        assert {m["id"]: m["cluster"] for m in v["members"]} == \
            {x.node_id: x.cluster_addr for x in nodes}
        assert [m["id"] for m in v["members"] if m["leader"]] == [view["leader"]]
    roles = Counter(v["role"] for v in views)
    assert roles == {"leader": 1, "follower": 2}, roles
    leader_view = [v for v in views if v["role"] == "leader"]
    assert leader_view[0]["node"] == view["leader"]

    for n in nodes:
        cp = run_cli("status", "--server", n.url)
        assert cp.returncode == 0, cp.stderr
        out = json.loads(cp.stdout)
        assert out["cluster"]["leader"] == view["leader"]
        assert out["cluster"]["term"] == view["term"]
        assert member_ids(out["cluster"]) == ["a", "b", "c"]
        assert isinstance(out["queues"], list)
