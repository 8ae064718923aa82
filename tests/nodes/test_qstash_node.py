"""QStash's own Python SDK (``qstash``) pointed at real nodes: it publishes, enqueues,
batches, schedules and cancels, and its ``Receiver`` verifies what the worker gets (the
header mapping and the error shapes alone: tests/unit/http/test_upstash.py)."""

from __future__ import annotations

from typing import Any

import pytest
import qstash  # the test extra's (setup.py): missing, this fails rather than skips

from helpers import NodeProcess, Reply, Sink, wait_until

TOKEN = "qstash-test-token-0123456789"
CURRENT = "sig_current_0123456789abcdefghijklmn"
NEXT = "sig_next_0123456789abcdefghijklmnopq"
OPTIONS = {"api_tokens": f"admin:{TOKEN}", "qstash_current_signing_key": CURRENT,
           "qstash_next_signing_key": NEXT}


def _client(node: NodeProcess) -> Any:
    return qstash.QStash(TOKEN, base_url=node.url, retry=False)


def _verified(sink: Sink, path: str, count: int) -> list[Any]:
    """The requests to ``path`` once ``count`` arrived, each verified by QStash's Receiver."""
    reqs = sink.wait_for(count=count, path=path, timeout=20)
    receiver = qstash.Receiver(CURRENT, NEXT)
    for r in reqs:
        url = sink.url_for(path) + (f"?{r.query}" if r.query else "")
        receiver.verify(signature=r.headers["Upstash-Signature"], body=r.body.decode(), url=url)
    return reqs


@pytest.mark.timeout(90)
def test_sdk_publishes_enqueues_batches_and_cancels(node_factory: Any, sink: Sink) -> None:
    node = node_factory(options=OPTIONS)
    q = _client(node)
    sent = q.message.publish_json(url=sink.url_for("/pub"), body={"a": 1},
                                  headers={"X-Trace": "t1"}, deduplication_id="d1")
    again = q.message.publish_json(url=sink.url_for("/pub"), body={"a": 1},
                                   deduplication_id="d1")
    assert again.deduplicated and again.message_id == sent.message_id
    (req,) = _verified(sink, "/pub", 1)
    assert req.json() == {"a": 1} and req.headers["X-Trace"] == "t1"
    assert req.headers["Upstash-Message-Id"] == sent.message_id
    got = q.message.get(sent.message_id)
    assert (got.url, got.max_retries, got.method) == (sink.url_for("/pub"), 3, "POST")

    q.queue.upsert("orders", parallelism=2)
    assert q.queue.get("orders").parallelism == 2
    q.message.enqueue(queue="orders", url=sink.url_for("/enq"), body="plain",
                      content_type="text/plain")
    results = q.message.batch_json([{"url": sink.url_for("/b1"), "body": {"n": 1}},
                                    {"url": sink.url_for("/b2"), "body": {"n": 2},
                                     "queue": "orders"}])
    assert len(results) == 2 and all(r.message_id for r in results)
    assert _verified(sink, "/enq", 1)[0].body == b"plain"
    _verified(sink, "/b1", 1)
    _verified(sink, "/b2", 1)

    q.queue.pause("orders")
    assert q.queue.get("orders").paused
    q.queue.resume("orders")
    assert not q.queue.get("orders").paused

    # a queue nobody upserted has QStash's parallelism of 1: one delivery at a time
    sink.reply("/slow", Reply(200, delay=0.3))
    for i in range(4):
        q.message.enqueue(queue="serial", url=sink.url_for("/slow"), body=str(i))
    _verified(sink, "/slow", 4)
    assert sink.max_inflight_by_path["/slow"] == 1

    q.message.publish(url=sink.url_for("/esc%2Fx?k=a%26b"), body="e")  # escapes kept
    assert _verified(sink, "/esc%2Fx", 1)[0].query == "k=a%26b"

    later = q.message.publish(url=sink.url_for("/never"), body="x", delay=60)
    q.message.cancel(later.message_id)
    with pytest.raises(qstash.errors.QStashError):  # delivered or cancelled: no second cancel
        q.message.cancel("no-such-message")
    assert sink.count("/never") == 0


@pytest.mark.timeout(60)
def test_sdk_retries_land_in_the_dlq(node_factory: Any, sink: Sink) -> None:
    node = node_factory(options=OPTIONS)
    q = _client(node)
    sink.reply("/fail", Reply(500))
    sent = q.message.publish(url=sink.url_for("/fail"), body="b", retries=1)
    _verified(sink, "/fail", 2)  # the first attempt and one retry, as Upstash-Retries says

    def in_dlq() -> Any:
        return [m for m in q.dlq.list().messages if m.message_id == sent.message_id]

    (dead,) = wait_until(in_dlq, timeout=15)
    assert dead.response_status == 500 and dead.max_retries == 1
    assert sink.count("/fail") == 2
    q.dlq.delete(dead.dlq_id)
    assert not in_dlq()


@pytest.mark.timeout(60)
def test_sdk_url_groups_schedules_and_tokens(node_factory: Any, sink: Sink) -> None:
    node = node_factory(options=OPTIONS)
    wrong = qstash.QStash("not-the-token", base_url=node.url, retry=False)
    with pytest.raises(qstash.errors.QStashError) as e:
        wrong.message.publish(url=sink.url_for("/x"), body="b")
    assert "401" in str(e.value) and '"error"' in str(e.value)
    q = _client(node)
    q.url_group.upsert_endpoints("team", [{"url": sink.url_for("/g1")},
                                          {"url": sink.url_for("/g2")}])
    assert [e.url for e in q.url_group.get("team").endpoints] == [sink.url_for("/g1"),
                                                                  sink.url_for("/g2")]
    fanned = q.message.publish_json(url_group="team", body={"hi": True})
    assert len(fanned) == 2
    _verified(sink, "/g1", 1)
    _verified(sink, "/g2", 1)

    sid = q.schedule.create_json(destination=sink.url_for("/cron"), cron="*/5 * * * *",
                                 body={"tick": 1}, retries=2, schedule_id="nightly")
    assert sid == "nightly"
    s = q.schedule.get(sid)
    assert (s.cron, s.destination, s.retries, s.paused) == ("*/5 * * * *",
                                                           sink.url_for("/cron"), 2, False)
    q.schedule.pause(sid)
    assert q.schedule.get(sid).paused
    q.schedule.resume(sid)
    assert [x.schedule_id for x in q.schedule.list()] == ["nightly"]
    native = node.get("/schedules/nightly", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert native["task"]["max_attempts"] == 3 and native["task"]["url"] == sink.url_for("/cron")
    q.schedule.delete(sid)
    assert q.schedule.list() == []
    q.url_group.delete("team")
    assert q.url_group.list() == []
    assert sink.count("/x") == 0


@pytest.mark.timeout(90)
def test_sdk_against_a_three_node_cluster(cluster_factory: Any, sink: Sink) -> None:
    """Each call at another member: every message delivered once, signed; a retry count
    and a cancel hold cluster-wide; a queue's setting and a schedule are on every node.
    Without api_tokens (the harness's convergence wait reads /cluster without one; the
    tokens are proven on one node above): the SDK's Bearer header is then ignored."""
    keys = {k: v for k, v in OPTIONS.items() if k != "api_tokens"}
    a, b, c = cluster_factory(3, options=dict(keys, replication=2, min_replicas=2))
    qa, qb, qc = _client(a), _client(b), _client(c)
    sent = [qa.message.publish(url=sink.url_for("/p"), body=f"m{i}") for i in range(3)]
    qb.queue.upsert("jobs", parallelism=2)
    wait_until(lambda: qc.queue.get("jobs").parallelism == 2, timeout=10)
    qc.message.enqueue(queue="jobs", url=sink.url_for("/p"), body="q")
    qb.message.batch([{"url": sink.url_for("/p"), "body": "b1"},
                      {"url": sink.url_for("/p"), "body": "b2", "queue": "jobs"}])
    sink.reply("/fail", Reply(500))
    failing = qc.message.publish(url=sink.url_for("/fail"), body="f", retries=2)
    later = qa.message.publish(url=sink.url_for("/never"), body="x", delay=30)
    qb.message.cancel(later.message_id)
    qa.schedule.create(destination=sink.url_for("/cron"), cron="0 0 1 1 *", schedule_id="yearly")
    wait_until(lambda: [s.schedule_id for s in qc.schedule.list()] == ["yearly"], timeout=10)

    reqs = _verified(sink, "/p", 6)
    assert sorted(r.body for r in reqs) == [b"b1", b"b2", b"m0", b"m1", b"m2", b"q"]
    ids = [r.headers["Upstash-Message-Id"] for r in reqs]
    assert len(set(ids)) == 6 and {s.message_id for s in sent} <= set(ids)
    _verified(sink, "/fail", 3)  # one attempt and two retries
    wait_until(lambda: qa.message.get(failing.message_id) and any(
        m.message_id == failing.message_id for m in qb.dlq.list().messages), timeout=15)
    assert sink.count("/fail") == 3 and sink.count("/p") == 6 and sink.count("/never") == 0
