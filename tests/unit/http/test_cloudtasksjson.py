"""Cloud Tasks' JSON both ways (``miyamoto.http.cloudtasksjson``): a Task as the SDK's
REST transport writes it becomes the fields of a native enqueue, our records become
Cloud Tasks' Task and Queue, times and durations round-trip, a queue's settings map
onto ours, and errors take Google's shape. Pure: no node, no request."""

from __future__ import annotations

import base64

import pytest

from miyamoto.http import cloudtasksjson as ctj
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.validate import Limits, build_task

pytestmark = pytest.mark.timeout(30)

NOW = 1_780_000_000.0
Q = "projects/p/locations/l/queues/q"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_sdks_task_becomes_a_native_enqueue() -> None:
    task = {"name": f"{Q}/tasks/order-1", "dispatchDeadline": "60s",
            "scheduleTime": ctj.timestamp(NOW + 30),
            "httpRequest": {"url": "http://127.0.0.1:9/w", "httpMethod": 4,  # PUT
                            "headers": {"content-type": "application/json", "X-A": "1"},
                            "body": b64(b'{"a": 1}')}}
    fields, short = ctj.task_fields(task, "q", NOW)
    assert short == "order-1"
    assert fields == {"url": "http://127.0.0.1:9/w", "method": "PUT", "headers": {"X-A": "1"},
                      "body": '{"a": 1}', "content_type": "application/json", "queue": "q",
                      "name": "order-1", "eta": NOW + 30, "timeout": 60.0}
    t = build_task(fields, path_queue="q", idempotency_key=None, limits=Limits(), now=NOW)
    assert (t.name, t.method, t.eta, t.timeout) == ("order-1", "PUT", NOW + 30, 60.0)


def test_defaults_and_the_enum_by_name() -> None:
    fields, short = ctj.task_fields({"httpRequest": {"url": "http://h/w",
                                                     "body": b64(b"raw")}}, "q", NOW)
    assert short is None and fields["method"] == "POST"
    assert fields["content_type"] == "application/octet-stream"  # Cloud Tasks' default
    assert ctj.http_method("PATCH") == "PATCH" and ctj.http_method(0) == "POST"
    past, _ = ctj.task_fields({"httpRequest": {"url": "http://h/w"},
                               "scheduleTime": "2001-01-01T00:00:00Z"}, "q", NOW)
    assert past["eta"] == NOW  # a time past is now


def test_an_oidc_token_asks_for_one_for_its_audience_or_the_tasks_url() -> None:
    url = "https://h.example/w?x=1"
    given, _ = ctj.task_fields({"httpRequest": {"url": url, "oidcToken": {
        "serviceAccountEmail": "sa@p.iam.gserviceaccount.com", "audience": "https://aud"}}},
        "q", NOW)
    assert given["oidc_audience"] == "https://aud"
    default, _ = ctj.task_fields({"httpRequest": {"url": url, "oidcToken": {
        "serviceAccountEmail": "sa@p.iam.gserviceaccount.com"}}}, "q", NOW)
    assert default["oidc_audience"] == url  # Cloud Tasks' default: the target's URL
    t = build_task(default, path_queue="q", idempotency_key=None, limits=Limits(), now=NOW)
    assert t.oidc_audience == url
    none, _ = ctj.task_fields({"httpRequest": {"url": url}}, "q", NOW)
    assert "oidc_audience" not in none
    with pytest.raises(ValidationError) as e:  # a node that signs no tokens says so
        build_task(given, path_queue="q", idempotency_key=None, limits=Limits(oidc=False),
                   now=NOW)
    assert ctj.cloud_field(e.value.field) == "task.httpRequest.oidcToken.audience"


@pytest.mark.parametrize("task, field", [
    ({"httpRequest": {"url": "http://h/w"}, "bogus": 1}, "task.bogus"),
    ({}, "task.httpRequest"),
    ({"appEngineHttpRequest": {}}, "task.appEngineHttpRequest"),
    ({"httpRequest": {"url": "http://h/w", "oauthToken": {"serviceAccountEmail": "x"}}},
     "task.httpRequest.oauthToken"),
    ({"httpRequest": {"url": "http://h/w", "oidcToken": "x"}}, "task.httpRequest.oidcToken"),
    ({"httpRequest": {"url": "http://h/w", "oidcToken": {"scope": "x"}}},
     "task.httpRequest.oidcToken.scope"),
    ({"httpRequest": {"url": "http://h/w", "httpMethod": 7}}, "task.httpRequest.httpMethod"),
    ({"httpRequest": {"url": "http://h/w", "body": "***"}}, "task.httpRequest.body"),
    ({"httpRequest": {"url": "http://h/w", "body": b64(b"\xff\xfe")}}, "task.httpRequest.body"),
    ({"httpRequest": {"url": "http://h/w"}, "name": f"{Q}/tasks/a b"}, "task.name"),
    ({"httpRequest": {"url": "http://h/w"}, "name": "projects/p/locations/l/queues/other/"
                                                    "tasks/t"}, "task.name"),
    ({"httpRequest": {"url": "http://h/w"}, "name": "tasks/t"}, "task.name"),
    ({"httpRequest": {"url": "http://h/w"}, "scheduleTime": "tomorrow"}, "task.scheduleTime"),
    ({"httpRequest": {"url": "http://h/w"}, "scheduleTime": "2030-01-01T00:00:00"},
     "task.scheduleTime"),
    ({"httpRequest": {"url": "http://h/w"}, "dispatchDeadline": "5s"}, "task.dispatchDeadline"),
    ({"httpRequest": {"url": "http://h/w"}, "dispatchDeadline": "60"}, "task.dispatchDeadline"),
    ({"httpRequest": {"url": "http://h/w"}, "dispatchDeadline": "14.9s"},
     "task.dispatchDeadline"),
    ({"httpRequest": {"url": "http://h/w"}, "dispatchDeadline": "1800.5s"},
     "task.dispatchDeadline"),
    ({"httpRequest": {"url": "http://h/w"}, "scheduleTime": 12}, "task.scheduleTime"),
    ({"httpRequest": {"url": "http://h/w"}, "name": 5}, "task.name"),
    ({"httpRequest": {"url": "http://h/w"}, "name": "projects/p/zones/l/queues/q/tasks/t"},
     "task.name"),
    ({"httpRequest": {"url": "http://h/w", "timeout": 3}}, "task.httpRequest.timeout"),
    ({"httpRequest": {"url": "http://h/w", "headers": ["X-A"]}}, "task.httpRequest.headers"),
    ({"httpRequest": {"url": "http://h/w", "body": 5}}, "task.httpRequest.body"),
    ({"httpRequest": "http://h/w"}, "task.httpRequest"),
])
def test_a_bad_task_is_refused_naming_its_cloud_tasks_field(task, field) -> None:
    with pytest.raises(ValidationError) as e:
        ctj.task_fields(task, "q", NOW)
    assert e.value.field == field


def test_a_task_that_is_no_object_is_refused() -> None:
    for task in (None, [], "t"):
        with pytest.raises(ValidationError) as e:
            ctj.task_fields(task, "q", NOW)
        assert e.value.field == "task"


def test_the_deadlines_bounds_and_a_body_in_url_safe_base64_without_padding() -> None:
    for given, taken in (("15s", 15.0), ("1800s", 1800.0)):
        fields, _ = ctj.task_fields({"httpRequest": {"url": "http://h/w"},
                                     "dispatchDeadline": given}, "q", NOW)
        assert fields["timeout"] == taken
    fields, _ = ctj.task_fields({"httpRequest": {"url": "http://h/w", "body": "eyJhIjoxfT8-"}},
                                "q", NOW)
    assert fields["body"] == '{"a":1}?>'  # '-' is url-safe '+', and no '=' padding


def test_our_field_names_are_told_as_cloud_tasks_paths() -> None:
    assert ctj.cloud_field("url") == "task.httpRequest.url"
    assert ctj.cloud_field("headers.X-Foo") == "task.httpRequest.headers.X-Foo"
    assert ctj.cloud_field("eta") == "task.scheduleTime"
    assert ctj.cloud_field("priority") == "priority"


def test_times_and_durations_round_trip() -> None:
    assert ctj.parse_timestamp("f", ctj.timestamp(NOW + 0.25)) == NOW + 0.25
    assert ctj.parse_timestamp("f", "2026-12-02T06:00:00.123456789Z") == pytest.approx(
        ctj.parse_timestamp("f", "2026-12-02T06:00:00.123456Z"))
    assert ctj.parse_timestamp("f", "2026-12-02T07:00:00+01:00") == \
        ctj.parse_timestamp("f", "2026-12-02T06:00:00Z")
    assert [ctj.duration(x) for x in (30, 0.5, 0.05)] == ["30s", "0.5s", "0.05s"]
    assert ctj.parse_duration("f", "0.05s") == 0.05


def test_a_record_becomes_a_cloud_tasks_task() -> None:
    summary = {"id": "7e998f34-bed7-44f4-80cd-49620b0ab562", "name": None, "url": "http://h/w",
               "method": "POST", "eta": NOW, "next_attempt": NOW + 5, "created": NOW - 1,
               "timeout": 30.0, "attempts": 2, "executions": 1,
               "history": [{"start": NOW - 2, "duration": 0.5, "status": 503},
                           {"start": NOW - 9, "duration": 0, "status": None, "error": "refused"}]}
    view = ctj.task_view(Q, summary)
    assert view["name"] == f"{Q}/tasks/{summary['id']}"  # made without a name: its id
    assert view["scheduleTime"] == ctj.timestamp(NOW + 5)
    assert (view["dispatchCount"], view["responseCount"], view["dispatchDeadline"]) == \
        (2, 1, "30s")
    assert view["lastAttempt"]["responseStatus"] == {"code": 14, "message": "HTTP status 503"}
    assert view["firstAttempt"]["responseStatus"] == {"code": 14, "message": "refused"}
    ok = ctj.task_view(Q, dict(summary, history=[
        {"start": NOW, "duration": 0.25, "status": 299},
        {"start": NOW - 9, "duration": 0.5, "status": 404},
        {"start": NOW - 20, "duration": 0.5, "status": 300}]))
    assert ok["lastAttempt"] == {"dispatchTime": ctj.timestamp(NOW),
                                 "responseTime": ctj.timestamp(NOW + 0.25),
                                 "responseStatus": {"code": 0, "message": "HTTP status 299"}}
    assert ok["firstAttempt"]["responseStatus"]["code"] == 2  # UNKNOWN: a redirect
    assert ctj.task_view(Q, dict(summary, history=[{"start": NOW, "status": 200}, {
        "start": NOW, "status": 404}]))["firstAttempt"]["responseStatus"]["code"] == 5
    fresh = ctj.task_view(Q, {k: v for k, v in summary.items()
                              if k not in ("attempts", "executions", "timeout")})
    assert (fresh["dispatchCount"], fresh["responseCount"]) == (0, 0)
    assert "dispatchDeadline" not in fresh  # the queue's
    named = ctj.task_view(Q, dict(summary, name="order-1", history=[]))
    assert named["name"] == f"{Q}/tasks/order-1" and "lastAttempt" not in named
    # a native task's name that is no Cloud Tasks id is answered by the task's id
    assert ctj.task_view(Q, dict(summary, name="a b"))["name"].endswith(summary["id"])


VIEW = {"name": "q", "paused": True, "limit": 50,
        "config": {"rate": 5.0, "burst": 10, "max_concurrent": 0, "max_attempts": 3,
                   "min_backoff": 0.05, "max_backoff": 2.0, "max_doublings": 2,
                   "max_retry_duration": 0.0, "timeout": 30.0}}


def test_a_queue_view_and_its_settings() -> None:
    out = ctj.queue_view("projects/p/locations/l", VIEW)
    assert out == {"name": Q, "state": "PAUSED",
                   "rateLimits": {"maxDispatchesPerSecond": 5.0, "maxBurstSize": 10,
                                  "maxConcurrentDispatches": 50},
                   "retryConfig": {"maxAttempts": 3, "maxRetryDuration": "0s",
                                   "minBackoff": "0.05s", "maxBackoff": "2s",
                                   "maxDoublings": 2}}
    assert ctj.queue_settings(out) == {"rate": 5.0, "max_concurrent": 50, "max_attempts": 3,
                                       "max_retry_duration": 0.0, "min_backoff": 0.05,
                                       "max_backoff": 2.0, "max_doublings": 2}
    assert ctj.queue_settings(out, "retryConfig.maxAttempts") == {"max_attempts": 3}


@pytest.mark.parametrize("queue, mask, field", [
    ({"retryConfig": {"maxAttempts": -1}}, None, "queue.retryConfig.maxAttempts"),
    ({"retryConfig": {"minBackoff": 1}}, None, "queue.retryConfig.minBackoff"),
    ({"rateLimits": {"maxDispatchesPerSecond": "x"}}, None,
     "queue.rateLimits.maxDispatchesPerSecond"),
    ({"rateLimits": 3}, None, "queue.rateLimits"),
    ([], None, "queue"),
    ({"rateLimits": {"maxConcurrentDispatches": -1}}, None,
     "queue.rateLimits.maxConcurrentDispatches"),
    ({"retryConfig": {"maxAttempts": 0}}, None, "queue.retryConfig.maxAttempts"),
    ({"retryConfig": {"maxDoublings": True}}, None, "queue.retryConfig.maxDoublings"),
    ({"appEngineRoutingOverride": {}}, None, "queue.appEngineRoutingOverride"),
    ({"httpTarget": {"uriOverride": {}}}, None, "queue.httpTarget"),
    ({}, "retryConfig.maxRetries", "queue.retryConfig.maxRetries"),
])
def test_a_bad_queue_is_refused_naming_its_field(queue, mask, field) -> None:
    with pytest.raises(ValidationError) as e:
        ctj.queue_settings(queue, mask)
    assert e.value.field == field


def test_errors_take_googles_shape() -> None:
    assert ctj.error(409, "taken") == {"error": {"code": 409, "message": "taken",
                                                 "status": "ALREADY_EXISTS"}}
    assert {s: ctj.error(s, "x")["error"]["status"] for s in (401, 403, 404, 405, 411, 413, 415,
                                                            429, 500, 501, 503, 418)} == {
        401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
        405: "UNIMPLEMENTED", 411: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT",
        415: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
        501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 418: "UNKNOWN"}
    bad = ctj.error(400, "url is bad", "task.httpRequest.url")["error"]
    assert bad["status"] == "INVALID_ARGUMENT"
    assert bad["details"][0]["fieldViolations"] == [{"field": "task.httpRequest.url",
                                                     "description": "url is bad"}]
    assert ctj.error(400, "x", code="FAILED_PRECONDITION")["error"]["status"] == \
        "FAILED_PRECONDITION"


def test_every_http_method_number_of_the_sdk() -> None:
    """google.cloud.tasks.v2.HttpMethod: 1 POST, 2 GET, 4 PUT, 5 DELETE, 6 PATCH (3 HEAD
    and 7 OPTIONS are no method a task may use)."""
    assert [ctj.http_method(n) for n in (1, 2, 4, 5, 6)] == ["POST", "GET", "PUT", "DELETE",
                                                             "PATCH"]
    for bad in (3, 7, 8, -1, "TRACE"):
        with pytest.raises(ValidationError):
            ctj.http_method(bad)


@pytest.mark.parametrize("status, code", [(200, 0), (204, 0), (299, 0), (199, 2), (300, 2),
                                          (404, 5), (429, 8), (503, 14)])
def test_an_attempts_http_status_is_its_rpc_code(status: int, code: int) -> None:
    view = ctj._attempt({"start": NOW, "duration": 0.1, "status": status})
    assert view["responseStatus"] == {"code": code, "message": f"HTTP status {status}"}
