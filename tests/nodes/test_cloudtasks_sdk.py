"""Google's own ``google-cloud-tasks`` SDK, REST transport, against real nodes: tasks
created with a name and without, read, listed, deleted and run; queues made, read,
paused and resumed; the sink gets Cloud Tasks' ``X-CloudTasks-*`` headers; a failing
target is retried as the queue's retry config says; the SDK's Bearer token is checked
as any other; errors arrive as the SDK's own exceptions (Google's JSON error shape).
The routes' units are in tests/unit/http/test_cloudtasks.py."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as authexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import tasks_v2  # the test extra's google-cloud-tasks: missing is a failure
from google.oauth2.credentials import Credentials
from google.protobuf import timestamp_pb2

from helpers import Reply, wait_until

P, L = "my-project", "us-central1"
ADMIN, READ = "ct-admin-token-0123456789", "ct-read-token-0123456789"
RETRYING = {"max_attempts": 3, "min_backoff": 0.05, "max_backoff": 0.2, "max_doublings": 2}


def client(node, token: str | None = None) -> tasks_v2.CloudTasksClient:
    creds = Credentials(token=token) if token else AnonymousCredentials()
    return tasks_v2.CloudTasksClient(credentials=creds, transport="rest",
                                     client_options=ClientOptions(api_endpoint=node.url))


def available(call):
    """``call()``'s answer once the cluster's definitions have a leader: a queue's
    settings are written by it, and before it a write is UNAVAILABLE (503), try again."""
    out: list = []

    def done() -> bool:
        try:
            out.append(call())
        except gexc.ServiceUnavailable:
            return False
        return True

    wait_until(done, 10, what="a leader for the definitions")
    return out[0]


def http_task(url: str, name: str | None = None, body: bytes = b"", delay: float = 0.0,
              **kw) -> tasks_v2.Task:
    req = tasks_v2.HttpRequest(url=url, http_method=tasks_v2.HttpMethod.POST, body=body,
                               headers={"Content-Type": "application/json", "X-App": "1"})
    task = tasks_v2.Task(http_request=req, **kw)
    if name:
        task.name = name
    if delay:
        ts = timestamp_pb2.Timestamp()
        ts.FromSeconds(int(time.time() + delay))
        task.schedule_time = ts
    return task


@pytest.mark.timeout(90)
def test_the_sdk_drives_tasks_and_queues_on_a_node(node_factory, sink):
    node = node_factory(env={"MIYAMOTO_API_TOKENS": f"admin:{ADMIN},read:{READ}"},
                        queues={"retrying": RETRYING})
    ct = client(node, ADMIN)
    # no token: a 401, on which the SDK tries to refresh its anonymous credentials
    with pytest.raises(authexc.InvalidOperation):
        client(node).list_queues(parent=f"projects/{P}/locations/{L}")
    reader = client(node, READ)
    assert [q.name for q in reader.list_queues(parent=f"projects/{P}/locations/{L}")] == [
        ct.queue_path(P, L, n) for n in ("default", "narrow", "patient", "ratelimited",
                                         "retrying")]
    with pytest.raises(gexc.Forbidden):  # PERMISSION_DENIED: read may not create
        reader.create_task(parent=ct.queue_path(P, L, "default"),
                           task=http_task(sink.url_for("/no")))
    made = available(lambda: ct.create_queue(parent=f"projects/{P}/locations/{L}",
                                             queue=tasks_v2.Queue(name=ct.queue_path(P, L, "sdk"))))
    assert made.name == ct.queue_path(P, L, "sdk") and made.state == tasks_v2.Queue.State.RUNNING
    parent = ct.queue_path(P, L, "sdk")
    with pytest.raises(gexc.Conflict):  # ALREADY_EXISTS
        ct.create_queue(parent=f"projects/{P}/locations/{L}", queue=made)

    named = ct.task_path(P, L, "sdk", "order-1")
    t = ct.create_task(parent=parent, task=http_task(sink.url_for("/named"), named, b'{"a": 1}'))
    assert t.name == named
    with pytest.raises(gexc.Conflict) as dup:  # a name de-duplicates: 409 ALREADY_EXISTS
        ct.create_task(parent=parent, task=http_task(sink.url_for("/named"), named))
    assert "exists" in dup.value.message
    (got,) = sink.wait_for(count=1, path="/named", timeout=10)
    assert got.body == b'{"a": 1}' and got.headers["Content-Type"] == "application/json"
    assert got.headers["X-App"] == "1"
    assert got.headers["X-CloudTasks-QueueName"] == "sdk"
    assert got.headers["X-CloudTasks-TaskName"] == "order-1"
    assert got.headers["X-CloudTasks-TaskRetryCount"] == "0"
    assert got.headers["X-CloudTasks-TaskExecutionCount"] == "0"
    assert abs(float(got.headers["X-CloudTasks-TaskETA"]) - time.time()) < 30

    later = ct.create_task(parent=parent, task=http_task(sink.url_for("/later"), delay=300))
    assert later.name.startswith(parent + "/tasks/") and later.schedule_time.timestamp() > \
        time.time() + 200
    assert ct.get_task(name=later.name).name == later.name
    assert later.name in [x.name for x in ct.list_tasks(parent=parent)]
    ct.delete_task(name=later.name)
    with pytest.raises(gexc.NotFound):
        ct.get_task(name=later.name)

    run = ct.create_task(parent=parent, task=http_task(sink.url_for("/run"), delay=300))
    ct.run_task(name=run.name)  # due in 5 minutes, dispatched now
    (r,) = sink.wait_for(count=1, path="/run", timeout=10)
    assert r.headers["X-CloudTasks-TaskName"] == run.name.rsplit("/", 1)[1]

    paused = ct.pause_queue(name=parent)
    assert paused.state == tasks_v2.Queue.State.PAUSED
    assert ct.get_queue(name=parent).state == tasks_v2.Queue.State.PAUSED
    held = ct.create_task(parent=parent, task=http_task(sink.url_for("/held")))
    wait_until(lambda: ct.get_task(name=held.name).schedule_time.timestamp() < time.time(),
               10, what="the held task due")
    assert sink.count("/held") == 0  # due, and the queue is paused
    assert ct.resume_queue(name=parent).state == tasks_v2.Queue.State.RUNNING
    sink.wait_for(count=1, path="/held", timeout=10)


@pytest.mark.timeout(60)
def test_the_sdks_retry_config_is_how_a_failing_target_is_retried(node_factory, sink):
    node = node_factory(queues={"retrying": RETRYING})
    ct = client(node)
    declared = ct.get_queue(name=ct.queue_path(P, L, "retrying"))  # the config's, as read
    assert declared.retry_config.max_attempts == 3 and declared.retry_config.max_doublings == 2
    assert declared.retry_config.min_backoff.total_seconds() == pytest.approx(0.05)
    assert available(lambda: ct.update_queue(queue=declared)) == declared  # as read: no change
    parent = ct.queue_path(P, L, "made")
    retry = tasks_v2.RetryConfig(max_attempts=7, max_doublings=1, min_backoff=timedelta(
        milliseconds=50), max_backoff=timedelta(milliseconds=100))
    made = ct.create_queue(parent=f"projects/{P}/locations/{L}",
                           queue=tasks_v2.Queue(name=parent, retry_config=retry))
    assert made.retry_config.max_attempts == 7
    # UpdateQueue with a mask: only maxAttempts changes
    q = ct.update_queue(queue=tasks_v2.Queue(name=parent, retry_config=tasks_v2.RetryConfig(
        max_attempts=3, max_doublings=9)), update_mask={"paths": ["retry_config.max_attempts"]})
    assert (q.retry_config.max_attempts, q.retry_config.max_doublings) == (3, 1)
    assert ct.get_queue(name=parent).retry_config.max_attempts == 3
    with pytest.raises(gexc.BadRequest) as refused:  # past our bound, named as its field
        ct.update_queue(queue=tasks_v2.Queue(name=parent, retry_config=tasks_v2.RetryConfig(
            max_attempts=100000)))
    assert "retryConfig.maxAttempts" in refused.value.message
    sink.reply("/fail", Reply(503))
    t = ct.create_task(parent=parent, task=http_task(sink.url_for("/fail"), body=b"{}"))

    def gone() -> bool:
        try:
            ct.get_task(name=t.name)
        except gexc.NotFound:
            return True
        return False

    wait_until(gone, 20, what="the failing task to end")
    reqs = sink.requests("/fail")
    assert [r.headers["X-CloudTasks-TaskRetryCount"] for r in reqs] == ["0", "1", "2"]
    assert [r.headers.get("X-CloudTasks-TaskPreviousResponse") for r in reqs] == \
        [None, "503", "503"]
    assert reqs[2].headers["X-CloudTasks-TaskRetryReason"] == "HTTP status 503"
    assert reqs[2].headers["X-CloudTasks-TaskExecutionCount"] == "2"


@pytest.mark.timeout(90)
def test_the_sdk_against_a_three_node_cluster(cluster_factory, sink):
    """Calls at different members: a queue made on one has its settings on all; each
    task delivered once, a pause and a delete hold cluster-wide, a failing target
    retried as the queue made through the SDK says, each retry once."""
    a, b, c = (client(n) for n in cluster_factory(3))
    parent = a.queue_path(P, L, "shared")
    retry = tasks_v2.RetryConfig(max_attempts=2, min_backoff=timedelta(milliseconds=50),
                                 max_backoff=timedelta(milliseconds=100))
    available(lambda: a.create_queue(parent=f"projects/{P}/locations/{L}",
                                     queue=tasks_v2.Queue(name=parent, retry_config=retry)))


    def everywhere() -> bool:  # a majority has it on disk at once, the rest a moment later
        try:
            return all(x.get_queue(name=parent).retry_config.max_attempts == 2 for x in (b, c))
        except gexc.NotFound:
            return False

    wait_until(everywhere, 10, what="the queue's settings on every member")
    named = a.create_task(parent=parent, task=http_task(
        sink.url_for("/c1"), a.task_path(P, L, "shared", "once"), b"{}"))
    with pytest.raises(gexc.Conflict):  # the name's owner de-duplicates for every member
        c.create_task(parent=parent, task=http_task(sink.url_for("/c1"), named.name))
    later = b.create_task(parent=parent, task=http_task(sink.url_for("/c2"), delay=300))
    assert c.get_task(name=later.name).http_request.url == sink.url_for("/c2")
    assert later.name in [t.name for t in c.list_tasks(parent=parent)]
    a.delete_task(name=later.name)
    with pytest.raises(gexc.NotFound):
        b.get_task(name=later.name)

    assert a.pause_queue(name=parent).state == tasks_v2.Queue.State.PAUSED
    assert c.get_queue(name=parent).state == tasks_v2.Queue.State.PAUSED
    held = b.create_task(parent=parent, task=http_task(sink.url_for("/c3")))
    wait_until(lambda: c.get_task(name=held.name).schedule_time.timestamp() < time.time(),
               10, what="the held task due")
    sink.reply("/fail", Reply(503))
    failing = c.create_task(parent=parent, task=http_task(sink.url_for("/fail"), body=b"{}"))
    assert sink.count("/c3") == sink.count("/fail") == 0  # due, and the queue is paused
    c.resume_queue(name=parent)

    def ended(name: str) -> bool:
        try:
            a.get_task(name=name)
        except gexc.NotFound:
            return True
        return False

    wait_until(lambda: all(ended(t.name) for t in (named, held, failing)), 30,
               what="every task to end")
    assert sink.count("/c1") == sink.count("/c3") == 1
    assert [r.headers["X-CloudTasks-TaskRetryCount"] for r in sink.requests("/fail")] == \
        ["0", "1"]
    assert sink.count("/c2") == 0
