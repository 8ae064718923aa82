"""QStash's headers as task fields, and our views as QStash's JSON (``miyamoto.http.upstash``):
pure, no node. The routes that use them: tests/unit/http/test_qstash.py."""

from __future__ import annotations

import pytest

from miyamoto.http import upstash
from miyamoto.tasks.checks import ValidationError
from miyamoto.tasks.validate import Limits, build_task

pytestmark = pytest.mark.timeout(10)
URL = "http://127.0.0.1:9/w"


def test_a_full_publish_maps_onto_the_native_fields():
    headers = {"content-type": "application/json", "upstash-method": "put",
               "upstash-forward-x-trace": "t1", "upstash-delay": "1h30m",
               "upstash-retries": "5", "upstash-timeout": "20s",
               "upstash-callback": "http://127.0.0.1:9/cb",
               "upstash-failure-callback": "http://127.0.0.1:9/fcb",
               "upstash-deduplication-id": "d-1", "upstash-label": "ignored",
               "upstash-flow-control-key": "k",
               "upstash-flow-control-value": "parallelism=2, rate=30, period=1m"}
    assert upstash.fields(URL, headers, b'{"a": 1}', queue="orders") == {
        "url": URL, "method": "PUT", "body": '{"a": 1}', "content_type": "application/json",
        "headers": {"X-Trace": "t1"}, "countdown": 5400.0, "timeout": 20.0,
        "max_attempts": 6, "callback": "http://127.0.0.1:9/cb",
        "failure_callback": "http://127.0.0.1:9/fcb", "name": "d-1", "flow_key": "k",
        "flow_parallelism": "2", "flow_rate": 0.5, "queue": "orders"}


def test_defaults_are_qstashs_and_a_name_is_a_topic():
    f = upstash.fields("orders", {}, b"")
    assert f == {"topic": "orders", "body": "", "max_attempts": 4}
    assert upstash.fields(URL, {"upstash-method": "GET"}, b"")["method"] == "GET"
    assert "body" not in upstash.fields(URL, {"upstash-method": "GET"}, b"")
    assert upstash.fields(URL, {"upstash-retries": "0"}, b"")["max_attempts"] == 1
    assert upstash.fields(URL, {"upstash-retries": "100"}, b"")["max_attempts"] == 101
    assert "headers" not in upstash.fields(URL, {"upstash-forward-": "no name"}, b"")
    assert upstash.fields(URL, {"upstash-flow-control-key": "k",
                                "upstash-flow-control-value": "rate=3"}, b"")["flow_rate"] == 3
    f = upstash.fields(URL, {"upstash-content-based-deduplication": "true"}, b"x")
    assert f["dedupe"] == "content"


def test_not_before_wins_over_delay():
    f = upstash.fields(URL, {"upstash-not-before": "2000000000", "upstash-delay": "10s"}, b"")
    assert f["eta"] == 2000000000 and "countdown" not in f


@pytest.mark.parametrize("text, seconds", [("10s", 10), ("500ms", 0.5), ("3m", 180),
                                           ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
                                           ("7", 7)])
def test_durations(text, seconds):
    assert upstash.duration("Upstash-Delay", text) == seconds


@pytest.mark.parametrize("headers, named", [
    ({"upstash-delay": "10x"}, "Upstash-Delay"),
    ({"upstash-delay": ""}, "Upstash-Delay"),
    ({"upstash-timeout": "soon"}, "Upstash-Timeout"),
    ({"upstash-retries": "-1"}, "Upstash-Retries"),
    ({"upstash-retries": "many"}, "Upstash-Retries"),
    ({"upstash-retries": "101"}, "Upstash-Retries"),
    ({"upstash-delay": "inf"}, "Upstash-Delay"),
    ({"upstash-delay": "nan"}, "Upstash-Delay"),
    ({"upstash-flow-control-key": "k", "upstash-flow-control-value": "rate=2, period=0s"},
     "Upstash-Flow-Control-Value"),
    ({"upstash-flow-control-key": "k", "upstash-flow-control-value": "rate=fast"},
     "Upstash-Flow-Control-Value"),
    ({"upstash-not-before": "tomorrow"}, "Upstash-Not-Before"),
    ({"upstash-retry-delay": "pow(2, retried)"}, "Upstash-Retry-Delay"),
    ({"upstash-callback-x-a": "1"}, "Upstash-Callback-X-A"),
    ({"upstash-failure-callback-x-a": "1"}, "Upstash-Failure-Callback-X-A"),
    ({"upstash-content-based-deduplication": "yes"}, "Upstash-Content-Based-Deduplication"),
    ({"upstash-flow-control-value": "parallelism=1"}, "Upstash-Flow-Control-Value"),
    ({"upstash-flow-control-key": "k", "upstash-flow-control-value": "speed=1"},
     "Upstash-Flow-Control-Value"),
])
def test_bad_headers_are_refused_by_name(headers, named):
    with pytest.raises(ValidationError) as e:
        upstash.fields(URL, headers, b"")
    assert e.value.field == named and e.value.status == 400


def test_a_body_that_is_not_utf8_is_refused():
    with pytest.raises(ValidationError) as e:
        upstash.fields(URL, {}, b"\xff\xfe")
    assert e.value.field == "body" and "byte 1" in e.value.message


@pytest.mark.parametrize("headers, named", [
    ({"upstash-retries": "100", "upstash-delay": "40d"}, "Upstash-Delay"),
    ({"upstash-timeout": "1d"}, "Upstash-Timeout"),
    ({"upstash-method": "HEAD"}, "Upstash-Method"),
    ({"upstash-forward-host": "evil"}, "Upstash-Forward-host"),
    ({"upstash-callback": "ftp://x/"}, "Upstash-Callback"),
])
def test_native_checks_are_renamed_to_the_header_sent(headers, named):
    fields = upstash.fields(URL, headers, b"b")
    with pytest.raises(ValidationError) as e:
        build_task(fields, path_queue=None, idempotency_key=None, limits=Limits(), now=0.0)
    assert upstash.renamed(e.value).field.lower() == named.lower()


def test_message_and_schedule_views_are_the_sdks_shapes():
    view = {"id": "t1", "url": URL, "method": "POST", "max_attempts": 2, "eta": 10.5,
            "created": 9.0, "state": "scheduled", "attempts": 1, "queue": "q",
            "callback": "http://127.0.0.1:9/cb", "failure_callback": None,
            "last_response": {"status": 500, "headers": {"A": "b"}, "body": "no"}}
    m = upstash.message_view(view)
    assert (m["messageId"], m["maxRetries"], m["notBefore"], m["createdAt"], m["state"]) == \
        ("t1", 1, 10500, 9000, "RETRY")
    assert m["callback"] == "http://127.0.0.1:9/cb" and "failureCallback" not in m
    d = upstash.dlq_view(view)
    assert (d["dlqId"], d["responseStatus"], d["responseHeader"]) == ("t1", 500, {"A": ["b"]})
    states = {st: upstash.message_view(dict(view, state=st, attempts=0))["state"]
              for st in ("scheduled", "running", "succeeded", "failed", "cancelled")}
    assert states == {"scheduled": "CREATED", "running": "ACTIVE", "succeeded": "DELIVERED",
                      "failed": "FAILED", "cancelled": "CANCELLED"}
    bare = upstash.message_view({"id": "t2"})
    assert (bare["retried"], bare["createdAt"], bare["maxRetries"]) == (0, 0, 3)
    d = upstash.dlq_view({"id": "t2", "last_response": None})
    assert (d["responseStatus"], d["responseBody"], d["responseHeader"]) == (0, "", {})
    e = upstash.schedule_view({"name": "e", "every": 60, "next": [12.5, 72.5], "last_tick": 2,
                               "task": {"url": URL, "max_attempts": 1}}, created=0)
    assert (e["cron"], e["nextScheduleTime"], e["lastScheduleTime"], e["retries"]) == \
        ("@every 60s", 12500, 2000, 0)
    assert "body" not in e and e["header"] == {}
    s = upstash.schedule_view({"name": "s", "cron": "0 * * * *", "timezone": "Europe/Paris",
                               "paused": True, "next": [], "task": {"url": URL, "body": "x"}},
                              created=5.0)
    assert (s["scheduleId"], s["cron"], s["retries"], s["isPaused"], s["createdAt"]) == \
        ("s", "CRON_TZ=Europe/Paris 0 * * * *", 3, True, 5000)
    assert s["body"] == "x"
    assert upstash.cron_and_zone("CRON_TZ=Asia/Tokyo 0 4 * * *") == ("0 4 * * *", "Asia/Tokyo")
    assert upstash.cron_and_zone(" */5 * * * * ") == ("*/5 * * * *", "UTC")


def test_renamed_names_what_the_client_sent():
    r = upstash.renamed(ValidationError("headers.X-A", "bad", 413))
    assert (r.field, r.message, r.status) == ("Upstash-Forward-X-A", "bad", 413)
    assert upstash.renamed(ValidationError("max_attempts", "m")).field == "Upstash-Retries"
    other = ValidationError("params", "p")
    assert upstash.renamed(other) is other


def test_environ_headers_by_lower_case_name():
    env = {"HTTP_UPSTASH_FORWARD_X_ID": "1", "CONTENT_TYPE": "text/plain", "PATH_INFO": "/"}
    assert upstash.environ_headers(env) == {"upstash-forward-x-id": "1",
                                            "content-type": "text/plain"}
