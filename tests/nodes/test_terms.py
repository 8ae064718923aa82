"""Terms move only for members, and never by a flood: real nodes under a forged-term flood.

Real node processes; the attacker is a raw pyzmq DEALER in the test process holding the
cluster key (an insider's key, not a member). What was found before: one VOTE with term
2**52 to each node made every node adopt it, every candidate's term+1 was then refused
as absurd, and enqueue and /readyz answered 503 until every node restarted.
"""

from __future__ import annotations

import json
import time

import pytest

from helpers import cluster_view, dealer, wait_converged, wait_until

HUGE = 2**52  # the largest term a message may carry


def flood(node_addr: str, members: list[dict]) -> int:
    """Every kind of term-raising frame at 2**52, as a stranger and in members' names."""
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    me = {"id": "mallory", "cluster": "tcp://127.0.0.1:1", "http": "127.0.0.1:1"}
    env = lambda who: {"term": HUGE, "inc": "0123456789abcdef", "from": who}  # noqa: E731
    frames = []
    for who in [me, *members]:  # a stranger, and the members it speaks for
        frames += [
            [b"VOTE", j(dict(env(who), granted=True))],
            [b"VOTE", j(dict(env(who), granted=False, pre=True))],
            [b"VOTE_REQUEST", j(dict(env(who), rterm=HUGE, version=HUGE))],
            [b"VOTE_REQUEST", j(dict(env(who), rterm=HUGE, version=HUGE, transfer=True))],
            [b"HEARTBEAT_ACK", j(dict(env(who), ok=False, rterm=HUGE, version=HUGE))],
            [b"LEAVE", j(env(who))],
        ]
    sent = 0
    # as "mallory", then under each member's own routing id (which any key holder may
    # pick) but without its incarnation
    for identity in [b"mallory", *(m["id"].encode() + b"\x00forged" for m in members)]:
        s = dealer(node_addr, identity)
        for f in frames:
            s.send_multipart(f)
            sent += 1
        s.close(linger=10_000)  # waits until what could be sent went out
    return sent


@pytest.mark.timeout(60)
def test_a_forged_term_flood_leaves_the_leader_in_place(cluster_factory, sink):
    nodes = cluster_factory(3)
    view = wait_converged(nodes)
    leader, term = view["leader"], view["term"]
    members = [{k: m[k] for k in ("id", "cluster", "http")} for m in view["members"]]
    for n in nodes:
        flood(n.cluster_addr, members)
    for n in nodes:  # the positive control: the flood was read, and dropped
        wait_until(lambda n=n: "mallory" in n.log_text(), 10,
                   what=f"{n.node_id} to have read the flood")
    t0 = time.monotonic()
    ok = 0
    while time.monotonic() - t0 < 4.0:  # a few election timeouts of the fast timings
        for n in nodes:
            r = n.post("/queue", json={"url": f"{sink.url}/w", "countdown": 60}, timeout=5)
            assert r.status_code == 200, (n.node_id, r.status_code, r.text)
            ok += 1
    after = wait_converged(nodes, timeout=5)
    assert after["leader"] == leader and after["term"] == term, (view, after)
    for n in nodes:
        v = cluster_view(n)
        assert v["term"] == term and v["leader"] == leader, (n.node_id, v)
        assert n.get("/readyz").status_code == 200
        assert n.running, n.log_text(40)
    assert ok >= 3
