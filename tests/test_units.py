"""Fast unit tests of the pure parts: backoff, token bucket, scheduler heap, the request a
delivery sends, config loading, and the journal on a real SQLite file (under gevent)."""

from __future__ import annotations

import base64
import dataclasses
import email.utils
import hashlib
import hmac
import os
import random
import sqlite3
import time
from urllib.parse import parse_qs, urlsplit

import gevent
import pytest
import ujson
from hypothesis import given, settings
from hypothesis import strategies as st

from miyamoto.config import settings as config_mod
from miyamoto.delivery.backoff import backoff, jittered, retry_after
from miyamoto.config.settings import ConfigError, QueueConfig
from miyamoto.delivery.attempt import Outcome, build_request
from miyamoto.store.journal import Journal, JournalClosed
from miyamoto.delivery.ratelimit import TokenBucket
from miyamoto.engine.scheduler import Scheduler
from miyamoto.tasks.task import State, Task
from miyamoto.version import __version__

# ================================================================ backoff


def q(**kw) -> QueueConfig:
    return QueueConfig(**kw)


def test_backoff_doubles_from_min_backoff():
    c = q(min_backoff=0.5, max_backoff=3600, max_doublings=16)
    assert [backoff(n, c) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_backoff_cloud_tasks_example():
    # Cloud Tasks docs: min 10 s, max 300 s, max_doublings 3 -> 10, 20, 40, 80, 160, 240, 300, 300
    c = q(min_backoff=10, max_backoff=300, max_doublings=3)
    assert [backoff(n, c) for n in range(1, 9)] == [10, 20, 40, 80, 160, 240, 300, 300]


def test_backoff_linear_phase_after_max_doublings():
    c = q(min_backoff=1, max_backoff=1e9, max_doublings=2)
    # doubling: 1, 2, 4 (n = 1..3 = max_doublings + 1); then +4 per attempt
    assert [backoff(n, c) for n in range(1, 8)] == [1, 2, 4, 8, 12, 16, 20]


def test_backoff_zero_doublings_is_linear():
    c = q(min_backoff=3, max_backoff=1e9, max_doublings=0)
    assert [backoff(n, c) for n in range(1, 5)] == [3, 6, 9, 12]


def test_backoff_cap():
    c = q(min_backoff=1, max_backoff=5, max_doublings=16)
    assert [backoff(n, c) for n in range(1, 7)] == [1, 2, 4, 5, 5, 5]
    assert backoff(10_000, c) == 5
    assert backoff(10_000, q(min_backoff=1, max_backoff=7, max_doublings=3)) == 7


def test_backoff_attempt_below_one_is_the_first_delay():
    c = q(min_backoff=2, max_backoff=100)
    assert backoff(0, c) == backoff(1, c) == 2


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 100), st.floats(0, 10_000), st.integers(0, 20), st.integers(1, 200))
def test_backoff_properties(min_b, extra, doublings, n):
    c = q(min_backoff=min_b, max_backoff=min_b + extra, max_doublings=doublings)
    d = backoff(n, c)
    assert 0 <= d <= c.max_backoff
    assert backoff(n + 1, c) >= d  # never shrinks
    assert d >= min(c.min_backoff, c.max_backoff)


class FixedRng:
    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


def test_jitter_bounds():
    assert jittered(10.0, FixedRng(0.0)) == pytest.approx(9.0)
    assert jittered(10.0, FixedRng(0.5)) == pytest.approx(10.0)
    assert jittered(10.0, FixedRng(0.999999)) == pytest.approx(11.0, abs=1e-4)
    assert jittered(0.0, FixedRng(0.7)) == 0.0


def test_jitter_is_within_ten_percent_and_spread():
    rng = random.Random(42)
    values = [jittered(100.0, rng) for _ in range(2000)]
    assert all(90.0 <= v <= 110.0 for v in values)
    assert min(values) < 92 and max(values) > 108  # really jittered, both ways
    assert 99 < sum(values) / len(values) < 101


def test_retry_after_seconds():
    assert retry_after("1", 0.0, 60) == 1.0
    assert retry_after(" 2.5 ", 0.0, 60) == 2.5
    assert retry_after("120", 0.0, 60) == 60  # capped at max_backoff
    assert retry_after("-5", 0.0, 60) == 0.0
    assert retry_after("inf", 0.0, 60) == 60


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "1 2", "Mon, 99 Foo 2020"])
def test_retry_after_garbage_is_ignored(value):
    assert retry_after(value, 1000.0, 60) is None


def test_retry_after_http_date():
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after(date, now, 3600) == pytest.approx(30, abs=1)
    assert retry_after(date, now, 10) == 10
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after(past, now, 3600) == 0.0


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


# ================================================================ token bucket


def test_bucket_burst_then_rate():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    assert b.take(0.0)
    assert not b.take(0.0)
    assert b.wait_time(0.0) == pytest.approx(0.2)
    assert not b.take(0.1)
    assert b.wait_time(0.1) == pytest.approx(0.1)
    assert b.take(0.2)
    assert not b.take(0.2)


def test_bucket_burst_saves_up_to_burst():
    b = TokenBucket(rate=1, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    # a long idle time saves at most `burst` tokens
    assert [b.take(1000.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait_time(1000.0) == pytest.approx(1.0)


def test_bucket_rate_bound_over_time():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    t, taken = 0.0, 0
    while t <= 10.0:
        while b.take(t):
            taken += 1
        t += 0.013
    assert 49 <= taken <= 51  # 1 + 5/s * 10 s


def test_bucket_zero_rate_is_unlimited():
    b = TokenBucket(rate=0, burst=1, now=0.0)
    assert all(b.take(0.0) for _ in range(1000))
    assert b.wait_time(0.0) == 0.0


def test_bucket_clock_going_back_adds_nothing():
    b = TokenBucket(rate=1, burst=1, now=10.0)
    assert b.take(10.0)
    assert not b.take(5.0)
    assert not b.take(10.5)
    assert b.take(11.0)


def test_bucket_configure():
    b = TokenBucket(rate=1, burst=10, now=0.0)
    b.configure(rate=2, burst=2)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    assert b.wait_time(0.0) == pytest.approx(0.5)
    assert TokenBucket(rate=1, burst=0, now=0).burst == 1


# ================================================================ scheduler (pure methods)


def sched() -> Scheduler:
    return Scheduler(lambda key: None, clock=lambda: 0.0)


def test_scheduler_pops_due_in_time_order():
    s = sched()
    for key, when in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("late", 100.0)]:
        s.schedule(key, when)
    assert len(s) == 4
    assert s.pop_due(0.5) == []
    assert s.pop_due(2.5) == ["a", "b"]
    assert s.pop_due(3.0) == ["c"]  # due exactly at its time
    assert s.next_time() == 100.0
    assert len(s) == 1 and "late" in s and "a" not in s


def test_scheduler_ties_keep_insertion_order():
    s = sched()
    for k in ["x", "y", "z", "w"]:
        s.schedule(k, 5.0)
    assert s.pop_due(5.0) == ["x", "y", "z", "w"]


def test_scheduler_reschedule_replaces_the_old_time():
    s = sched()
    s.schedule("a", 1.0)
    s.schedule("b", 2.0)
    s.schedule("a", 10.0)  # pushed back
    assert s.pop_due(5.0) == ["b"]
    assert s.next_time() == 10.0
    s.schedule("a", 0.5)  # pulled forward
    assert s.pop_due(1.0) == ["a"]
    assert s.pop_due(100.0) == []  # the stale entries never fire


def test_scheduler_cancel():
    s = sched()
    s.schedule("a", 1.0)
    s.schedule("b", 1.0)
    s.cancel("a")
    s.cancel("never-scheduled")
    assert "a" not in s and len(s) == 1
    assert s.pop_due(2.0) == ["b"]
    assert s.next_time() is None
    s.schedule("a", 3.0)  # a cancelled key can come back
    assert s.pop_due(3.0) == ["a"]


def test_scheduler_pop_limit():
    s = sched()
    for i in range(10):
        s.schedule(f"k{i}", float(i))
    assert s.pop_due(100.0, limit=3) == ["k0", "k1", "k2"]
    assert s.pop_due(100.0) == [f"k{i}" for i in range(3, 10)]


def test_scheduler_stale_entries_are_compacted():
    s = sched()
    for i in range(20_000):
        s.schedule("same", float(i))
    assert len(s) == 1
    assert len(s._heap) < 3000  # not 20,000 entries for one key
    assert s.pop_due(1e9) == ["same"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 100),
                          st.booleans()), max_size=60), st.floats(0, 100))
def test_scheduler_matches_a_dict_model(ops, now):
    s = sched()
    model: dict[str, float] = {}
    for key, when, cancel in ops:
        if cancel:
            s.cancel(key)
            model.pop(key, None)
        else:
            s.schedule(key, when)
            model[key] = when
    due = s.pop_due(now)
    expected = sorted((w, k) for k, w in model.items() if w <= now)
    assert sorted(due) == sorted(k for _, k in expected)
    assert [model[k] for k in due] == sorted(model[k] for k in due)
    rest = {k: w for k, w in model.items() if w > now}
    assert len(s) == len(rest)
    assert s.next_time() == (min(rest.values()) if rest else None)


def test_scheduler_greenlet_fires_due_keys():
    fired: list[tuple[str, float]] = []
    s = Scheduler(lambda k: fired.append((k, time.time())))
    s.start()
    try:
        t0 = time.time()
        s.schedule("later", t0 + 0.15)
        s.schedule("soon", t0 + 0.05)
        s.schedule("gone", t0 + 0.05)
        s.cancel("gone")
        deadline = time.monotonic() + 5
        while len(fired) < 2 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        assert [k for k, _ in fired] == ["soon", "later"]
        assert fired[0][1] >= t0 + 0.05 - 0.005
        assert fired[1][1] >= t0 + 0.15 - 0.005
        # the positive control for "gone never fires": a key due after it does
        s.schedule("marker", time.time() + 0.02)
        deadline = time.monotonic() + 5
        while len(fired) < 3 and time.monotonic() < deadline:
            gevent.sleep(0.01)
        assert [k for k, _ in fired] == ["soon", "later", "marker"]
    finally:
        s.stop()


# ================================================================ the delivery request

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


def test_config_signing_secrets_comma_or_space_separated():
    other = "whsec_" + base64.b64encode(b"z" * 64).decode()
    for raw in (f"{SECRET},{other}", f" {SECRET}  {other} ", f"{SECRET}, {other},"):
        c = config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": raw})
        assert c.signing_secret == (SECRET, other)
    assert config_mod.load(env={}).signing_secret == ()


def test_config_bad_signing_secret_is_not_quoted():
    bad = "whsec_dHdlbnR5LWJ5dGVzLXNlY3JldCE="  # base64, but 20 bytes
    with pytest.raises(ConfigError) as info:
        config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": f"{SECRET} {bad}"})
    assert str(info.value).startswith("signing_secret: entry 2")
    assert bad[6:] not in str(info.value) and SECRET[6:] not in str(info.value)


def test_request_signature_covers_raw_bodies_and_empty_ones():
    key = base64.b64decode(SECRET[len("whsec_"):])
    for t in (task(body="<x/>", content_type="application/xml"), task(method="GET", params={"a": "1"})):
        _, _, headers, body = build_request(t, 5.0, (SECRET,))
        signed = f"{t.id}.5.".encode() + body
        mac = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert headers["webhook-signature"] == "v1," + mac


# ================================================================ config


def load(ini: str | None = None, env: dict | None = None, flags: dict | None = None, tmp=None):
    path = None
    if ini is not None:
        path = os.path.join(tmp, "m.ini")
        with open(path, "w") as f:
            f.write(ini)
    return config_mod.load(path, env=env or {}, flags=flags)


def test_config_defaults():
    c = config_mod.load(env={})
    assert c.http == "127.0.0.1:8088"
    assert c.cluster == "tcp://127.0.0.1:6000"
    assert c.advertise == c.cluster
    assert c.data_dir == "./miyamoto-data"
    assert c.replication == 2 and c.min_replicas == 1
    assert c.replica_offset == 5.0
    assert c.heartbeat_interval == 0.5 and c.failure_timeout == 3.0
    assert (c.max_body, c.max_url, c.max_delay, c.max_name) == (1 << 20, 2083, 30 * 86400, 500)
    assert c.dedup_window == 3600
    assert c.node.endswith("-8088")
    assert c.seeds == ()
    d = c.queue("default")
    assert d == QueueConfig(name="default")
    assert (d.timeout, d.rate, d.max_attempts) == (30.0, 0.0, 25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.http = "x"  # type: ignore[misc]


def test_config_ini(tmp_path):
    c = load("""
[miyamoto]
http = 0.0.0.0:9000
insecure_http = true
replication = 3
seeds = tcp://10.0.0.1:6000, tcp://10.0.0.2:6000
insecure_cluster = true
log_level = debug

[queue:default]
min_backoff = 0.05
max_backoff = 0.5

[queue:emails]
rate = 5
burst = 1
max_concurrent = 2
paused = yes
""", tmp=tmp_path)
    assert c.http == "0.0.0.0:9000" and c.http_port == 9000 and c.http_host == "0.0.0.0"
    assert c.replication == 3
    assert c.seeds == ("tcp://10.0.0.1:6000", "tcp://10.0.0.2:6000")
    assert c.log_level == "DEBUG"
    d = c.queue("default")
    assert (d.min_backoff, d.max_backoff) == (0.05, 0.5)
    e = c.queue("emails")
    assert (e.name, e.rate, e.burst, e.max_concurrent, e.paused) == ("emails", 5.0, 1, 2, True)
    assert (e.min_backoff, e.max_backoff) == (0.05, 0.5)  # inherited from [queue:default]
    new = c.queue("brand-new")  # created on first use with [queue:default]'s values
    assert new.name == "brand-new" and new.min_backoff == 0.05 and new.rate == 0


def test_config_precedence(tmp_path):
    ini = "[miyamoto]\nreplica_offset = 1\nhttp = 127.0.0.1:1111\nreplication = 3\n"
    c = load(ini, tmp=tmp_path)
    assert (c.replica_offset, c.http, c.replication) == (1.0, "127.0.0.1:1111", 3)
    c = load(ini, env={"MIYAMOTO_REPLICA_OFFSET": "2", "MIYAMOTO_HTTP": "127.0.0.1:2222"},
             tmp=tmp_path)
    assert (c.replica_offset, c.http, c.replication) == (2.0, "127.0.0.1:2222", 3)
    c = load(ini, env={"MIYAMOTO_REPLICA_OFFSET": "2", "MIYAMOTO_HTTP": "127.0.0.1:2222"},
             flags={"http": "127.0.0.1:3333", "replica_offset": None}, tmp=tmp_path)
    assert (c.replica_offset, c.http) == (2.0, "127.0.0.1:3333")  # None flags are unset


def test_config_file_from_env_and_flag(tmp_path):
    a = tmp_path / "a.ini"
    a.write_text("[miyamoto]\nreplication = 4\n")
    b = tmp_path / "b.ini"
    b.write_text("[miyamoto]\nreplication = 5\n")
    assert config_mod.load(env={"MIYAMOTO_CONFIG": str(a)}).replication == 4
    assert config_mod.load(env={"MIYAMOTO_CONFIG": str(a)},
                           flags={"config": str(b)}).replication == 5


def test_config_node_sections(tmp_path):
    ini = """
[miyamoto]
replication = 2
[node:a]
http = 127.0.0.1:8001
cluster = tcp://127.0.0.1:6001
[node:b]
http = 127.0.0.1:8002
cluster = tcp://127.0.0.1:6002
seeds = tcp://127.0.0.1:6001
insecure_cluster = true
"""
    c = load(ini, flags={"node": "b"}, tmp=tmp_path)
    assert (c.node, c.http, c.cluster, c.seeds) == ("b", "127.0.0.1:8002", "tcp://127.0.0.1:6002",
                                                   ("tcp://127.0.0.1:6001",))
    with pytest.raises(ConfigError, match="node"):
        load(ini, flags={"node": "zz"}, tmp=tmp_path)


@pytest.mark.parametrize("source,name,value", [
    ("env", "replication", "0"), ("flag", "replication", "0"), ("ini", "replication", "two"),
    ("env", "http", "nonsense"), ("flag", "http", "host:99999"), ("ini", "http", ":80"),
    ("env", "cluster", "udp://1.2.3.4:5"), ("env", "seeds", "tcp://a:1,b:2"),
    ("env", "replica_offset", "-1"), ("env", "replica_offset", "nan"),
    ("env", "heartbeat_interval", "inf"), ("env", "log_level", "loud"),
    ("env", "signing_secret", "plain"), ("ini", "signing_secret", "whsec_NOT-base64!!"),
    ("env", "signing_secret", "whsec_"), ("env", "signing_secret", "whsec_" + "QUFB" * 2),
    ("flag", "signing_secret", SECRET + ",dGVzdA=="), ("env", "curve_public", "short"),
    ("env", "max_body", "0"), ("env", "concurrency", "1.5"), ("env", "advertise", "x"),
])
def test_config_bad_values_name_the_option(tmp_path, source, name, value):
    kw: dict = {}
    if source == "env":
        kw["env"] = {f"MIYAMOTO_{name.upper()}": value}
    elif source == "flag":
        kw["flags"] = {name: value}
    else:
        kw["ini"] = f"[miyamoto]\n{name} = {value}\n"
    with pytest.raises(ConfigError) as info:
        load(tmp=tmp_path, **kw)
    assert str(info.value).startswith(name), str(info.value)


@pytest.mark.parametrize("ini,culprit", [
    ("[miyamoto]\ncolour = red\n", "colour"),
    ("[queue:q]\nrate = fast\n", "queue:q.rate"),
    ("[queue:q]\nspeed = 1\n", "queue:q.speed"),
    ("[queue:default]\nmin_backoff = 2\nmax_backoff = 1\n", "queue:default.max_backoff"),
    ("[queue:q]\nmax_attempts = 0\n", "queue:q.max_attempts"),
    ("[queue:q]\npaused = maybe\n", "queue:q.paused"),
    ("[queue:bad.name]\nrate = 1\n", "queue:bad.name"),
    ("[cluster]\nx = 1\n", "cluster"),
    ("[miyamoto]\nelection_timeout_min = 3\nelection_timeout_max = 1\n", "election_timeout_max"),
    ("[miyamoto]\ncurve_public = " + "a" * 40 + "\n", "curve_secret"),
    ("this is not an ini file", "config"),
])
def test_config_bad_ini(tmp_path, ini, culprit):
    with pytest.raises(ConfigError) as info:
        load(ini, tmp=tmp_path)
    assert culprit in str(info.value)


def test_config_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        config_mod.load(str(tmp_path / "nope.ini"), env={})


def test_config_redacts_secrets():
    c = config_mod.load(env={"MIYAMOTO_SIGNING_SECRET": SECRET})
    assert c.signing_secret == (SECRET,)
    red = c.redacted()
    assert red["signing_secret"] == "***" and SECRET not in str(red)
    assert red["curve_secret"] == ""


def test_config_every_setting_has_an_env_twin():
    for s in config_mod.SETTINGS:
        if s.name in ("node", "zone", "seeds", "advertise", "curve_public", "curve_secret",
                      "signing_secret", "log_level", "data_dir"):
            continue
        value = str(s.default) if not isinstance(s.default, tuple) else ""
        c = config_mod.load(env={f"MIYAMOTO_{s.name.upper()}": value})
        assert getattr(c, s.name) == s.default, s.name


# ================================================================ journal (real SQLite, gevent)


def jtask(i: int, **kw) -> Task:
    base = dict(id=f"t{i:05d}", queue=kw.pop("queue", "q"), url="http://w/x", eta=100.0 + i,
                fire_at=100.0 + i, params={"i": str(i), "u": "ü"}, created=1.0)
    base.update(kw)
    return Task(**base)


@pytest.fixture
def journal_factory(tmp_path):
    opened: list[Journal] = []

    def make(data_dir: str | None = None) -> Journal:
        j = Journal(data_dir or str(tmp_path / "data"))
        j.open()
        opened.append(j)
        return j

    yield make
    for j in opened:
        j.close()


def test_journal_put_get_and_reopen(journal_factory, tmp_path):
    j = journal_factory()
    t = jtask(1, name="n1", headers={"X-A": "1"}, max_attempts=3, timeout=2.5,
              last={"status": 500, "headers": {"A": "b"}, "body": "x", "error": None, "at": 3.0})
    j.put(t, wait=True, name_expires=5000.0)
    assert j.get(t.id) == t
    assert j.get("missing") is None
    j.close()
    assert os.path.exists(os.path.join(tmp_path, "data", "journal.sqlite3"))
    with pytest.raises(JournalClosed):
        j.put(jtask(2))
    j2 = journal_factory()
    assert j2.get(t.id) == t
    tasks, names, paused = j2.load()
    assert tasks == [t]
    assert names == {("q", "n1"): (t.id, 5000.0)}
    assert paused == {}


def test_journal_load_returns_only_live_tasks(journal_factory):
    j = journal_factory()
    live = [jtask(1), jtask(2, state=State.RUNNING)]
    ended = [jtask(3, state=State.SUCCEEDED, finished=10.0), jtask(4, state=State.FAILED, finished=11.0),
             jtask(5, state=State.CANCELLED, finished=12.0)]
    j.put_many(live + ended, wait=True)
    tasks, _, _ = j.load()
    assert sorted(t.id for t in tasks) == ["t00001", "t00002"]
    assert {t.id: t.state for t in tasks}["t00002"] == State.RUNNING


def test_journal_newer_write_wins(journal_factory):
    j = journal_factory()
    t = jtask(1)
    j.put(t)
    j.put(t.evolve(attempts=1, fire_at=500.0))
    j.put(t.evolve(attempts=2, fire_at=900.0), wait=True)
    assert j.get(t.id).attempts == 2
    j.put(t.evolve(state=State.SUCCEEDED, attempts=3, finished=50.0), wait=True)
    assert j.load()[0] == []
    assert j.get(t.id).state == State.SUCCEEDED


def test_journal_reads_see_pending_writes(journal_factory):
    j = journal_factory()
    t = jtask(1, state=State.FAILED, finished=5.0)
    j.put(t)  # not waited for: still pending in memory
    assert j.get(t.id) == t
    assert [x.id for x in j.list("q", "failed", 10)] == [t.id]
    j.flush()
    assert j.get(t.id) == t
    assert [x.id for x in j.list("q", "failed", 10)] == [t.id]


def test_journal_counts_and_list(journal_factory):
    j = journal_factory()
    j.put_many([jtask(i, state=State.SUCCEEDED, finished=float(i)) for i in range(5)]
               + [jtask(10 + i, state=State.FAILED, finished=float(i), queue="other") for i in range(2)]
               + [jtask(20)], wait=True)
    # every row is counted, live ones too (the engine splits them into running/scheduled)
    assert j.counts() == {"q": {"succeeded": 5, "scheduled": 1}, "other": {"failed": 2}}
    assert j.counts(primary_only=True) == j.counts()
    newest_first = [t.id for t in j.list("q", "succeeded", 3)]
    assert newest_first == ["t00004", "t00003", "t00002"]
    assert j.list("q", "failed", 10) == []
    assert len(j.list("other", "failed", 10)) == 2


def test_journal_delete(journal_factory):
    j = journal_factory()
    j.put(jtask(1), wait=True)
    j.delete("t00001")
    j.flush()
    assert j.get("t00001") is None
    assert j.load()[0] == []


def test_journal_sweep(journal_factory):
    j = journal_factory()
    now = 10_000.0
    j.put_many([jtask(1, state=State.SUCCEEDED, finished=now - 100),
                jtask(2, state=State.FAILED, finished=now - 5),
                jtask(3, state=State.CANCELLED, finished=now - 200),
                jtask(4)], wait=True)
    j.put(jtask(5, name="old"), name_expires=now - 1)
    j.put(jtask(6, name="fresh"), name_expires=now + 100, wait=True)
    removed = j.sweep(now, retention=50)
    assert removed == 3  # two expired tasks, one expired name
    assert j.get("t00001") is None and j.get("t00003") is None
    assert j.get("t00002") is not None and j.get("t00004") is not None
    assert j.get("t00005") is not None  # a live task is never swept
    _, names, _ = j.load()
    assert set(names) == {("q", "fresh")}


def test_journal_paused_queues_and_names(journal_factory):
    j = journal_factory()
    j.set_paused("a", True)
    j.set_paused("b", True)
    j.set_paused("b", False)
    j.put(jtask(1, name="n"), name_expires=99.0)
    j.release_name("q", "n")
    j.flush()
    _, names, paused = j.load()
    assert paused == {"a": True, "b": False}
    assert names == {}


def test_journal_group_commit(journal_factory):
    j = journal_factory()
    before = j.commits
    greenlets = [gevent.spawn(j.put, jtask(i), wait=True) for i in range(200)]
    gevent.joinall(greenlets, raise_error=True, timeout=30)
    assert all(g.successful() for g in greenlets)
    commits = j.commits - before
    assert 1 <= commits <= 20, commits  # many tasks per transaction, not one each
    assert len(j.load()[0]) == 200


def test_journal_wait_means_committed(journal_factory, tmp_path):
    """After put(wait=True) returns, another connection sees the row (it is committed)."""
    j = journal_factory()
    j.put(jtask(7), wait=True)
    db = sqlite3.connect(os.path.join(tmp_path, "data", "journal.sqlite3"))
    try:
        rows = db.execute("SELECT id, state FROM tasks").fetchall()
    finally:
        db.close()
    assert rows == [("t00007", "scheduled")]


def test_journal_close_flushes_pending(journal_factory):
    j = journal_factory()
    j.put_many([jtask(i) for i in range(50)])  # not waited for
    j.close()
    j2 = journal_factory()
    assert len(j2.load()[0]) == 50


def test_journal_skips_unreadable_rows(journal_factory, tmp_path):
    j = journal_factory()
    j.put(jtask(1), wait=True)
    j.close()
    db = sqlite3.connect(os.path.join(tmp_path, "data", "journal.sqlite3"))
    db.execute("INSERT INTO tasks (id, queue, state, data) VALUES ('bad', 'q', 'scheduled', '{not json')")
    db.execute("INSERT INTO tasks (id, queue, state, data) VALUES ('bad2', 'q', 'scheduled', '{\"id\": 5}')")
    db.commit()
    db.close()
    j2 = journal_factory()
    tasks, _, _ = j2.load()
    assert [t.id for t in tasks] == ["t00001"]


def test_journal_survives_a_record_it_cannot_encode(journal_factory):
    """One bad record (text with no UTF-8 form, e.g. from a peer) must not kill the writer:
    later writes still commit."""
    j = journal_factory()
    for bad in (jtask(1, params={"k": "\ud800"}), jtask(3, id="bad-\udc00"),
                jtask(4, name="\ud800"), jtask(5, queue="q\ud800")):
        try:
            j.put(bad, wait=True, name_expires=99.0)
        except Exception:
            pass
    good = jtask(2)
    g = gevent.spawn(j.put, good, wait=True)
    g.join(timeout=5)
    assert g.successful(), "the journal writer died on an unencodable record"
    j.close()
    j2 = journal_factory()
    ids = [t.id for t in j2.load()[0]]
    assert "t00002" in ids
    if "t00001" in ids:  # kept: then it must round-trip exactly
        assert j2.get("t00001").params == {"k": "\ud800"}


def test_journal_memory(journal_factory):
    j = journal_factory(":memory:")
    j.put(jtask(1), wait=True)
    assert j.get("t00001") is not None
    assert len(j.load()[0]) == 1
    assert j.size_bytes() == 0
