"""QStash's v2 routes in process (``miyamoto.http.qstash`` behind ``http.api.Api``): what
each call enqueues, QStash's answers and error shape, and the tokens, against the
recording service of test_api_inproc.py. With QStash's SDK against real nodes:
tests/nodes/test_qstash_node.py."""

from __future__ import annotations

from typing import Any

import pytest
import ujson

from miyamoto.errors import Duplicate
from miyamoto.http import auth, qstash
from miyamoto.http.api import Api
from miyamoto.tasks.task import State
from miyamoto.tasks.validate import Limits
from test_api_inproc import NOW, URL, Service, call, post_json

pytestmark = pytest.mark.timeout(30)


class QSvc(Service):
    """The recording service, with the queue reads the v2 routes make as a node answers
    them: ``queues(limit, cursor)``, a queue no node holds is None, and so is its control."""

    held = {"default", "orders"}

    def __init__(self) -> None:
        super().__init__()
        self.config.max_queues = 1000

    def queues(self, limit: int = 1000, cursor: str = "") -> dict:  # type: ignore[override]
        self._record("queues", limit, cursor)
        failed = {t.get("queue") for t in self.tasks.values() if t["state"] == "failed"}
        return {"queues": [{"name": n, "counts": {"failed": int(n in failed)}}
                           for n in sorted(self.held)], "next_cursor": None}

    def queue(self, name: str) -> dict | None:  # type: ignore[override]
        self._record("queue", name)
        return {"name": name, "paused": False, "counts": {"scheduled": 2, "running": 1}} \
            if name in self.held else None

    def control(self, queue: str, action: str) -> dict | None:  # type: ignore[override]
        self._record("control", queue, action)
        return {"queue": queue, "action": action} if queue in self.held else None

    def list_tasks(self, queue: str, state: Any, limit: int) -> list[dict]:
        self._record("list_tasks", queue, state, limit)
        return [t for t in self.tasks.values()
                if t.get("queue") == queue and t["state"] == state.value]


@pytest.fixture
def svc() -> Service:
    return QSvc()


@pytest.fixture
def app(svc: Service) -> Api:
    return Api(svc, Limits(), max_batch=10, clock=lambda: NOW)


def publish(app: Api, dest: str, body: bytes = b"", **headers: str) -> Any:
    return call(app, "POST", f"/v2/publish/{dest}", body,
                headers={k.replace("_", "-"): v for k, v in headers.items()})


def test_publish_enqueues_the_mapped_task_and_answers_its_id(app: Api, svc: Service) -> None:
    r = publish(app, URL, b"hi", Upstash_Retries="2", Upstash_Delay="30s",
                Upstash_Forward_X_Trace="t")
    assert r.status == 201, r.body
    (name, task), = svc.calls
    assert r.json() == {"messageId": task.id} and name == "enqueue"
    assert (task.url, task.body, task.max_attempts, task.eta, task.headers) == \
        (URL, "hi", 3, NOW + 30, {"X-Trace": "t"})
    assert task.queue == "default" and task.flow_key is None


def test_a_destination_keeps_its_query_string(app: Api, svc: Service) -> None:
    r = call(app, "POST", f"/v2/publish/{URL}", b"", query="a=1&b=2")
    assert r.status == 201, r.body
    assert svc.calls[0][1].url == URL + "?a=1&b=2"


def test_a_destination_is_taken_as_sent_with_its_escapes(app: Api, svc: Service) -> None:
    r = call(app, "POST", f"/v2/publish/{URL}/p q", b"", raw_uri=f"/v2/publish/{URL}/p%20q")
    assert r.status == 201 and svc.calls.pop()[1].url == URL + "/p%20q", r.body
    raw = f"/v2/enqueue/orders/{URL}/a%2Fb%20c?x=%26"
    r = call(app, "POST", f"/v2/enqueue/orders/{URL}/a/b c", b"", query="x=%26",
             raw_uri=raw)
    assert r.status == 201, r.body
    assert svc.calls[0][1].url == URL + "/a%2Fb%20c?x=%26"


def test_a_duplicate_is_qstashs_202_with_the_first_id(app: Api, svc: Service) -> None:
    svc.raise_ = Duplicate("first-id")
    r = publish(app, URL, b"x", Upstash_Deduplication_Id="d")
    assert (r.status, r.json()) == (202, {"messageId": "first-id", "deduplicated": True})
    assert svc.calls[0][1].name == "d"


@pytest.mark.parametrize("path, headers, status, says", [
    (f"/v2/publish/{URL}", {"Upstash-Retries": "x"}, 400, "Upstash-Retries must"),
    (f"/v2/publish/{URL}", {"Upstash-Delay": "40d"}, 400, "Upstash-Delay must be at most"),
    ("/v2/publish/ftp://x/y", {}, 400, "destination must be an http"),  # not a group name
    ("/v2/publish/nogroup", {}, 404, "destination names no URL group: nogroup"),
    ("/v2/nothing", {}, 404, "no route for /v2/nothing"),
    ("/v2/enqueue/bad queue!/http://x/", {}, 400, "queue must be 1-100"),
])
def test_errors_are_qstashs_shape_naming_the_culprit(app: Api, svc: Service, path: str,
                                                     headers: dict, status: int,
                                                     says: str) -> None:
    r = call(app, "POST", path, b"", headers=headers)
    assert r.status == status, r.body
    assert list(r.json()) == ["error"] and r.json()["error"].startswith(says), r.json()
    assert not [c for c in svc.calls if c[0].startswith("enqueue")]


def test_enqueue_to_a_queue_shares_its_parallelism(app: Api, svc: Service) -> None:
    r = call(app, "POST", f"/v2/enqueue/orders/{URL}", b"a")
    assert r.status == 201, r.body
    t = svc.calls[-1][1]
    assert (t.queue, t.flow_key, t.flow_parallelism) == ("orders", "qstash-queue:orders", 1)
    r = post_json(app, "/v2/queues", {"queueName": "orders", "parallelism": 3})
    assert r.status == 200, r.body
    assert not [c for c in svc.calls if c[0] == "control"]  # it runs already: no resume
    assert post_json(app, "/v2/queues", {"queueName": "orders", "parallelism": 3,
                                         "paused": True}).status == 200
    assert ("control", "orders", "pause") in svc.calls
    post_json(app, "/v2/queues", {"queueName": "orders", "parallelism": 3})
    call(app, "POST", f"/v2/enqueue/orders/{URL}", b"b")
    assert svc.calls[-1][1].flow_parallelism == 3
    q = call(app, "GET", "/v2/queues/orders").json()
    assert (q["name"], q["parallelism"], q["paused"]) == ("orders", 3, False)
    r = post_json(app, "/v2/queues", {"queueName": "orders", "parallelism": 0})
    assert r.status == 400 and r.json()["error"].startswith("parallelism"), r.body


def test_batch_answers_each_message_and_a_group_as_a_list(app: Api, svc: Service) -> None:
    svc.definitions.op("put", "topic", "team", {"urls": [URL, URL + "2"]})
    items = [{"destination": URL, "headers": {"Upstash-Retries": "0"}, "body": "one"},
             {"destination": "team", "body": "all"},
             {"destination": URL, "queue": "orders"}]
    r = post_json(app, "/v2/batch", items)
    assert r.status == 200, r.body
    (_, tasks), = svc.calls
    assert [t.url for t in tasks] == [URL, URL, URL + "2", URL]
    assert tasks[0].max_attempts == 1 and tasks[3].queue == "orders"
    out = r.json()
    assert out[0] == {"messageId": tasks[0].id}
    assert out[1] == [{"messageId": tasks[1].id, "url": URL},
                      {"messageId": tasks[2].id, "url": URL + "2"}]
    bad = post_json(app, "/v2/batch", [items[0], {"destination": URL,
                                                  "headers": {"Upstash-Delay": "x"}}])
    assert bad.status == 400 and bad.json()["error"].startswith("[1].Upstash-Delay"), bad.body
    for item, why in (("x", "destination must be given as a string"),
                      ({"destination": 5}, "destination must be given as a string"),
                      ({"destination": URL, "headers": {"Upstash-Retries": 2}},
                       "headers must be an object of header names to strings"),
                      ({"destination": URL, "headers": ["a"]}, "headers must be an object")):
        bad = post_json(app, "/v2/batch", [items[0], item])
        assert bad.status == 400 and bad.json()["error"].startswith(f"[1].{why}"), bad.body
    assert len(svc.calls) == 1  # none of them enqueued anything


def test_messages_are_read_and_cancelled(app: Api, svc: Service) -> None:
    svc.tasks["t-1"].update(url=URL, method="POST", max_attempts=4, eta=NOW, created=NOW)
    r = call(app, "GET", "/v2/messages/t-1")
    assert r.status == 200 and r.json()["messageId"] == "t-1" and r.json()["maxRetries"] == 3
    assert call(app, "DELETE", "/v2/messages/t-1").status == 202
    r = call(app, "DELETE", "/v2/messages/t-2")
    assert (r.status, r.json()) == (404, {"error": "message t-2 not found"})
    r = call(app, "DELETE", "/v2/messages", ujson.dumps({"messageIds": ["t-1", "t-2"]}).encode())
    assert r.json() == {"cancelled": 1}
    r = call(app, "DELETE", "/v2/messages")
    assert r.status == 400 and r.json()["error"].startswith("messageIds"), r.body


def test_schedules_take_upstash_cron(app: Api, svc: Service) -> None:
    r = call(app, "POST", f"/v2/schedules/{URL}", b"tick",
             headers={"Upstash-Cron": "CRON_TZ=Asia/Tokyo */5 * * * *",
                      "Upstash-Schedule-Id": "s1", "Upstash-Retries": "1"})
    assert (r.status, r.json()) == (200, {"scheduleId": "s1"}), r.body
    stored = svc.definitions.machine.get("schedule", "s1")
    assert (stored["cron"], stored["timezone"]) == ("*/5 * * * *", "Asia/Tokyo")
    assert stored["task"]["max_attempts"] == 2 and stored["task"]["body"] == "tick"
    s = call(app, "GET", "/v2/schedules/s1").json()
    assert s["cron"] == "CRON_TZ=Asia/Tokyo */5 * * * *" and s["retries"] == 1
    assert call(app, "PATCH", "/v2/schedules/s1/pause").status == 200
    assert call(app, "GET", "/v2/schedules/s1").json()["isPaused"] is True
    r = call(app, "POST", f"/v2/schedules/{URL}", b"", headers={"Upstash-Cron": "61 * * * *"})
    assert r.status == 400 and r.json()["error"].startswith("Upstash-Cron"), r.body
    r = call(app, "POST", f"/v2/schedules/{URL}", b"")
    assert r.status == 400 and r.json()["error"] == "Upstash-Cron is required"
    assert call(app, "DELETE", "/v2/schedules/s1").status == 200
    assert call(app, "GET", "/v2/schedules/s1").status == 404


def test_url_groups_are_topics(app: Api, svc: Service) -> None:
    eps = {"endpoints": [{"url": URL}, {"url": URL + "2"}]}
    assert post_json(app, "/v2/topics/team/endpoints", eps).status == 200
    assert svc.definitions.machine.get("topic", "team") == {"urls": [URL, URL + "2"]}
    r = call(app, "DELETE", "/v2/topics/team/endpoints",
             ujson.dumps({"endpoints": [{"url": URL}]}).encode())
    got = call(app, "GET", "/v2/topics/team")
    assert r.status == 200 and got.status_line == "200 OK"
    assert got.json()["endpoints"] == [{"url": URL + "2"}]
    r = call(app, "DELETE", "/v2/topics/team/endpoints",
             ujson.dumps({"endpoints": [{"url": URL + "2"}]}).encode())
    assert call(app, "GET", "/v2/topics/team").status == 404  # its last endpoint went
    r = post_json(app, "/v2/topics/team/endpoints", {"endpoints": [{"name": "a"}]})
    assert r.status == 400 and "names are not supported" in r.json()["error"]


def test_tokens_apply_as_bearer(svc: Service) -> None:
    app = Api(svc, Limits(), max_batch=10, clock=lambda: NOW,
              tokens=auth.Tokens([("admin", "adm-token"), ("enqueue", "enq-token")]))
    r = call(app, "POST", f"/v2/publish/{URL}", b"")
    assert r.status == 401 and list(r.json()) == ["error"]
    r = call(app, "POST", f"/v2/publish/{URL}", b"", headers={"Authorization": "Bearer enq-token"})
    assert r.status == 201, r.body
    r = call(app, "GET", "/v2/messages/t-1", headers={"Authorization": "Bearer enq-token"})
    assert r.status == 200, r.body
    r = call(app, "DELETE", "/v2/schedules/x", headers={"Authorization": "Bearer enq-token"})
    assert r.status == 403 and list(r.json()) == ["error"]
    r = call(app, "GET", "/v2/schedules", headers={"Authorization": "Bearer adm-token"})
    assert (r.status, r.json()) == (200, [])


def test_the_dlq_is_the_failed_tasks_of_every_queue(app: Api, svc: Service) -> None:
    svc.tasks["f-1"] = {"id": "f-1", "state": "failed", "queue": "orders", "url": URL,
                        "last_response": {"status": 503, "headers": {}, "body": "down"}}
    r = call(app, "GET", "/v2/dlq")
    assert r.status == 200 and [m["dlqId"] for m in r.json()["messages"]] == ["f-1"]
    assert r.json()["messages"][0]["responseStatus"] == 503
    assert ("list_tasks", "orders", State.FAILED, 100) in svc.calls
    assert ("list_tasks", "default", State.FAILED, 100) not in svc.calls  # it has none
    assert call(app, "GET", "/v2/dlq/f-1").json()["responseBody"] == "down"
    r = call(app, "GET", "/v2/dlq/t-1")  # a task that has not failed is in no DLQ
    assert (r.status, r.json()) == (404, {"error": "dlq message t-1 not found"})
    assert call(app, "DELETE", "/v2/dlq/t-1").status == 404
    assert ("delete", "t-1") not in svc.calls
    r = call(app, "DELETE", "/v2/dlq", ujson.dumps({"dlqIds": ["f-1", "t-1", "zz"]}).encode())
    assert (r.status, r.json()) == (200, {"deleted": 1})
    assert ("delete", "f-1") in svc.calls and ("delete", "t-1") not in svc.calls
    assert call(app, "DELETE", "/v2/dlq/f-1").status == 200
    r = call(app, "DELETE", "/v2/dlq", ujson.dumps({"dlqIds": "f-1"}).encode())
    assert (r.status, r.json()) == (400, {"error": "dlqIds must be a list of ids"})


def test_queues_read_delete_and_control(app: Api, svc: Service) -> None:
    q = call(app, "GET", "/v2/queues/default").json()
    assert q == {"name": "default", "parallelism": 1, "createdAt": 0, "updatedAt": 0,
                 "lag": 3, "paused": False}
    assert call(app, "GET", "/v2/queues/nowhere").status == 404
    post_json(app, "/v2/queues", {"queueName": "fresh", "parallelism": 4})
    assert call(app, "GET", "/v2/queues/fresh").json()["createdAt"] == NOW * 1000
    names = [x["name"] for x in call(app, "GET", "/v2/queues").json()]
    assert names == ["default", "fresh", "orders"]
    assert call(app, "POST", "/v2/queues/orders/pause").status == 200
    assert ("control", "orders", "pause") in svc.calls
    assert call(app, "POST", "/v2/queues/nowhere/pause").status == 404
    assert call(app, "DELETE", "/v2/queues/fresh").status == 200
    assert svc.definitions.machine.get("qstash_queue", "fresh") is None
    assert ("control", "fresh", "purge") in svc.calls
    assert call(app, "DELETE", "/v2/queues/nowhere").status == 404
    svc.config.max_queues = 1  # one setting is the most
    assert post_json(app, "/v2/queues", {"queueName": "one"}).status == 200
    r = post_json(app, "/v2/queues", {"queueName": "more"})
    assert r.status == 400 and "max_queues" in r.json()["error"], r.body
    assert post_json(app, "/v2/queues", {"queueName": "one", "parallelism": 2}).status == 200
    r = post_json(app, "/v2/queues", {"queueName": "a b"})
    assert r.status == 400 and r.json()["error"].startswith("queueName"), r.body


def test_publish_to_a_url_group_answers_one_per_url(app: Api, svc: Service) -> None:
    svc.definitions.op("put", "topic", "team", {"urls": [URL, URL + "2"]})
    r = publish(app, "team", b"x")
    assert r.status == 201 and [a["url"] for a in r.json()] == [URL, URL + "2"], r.body
    svc.results = [{"status": "duplicate", "id": "a"}, {"status": "duplicate", "id": "b"}]
    r = publish(app, "team", b"x", Upstash_Deduplication_Id="d")
    assert (r.status, r.json()) == (202, [{"messageId": "a", "url": URL, "deduplicated": True},
                                          {"messageId": "b", "url": URL + "2",
                                           "deduplicated": True}])
    svc.results = [{"status": "error", "id": "a", "error": "too few replicas"}] * 2
    r = publish(app, "team", b"x")
    assert (r.status, r.json()) == (503, {"error": "too few replicas"})
    assert [g["name"] for g in call(app, "GET", "/v2/topics").json()] == ["team"]
    assert call(app, "GET", "/v2/topics/none").status == 404
    assert call(app, "DELETE", "/v2/topics/team").status == 200
    r = call(app, "POST", "/v2/schedules/team", b"", headers={"Upstash-Cron": "* * * * *"})
    assert r.status == 400 and r.json()["error"].startswith("destination must be an http")


def test_not_before_is_on_the_clusters_clock_a_delay_on_ours(app: Api, svc: Service) -> None:
    """This node runs 30 s ahead (the cluster's clock minus ours is -30): a message not
    before the cluster's NOW + 3 fires at our NOW + 33; an Upstash-Delay of 3 s at our
    NOW + 3, as before."""
    svc.offset = -30.0
    assert publish(app, URL, Upstash_Not_Before=str(int(NOW) + 3)).status == 201
    assert publish(app, URL, Upstash_Delay="3s").status == 201
    assert [t.fire_at for _, t in svc.calls] == [NOW + 33, NOW + 3]


def test_a_url_group_past_the_most_topics_is_refused(app: Api, monkeypatch) -> None:
    monkeypatch.setattr(qstash, "MAX_TOPICS", 2)
    for name in ("a", "b"):
        assert post_json(app, f"/v2/topics/{name}/endpoints",
                         {"endpoints": [{"url": URL}]}).status == 200
    r = post_json(app, "/v2/topics/c/endpoints", {"endpoints": [{"url": URL}]})
    assert (r.status, r.json()) == (400, {"error": "name would be URL group 3: too many"})
    # an endpoint more for a group that exists is no new group
    assert post_json(app, "/v2/topics/a/endpoints",
                     {"endpoints": [{"url": URL + "2"}]}).status == 200
