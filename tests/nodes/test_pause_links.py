"""A node paused past the ZeroMQ heartbeat timeout must hear its peers again on resume.

Real processes: a cluster of two, its leader frozen (SIGSTOP) for 5 s, three times.
While it is frozen the other node's DEALER to it times out (HEARTBEAT_TIMEOUT_MS, 3 s)
and reconnects. libzmq reconnects under the same routing id, and the frozen node's
ROUTER still holds the old connection under that id when it resumes: it took the new one
for a duplicate and discarded everything that came over it, for good. The resumed node
then heard nobody, stepped down, and the pair stayed without a leader (about 4 minutes
in one run, until something else dropped the link) while its copies waited. The
transport now redials a dropped connection with a fresh DEALER (a fresh routing id).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from helpers import NodeProcess, cluster_view, wait_converged, wait_until

PAUSE_S = 5.0  # past the transport's HEARTBEAT_TIMEOUT_MS (3 s)


def both_hear_each_other(nodes: list[NodeProcess]) -> bool:
    """One leader, and every node heard every other member within the last second."""
    views = [cluster_view(n) for n in nodes]
    if sorted(v.get("role") for v in views) != ["follower", "leader"]:
        return False
    return all(m["last_heard"] is not None and m["last_heard"] < 1.0
               for v in views for m in v["members"] if m["id"] != v["node"])


def accepted(node: NodeProcess, url: str, round_: int, ids: list[str]) -> bool:
    """An enqueue through ``node`` was acknowledged (its id kept); a 503 (no majority in
    reach, as right after an election) is retried by the caller, as a client would."""
    r = node.post("/queue", json={"url": url, "params": {"r": str(round_)}})
    assert r.status_code in (200, 503), (r.status_code, r.text)
    if r.status_code == 200:
        ids.append(r.json()["id"])
    return r.status_code == 200


def links(nodes: list[NodeProcess]) -> list[Any]:
    return [(v["node"], v.get("role"), [(m["id"], m["last_heard"]) for m in v["members"]])
            for v in (cluster_view(n) for n in nodes)]


@pytest.mark.timeout(120)
def test_a_node_paused_past_the_heartbeat_timeout_hears_its_peer_again(cluster_factory, sink):
    nodes = cluster_factory(2, options={"replication": 2})
    wait_converged(nodes)
    for round_ in range(3):
        leader = next(n for n in nodes if cluster_view(n).get("role") == "leader")
        leader.signal(signal.SIGSTOP)
        time.sleep(PAUSE_S)  # the fault itself: the node is frozen this long
        leader.signal(signal.SIGCONT)
        ids: list[str] = []
        try:  # (right after the resume the frozen node's old inbox makes both look fine)
            for n in nodes:
                wait_until(lambda: accepted(n, f"{sink.url}/after", round_, ids), 20,
                           what=f"an enqueue through {n.node_id} acknowledged (round {round_})")
            wait_until(lambda: both_hear_each_other(nodes), 10,
                       what=f"a leader, and both nodes hearing each other (round {round_})")
        except AssertionError as e:
            raise AssertionError(f"{e}; (node, role, [(member, last heard s ago)]): "
                                 f"{links(nodes)}") from None
        sink.wait_for(lambda reqs: set(ids) <= {r.task_id for r in reqs}, path="/after",
                      timeout=20)
