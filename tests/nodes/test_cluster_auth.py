"""The cluster port obeys only the cluster: CurveZMQ keys, and roster members only.

Real node processes; the attacker is a raw pyzmq DEALER in the test process. What was
found before: a keyless DEALER's DONE marked a scheduled task succeeded on
both replicas and it was never delivered; CANCEL and a remote purge worked the same way;
a stranger's ``miyamoto serve --seeds`` joined the roster; and, while every node held the
same key pair, any key holder spoke as any member (a forged DONE under a member's id),
and a message replayed from earlier was obeyed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from helpers import (CLUSTER_CURVE, NodeProcess, as_member, cluster_view, dealer, free_port,
                     member_ids, port_refuses, wait_converged, wait_until)

KEYLESS = {"curve_public": "", "curve_secret": ""}
INSECURE = dict(KEYLESS, insecure_cluster="true")


def forged(task_id: str, reply_to: str) -> list[list[bytes]]:
    """Well-formed messages that would end, cancel or purge the task if obeyed."""
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    req = lambda op, args: [b"REQUEST", j({"req": os.urandom(4).hex(), "reply_to": reply_to,  # noqa: E731
                                           "op": op, "args": args})]
    return [
        [b"DONE", j({"id": task_id, "attempts": 1, "last": None})],
        [b"FAILED", j({"id": task_id, "attempts": 1, "last": None})],
        [b"CANCEL", j({"id": task_id})],
        [b"HANDOFF", j({"tasks": [[task_id, 0]]})],
        req("control", {"queue": "victim", "action": "purge"}),
        req("control", {"queue": "default", "action": "pause"}),
        req("cancel", {"id": task_id}),
    ]


def attack(nodes: list[NodeProcess], task_id: str, who: list[tuple[bytes, Any, bool]]) -> None:
    for n in nodes:
        for identity, curve, prove in who:
            s = dealer(n.cluster_addr, identity, curve, prove=prove)
            for frames in forged(task_id, n.cluster_addr):
                s.send_multipart(frames)
            s.close(linger=10_000)  # waits until what could be sent went out (a CURVE
            # handshake on a loaded box can take seconds)


def check_untouched(nodes: list[NodeProcess], sink: Any, target: dict, victim: dict) -> None:
    """Both tasks are delivered once, at their eta; no queue was paused or purged."""
    for t, path in ((target, "/forged"), (victim, "/victim")):
        (req,) = sink.wait_for(count=1, path=path, timeout=20)
        assert req.task_id == t["id"]
        assert req.time >= t["eta"] - 0.05, "pulled in by a forged HANDOFF"
        assert nodes[0].wait_task_state(t["id"], "succeeded")["attempts"] == 1
    for n in nodes:
        assert n.running, n.log_text(40)
        queues = n.get("/queues").json()
        assert not any(q.get("paused") for q in _queue_list(queues)), queues
    assert sink.count("/forged") == 1 and sink.count("/victim") == 1


def _queue_list(body: Any) -> list[dict]:
    qs = body.get("queues", body) if isinstance(body, dict) else body
    return list(qs.values()) if isinstance(qs, dict) else list(qs)


@pytest.mark.timeout(90)
def test_forged_messages_from_outside_the_cluster_change_nothing(cluster_factory, sink):
    nodes = cluster_factory(3)
    wait_converged(nodes)
    # nor can a task be aimed at a member's API or cluster port (the target guard)
    for url in (f"http://127.0.0.1:{nodes[1].http_port}/queues/victim/purge",
                f"http://127.0.0.1:{nodes[2].cluster_port}/"):
        r = nodes[0].post("/queue", json={"url": url}, timeout=10)
        assert r.status_code == 400 and r.json()["field"] == "url", r.text
    target = nodes[0].enqueue(url=f"{sink.url}/forged", countdown=4)
    victim = nodes[0].enqueue("victim", url=f"{sink.url}/victim", countdown=4)
    attack(nodes, target["id"], [
        (b"intruder", None, False),                           # no CURVE at all
        (b"intruder", zmq_keypair(), False),                  # CURVE, no join proof
        (nodes[1].node_id.encode() + b"\x00x", None, False),  # a member's id, no key
    ])
    # holders of the join secret (the cluster pair): not a member's id, dropped by the
    # roster rule; a member's id from the insider's own key, dropped by the key rule
    attack(nodes, target["id"], [(b"stranger", CLUSTER_CURVE, True),
                                 (nodes[1].node_id.encode(), zmq_keypair(), True)])
    b = nodes[1].node_id
    for n in nodes:  # the positive control: those messages were read, and dropped
        wait_until(lambda n=n: "dropped DONE from 'stranger': not a roster member"
                   in n.log_text(), 20, what=f"{n.node_id} to drop the stranger's DONE")
        wait_until(lambda n=n: f"dropped DONE from '{b}': not the key {b} joined with"
                   in n.log_text(), 20, what=f"{n.node_id} to drop the forged DONE")
        assert "not the cluster key" in n.log_text()
    replay(nodes, target["id"])
    check_untouched(nodes, sink, target, victim)


def replay(nodes: list[NodeProcess], task_id: str) -> None:
    """Member b's own key (read from its data dir: the strongest insider) replays a DONE
    from b's earlier incarnation, and one under a sequence number its connection used."""
    b = nodes[1]
    me = as_member(b)
    boot = me["boot"]
    done = forged(task_id, nodes[0].cluster_addr)[0]
    clock = [b"CLOCK", json.dumps({"t1": 1.0}).encode()]  # harmless: a probe
    for n in (nodes[0], nodes[2]):
        s = dealer(n.cluster_addr, b.node_id.encode(), **me)
        s.send_multipart(done, stamp=(boot - 1, 10**9))
        s.send_multipart(clock, stamp=(boot, 5))
        s.send_multipart(done, stamp=(boot, 5))
        s.close(linger=10_000)
    for n in (nodes[0], nodes[2]):
        for why in ("from an earlier incarnation", "a sequence number already seen"):
            wait_until(lambda n=n, why=why: f"dropped DONE from '{b.node_id}': {why}"
                       in n.log_text(), 20, what=f"{n.node_id} to drop the replay ({why})")


@pytest.mark.timeout(90)
def test_insecure_cluster_still_obeys_only_members(cluster_factory, sink):
    nodes = cluster_factory(3, options=INSECURE)
    view = wait_converged(nodes)
    for n in nodes:
        assert "insecure_cluster = true" in n.log_text() and "(CurveZMQ)" not in n.log_text()
    target = nodes[0].enqueue(url=f"{sink.url}/forged", countdown=4)
    victim = nodes[0].enqueue("victim", url=f"{sink.url}/victim", countdown=4)
    attack(nodes, target["id"], [(b"stranger", None, False), (b"evil\x00tag", None, False)])
    for n in nodes:
        wait_until(lambda n=n: "dropped CANCEL from 'stranger': not a roster member"
                   in n.log_text(), 20, what=f"{n.node_id} to drop the stranger's CANCEL")
    check_untouched(nodes, sink, target, victim)
    assert set(member_ids(cluster_view(nodes[0]))) == set(member_ids(view))


@pytest.mark.timeout(30)
def test_a_node_with_seeds_and_no_key_refuses_to_start(node_factory):
    seeds = [f"tcp://127.0.0.1:{free_port()}"]
    n = node_factory("keyless", options=KEYLESS, seeds=seeds, ready=False)
    assert n.wait_exit(15) == 2
    text = n.log_text()
    assert "curve_secret" in text and "miyamoto keygen" in text and "Traceback" not in text
    # the way round it is explicit, and said out loud
    n2 = node_factory("insecure", options=INSECURE, seeds=seeds, ready=False)
    wait_until(lambda: "insecure_cluster = true" in n2.log_text(), 10, what="the warning")
    assert n2.running


@pytest.mark.timeout(30)
def test_a_node_without_a_key_is_a_cluster_of_one(node_factory, sink):
    n = node_factory("alone", options=KEYLESS)
    assert "a cluster of one" in n.log_text()
    assert port_refuses(n.cluster_port), "a keyless node must not listen for peers"
    view = cluster_view(n)
    assert member_ids(view) == ["alone"] and view["leader"] == "alone"
    t = n.enqueue(url=f"{sink.url}/alone")
    (req,) = sink.wait_for(count=1, path="/alone", timeout=10)
    assert req.task_id == t["id"]


def zmq_keypair() -> tuple[bytes, bytes, bytes]:
    """A CURVE client key pair that is not the cluster's, aimed at the cluster's server key."""
    import zmq

    public, secret = zmq.curve_keypair()
    return public, secret, CLUSTER_CURVE[0]



@pytest.mark.timeout(30)
def test_a_node_whose_key_file_is_not_a_key_pair_refuses_to_start(node_factory, tmp_path):
    data = tmp_path / "data-badkey"
    data.mkdir()
    (data / "node.key").write_text('{"public": "not a key"}')
    n = node_factory("badkey", data_dir=str(data), ready=False)
    assert n.wait_exit(15) == 2
    text = n.log_text()
    assert str(data / "node.key") in text and "Traceback" not in text, text
    assert (data / "node.key").read_text() == '{"public": "not a key"}'  # left as it was
