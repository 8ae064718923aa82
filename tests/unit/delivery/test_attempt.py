"""miyamoto.delivery.attempt: the request a delivery sends (form, query string, raw and JSON
bodies, headers a task cannot spoof, the Standard Webhooks signature with every secret)
and the outcome it records."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import qstash  # QStash's SDK (the test extra): its Receiver checks our signatures
import standardwebhooks  # the reference HMAC receiver (the test extra)
import ujson
from hypothesis import given, settings
from hypothesis import strategies as st
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from keymaker import ed_key
from miyamoto.config.keys import whpk

from miyamoto.delivery.attempt import Outcome, build_request, form_encode
from miyamoto.tasks.task import CLOUDTASKS, Task
from miyamoto.version import __version__


def test_outcome_retry_after_header_any_case():
    assert Outcome(ok=False, status=429, headers={"retry-after": "3"}).retry_after() == "3"
    assert Outcome(ok=False, status=429, headers={"Retry-After": "4"}).retry_after() == "4"
    assert Outcome(ok=False, status=500, headers={}).retry_after() is None
    assert Outcome(ok=False, error="timeout").retry_after() is None


def test_outcome_record_keeps_4k_of_the_body():
    rec = Outcome(ok=False, status=503, headers={"X": "1"}, body=b"a" * 10_000, at=5.0).record()
    assert rec["status"] == 503 and rec["headers"] == {"X": "1"} and rec["at"] == 5.0
    assert rec["body"] == "a" * 4096 and rec["error"] is None
    rec = Outcome(ok=False, body=b"\xff\xfe ok").record()
    ujson.dumps(rec)  # undecodable bytes still make a storable record
    assert rec["body"].endswith(" ok")


SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def task(**kw) -> Task:
    base = dict(id="0b6f1d5e-1111-4222-8333-944455556666", queue="emails",
                url="http://worker.example:9099/worker", eta=1_700_000_123.25)
    base.update(kw)
    return Task(**base)


def test_request_form_post():
    method, url, headers, body = build_request(task(params={"foo": "bar", "n": ["1", "2"]}), 0)
    assert method == "POST"
    assert url == "http://worker.example:9099/worker"
    assert parse_qs(body.decode()) == {"foo": ["bar"], "n": ["1", "2"]}
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert headers["User-Agent"] == f"miyamoto/{__version__}"
    assert headers["X-Task-Id"] == "0b6f1d5e-1111-4222-8333-944455556666"
    assert headers["X-Task-Queue"] == "emails"
    assert headers["X-Task-Retry-Count"] == "0"
    assert headers["X-Task-Execution-Count"] == "0"
    assert float(headers["X-Task-Eta"]) == pytest.approx(1_700_000_123.25)
    for absent in ("X-Task-Name", "Idempotency-Key", "X-Task-Previous-Response",
                   "webhook-id", "webhook-signature", "webhook-timestamp"):
        assert absent not in headers


def test_request_readme_body_is_exactly_foo_bar():
    _, _, _, body = build_request(task(params={"foo": "bar"}), 0)
    assert body == b"foo=bar"


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_request_put_patch_carry_the_form(method):
    m, _, headers, body = build_request(task(method=method, params={"a": "1"}), 0)
    assert m == method and body == b"a=1"
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_request_get_delete_use_the_query_string(method):
    m, url, headers, body = build_request(task(method=method, params={"a": "1 2", "b": ["x", "y"]}), 0)
    assert m == method and body == b""
    assert "Content-Type" not in headers
    parts = urlsplit(url)
    assert parts.path == "/worker"
    assert parse_qs(parts.query) == {"a": ["1 2"], "b": ["x", "y"]}
    # an existing query string is kept
    _, url, _, _ = build_request(task(method=method, url="http://w/x?k=v#frag",
                                      params={"a": "1"}), 0)
    assert parse_qs(urlsplit(url).query) == {"k": ["v"], "a": ["1"]}
    # no params: the URL is untouched
    assert build_request(task(method=method, url="http://w/x?k=v"), 0)[1] == "http://w/x?k=v"


def test_request_raw_and_json_bodies():
    _, _, headers, body = build_request(task(body='{"k": "ü"}', content_type="application/json"), 0)
    assert body == '{"k": "ü"}'.encode() and headers["Content-Type"] == "application/json"
    _, _, headers, body = build_request(task(body="plain"), 0)
    assert body == b"plain" and headers["Content-Type"].startswith("text/plain")


def test_request_custom_headers_and_name():
    t = task(headers={"Authorization": "Bearer x", "X-Foo": "1"}, name="job-7")
    _, _, headers, _ = build_request(t, 0)
    assert headers["Authorization"] == "Bearer x" and headers["X-Foo"] == "1"
    assert headers["X-Task-Name"] == "job-7" and headers["Idempotency-Key"] == "job-7"


def test_request_non_ascii_name_is_header_safe():
    _, _, headers, _ = build_request(task(name="名前 ü"), 0)
    value = headers["X-Task-Name"]
    assert value.isascii() and value == headers["Idempotency-Key"]
    value.encode("latin-1")


def test_request_task_headers_cannot_spoof_ours_in_any_case():
    t = task(headers={"x-task-id": "spoofed", "X-TASK-RETRY-COUNT": "99", "user-agent": "me",
                      "content-type": "text/csv", "X-Other": "kept"}, params={"a": "1"})
    _, _, headers, _ = build_request(t, 0)
    lower: dict[str, list[str]] = {}
    for k, v in headers.items():
        lower.setdefault(k.lower(), []).append(v)
    assert lower["x-task-id"] == [t.id]
    assert lower["x-task-retry-count"] == ["0"]
    assert lower["user-agent"] == [f"miyamoto/{__version__}"]
    assert lower["content-type"] == ["application/x-www-form-urlencoded"]
    assert lower["x-other"] == ["kept"]


def test_request_retry_headers():
    t = task(attempts=2, executions=1, last={"status": 503, "headers": {}, "body": "", "error": None})
    _, _, headers, _ = build_request(t, 0)
    assert headers["X-Task-Retry-Count"] == "2"
    assert headers["X-Task-Execution-Count"] == "1"
    assert headers["X-Task-Previous-Response"] == "503"
    # a previous attempt with no HTTP answer (timeout) has no previous response code
    t = task(attempts=1, last={"status": None, "error": "timeout", "headers": {}, "body": ""})
    assert "X-Task-Previous-Response" not in build_request(t, 0)[2]


def test_request_standard_webhooks_signature():
    now = 1_700_000_500.9
    t = task(params={"foo": "bar"})
    _, _, headers, body = build_request(t, now, (SECRET,))
    assert headers["webhook-id"] == t.id
    assert headers["webhook-timestamp"] == "1700000500"
    key = base64.b64decode(SECRET[len("whsec_"):])
    signed = f"{t.id}.1700000500.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    versions = dict(s.split(",", 1) for s in headers["webhook-signature"].split(" "))
    assert versions == {"v1": expected}
    # the signature covers the body: another body would not verify
    other = base64.b64encode(hmac.new(key, signed + b"x", hashlib.sha256).digest()).decode()
    assert other != expected


def test_request_signed_with_every_secret_for_rotation():
    other = "whsec_" + base64.b64encode(b"z" * 24).decode()
    t = task(params={"foo": "bar"})
    _, _, headers, body = build_request(t, 7.0, (SECRET, other))
    sigs = headers["webhook-signature"].split(" ")
    assert len(sigs) == 2
    for secret, sig in zip((SECRET, other), sigs):
        key = base64.b64decode(secret[len("whsec_"):])
        mac = hmac.new(key, f"{t.id}.7.".encode() + body, hashlib.sha256).digest()
        assert sig == "v1," + base64.b64encode(mac).decode()


def verify_v1a(public: str, headers: dict[str, str], body: bytes) -> None:
    """Standard Webhooks' asymmetric check, as its spec says: the whpk_ key's Ed25519
    signature over {id}.{timestamp}.{body}, one of the space-separated v1a, entries."""
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public[len("whpk_"):]))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    sigs = [s.split(",", 1)[1] for s in headers["webhook-signature"].split(" ")
            if s.startswith("v1a,")]
    assert len(sigs) == 1
    key.verify(base64.b64decode(sigs[0]), signed)  # raises InvalidSignature


def test_request_ed25519_signature_verifies_with_the_published_key():
    ed = ed_key()
    t = task(params={"foo": "bar"})
    _, _, headers, body = build_request(t, 1_700_000_500.9, ed25519=ed)
    assert headers["webhook-id"] == t.id and headers["webhook-timestamp"] == "1700000500"
    assert headers["webhook-signature"].startswith("v1a,")
    verify_v1a(whpk(ed.public_key()), headers, body)
    with pytest.raises(InvalidSignature):  # the signature covers the body
        verify_v1a(whpk(ed.public_key()), headers, body + b"x")
    with pytest.raises(InvalidSignature):  # and the timestamp
        verify_v1a(whpk(ed.public_key()), dict(headers, **{"webhook-timestamp": "1700000501"}),
                   body)


def test_request_both_schemes_pass_the_reference_hmac_receiver_and_the_v1a_check():
    """A queue with signature = both: an HMAC receiver (the standardwebhooks package, which
    skips entries of other versions) and a public-key receiver both accept the delivery."""
    ed = ed_key()
    t = task(body='{"a": 1}', content_type="application/json")
    now = time.time()
    _, _, headers, body = build_request(t, now, (SECRET,), ed25519=ed)
    assert [s.split(",")[0] for s in headers["webhook-signature"].split(" ")] == ["v1", "v1a"]
    assert standardwebhooks.Webhook(SECRET).verify(body.decode(), headers) == {"a": 1}
    verify_v1a(whpk(ed.public_key()), headers, body)


def test_request_bearer_token_goes_in_authorization_over_a_tasks_own():
    t = task(headers={"authorization": "Bearer forged", "X-Mine": "1"})
    _, _, headers, _ = build_request(t, 5.0, bearer="eyJ.token.sig")
    assert headers["Authorization"] == "Bearer eyJ.token.sig"
    assert "authorization" not in headers and headers["X-Mine"] == "1"
    _, _, headers, _ = build_request(t, 5.0)  # no token asked: the task's header goes
    assert headers["authorization"] == "Bearer forged" and "webhook-signature" not in headers


def test_request_signature_covers_raw_bodies_and_empty_ones():
    key = base64.b64decode(SECRET[len("whsec_"):])
    for t in (task(body="<x/>", content_type="application/xml"), task(method="GET", params={"a": "1"})):
        _, _, headers, body = build_request(t, 5.0, (SECRET,))
        signed = f"{t.id}.5.".encode() + body
        mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == "v1," + mac


def test_outcome_defaults():
    o = Outcome(ok=True)
    assert (o.status, o.headers, o.body, o.error, o.at) == (None, None, b"", None, 0.0)
    assert o.record()["at"] == 0.0


def test_a_cloud_tasks_task_carries_cloud_tasks_headers_and_a_native_one_none():
    t = task(name="order-1", face=CLOUDTASKS)
    _, _, headers, _ = build_request(t, 0)
    assert {k: v for k, v in headers.items() if k.startswith("X-CloudTasks-")} == {
        "X-CloudTasks-QueueName": "emails", "X-CloudTasks-TaskName": "order-1",
        "X-CloudTasks-TaskRetryCount": "0", "X-CloudTasks-TaskExecutionCount": "0",
        "X-CloudTasks-TaskETA": "1700000123.250000"}
    retried = t.evolve(name=None, attempts=2, executions=1, last={"status": 503})
    _, _, headers, _ = build_request(retried, 0)
    assert headers["X-CloudTasks-TaskName"] == t.id  # made without a name: its id
    assert headers["X-CloudTasks-TaskRetryCount"] == "2"
    assert headers["X-CloudTasks-TaskExecutionCount"] == "1"
    assert headers["X-CloudTasks-TaskPreviousResponse"] == "503"
    assert headers["X-CloudTasks-TaskRetryReason"] == "HTTP status 503"
    _, _, headers, _ = build_request(t.evolve(attempts=1, last={"status": None,
                                                                "error": "timed out\n"}), 0)
    assert "X-CloudTasks-TaskPreviousResponse" not in headers
    assert headers["X-CloudTasks-TaskRetryReason"] == "timed%20out%0A"  # header-safe
    _, _, headers, _ = build_request(t.evolve(attempts=1, last={"status": None,
                                                                "error": "e" * 500}), 0)
    assert headers["X-CloudTasks-TaskRetryReason"] == "e" * 200  # a long error: its start
    # a task header cannot forge them
    _, _, headers, _ = build_request(t.evolve(headers={"x-cloudtasks-taskname": "evil"}), 0)
    assert [v for k, v in headers.items() if k.lower() == "x-cloudtasks-taskname"] == ["order-1"]
    _, _, native, _ = build_request(task(name="order-1"), 0)
    assert not [k for k in native if k.lower().startswith("x-cloudtasks-")]


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_task_traceparent_goes_to_the_target_unless_the_attempt_has_its_own():
    attempt = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
    assert "traceparent" not in build_request(task(), 0.0)[2]
    assert build_request(task(traceparent=TRACE), 0.0)[2]["traceparent"] == TRACE
    assert build_request(task(traceparent=TRACE), 0.0, (), attempt)[2]["traceparent"] == attempt
    spoofed = build_request(task(traceparent=TRACE, headers={"TraceParent": "x"}), 0.0)[2]
    assert [v for k, v in spoofed.items() if k.lower() == "traceparent"] == [TRACE]


# ------------------------------------------------------------ Upstash-Signature
QSTASH_KEY = "sig_current_0123456789abcdefghijklmn"
QSTASH_NEXT = "sig_next_0123456789abcdefghijklmnopq"


def test_upstash_signature_is_verified_by_qstash_receiver():
    t = Task(id="t-9", queue="q", url="http://w/x?a=1", body='{"k": 1}',
             content_type="application/json", attempts=2)
    now = time.time()  # the Receiver checks exp and nbf against the real clock
    method, url, headers, body = build_request(t, now, upstash_key=QSTASH_KEY)
    assert headers["Upstash-Message-Id"] == "t-9" and headers["Upstash-Retried"] == "2"
    sig = headers["Upstash-Signature"]
    qstash.Receiver(QSTASH_KEY, QSTASH_NEXT).verify(signature=sig, body=body.decode(), url=url)
    # rotation: a worker that has moved on (our current key is its next) still verifies
    qstash.Receiver("sig_some_other_key_0123456789abcdef", QSTASH_KEY).verify(
        signature=sig, body=body.decode(), url=url)
    with pytest.raises(qstash.errors.SignatureError):  # another body
        qstash.Receiver(QSTASH_KEY, QSTASH_NEXT).verify(signature=sig, body='{"k": 2}', url=url)
    with pytest.raises(qstash.errors.SignatureError):  # another URL
        qstash.Receiver(QSTASH_KEY, QSTASH_NEXT).verify(signature=sig, body=body.decode(),
                                                        url="http://w/y")
    with pytest.raises(qstash.errors.SignatureError):  # neither key
        qstash.Receiver(QSTASH_NEXT, QSTASH_NEXT).verify(signature=sig, body=body.decode())
    with pytest.raises(qstash.errors.SignatureError):  # expired: 5 minutes on
        old = build_request(t, now - 301, upstash_key=QSTASH_KEY)[2]["Upstash-Signature"]
        qstash.Receiver(QSTASH_KEY, QSTASH_NEXT).verify(signature=old, body=body.decode())


def test_upstash_signature_claims_are_qstashs():
    from miyamoto.delivery.attempt import upstash_signature

    token = upstash_signature(QSTASH_KEY, "http://w/x", b"hello", 1000.0)
    head, claims, mac = token.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)  # noqa: E731
    assert ujson.loads(base64.urlsafe_b64decode(pad(head))) == {"alg": "HS256", "typ": "JWT"}
    c = ujson.loads(base64.urlsafe_b64decode(pad(claims)))
    assert (c["iss"], c["sub"], c["iat"], c["nbf"], c["exp"]) == ("Upstash", "http://w/x",
                                                                 1000, 1000, 1300)
    assert c["body"] == base64.urlsafe_b64encode(hashlib.sha256(b"hello").digest()).decode()
    assert c["jti"] != ujson.loads(base64.urlsafe_b64decode(pad(
        upstash_signature(QSTASH_KEY, "http://w/x", b"hello", 1000.0).split(".")[1])))["jti"]
    want = hmac.new(QSTASH_KEY.encode(), f"{head}.{claims}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(pad(mac)) == want


def test_no_upstash_headers_without_a_key():
    _, _, headers, _ = build_request(Task(id="t", queue="q", url="http://w/"), 1.0)
    assert not {k for k in headers if k.lower().startswith("upstash-")}


_TEXT = st.text(max_size=8)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(_TEXT, st.one_of(_TEXT, st.lists(_TEXT, max_size=3), st.integers(),
                                        st.tuples(_TEXT), st.binary(max_size=4)), max_size=5))
def test_a_form_body_is_what_urlencode_makes(params):
    assert form_encode(params) == urlencode(params, doseq=True)


def test_a_form_with_a_key_that_is_not_text_is_urlencoded_with_lists_repeated():
    # a key that is not a string (params built in Python, not from JSON) hands the whole
    # form to urlencode, and a list is still sent as the key repeated
    params = {1: ["a", "b c"], "d": "e"}
    assert form_encode(params) == "1=a&1=b+c&d=e"
    assert parse_qs(form_encode(params)) == {"1": ["a", "b c"], "d": ["e"]}


def test_a_task_without_headers_of_its_own_sends_ours_only():
    t = Task(id="t1", queue="q", url="http://w.example/", params={"a b": "ü", "c": ["1", "2"]})
    _, _, headers, body = build_request(t, 1.0)
    assert body == b"a+b=%C3%BC&c=1&c=2" and headers["X-Task-Id"] == "t1"
    _, _, theirs, _ = build_request(t.evolve(headers={"x-task-id": "spoof", "X-Mine": "1"}), 1.0)
    assert theirs == {"X-Mine": "1", **headers}
