"""The Python client (``miyamoto.client``) over a scripted session: the request each
method sends (path segments escaped, None fields left out), the exception each answer
becomes, and the retries (which calls, how many, how long), on a fake clock so no test
sleeps. Against a real node: tests/nodes/test_client_node.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
import requests
import ujson
from urllib3.exceptions import MaxRetryError, NewConnectionError

from miyamoto import client as mc
from miyamoto.client import (Client, Conflict, DuplicateTask, Forbidden, InvalidTask,
                             MiyamotoError, NotFound, Unauthorized, Unavailable, error_for)

pytestmark = pytest.mark.timeout(10)

BASE = "http://127.0.0.1:8088"


def response(status: int, body: Any = None, headers: dict | None = None,
             raw: bytes | None = None) -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r._content = raw if raw is not None else ujson.dumps({} if body is None else body).encode()
    r.headers.update(headers or {})
    return r


class Session:
    """requests.Session's surface: answers from a script (an exception is raised), the
    last one repeating; records every request."""

    def __init__(self, *script: Any):
        self.script = list(script) or [response(200, {"status": "ok"})]
        self.headers: dict[str, str] = {}
        self.sent: list[dict[str, Any]] = []
        self.closed = False

    def request(self, method: str, url: str, **kw: Any) -> requests.Response:
        self.sent.append(dict(kw, method=method, url=url))
        answer = self.script[min(len(self.sent), len(self.script)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        self.closed = True


class Clock:
    """time.monotonic and time.sleep of the client: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(mc.time, "monotonic", c.monotonic)
    monkeypatch.setattr(mc.time, "sleep", c.sleep)
    return c


def make(*script: Any, **kw: Any) -> tuple[Client, Session]:
    s = Session(*script)
    return Client(BASE + "/", session=s, rng=random.Random(1), **kw), s


UNAVAILABLE = response(503, {"status": "error", "error": "stored on 1 of 2 replicas"})


# ---------------------------------------------------------------- requests sent

def test_the_session_says_who_it_is_and_never_shows_the_token(clock: Clock) -> None:
    c, s = make(token="tok-123")
    assert s.headers["User-Agent"].startswith("miyamoto-client/")
    assert s.headers["Authorization"] == "Bearer tok-123"
    assert repr(c) == f"Client({BASE!r})" and "tok-123" not in repr(c)
    assert "Authorization" not in make()[1].headers
    with c:
        pass
    assert s.closed


def test_every_id_and_name_is_one_path_segment(clock: Clock) -> None:
    """An id or a name holding '/', '?' or '%' must never reach another route."""
    c, s = make()
    odd = "a/b?c=%2F#d e"
    esc = "a%2Fb%3Fc%3D%252F%23d%20e"
    calls = [
        (lambda: c.get(odd), "GET", f"/tasks/{esc}"),
        (lambda: c.cancel(odd), "DELETE", f"/tasks/{esc}"),
        (lambda: c.retry(odd), "POST", f"/tasks/{esc}/retry"),
        (lambda: c.tasks(odd), "GET", f"/queues/{esc}/tasks"),
        (lambda: c.queue(odd), "GET", f"/queues/{esc}"),
        (lambda: c.pause(odd), "POST", f"/queues/{esc}/pause"),
        (lambda: c.resume(odd), "POST", f"/queues/{esc}/resume"),
        (lambda: c.purge(odd), "POST", f"/queues/{esc}/purge"),
        (lambda: c.retry_failed(odd), "POST", f"/queues/{esc}/failed/retry"),
        (lambda: c.delete_failed(odd), "POST", f"/queues/{esc}/failed/delete"),
        (lambda: c.enqueue_batch([{"url": "u"}], queue=odd), "POST", f"/queue/{esc}/batch"),
        (lambda: c.get_schedule(odd), "GET", f"/schedules/{esc}"),
        (lambda: c.unschedule(odd), "DELETE", f"/schedules/{esc}"),
        (lambda: c.pause_schedule(odd), "POST", f"/schedules/{esc}/pause"),
        (lambda: c.resume_schedule(odd), "POST", f"/schedules/{esc}/resume"),
        (lambda: c.put_topic(odd, ["u"]), "PUT", f"/topics/{esc}"),
        (lambda: c.topic(odd), "GET", f"/topics/{esc}"),
        (lambda: c.delete_topic(odd), "DELETE", f"/topics/{esc}"),
        (lambda: c.resend(odd), "POST", f"/tasks/{esc}/resend"),
        (lambda: c.resend_many(odd), "POST", f"/queues/{esc}/resend"),
        (lambda: c.complete(odd, token="tk"), "POST", f"/tasks/{esc}/complete"),
        (lambda: c.heartbeat(odd, token="tk"), "POST", f"/tasks/{esc}/heartbeat"),
        (lambda: c.set_queue(odd, rate=1), "PUT", f"/queues/{esc}"),
        (lambda: c.reset_queue(odd), "DELETE", f"/queues/{esc}"),
        (lambda: c.run_schedule(odd), "POST", f"/schedules/{esc}/run"),
    ]
    for fn, method, path in calls:
        fn()
        sent = s.sent[-1]
        assert (sent["method"], sent["url"]) == (method, BASE + path), path
        assert sent["allow_redirects"] is False


def test_the_fixed_routes(clock: Clock) -> None:
    c, s = make(response(200, {"queues": [{"name": "q"}], "schedules": [{"name": "s"}],
                               "topics": [{"name": "t"}], "targets": [{"origin": "o"}],
                               "tasks": [{"id": "x"}], "leader": "n1"}))
    assert c.queues() == [{"name": "q"}] and c.schedules() == [{"name": "s"}]
    assert c.topics() == [{"name": "t"}] and c.targets() == [{"origin": "o"}]
    assert c.cluster()["leader"] == "n1"
    assert c.tasks("q", state="failed", limit=7) == [{"id": "x"}]
    assert s.sent[-1]["params"] == {"state": "failed", "limit": "7"}
    assert c.find("n1", queue="mail")["leader"] == "n1"
    assert (s.sent[-1]["url"], s.sent[-1]["params"]) == (BASE + "/tasks",
                                                         {"name": "n1", "queue": "mail"})
    assert [x["url"] for x in s.sent[:5]] == [BASE + p for p in (
        "/queues", "/schedules", "/topics", "/targets", "/cluster")]
    assert c.browse("failed", queue="q", name_prefix="inv-", cursor="1.5~t")["tasks"] == \
        [{"id": "x"}]
    assert (s.sent[-1]["url"], s.sent[-1]["params"]) == (BASE + "/tasks", {
        "state": "failed", "limit": "50", "queue": "q", "name_prefix": "inv-",
        "cursor": "1.5~t"})
    c.rates(3600, node="n2")
    assert (s.sent[-1]["url"], s.sent[-1]["params"]) == (BASE + "/rates",
                                                         {"seconds": "3600", "node": "n2"})
    c2, _ = make(response(200, {}))
    assert c2.queues() == [] and c2.tasks() == [] and c2.enqueue_batch([{"url": "u"}]) == []


def test_enqueue_sends_the_fields_given(clock: Clock) -> None:
    c, s = make(response(200, {"status": "scheduled", "id": "t1"}))
    assert c.enqueue("http://x/", {"k": "v"}, name="n", countdown=None, priority=0) == {
        "status": "scheduled", "id": "t1"}
    assert (s.sent[-1]["method"], s.sent[-1]["url"]) == ("POST", BASE + "/queue")
    assert s.sent[-1]["json"] == {"url": "http://x/", "params": {"k": "v"}, "name": "n",
                                  "priority": 0}
    c.enqueue("http://x/", {})
    assert s.sent[-1]["json"] == {"url": "http://x/"}


def test_batch_publish_schedule_and_topic_bodies(clock: Clock) -> None:
    c, s = make(response(200, {"tasks": [{"status": "scheduled"}]}))
    assert c.enqueue_batch([{"url": "u", "name": None, "queue": "q"}]) == [{"status": "scheduled"}]
    assert s.sent[-1]["json"] == [{"url": "u", "queue": "q"}]
    assert s.sent[-1]["url"] == BASE + "/queue/default/batch"
    c.publish("orders", {"n": "1"}, name="o1", priority=None)
    assert s.sent[-1]["json"] == {"topic": "orders", "params": {"n": "1"}, "name": "o1"}
    c.publish("orders")
    assert s.sent[-1]["json"] == {"topic": "orders"}
    c.schedule("s", {"url": "u"}, every=5, paused=False)
    assert (s.sent[-1]["url"], s.sent[-1]["json"]) == (
        BASE + "/schedules", {"name": "s", "task": {"url": "u"}, "every": 5, "paused": False})
    c.schedule("s", {"url": "u"}, cron="0 3 * * *", timezone="UTC", catch_up="none")
    assert s.sent[-1]["json"] == {"name": "s", "task": {"url": "u"}, "cron": "0 3 * * *",
                                  "timezone": "UTC", "catch_up": "none"}
    c.put_topic("t", ("a", "b"))
    assert s.sent[-1]["json"] == {"urls": ["a", "b"]}


def test_long_task_and_pull_bodies_leave_out_what_is_not_given(clock: Clock) -> None:
    c, s = make()
    c.complete("t1", token="tk")
    assert (s.sent[-1]["json"], s.sent[-1]["params"]) == ({"state": "succeeded"},
                                                          {"token": "tk"})
    c.complete("t1", "failed", {"why": "x"}, token="tk")
    assert s.sent[-1]["json"] == {"state": "failed", "result": {"why": "x"}}
    c.complete("t1", result=0, token="tk")  # a falsy result is still sent
    assert s.sent[-1]["json"] == {"state": "succeeded", "result": 0}
    c.heartbeat("t1", token="tk")
    assert s.sent[-1]["json"] == {}
    c.heartbeat("t1", 30.0, token="tk")
    assert s.sent[-1]["json"] == {"lease": 30.0}
    leased = {"id": "t2", "token": "lt"}
    c.nack(leased)
    assert (s.sent[-1]["url"], s.sent[-1]["json"]) == (BASE + "/tasks/t2/nack",
                                                       {"token": "lt"})
    c.nack(leased, delay=0)
    assert s.sent[-1]["json"] == {"token": "lt", "delay": 0}
    c.extend("t2", "lt")
    assert (s.sent[-1]["url"], s.sent[-1]["json"]) == (BASE + "/tasks/t2/extend",
                                                       {"token": "lt"})
    c.extend(leased, lease_s=5.0)
    assert s.sent[-1]["json"] == {"token": "lt", "lease_s": 5.0}
    c.ack(leased)
    assert (s.sent[-1]["url"], s.sent[-1]["json"]) == (BASE + "/tasks/t2/ack",
                                                       {"token": "lt"})
    with pytest.raises(MiyamotoError):
        c.ack({"id": "t2"})  # no token
    with pytest.raises(MiyamotoError):
        c.complete("t1")  # an id without its token


# ---------------------------------------------------------------- answers

@pytest.mark.parametrize("status,cls", [
    (400, InvalidTask), (411, InvalidTask), (413, InvalidTask), (415, InvalidTask),
    (422, InvalidTask), (401, Unauthorized), (403, Forbidden), (404, NotFound),
    (409, Conflict), (503, Unavailable), (500, MiyamotoError), (502, MiyamotoError),
    (399, MiyamotoError)])
def test_each_answer_is_its_exception(status: int, cls: type) -> None:
    e = error_for(status, {"status": "error", "error": "why", "field": "url"})
    assert type(e) is cls and e.status == status and e.message == "why" and str(e) == "why"
    assert e.body == {"status": "error", "error": "why", "field": "url"}


def test_a_taken_name_carries_the_original_id() -> None:
    e = error_for(409, {"status": "duplicate", "id": "orig"})
    assert isinstance(e, DuplicateTask) and e.id == "orig" and "orig" in e.message


def test_an_answer_without_an_error_text_says_its_status() -> None:
    assert error_for(404, {}).message == "HTTP 404"
    assert error_for(400, {"error": 5}).message == "HTTP 400"
    e = error_for(400, {"error": "bad", "field": 3})
    assert isinstance(e, InvalidTask) and e.field is None
    assert error_for(400, {"error": "bad", "field": "tasks[1].url"}).field == "tasks[1].url"
    assert MiyamotoError("m").body == {} and MiyamotoError("m").status is None


def test_answers_that_are_not_a_json_object(clock: Clock) -> None:
    c, _ = make(response(502, raw=b"<html>bad gateway</html>" + b"x" * 300))
    with pytest.raises(MiyamotoError) as e:
        c.cluster()
    assert e.value.status == 502 and e.value.message.startswith("HTTP 502: <html>bad gateway")
    assert len(e.value.message) == len("HTTP 502: ") + 200
    c, _ = make(response(200, [1, 2]))
    assert c.cluster() == {"result": [1, 2]}
    c, _ = make(response(204, raw=b""))
    assert c.cluster()["status"] == "error"  # an empty 2xx is still an answer
    c, _ = make(response(299, {"ok": 1}))
    assert c.cluster() == {"ok": 1}
    c, _ = make(response(300, {"error": "moved"}))
    with pytest.raises(MiyamotoError) as e:  # a 3xx is no answer (redirects not followed)
        c.cluster()
    assert e.value.status == 300


def test_a_node_that_cannot_be_reached_is_unavailable(clock: Clock) -> None:
    refused = requests.ConnectionError("pool")
    refused.__context__ = ConnectionRefusedError(111, "Connection refused")
    c, s = make(refused)
    with pytest.raises(Unavailable) as e:
        c.cluster()
    assert e.value.status is None
    assert e.value.message == f"cannot reach {BASE}: Connection refused"
    c, _ = make(requests.ConnectionError())
    with pytest.raises(Unavailable) as e:
        c.cluster()
    assert e.value.message == f"cannot reach {BASE}: ConnectionError"
    c, _ = make(requests.Timeout())
    with pytest.raises(Unavailable) as e:
        c.cluster()
    # (within what is left of the call's timeout: a read is tried again meanwhile)
    assert e.value.message.startswith(f"{BASE} did not answer within ")
    c, _ = make(requests.TooManyRedirects("loop"))
    with pytest.raises(MiyamotoError) as e:
        c.cluster()
    assert type(e.value) is MiyamotoError and "GET http" in e.value.message


def test_the_innermost_cause_names_a_connection_error() -> None:
    inner: BaseException = OSError(113, "No route to host")
    for _ in range(5):
        outer = RuntimeError("wrapped")
        outer.__cause__ = inner
        inner = outer
    assert mc._reason(inner) == "No route to host"
    loop = RuntimeError("a loop")
    loop.__context__ = loop
    assert mc._reason(loop) == "a loop"
    assert mc._reason(OSError("no strerror")) == "no strerror"


@pytest.mark.parametrize("value,seconds", [("2", 2.0), ("0.5", 0.5), ("-3", 0.0),
                                           ("soon", None), (None, None), ("", None)])
def test_retry_after_in_seconds(value: str | None, seconds: float | None) -> None:
    assert mc._retry_after(value) == seconds


# ---------------------------------------------------------------- retries

def test_a_named_enqueue_is_retried_on_503_an_unnamed_one_is_not(clock: Clock) -> None:
    ok = response(200, {"status": "scheduled", "id": "abc"})
    c, s = make(UNAVAILABLE, UNAVAILABLE, ok)
    assert c.enqueue("http://x/", name="n1")["id"] == "abc" and len(s.sent) == 3
    c, s = make(UNAVAILABLE, ok)
    assert c.enqueue("http://x/", dedupe="content")["id"] == "abc" and len(s.sent) == 2
    c, s = make(UNAVAILABLE, ok)
    with pytest.raises(Unavailable) as e:
        c.enqueue("http://x/")
    assert len(s.sent) == 1 and e.value.status == 503 and "replicas" in e.value.message
    c, s = make(UNAVAILABLE, ok)
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", dedupe="none")
    assert len(s.sent) == 1


def test_a_batch_is_retried_only_when_every_task_is_named(clock: Clock) -> None:
    ok = response(200, {"tasks": []})
    c, s = make(UNAVAILABLE, ok)
    c.enqueue_batch([{"url": "u", "name": "a"}, {"url": "u", "dedupe": "content"}])
    assert len(s.sent) == 2
    for batch in ([{"url": "u", "name": "a"}, {"url": "u"}], [{"url": "u", "name": None}], []):
        c, s = make(UNAVAILABLE, ok)
        with pytest.raises(Unavailable):
            c.enqueue_batch(batch)
        assert len(s.sent) == 1, batch


def test_calls_safe_to_repeat_are_retried_on_a_503_an_unnamed_publish_is_not(
        clock: Clock) -> None:
    ok = response(200, {})
    for write in (lambda c: c.schedule("s", {"url": "u"}, every=1), lambda c: c.unschedule("s"),
                  lambda c: c.pause_schedule("s"), lambda c: c.resume_schedule("s"),
                  lambda c: c.put_topic("t", ["u"]), lambda c: c.delete_topic("t"),
                  lambda c: c.publish("t", name="n"), lambda c: c.cluster(),
                  lambda c: c.cancel("t"), lambda c: c.get_schedule("s")):
        c, s = make(UNAVAILABLE, ok)
        write(c)
        assert len(s.sent) == 2
    for once in (lambda c: c.publish("t"),):
        c, s = make(UNAVAILABLE, ok)
        with pytest.raises(Unavailable):
            once(c)
        assert len(s.sent) == 1


def test_a_refused_connection_is_retried_like_a_503(clock: Clock) -> None:
    c, s = make(requests.ConnectionError("refused"), response(200, {"id": "abc"}))
    assert c.enqueue("http://x/", name="n")["id"] == "abc" and len(s.sent) == 2


def test_other_errors_are_never_retried(clock: Clock) -> None:
    c, s = make(response(500, {"error": "boom"}), response(200, {}))
    with pytest.raises(MiyamotoError):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 1


def test_retries_are_bounded_in_count(clock: Clock) -> None:
    c, s = make(UNAVAILABLE, retries=4)
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 4 and len(clock.slept) == 3
    c, s = make(UNAVAILABLE, retries=0)  # at least one attempt
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 1 and c.retries == 1


def test_backoff_is_full_jitter_under_a_doubling_cap(clock: Clock) -> None:
    c, s = make(UNAVAILABLE, retries=10, timeout=1000)
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    caps = [min(mc.BACKOFF_CAP, mc.BACKOFF_BASE * 2 ** i) for i in range(9)]
    assert len(clock.slept) == 9
    assert all(0 <= w <= cap for w, cap in zip(clock.slept, caps)), clock.slept
    assert max(clock.slept[:3]) < 0.4 and max(clock.slept) > 0.5  # it grows
    rng = random.Random(1)
    assert clock.slept == [rng.uniform(0, cap) for cap in caps]  # full jitter: uniform(0, cap)


def test_retry_after_is_a_floor_capped_at_the_backoff_cap(clock: Clock) -> None:
    c, s = make(response(503, {}, {"Retry-After": "1.5"}), response(200, {}))
    c.enqueue("http://x/", name="n")
    assert clock.slept == [1.5]
    c, s = make(response(503, {}, {"Retry-After": "60"}), response(200, {}))
    c.enqueue("http://x/", name="n")
    assert clock.slept[-1] == mc.BACKOFF_CAP
    c, s = make(response(503, {}, {"Retry-After": "0"}), response(200, {}))
    c.enqueue("http://x/", name="n")
    assert 0 <= clock.slept[-1] <= mc.BACKOFF_BASE
    with pytest.raises(Unavailable) as e:
        make(response(503, {}, {"Retry-After": "7"}))[0].cluster()
    assert e.value.retry_after == 7.0


def test_all_attempts_fit_in_the_timeout(clock: Clock) -> None:
    """Each wait is at least 1 s (Retry-After): with 1.5 s, the second try is the last."""
    c, s = make(response(503, {}, {"Retry-After": "1"}), timeout=1.5, retries=100)
    start = clock.now
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 2 and clock.now - start <= 1.5
    assert s.sent[0]["timeout"] == 1.5 and s.sent[1]["timeout"] == 0.5  # what is left
    c, s = make(response(503, {}, {"Retry-After": "1"}), timeout=2.0, retries=100)
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 2  # a wait that would end at the deadline is not taken


def test_a_spent_deadline_still_sends_with_a_tiny_timeout(clock: Clock) -> None:
    c, s = make(response(200, {}), timeout=0)
    c.cluster()
    assert s.sent[0]["timeout"] == 0.001


def test_the_client_is_reached_from_the_package_lazily() -> None:
    import miyamoto
    for name in ("Client", "MiyamotoError", "DuplicateTask", "Unavailable"):
        assert getattr(miyamoto, name) is getattr(mc, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        miyamoto.nope  # noqa: B018
    assert "Client" in miyamoto.__all__ and "__version__" in miyamoto.__all__


def test_the_defaults_ten_attempts_within_thirty_seconds(clock: Clock) -> None:
    c, s = make(UNAVAILABLE)
    with pytest.raises(Unavailable):
        c.enqueue("http://x/", name="n")
    assert len(s.sent) == 10 and clock.now - 100.0 <= 30.0
    assert s.sent[0]["timeout"] == pytest.approx(30.0)
    with pytest.raises(ValueError, match="at least one node URL"):
        Client(" , ", session=Session())
    with pytest.raises(ValueError, match="at least one node URL"):
        Client([], session=Session())


def test_a_with_block_gives_the_client_and_closes_its_session(clock: Clock) -> None:
    c, s = make()
    with c as inside:
        assert inside is c
        inside.get("t-1")
    assert s.closed and s.sent[-1]["url"] == BASE + "/tasks/t-1"


def test_more_calls_safe_to_repeat_and_a_keyless_run_that_is_not(clock: Clock) -> None:
    ok = response(200, {})
    for safe in (lambda c: c.reset_queue("q"), lambda c: c.set_queue("q", rate=1),
                 lambda c: c.run_schedule("s", idempotency_key="k"),
                 lambda c: c.retry("t"), lambda c: c.pause("q"), lambda c: c.resume("q"),
                 lambda c: c.purge("q"), lambda c: c.retry_failed("q"),
                 lambda c: c.delete_failed("q"), lambda c: c.lease("q")):
        c, s = make(UNAVAILABLE, ok)
        safe(c)
        assert len(s.sent) == 2
    c, s = make(UNAVAILABLE, ok)
    with pytest.raises(Unavailable):
        c.run_schedule("s")
    assert len(s.sent) == 1 and s.sent[0]["headers"] is None
    c, s = make()
    c.run_schedule("s", idempotency_key="k-1")
    assert s.sent[0]["headers"] == {"Idempotency-Key": "k-1"}


def test_the_query_of_resend_many_rates_and_the_queue_pages(clock: Clock) -> None:
    c, s = make()
    c.resend_many("q")
    assert s.sent[-1]["params"] == {"state": "failed"}
    c.resend_many("q", "expired", target="http://w/", since=1.0, until=2.0)
    assert s.sent[-1]["params"] == {"state": "expired", "target": "http://w/", "since": 1.0,
                                    "until": 2.0}
    c.rates()
    assert (s.sent[-1]["url"], s.sent[-1]["params"]) == (BASE + "/rates", {"seconds": "300"})
    c.rates(60, node="n2")
    assert s.sent[-1]["params"] == {"seconds": "60", "node": "n2"}
    c, s = make(response(200, {"queues": [{"name": "a"}], "next_cursor": "a"}),
                response(200, {"queues": [{"name": "b"}], "next_cursor": None}))
    assert c.queues() == [{"name": "a"}, {"name": "b"}]
    assert [r["params"] for r in s.sent] == [None, {"cursor": "a"}]


def test_an_unnamed_enqueue_is_retried_only_when_it_never_left(clock: Clock) -> None:
    refused = requests.ConnectionError(MaxRetryError(None, "/queue",  # type: ignore[arg-type]
                                                     NewConnectionError(None, "refused")))
    c, s = make(refused, response(200, {"id": "abc"}))
    assert c.enqueue("http://x/")["id"] == "abc" and len(s.sent) == 2
    c, s = make(requests.ConnectionError("connection reset"), response(200, {"id": "abc"}))
    with pytest.raises(Unavailable):
        c.enqueue("http://x/")  # it may have been stored: not sent twice
    assert len(s.sent) == 1
