"""miyamoto.tasks.validate: form and JSON enqueue requests into Tasks, and every rejection.

Pure functions, no processes: each case names the field the error must name.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlencode

import pytest
import ujson
from hypothesis import given, settings
from hypothesis import strategies as st

from miyamoto.tasks import validate as v
from miyamoto.tasks.task import State, Task
from miyamoto.tasks.validate import (
    Limits,
    ValidationError,
    build_task,
    form_fields,
    parse_batch,
    parse_enqueue,
)

NOW = 1_700_000_000.0
LIMITS = Limits()
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
URL = "http://worker.example:9099/worker"


def form(body: bytes | str | list[tuple[str, str]], *, queue: str | None = None,
         key: str | None = None, limits: Limits = LIMITS, ctype: str = FORM):
    if isinstance(body, list):
        body = urlencode(body)
    if isinstance(body, str):
        body = body.encode()
    return parse_enqueue(ctype, body, path_queue=queue, idempotency_key=key, limits=limits,
                         now=NOW)


def js(obj, *, queue: str | None = None, key: str | None = None, limits: Limits = LIMITS,
       ctype: str = JSON):
    body = obj if isinstance(obj, bytes) else ujson.dumps(obj).encode()
    return parse_enqueue(ctype, body, path_queue=queue, idempotency_key=key, limits=limits,
                         now=NOW)


def rejects(fn, *args, field: str, status: int = 400, **kw) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        fn(*args, **kw)
    assert info.value.field == field, (info.value.field, info.value.message)
    assert info.value.status == status
    assert info.value.message
    return info.value


# ---------------------------------------------------------------- the README examples

def test_readme_form_example():
    t = form(f"task.url={URL}&task.countdown=5&foo=bar")
    assert t.url == URL
    assert t.method == "POST"
    assert t.params == {"foo": "bar"}
    assert t.eta == NOW + 5 and t.fire_at == NOW + 5
    assert t.queue == "default"
    assert t.state == State.SCHEDULED and t.attempts == 0
    assert t.body is None and t.content_type is None
    assert t.created == NOW
    assert str(uuid.UUID(t.id)) == t.id


def test_readme_json_example():
    t = js({"url": URL, "params": {"foo": "bar"}, "countdown": 5})
    assert (t.url, t.params, t.eta, t.queue) == (URL, {"foo": "bar"}, NOW + 5, "default")


def test_json_content_type_with_charset_and_case():
    t = js({"url": URL}, ctype="Application/JSON; charset=utf-8")
    assert t.url == URL


def test_no_content_type_means_form():
    t = form(f"task.url={URL}&a=1", ctype="")
    assert t.params == {"a": "1"}


def test_each_task_gets_a_fresh_id():
    ids = {js({"url": URL}).id for _ in range(50)}
    assert len(ids) == 50


# ---------------------------------------------------------------- form specifics

def test_form_every_task_option():
    t = form([("task.url", URL), ("task.method", "put"), ("task.countdown", "3"),
              ("task.name", "job-1"), ("task.queue", "emails"), ("task.max_attempts", "7"),
              ("task.timeout", "2.5"), ("task.callback", "http://cb/ok"),
              ("task.failure_callback", "https://cb/fail"), ("task.header.X-Foo", "1"),
              ("task.header.Authorization", "Bearer t"), ("p", "v")])
    assert t.method == "PUT"
    assert t.eta == NOW + 3
    assert t.name == "job-1"
    assert t.queue == "emails"
    assert t.max_attempts == 7 and isinstance(t.max_attempts, int)
    assert t.timeout == 2.5
    assert t.callback == "http://cb/ok" and t.failure_callback == "https://cb/fail"
    assert t.headers == {"X-Foo": "1", "Authorization": "Bearer t"}
    assert t.params == {"p": "v"}


def test_form_eta_wins_over_countdown():
    t = form([("task.url", URL), ("task.countdown", "100"), ("task.eta", str(NOW + 7))])
    assert t.eta == NOW + 7


def test_form_repeated_keys_become_a_list():
    t = form([("task.url", URL), ("a", "1"), ("a", "2"), ("b", "x"), ("a", "3")])
    assert t.params == {"a": ["1", "2", "3"], "b": "x"}


def test_form_blank_values_are_kept():
    t = form(f"task.url={URL}&empty=&x=1")
    assert t.params == {"empty": "", "x": "1"}


def test_form_percent_decoding_and_unicode():
    t = form([("task.url", URL), ("msg", "héllo wörld & more=1"), ("ключ", "значение")])
    assert t.params == {"msg": "héllo wörld & more=1", "ключ": "значение"}


@pytest.mark.parametrize("key", ["task.colour", "task.", "task.params", "task.json",
                                 "task.body", "task.headers", "task.content_type"])
def test_form_unknown_or_json_only_task_keys(key):
    rejects(form, [("task.url", URL), (key, "x")], field=key)


def test_form_invalid_utf8_bytes():
    rejects(form, b"task.url=" + URL.encode() + b"&foo=\xff\xfe", field="body")


def test_form_invalid_utf8_percent_escape():
    # %FF decodes to a byte that is not UTF-8: reject it instead of storing U+FFFD
    rejects(form, f"task.url={URL}&foo=%FF", field="body")


def test_form_too_many_fields_is_a_4xx_not_a_crash():
    body = "&".join(f"k{i}=1" for i in range(10001)) + f"&task.url={URL}"
    with pytest.raises(ValidationError) as info:
        form(body)
    assert info.value.field == "body"
    assert 400 <= info.value.status < 500


def test_form_missing_url():
    rejects(form, "foo=bar", field="url")


def test_form_header_validation():
    rejects(form, [("task.url", URL), ("task.header.Host", "evil")], field="headers.Host")
    rejects(form, [("task.url", URL), ("task.header.Bad Name", "x")], field="headers.Bad Name")
    rejects(form, [("task.url", URL), ("task.header.X-A", "a\r\nB: c")], field="headers.X-A")


def test_form_fields_maps_keys():
    f = form_fields(b"task.url=u&task.header.X-A=1&a=1&a=2")
    assert f == {"url": "u", "params": {"a": ["1", "2"]}, "headers": {"X-A": "1"}}


# ---------------------------------------------------------------- JSON: every field

def test_json_every_field():
    t = js({"url": URL, "method": "patch", "params": {"a": 1, "b": True, "c": None,
                                                      "d": [1, "x", False], "e": 1.5},
            "headers": {"X-Num": 5, "X-Str": "v"}, "countdown": 10, "name": "n1",
            "queue": "q1", "max_attempts": 4, "timeout": 12, "callback": "http://cb/",
            "failure_callback": "http://fcb/"}, queue="q1")
    assert t.method == "PATCH"
    assert t.params == {"a": "1", "b": "true", "c": "", "d": ["1", "x", "false"], "e": "1.5"}
    assert t.headers == {"X-Num": "5", "X-Str": "v"}
    assert t.eta == NOW + 10
    assert (t.name, t.queue, t.max_attempts, t.timeout) == ("n1", "q1", 4, 12.0)
    assert (t.callback, t.failure_callback) == ("http://cb/", "http://fcb/")


def test_json_body_field():
    t = js({"url": URL, "json": {"k": [1, 2, {"z": None}]}})
    assert t.content_type == "application/json"
    assert ujson.loads(t.body) == {"k": [1, 2, {"z": None}]}
    assert t.params == {}


@pytest.mark.parametrize("raw,field", [
    (b'NaN', "json"), (b'Infinity', "json"), (b'-Infinity', "json"), (b'1e999', "json"),
    (b'{"a": [1, NaN]}', "json.a[1]"), (b'{"a": {"b": -Infinity}}', "json.a.b"),
])
def test_json_field_rejects_nan_and_infinity(raw, field):
    """ujson reads them and writes them back as bare NaN/Inf: the worker would get
    a body that is not JSON."""
    body = b'{"url": "' + URL.encode() + b'", "json": ' + raw + b'}'
    rejects(js, body, field=field)


def test_json_body_keeps_unicode():
    t = js({"url": URL, "json": {"k": "ü€😀"}})
    assert ujson.loads(t.body) == {"k": "ü€😀"}


def test_raw_body_with_and_without_content_type():
    t = js({"url": URL, "body": "<x/>", "content_type": "application/xml"})
    assert (t.body, t.content_type) == ("<x/>", "application/xml")
    t = js({"url": URL, "body": "plain"})
    assert t.body == "plain" and t.content_type.startswith("text/plain")
    t = js({"url": URL, "json": [1], "content_type": "application/vnd.x+json"})
    assert t.content_type == "application/vnd.x+json" and t.body == "[1]"


def test_body_combinations_rejected():
    rejects(js, {"url": URL, "json": 1, "body": "x"}, field="json")
    rejects(js, {"url": URL, "content_type": "text/plain"}, field="content_type")
    rejects(js, {"url": URL, "body": "x", "params": {"a": 1}}, field="params")
    rejects(js, {"url": URL, "body": 5}, field="body")
    rejects(js, {"url": URL, "body": "x", "content_type": 5}, field="content_type")
    rejects(js, {"url": URL, "body": "x", "content_type": ""}, field="content_type")
    rejects(js, {"url": URL, "body": "x", "content_type": "a\nb"}, field="content_type")
    for m in ("GET", "DELETE"):
        rejects(js, {"url": URL, "body": "x", "method": m}, field="body")
        rejects(js, {"url": URL, "json": {}, "method": m}, field="body")


def test_null_params_and_headers_are_empty():
    t = js({"url": URL, "params": None, "headers": None, "countdown": None, "eta": None})
    assert t.params == {} and t.headers == {} and t.eta == NOW


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "GET", "DELETE", "get", "Delete"])
def test_methods_accepted(method):
    assert js({"url": URL, "method": method}).method == method.upper()


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "HEAD", "OPTIONS", "", 1, None, ["POST"]])
def test_methods_rejected(method):
    rejects(js, {"url": URL, "method": method}, field="method")


def test_unknown_json_field():
    rejects(js, {"url": URL, "colour": "red"}, field="colour")
    rejects(js, {"url": URL, "task.url": URL}, field="task.url")


@pytest.mark.parametrize("body", [b"{", b"", b"{'url': 1}", b"nul", b"\xff\xfe", b"[" * 5000])
def test_malformed_json(body):
    rejects(js, body, field="body")


@pytest.mark.parametrize("body", [b"[]", b"[{\"url\": \"http://a/\"}]", b"\"x\"", b"5", b"null"])
def test_json_body_must_be_an_object(body):
    rejects(js, body, field="body")


@pytest.mark.parametrize("params,field", [
    ([1, 2], "params"), ("a=b", "params"), (5, "params"),
    ({"a": {"b": 1}}, "params.a"), ({"a": [[1]]}, "params.a"), ({"a": [{"x": 1}]}, "params.a"),
])
def test_bad_params(params, field):
    rejects(js, {"url": URL, "params": params}, field=field)


@pytest.mark.parametrize("headers,field", [
    ([["X-A", "1"]], "headers"), ("X-A: 1", "headers"),
    ({"X-A": {"a": 1}}, "headers.X-A"), ({"X-A": ["1"]}, "headers.X-A"),
    ({"X-A": True}, "headers.X-A"), ({"X-A": None}, "headers.X-A"),
    ({"X-A": "a\nb"}, "headers.X-A"), ({"X-A": "a\x00b"}, "headers.X-A"),
    ({"X-A": "snow\u2603"}, "headers.X-A"), ({"Bad Name": "1"}, "headers.Bad Name"),
    ({"": "1"}, "headers."), ({"X(A)": "1"}, "headers.X(A)"),
])
def test_bad_headers(headers, field):
    rejects(js, {"url": URL, "headers": headers}, field=field)


@pytest.mark.parametrize("name", ["Host", "host", "Content-Length", "Transfer-Encoding",
                                  "Connection", "Keep-Alive", "Upgrade", "TE", "Trailer",
                                  "Proxy-Connection"])
def test_forbidden_headers(name):
    rejects(js, {"url": URL, "headers": {name: "x"}}, field=f"headers.{name}")


def test_latin1_header_value_allowed():
    assert js({"url": URL, "headers": {"X-A": "caf\u00e9"}}).headers == {"X-A": "caf\u00e9"}


# ---------------------------------------------------------------- URLs

@pytest.mark.parametrize("url", [
    "http://a/", "https://a.example/x?y=1#z", "http://127.0.0.1:9099/w", "http://[::1]:8080/",
    "HTTP://EXAMPLE.COM/",
])
def test_urls_accepted(url):
    assert js({"url": url}).url == url


@pytest.mark.parametrize("url", [
    "", "ftp://a/x", "javascript:alert(1)", "file:///etc/passwd", "mailto:a@b", "//a/x",
    "http://", "http:///x", "http://a b/", "http://a/\n", "http://a/\x00", "http://a:99999/",
    "http://a:0/", "http://user:pw@a/", "http://[::1/", "a/b", 5, None, ["http://a/"],
])
def test_urls_rejected(url):
    rejects(js, {"url": url}, field="url")


def test_url_length_limit():
    base = "http://a.example/"
    ok = base + "x" * (LIMITS.max_url - len(base))
    assert len(ok) == 2083
    assert js({"url": ok}).url == ok
    rejects(js, {"url": ok + "x"}, field="url")
    small = Limits(max_url=30)
    rejects(js, {"url": "http://a.example/" + "x" * 20}, field="url", limits=small)


def test_callbacks_are_checked_like_urls():
    rejects(js, {"url": URL, "callback": "ftp://x/"}, field="callback")
    rejects(js, {"url": URL, "failure_callback": "javascript:x"}, field="failure_callback")
    rejects(js, {"url": URL, "callback": 5}, field="callback")


def test_missing_url():
    rejects(js, {"params": {"a": 1}}, field="url")


# ---------------------------------------------------------------- timing fields

@pytest.mark.parametrize("countdown,eta", [(0, NOW), (2, NOW + 2), ("2.5", NOW + 2.5),
                                           (" 3 ", NOW + 3), (0.001, NOW + 0.001)])
def test_countdown(countdown, eta):
    assert js({"url": URL, "countdown": countdown}).eta == pytest.approx(eta)


@pytest.mark.parametrize("countdown", ["abc", "", True, False, [1], {"a": 1}, "nan", "inf",
                                       "-inf", -1, -0.001, "-5", 30 * 86400 + 1, 1e300])
def test_countdown_rejected(countdown):
    rejects(js, {"url": URL, "countdown": countdown}, field="countdown")


def test_countdown_limit_is_inclusive_and_configurable():
    assert js({"url": URL, "countdown": 30 * 86400}).eta == NOW + 30 * 86400
    rejects(js, {"url": URL, "countdown": 11}, field="countdown", limits=Limits(max_delay=10))


def test_eta():
    assert js({"url": URL, "eta": NOW + 60}).eta == NOW + 60
    # an eta in the past runs now-ish: it is kept as given
    assert js({"url": URL, "eta": NOW - 60}).eta == NOW - 60
    assert js({"url": URL, "eta": NOW + 60, "countdown": 5}).eta == NOW + 60
    assert js({"url": URL, "eta": str(NOW + 1)}).fire_at == NOW + 1


@pytest.mark.parametrize("eta", [NOW + 30 * 86400 + 1, NOW * 10, -1, "tomorrow", True, "nan",
                                 [NOW]])
def test_eta_rejected(eta):
    rejects(js, {"url": URL, "eta": eta}, field="eta")


@pytest.mark.parametrize("value,expected", [(1, 1), ("3", 3), (10000, 10000), (2.0, 2)])
def test_max_attempts(value, expected):
    t = js({"url": URL, "max_attempts": value})
    assert t.max_attempts == expected and isinstance(t.max_attempts, int)


@pytest.mark.parametrize("value", [0, -1, 10001, 1.5, True, False, "abc", "", [3], {"n": 1}])
def test_max_attempts_rejected(value):
    rejects(js, {"url": URL, "max_attempts": value}, field="max_attempts")


@pytest.mark.parametrize("value", [0.001, 1, "2.5", 1800])
def test_timeout(value):
    assert js({"url": URL, "timeout": value}).timeout == float(value)


@pytest.mark.parametrize("value", [0, -1, 1800.5, True, "x", "inf", [1]])
def test_timeout_rejected(value):
    rejects(js, {"url": URL, "timeout": value}, field="timeout")


# ---------------------------------------------------------------- name, idempotency, queue

def test_name_and_idempotency_key():
    assert js({"url": URL}, key="idem-1").name == "idem-1"
    assert js({"url": URL, "name": "explicit"}, key="idem-1").name == "explicit"
    assert js({"url": URL}).name is None
    assert form(f"task.url={URL}", key="k").name == "k"


def test_name_limits():
    assert js({"url": URL, "name": "n" * 500}).name == "n" * 500
    rejects(js, {"url": URL, "name": "n" * 501}, field="name")
    rejects(js, {"url": URL}, key="k" * 501, field="name")
    rejects(js, {"url": URL, "name": "abcd"}, field="name", limits=Limits(max_name=3))
    assert js({"url": URL, "name": "ünïcødé 名前"}).name == "ünïcødé 名前"


@pytest.mark.parametrize("name", ["", 5, True, ["a"], "a\nb", "a\x00", "tab\there", "\x7f"])
def test_name_rejected(name):
    rejects(js, {"url": URL, "name": name}, field="name")


def test_queue_sources():
    assert js({"url": URL}).queue == "default"
    assert js({"url": URL}, queue="q-1").queue == "q-1"
    assert js({"url": URL, "queue": "q_2"}).queue == "q_2"
    assert js({"url": URL, "queue": "same"}, queue="same").queue == "same"
    rejects(js, {"url": URL, "queue": "a"}, queue="b", field="queue")


@pytest.mark.parametrize("queue", ["", "a.b", "a/b", "a b", "q" * 101, 5, "ü"])
def test_queue_rejected(queue):
    rejects(js, {"url": URL, "queue": queue}, field="queue")


def test_queue_name_length_boundary():
    assert js({"url": URL, "queue": "q" * 100}).queue == "q" * 100


# ---------------------------------------------------------------- size limits

def test_body_limit_applies_to_the_request():
    big = ("x" * (LIMITS.max_body + 1)).encode()
    rejects(form, big, field="body", status=413)
    rejects(js, big, field="body", status=413)
    rejects(parse_batch, big, path_queue=None, limits=LIMITS, now=NOW, max_batch=10,
            field="body", status=413)


def test_body_limit_applies_to_the_task_body():
    limits = Limits(max_body=100)
    t = js({"url": "http://a/", "body": "y" * 50}, limits=limits)
    assert t.body == "y" * 50
    # a task built from fields (as the batch path does) is held to the same limit
    fields = {"url": URL, "body": "y" * 101}
    with pytest.raises(ValidationError) as info:
        build_task(fields, path_queue=None, idempotency_key=None, limits=limits, now=NOW)
    assert (info.value.field, info.value.status) == ("body", 413)


def test_limits_exactly_at_the_body_limit():
    limits = Limits(max_body=200)
    body = ujson.dumps({"url": URL, "body": ""}).encode()
    pad = 200 - len(body)
    exact = ujson.dumps({"url": URL, "body": "z" * pad}).encode()
    assert len(exact) == 200
    assert js(exact, limits=limits).body == "z" * pad


# ---------------------------------------------------------------- text that is not text

@pytest.mark.parametrize("doc,field", [
    (b'{"url": "http://a/", "body": "\\ud800"}', "body"),
    (b'{"url": "http://a/", "json": {"k": "\\udfff"}}', "json"),
    (b'{"url": "http://a/", "params": {"k": "\\ud800"}}', "params"),
    (b'{"url": "http://a/", "params": {"\\ud800": "v"}}', "params"),
    (b'{"url": "http://a/", "name": "\\ud800"}', "name"),
])
def test_lone_surrogates_rejected(doc, field):
    """JSON escapes can spell text that has no UTF-8 form; storing it would break the
    journal and the delivery, so it is a 400 naming the field."""
    with pytest.raises(ValidationError) as info:
        js(doc)
    assert info.value.field.split(".")[0] == field
    assert info.value.status == 400


def test_surrogate_pairs_are_fine():
    t = js(b'{"url": "http://a/", "params": {"k": "\\ud83d\\ude00"}}')
    assert t.params == {"k": "\U0001F600"}


# ---------------------------------------------------------------- batches

def batch(data, *, queue="q", max_batch=10, limits=LIMITS):
    body = data if isinstance(data, bytes) else ujson.dumps(data).encode()
    return parse_batch(body, path_queue=queue, limits=limits, now=NOW, max_batch=max_batch)


def test_batch_list_and_object_forms():
    tasks = batch([{"url": URL, "params": {"i": i}} for i in range(3)])
    assert [t.params for t in tasks] == [{"i": "0"}, {"i": "1"}, {"i": "2"}]
    assert {t.queue for t in tasks} == {"q"}
    assert len({t.id for t in tasks}) == 3
    assert len(batch({"tasks": [{"url": URL}]})) == 1


def test_batch_rejections():
    rejects(batch, [], field="body")
    rejects(batch, {"url": URL}, field="body")
    rejects(batch, {"tasks": [{"url": URL}], "x": 1}, field="body")
    rejects(batch, b"[", field="body")
    rejects(batch, [{"url": URL}] * 11, field="body", status=413)
    assert len(batch([{"url": URL}] * 10)) == 10
    rejects(batch, [{"url": URL}, "nope"], field="tasks[1]")
    rejects(batch, [{"url": URL}, {"url": URL}, {"url": "ftp://x/"}], field="tasks[2].url")
    rejects(batch, [{"url": URL, "queue": "other"}], field="tasks[0].queue")
    rejects(batch, [{"url": URL, "headers": {"Host": "h"}}], field="tasks[0].headers.Host")
    rejects(batch, [{"url": URL, "countdown": -1}], field="tasks[0].countdown")


# ---------------------------------------------------------------- properties

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_text.filter(lambda k: not k.startswith("task.")), _text, max_size=8))
def test_form_params_round_trip(params):
    body = urlencode([("task.url", URL)] + list(params.items()))
    assert form(body).params == params


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["url", "method", "params", "body", "json", "headers",
                                         "countdown", "eta", "name", "queue", "max_attempts",
                                         "timeout", "callback", "extra"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                 _text, st.lists(_text, max_size=3),
                                 st.dictionaries(_text, _text, max_size=3)), max_size=8))
def test_anything_is_a_task_or_a_validation_error(fields):
    """No input makes validation raise anything but ValidationError."""
    try:
        t = build_task(fields, path_queue=None, idempotency_key=None, limits=LIMITS, now=NOW)
    except ValidationError as e:
        assert e.field and 400 <= e.status < 500
    else:
        assert t.url and t.method in ("POST", "PUT", "PATCH", "GET", "DELETE")
        ujson.dumps(t.encode(), ensure_ascii=False).encode("utf-8")  # storable


SHORT_URL = "http://worker.example/w"


def build(limits: "v.Limits | None" = None, **fields):
    fields.setdefault("url", SHORT_URL)
    return v.build_task(fields, path_queue=None, idempotency_key=None,
                        limits=limits or v.Limits(), now=NOW)


def refused(field: str, fn, *args, status: int = 400, message: str | None = None, **kw):
    with pytest.raises(v.ValidationError) as e:
        fn(*args, **kw)
    assert e.value.field == field, (e.value.field, e.value.message)
    assert e.value.status == status
    if message is not None:
        assert message in e.value.message, e.value.message
    return e.value


def test_validate_error_text_and_default_limits():
    e = v.ValidationError("url", "is bad")
    assert str(e) == "url: is bad" and e.status == 400
    assert v.Limits() == v.Limits(max_body=1048576, max_url=2083, max_delay=2592000.0,
                                   max_name=500)


def test_validate_form_field_count_limit():
    ok = urlencode([("task.url", SHORT_URL)] + [(f"p{i}", "x") for i in range(9999)]).encode()
    assert len(v.form_fields(ok)["params"]) == 9999
    over = urlencode([("task.url", SHORT_URL)] + [(f"p{i}", "x") for i in range(10000)]).encode()
    refused("body", v.form_fields, over, message="more than 10000 fields")


def test_validate_an_iri_is_sent_as_the_uri_it_stands_for():
    lim = v.Limits()
    assert v.check_url("url", "http://bücher.example/ä?q=é#f", lim) == \
        "http://xn--bcher-kva.example/%C3%A4?q=%C3%A9#f"
    assert v.check_url("url", "http://bücher.example:8080/", lim) == \
        "http://xn--bcher-kva.example:8080/"
    assert v.check_url("url", "http://[::1]:8080/ü", lim) == "http://[::1]:8080/%C3%BC"
    assert v.check_url("url", "http://[::1]/ü", lim) == "http://[::1]/%C3%BC"


def test_validate_an_iri_longer_than_the_limit_once_encoded_is_refused():
    lim = v.Limits(max_url=40)
    base = "http://h.example/"  # 17 characters
    fits = base + "ü" * 3  # 20 characters, 17 + 18 = 35 once encoded
    assert len(v.check_url("url", fits, lim)) == 35
    exact = base + "ü" * 3 + "x" * 5  # 40 once encoded
    assert len(v.check_url("url", exact, lim)) == 40
    refused("url", v.check_url, "url", base + "ü" * 4, lim, message="once percent-encoded")


def test_validate_credentials_in_the_url_are_refused_alone_too():
    lim = v.Limits()
    refused("url", v.check_url, "url", "http://user@h.example/", lim, message="credentials")
    refused("url", v.check_url, "url", "http://:pw@h.example/", lim, message="credentials")


def test_validate_number_messages():
    refused("eta", build, eta="soon", message="must be a number")
    refused("countdown", build, countdown="nan", message="finite")


def test_validate_nan_param_is_refused():
    refused("params.x", build, params={"x": float("nan")})
    assert build(params={"x": 1.5, "y": 2}).params == {"x": "1.5", "y": "2"}


def nest(n: int, kind: str):
    value: object = "leaf"
    for _ in range(n):
        value = {"a": value} if kind == "dict" else [value]
    return value


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_validate_nesting_limit_is_64(kind):
    assert build(json=nest(64, kind)).body is not None
    refused("json", build, json=nest(65, kind), message="nested more than 64")


def test_validate_lone_surrogates_are_found_everywhere():
    refused("json[1]", build, json=["ok", "\ud800"])
    refused("json.a", build, json={"a": "\ud800"})
    refused("json[0].b", build, json=[{"b": "\ud800"}])
    e = refused("body", build, **{"\ud800": 1})
    assert "surrogate" in e.message


def test_validate_header_values_must_be_latin_1():
    assert build(headers={"X-A": "café"}).headers == {"X-A": "café"}
    e = refused("headers.X-A", build, headers={"X-A": "€"})
    assert "must be latin-1 text" in e.message  # the real reason, not "a control character"


def test_validate_json_body_keeps_non_ascii_text():
    t = build(json={"a": "é"})
    assert t.body == '{"a":"é"}' and t.content_type == "application/json"


def test_validate_raw_body_of_exactly_the_limit():
    lim = v.Limits(max_body=10)
    assert build(lim, body="x" * 10).body == "x" * 10
    refused("body", build, lim, body="x" * 11, status=413)
    assert build(lim, body="é" * 5).body == "é" * 5  # 10 bytes
    refused("body", build, lim, body="é" * 5 + "x", status=413)


def test_validate_eta_bounds():
    lim = v.Limits(max_delay=100.0)
    assert build(lim, eta=NOW + 100.0).eta == NOW + 100.0
    refused("eta", build, lim, eta=NOW + 100.5)
    assert build(eta=0).eta == 0.0 and build(eta=0.5).eta == 0.5  # long past: due now
    refused("eta", build, eta=-0.5)


def test_validate_bad_json_says_so():
    refused("body", v.json_fields, b"{nope", message="not valid JSON")
    refused("body", v.parse_enqueue, "application/json", b"[1", path_queue=None,
            idempotency_key=None, limits=v.Limits(), now=NOW, message="not valid JSON")


@pytest.mark.parametrize("body,where", [
    # a trailing comma: ujson said "Unexpected character in found when decoding object value"
    (b'{"url": "http://x/", "params": {"a": 1},}',
     "Expecting property name enclosed in double quotes at line 1 column 41"),
    (b'{\n  "url": "http://x/"\n  "countdown": 5\n}', "Expecting ',' delimiter at line 3 column 3"),
    (b"", "Expecting value at line 1 column 1"),
    (b'{"url": "\xc3"}', "not UTF-8 at byte 10"),
    (b"[" * 100_000, "nested too deep"),  # deeper than the standard library's recursion
])
def test_validate_bad_json_gives_line_and_column(body, where):
    refused("body", v.json_fields, body, message=f"is not valid JSON: {where}")


def test_validate_batch_of_exactly_the_limit():
    one = json.dumps([{"url": SHORT_URL}]).encode()
    lim = v.Limits(max_body=len(one))
    assert len(v.parse_batch(one, path_queue=None, limits=lim, now=NOW, max_batch=10)) == 1
    refused("body", v.parse_batch, one + b" ", path_queue=None, limits=lim, now=NOW,
            max_batch=10, status=413)
    lim = v.Limits(max_body=len(one) + 20)
    assert v.parse_enqueue("application/json", json.dumps({"url": SHORT_URL}).encode(),
                           path_queue=None, idempotency_key=None, limits=lim, now=NOW)


def test_validate_urls_are_checked_against_the_target_rules():
    """The SSRF guard sees the host and the port the delivery would use (the scheme's
    default when the URL names none), and its rule is named in the answer."""
    asked: list[tuple[str, int]] = []

    def rules(host: str, port: int) -> str | None:
        asked.append((host, port))
        return "a private address" if host == "10.0.0.1" else None
    lim = Limits(targets=rules)
    for url, seen in [("http://a.example/x", ("a.example", 80)),
                      ("https://a.example/x", ("a.example", 443)),
                      ("http://a.example:8080/x", ("a.example", 8080)),
                      ("https://a.example:80/x", ("a.example", 80))]:
        assert v.check_url("url", url, lim) == url
        assert asked[-1] == seen
    e = rejects(v.check_url, "callback", "http://10.0.0.1/x", lim, field="callback")
    assert e.message == "targets a denied address: a private address"


def test_validate_a_topic_is_expanded_before_it_is_a_task():
    e = rejects(js, {"topic": "t"}, field="topic")
    assert "POST /queue only" in e.message
    e = rejects(js, {"topic": "t", "url": URL}, field="topic")
    assert e.message == "cannot be given with url"


def test_an_absolute_eta_is_on_the_clusters_clock_a_countdown_on_ours():
    """offset is the cluster's clock minus ours: on a node 30 s ahead (offset -30) an eta
    fires 30 s later by its own clock, that is at the eta's real moment; a countdown is
    the same either way. The 30-day bound is judged on the cluster's clock too."""
    ahead = -30.0
    t = build_task({"url": URL, "eta": NOW + 3}, path_queue=None, idempotency_key=None,
                   limits=LIMITS, now=NOW + 30, offset=ahead)
    assert t.eta == t.fire_at == NOW + 33 and t.created == NOW + 30
    t = build_task({"url": URL, "countdown": 3}, path_queue=None, idempotency_key=None,
                   limits=LIMITS, now=NOW + 30, offset=ahead)
    assert t.eta == t.fire_at == NOW + 33
    edge = {"url": URL, "eta": NOW + LIMITS.max_delay}
    build_task(edge, path_queue=None, idempotency_key=None, limits=LIMITS, now=NOW + 30,
               offset=ahead)
    with pytest.raises(ValidationError) as e:  # 10 s past the bound, by the cluster's clock
        build_task(dict(edge, eta=NOW + LIMITS.max_delay + 10), path_queue=None,
                   idempotency_key=None, limits=LIMITS, now=NOW + 30, offset=ahead)
    assert e.value.field == "eta"
    (b,) = parse_batch(ujson.dumps([{"url": URL, "eta": NOW + 3}]).encode(), path_queue=None,
                       limits=LIMITS, now=NOW - 8, max_batch=10, offset=8.0)
    assert b.fire_at == NOW - 5


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traceparent_is_kept_and_a_malformed_one_refused_naming_it():
    assert build(traceparent=TRACE).traceparent == TRACE
    assert build().traceparent is None
    form = v.parse_enqueue("application/x-www-form-urlencoded",
                           urlencode({"task.url": SHORT_URL, "task.traceparent": TRACE}).encode(),
                           path_queue=None, idempotency_key=None, limits=v.Limits(), now=NOW)
    assert form.traceparent == TRACE and "task.traceparent" not in form.params
    for bad in (TRACE.upper(), TRACE[:-1], "ff" + TRACE[2:], TRACE.replace("4bf92f3577b34da6a3ce929d0e0e4736", "0" * 32),
                TRACE.replace("00f067aa0ba902b7", "0" * 16), TRACE + "-x", 7, ""):
        refused("traceparent", build, traceparent=bad)


def test_an_oidc_audience_is_kept_and_a_bad_one_refused_naming_it():
    aud = "https://worker.example/hook"
    assert build(oidc_audience=aud).oidc_audience == aud
    assert build().oidc_audience is None
    assert Task.decode(build(oidc_audience=aud).encode()).oidc_audience == aud  # journal, STORE
    form = v.parse_enqueue("application/x-www-form-urlencoded",
                           urlencode({"task.url": SHORT_URL, "task.oidc_audience": aud}).encode(),
                           path_queue=None, idempotency_key=None, limits=v.Limits(), now=NOW)
    assert form.oidc_audience == aud and "task.oidc_audience" not in form.params
    for bad in ("", "a b", "x" * 2084, "caf\u00e9", "tab\there", 7, ["x"]):
        refused("oidc_audience", build, oidc_audience=bad)


def test_an_oidc_audience_is_refused_by_a_node_that_signs_no_tokens():
    e = rejects(js, {"url": URL, "oidc_audience": "https://w/h"}, field="oidc_audience",
                limits=v.Limits(oidc=False))
    assert "oidc_signing_key" in e.message


def test_expiry_from_expires_at_or_ttl_and_refused_when_it_could_never_run():
    assert js({"url": URL, "ttl": 60}).expires_at == NOW + 60
    assert js({"url": URL, "ttl": 60, "expires_at": NOW + 5}).expires_at == NOW + 5  # wins
    assert form([("task.url", URL), ("task.ttl", "30")]).expires_at == NOW + 30
    assert js({"url": URL}).expires_at is None
    assert "before the task is due" in rejects(js, {"url": URL, "countdown": 60, "ttl": 30},
                                               field="ttl").message
    rejects(js, {"url": URL, "eta": NOW + 60, "expires_at": NOW + 60}, field="expires_at")
    assert "in the past" in rejects(js, {"url": URL, "expires_at": NOW - 1},
                                    field="expires_at").message
    for bad in (0, -1, "soon", True, 1e12):
        rejects(js, {"url": URL, "ttl": bad}, field="ttl")


def test_retry_delays_as_a_json_list_or_a_form_list_and_their_bounds():
    assert js({"url": URL, "retry_delays": [1, 10, 60]}).retry_delays == (1.0, 10.0, 60.0)
    assert form([("task.url", URL), ("task.retry_delays", "1, 10,60")]).retry_delays == \
        (1.0, 10.0, 60.0)
    assert js({"url": URL}).retry_delays == ()
    for bad in ([], "", {"a": 1}, 5, list(range(21))):
        rejects(js, {"url": URL, "retry_delays": bad}, field="retry_delays")
    rejects(js, {"url": URL, "retry_delays": [1, -1]}, field="retry_delays[1]")
    rejects(js, {"url": URL, "retry_delays": [1, "x"]}, field="retry_delays[1]")
    rejects(js, {"url": URL, "retry_delays": [1e9]}, field="retry_delays[0]")


@pytest.mark.parametrize("fields,lease", [
    ({}, None), ({"async": True}, 300.0), ({"async": False}, None), ({"lease": 7200}, 7200.0),
    ({"async": True, "lease": 30}, 30.0), ({"lease": 7 * 86400}, 7 * 86400.0)])
def test_json_async_and_lease_make_a_long_task(fields, lease):
    assert js({"url": "http://w.example/x", **fields}).lease == lease


def test_form_async_and_lease():
    assert form("task.url=http://w.example/x&task.async=true").lease == 300.0
    assert form("task.url=http://w.example/x&task.lease=60").lease == 60.0
    assert form("task.url=http://w.example/x&task.async=0").lease is None


@pytest.mark.parametrize("fields,field", [
    ({"async": "maybe"}, "async"), ({"async": 1}, "async"), ({"lease": 0}, "lease"),
    ({"lease": 7 * 86400 + 1}, "lease"), ({"lease": "x"}, "lease"),
    ({"async": False, "lease": 60}, "lease")])
def test_bad_async_or_lease_is_named(fields, field):
    rejects(js, {"url": "http://w.example/x", **fields}, field=field)


# ================================================================ the fast paths


@pytest.mark.parametrize("fields", [
    {"url": "http://w.example/a"},
    {"url": "http://w.example/a", "params": {"a": "1", "b": ["x", "y"]}, "queue": "q"},
    {"url": "http://w.example/a", "params": {"n": 3, "t": True, "é": "ü"}},
    {"url": "http://w.example/a", "headers": {"X-A": "1", "X-B": 2}, "params": None},
    {"url": "http://bücher.example/ä?q=ö"},
])
@pytest.mark.parametrize("key", [None, "idem-1"])
def test_a_plain_task_is_built_as_the_full_path_builds_it(fields, key):
    """``_plain_task`` (only url, params, headers, queue given) answers the Task the
    general path answers (forced here with a field given at its default value)."""
    kw = {"path_queue": None, "idempotency_key": key, "limits": LIMITS, "now": NOW}
    plain = build_task(dict(fields), **kw)
    full = build_task({**fields, "method": "POST"}, **kw)
    assert plain.evolve(id=full.id) == full


@pytest.mark.parametrize("fields, field", [
    ({"url": "http://w.example/a", "params": {"a": "\ud800"}}, "params.a"),
    ({"url": "http://w.example/a", "params": {"\ud800": "a"}}, "params"),
    ({"url": "http://w.example/a", "params": {"a": float("nan")}}, "params.a"),
    ({"url": "http://w.example/a", "headers": {"X-A": "\udfff"}}, "headers.X-A"),
    ({"url": "http://w.example/a", "queue": "\ud800"}, "queue"),
    ({"url": "http://w.example/\ud800"}, "url"),
])
def test_a_plain_task_still_refuses_what_is_not_text(fields, field):
    """The checks' fast path (ASCII strings) lets no lone surrogate or NaN through."""
    with pytest.raises(ValidationError) as e:
        build_task(fields, path_queue=None, idempotency_key=None, limits=LIMITS, now=NOW)
    assert e.value.field == field
    assert "Unicode text" in e.value.message or "finite number" in e.value.message


def test_a_remembered_url_still_asks_the_target_rules_each_time():
    denied: set[tuple[str, int]] = set()
    limits = Limits(targets=lambda h, p: "deny" if (h, p) in denied else None)
    fields = {"url": "http://w.example:8080/a"}
    kw = {"path_queue": None, "idempotency_key": None, "limits": limits, "now": NOW}
    assert build_task(dict(fields), **kw).url == fields["url"]
    denied.add(("w.example", 8080))  # the cluster's endpoints changed
    with pytest.raises(ValidationError, match="denied address"):
        build_task(dict(fields), **kw)
    with pytest.raises(ValidationError, match="longer than 10"):  # a limit is part of the key
        build_task(dict(fields), **{**kw, "limits": Limits(max_url=10)})
