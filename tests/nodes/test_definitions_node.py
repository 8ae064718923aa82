"""Cluster-wide definitions on real nodes: they converge after a member was down during
writes, and a stranger's are dropped (the machine and its simulator:
tests/unit/definitions/test_definitions.py)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from helpers import NodeProcess, dealer, definition_write, wait_converged, wait_until
from miyamoto.definitions import messages as dm
from miyamoto.wire import verbs as protocol


def topics_of(node: NodeProcess) -> list[dict]:
    r = node.get("/topics", timeout=5)
    assert r.status_code == 200, r.text
    return r.json()["topics"]


@pytest.mark.timeout(120)
def test_definitions_converge_after_a_member_was_down_during_writes(cluster_factory) -> None:
    a, b, c = nodes = cluster_factory(3)
    assert definition_write(a, "PUT", "/topics/gone", json={"urls": ["http://127.0.0.1:9/g"]}
                  ).status_code == 200
    wait_until(lambda: all(topics_of(n) for n in nodes), timeout=20)
    c.kill()
    wait_converged([a, b], timeout=30)
    r = definition_write(b, "PUT", "/topics/t", json={"urls": ["http://127.0.0.1:9/x"]})
    assert r.status_code == 200, r.text  # a majority (a, b) has it on disk
    assert definition_write(b, "DELETE", "/topics/gone").status_code == 200
    c.restart().wait_ready(30)
    wait_converged(nodes, timeout=30)
    want = [{"name": "t", "urls": ["http://127.0.0.1:9/x"]}]
    wait_until(lambda: all(topics_of(n) == want for n in nodes), timeout=30)

    def on_disk(n: NodeProcess) -> Any:  # a member catching up writes its file just after
        with open(os.path.join(n.data_dir, "definitions.json")) as f:
            return {e["name"]: e["value"] for e in json.load(f)["entries"]}.get("t")
    wait_until(lambda: all(on_disk(n) == {"urls": ["http://127.0.0.1:9/x"]} for n in nodes),
               timeout=10, what="every member's definitions.json to hold topic t")


@pytest.mark.timeout(60)
def test_a_strangers_definitions_are_dropped(node: NodeProcess) -> None:
    entry = dm.Entry("topic", "evil", 10**6, 1, {"urls": ["http://127.0.0.1:9/evil"]})
    s = dealer(node.cluster_addr, b"stranger")
    for msg in (dm.DefsPut(10**6, (entry,), wid=1),
                dm.DefsWrite("r1", "tcp://127.0.0.1:9", "put", "topic", "evil2",
                            {"urls": ["http://127.0.0.1:9/evil"]})):
        s.send_multipart(protocol.encode(msg.verb, msg.payload()))
    s.close(linger=10_000)
    for verb in ("DEFS_PUT", "DEFS_WRITE"):  # read (the positive control), and dropped
        wait_until(lambda verb=verb: f"dropped {verb} from 'stranger': not a roster member"
                   in node.log_text(), 20)
    assert topics_of(node) == []
