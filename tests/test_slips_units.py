"""Unit tests written to kill what scripts/mutate.py showed no other test noticed
(issue 12): each pins a boundary or a branch of a pure or core module.

No sockets, no processes; the scheduler and dispatcher run their greenlets for real,
with waits on conditions under deadlines.
"""

from __future__ import annotations

import time

import gevent
import pytest

from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.delivery.ratelimit import TokenBucket
from miyamoto.engine.scheduler import Scheduler


def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        gevent.sleep(0.005)


# ================================================================ token bucket


def test_bucket_configure_to_a_burst_of_one_keeps_one_token():
    b = TokenBucket(rate=1, burst=10, now=0.0)
    b.configure(rate=1, burst=1)
    assert b.burst == 1
    assert [b.take(0.0) for _ in range(2)] == [True, False]


def test_bucket_refund_gives_a_token_back_up_to_the_burst():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]
    b.refund()
    assert [b.take(0.0) for _ in range(2)] == [True, False]
    b.refund()
    b.refund()
    b.refund()  # never more than the burst
    assert [b.take(0.0) for _ in range(3)] == [True, True, False]


def test_bucket_refund_at_rate_zero_saves_nothing_for_later():
    b = TokenBucket(rate=1, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    b.configure(rate=0, burst=3)
    b.refund()  # unlimited: nothing to give back
    b.configure(rate=1, burst=3)
    assert not b.take(0.0)


def test_bucket_wait_time_refills_by_itself():
    b = TokenBucket(rate=5, burst=1, now=0.0)
    assert b.take(0.0)
    assert b.wait_time(0.1) == pytest.approx(0.1)  # no take() in between
    assert b.wait_time(0.0) == pytest.approx(0.1)  # the clock going back adds nothing


def test_bucket_wait_time_is_zero_with_a_token_or_more():
    b = TokenBucket(rate=1, burst=2, now=0.0)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)
    assert b.wait_time(0.5) == 0.0  # 1.5 tokens
    assert b.take(0.5)
    assert b.wait_time(0.5) == pytest.approx(0.5)


def test_bucket_wait_time_at_rate_zero_with_an_empty_bucket():
    b = TokenBucket(rate=1, burst=1, now=0.0)
    assert b.take(0.0)
    b.configure(rate=0, burst=1)
    assert b.wait_time(0.0) == 0.0
    assert b.take(0.0)


# ================================================================ scheduler: the timer greenlet


def test_scheduler_an_earlier_key_wakes_the_timer_waiting_for_a_later_one():
    fired: list[tuple[str, float]] = []
    s = Scheduler(lambda k: fired.append((k, time.time())))
    s.start()
    try:
        t0 = time.time()
        s.schedule("late", t0 + 3.0)
        gevent.sleep(0.05)  # the timer goes to sleep until "late"
        s.schedule("early", time.time() + 0.05)
        wait_for(lambda: fired, 2.0)
        assert fired[0][0] == "early" and fired[0][1] - t0 < 1.0, fired
    finally:
        s.stop()


def test_scheduler_a_cancelled_key_never_fires_while_a_later_one_does():
    fired: list[str] = []
    s = Scheduler(fired.append)
    s.start()
    try:
        now = time.time()
        s.schedule("gone", now + 0.05)
        s.schedule("kept", now + 0.1)
        s.cancel("gone")
        wait_for(lambda: fired)  # the positive control: "kept", due after "gone"
        assert fired == ["kept"]
        assert "gone" not in s and "kept" not in s and len(s) == 0
    finally:
        s.stop()


# ================================================================ dispatcher


class Runs:
    """A dispatcher's run(): records (task, start time); answers per task."""

    def __init__(self, answers: dict[str, object] | None = None, hold: float = 0.0):
        self.started: list[tuple[str, float]] = []
        self.answers = answers or {}
        self.hold = hold

    def __call__(self, task_id: str):
        self.started.append((task_id, time.monotonic()))
        if self.hold:
            gevent.sleep(self.hold)
        a = self.answers.get(task_id)
        if isinstance(a, Exception):
            raise a
        return a

    @property
    def ids(self) -> list[str]:
        return [t for t, _ in self.started]


def dispatcher(run, configs: dict[str, QueueConfig] | None = None, concurrency: int = 8):
    configs = configs or {}
    d = Dispatcher(run, lambda name: configs.get(name) or QueueConfig(name=name), concurrency)
    d.start()
    return d


def test_dispatch_a_rate_limited_queue_spaces_its_starts_and_keeps_order():
    runs = Runs()
    d = dispatcher(runs, {"r": QueueConfig(name="r", rate=20, burst=1)})
    try:
        for i in range(5):
            d.submit("r", str(i))
        wait_for(lambda: len(runs.started) == 5, 5)
        assert runs.ids == ["0", "1", "2", "3", "4"]
        times = [t for _, t in runs.started]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g > 0.04 for g in gaps), gaps  # 20/s: 0.05 s apart
        assert times[-1] - times[0] < 1.0, gaps
    finally:
        d.stop(1)


def test_dispatch_a_limited_queue_does_not_hold_up_another():
    runs = Runs()
    d = dispatcher(runs, {"slow": QueueConfig(name="slow", rate=0.5, burst=1)})
    try:
        d.submit("slow", "s1")
        d.submit("slow", "s2")  # waits 2 s for a token
        for i in range(3):
            d.submit("fast", f"f{i}")
        wait_for(lambda: {"s1", "f0", "f1", "f2"} <= set(runs.ids), 1.0)
        assert "s2" not in runs.ids
    finally:
        d.stop(1)


def test_dispatch_a_run_that_did_not_deliver_gives_its_token_back():
    runs = Runs({"held": False})
    d = dispatcher(runs, {"r": QueueConfig(name="r", rate=0.2, burst=1)})
    try:
        d.submit("r", "held")
        wait_for(lambda: runs.ids == ["held"], 2)
        d.submit("r", "next")  # without the refund it would wait 5 s for a token
        wait_for(lambda: runs.ids == ["held", "next"], 2)
        d.submit("r", "third")  # "next" delivered (None): its token stays spent
        gevent.sleep(0.3)
        assert runs.ids == ["held", "next"]
    finally:
        d.stop(1)


def test_dispatch_a_failing_run_frees_its_slot():
    runs = Runs({"boom": RuntimeError("bug")})
    d = dispatcher(runs, concurrency=1)
    try:
        d.submit("q", "boom")
        d.submit("q", "after")
        wait_for(lambda: runs.ids == ["boom", "after"], 2)
        wait_for(lambda: d.busy == 0 and d.queue("q").inflight == 0, 2)
    finally:
        d.stop(1)


def test_dispatch_concurrency_is_capped_across_queues_and_slots_are_reused():
    runs = Runs(hold=0.1)
    d = dispatcher(runs, concurrency=2)
    try:
        for i in range(3):
            d.submit("a", f"a{i}")
            d.submit("b", f"b{i}")
        wait_for(lambda: len(runs.started) == 2, 1)
        assert d.busy == 2
        gevent.sleep(0.05)
        assert len(runs.started) == 2  # both slots taken
        wait_for(lambda: len(runs.started) == 6, 3)
        wait_for(lambda: d.busy == 0, 2)
    finally:
        d.stop(1)


def test_dispatch_queue_max_concurrent_caps_only_that_queue():
    runs = Runs(hold=0.2)
    d = dispatcher(runs, {"narrow": QueueConfig(name="narrow", max_concurrent=1)})
    try:
        d.submit("narrow", "n1")
        d.submit("narrow", "n2")
        d.submit("wide", "w1")
        d.submit("wide", "w2")
        wait_for(lambda: {"n1", "w1", "w2"} <= set(runs.ids), 1)
        assert "n2" not in runs.ids
        wait_for(lambda: "n2" in runs.ids, 2)
    finally:
        d.stop(1)


def test_dispatch_pause_holds_one_queue_while_another_runs():
    runs = Runs()
    d = dispatcher(runs)
    try:
        d.pause("p", True)
        assert d.queue("p").paused
        d.submit("p", "held")
        d.submit("q", "free")
        wait_for(lambda: "free" in runs.ids, 2)  # the positive control
        gevent.sleep(0.05)
        assert runs.ids == ["free"]
        d.pause("p", False)
        wait_for(lambda: runs.ids == ["free", "held"], 2)
    finally:
        d.stop(1)


def test_dispatch_a_queue_created_paused_holds_its_tasks():
    runs = Runs()
    d = dispatcher(runs, {"p": QueueConfig(name="p", paused=True)})
    try:
        d.submit("p", "held")
        d.submit("q", "free")
        wait_for(lambda: "free" in runs.ids, 2)
        gevent.sleep(0.05)
        assert runs.ids == ["free"]
    finally:
        d.stop(1)


def test_dispatch_rate_is_shared_among_members():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=12, burst=3), 4)
    assert d.queue("a").bucket.rate == 12
    d.set_share(3)
    assert d.queue("a").bucket.rate == 4
    assert d.queue("b").bucket.rate == 4  # created after the share was set
    d.set_share(0)
    assert d.queue("a").bucket.rate == 12 and d.queue("b").bucket.rate == 12
    assert d.queue("a").bucket.burst == 3


def test_dispatch_view_reads_without_creating():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=2), 4)
    assert d.view("x").config.rate == 2 and "x" not in d.queues
    q = d.queue("x")
    q.paused = True
    assert d.view("x") is q


def test_dispatch_stop_starts_nothing_more_and_waits_for_what_runs():
    runs = Runs(hold=0.2)
    d = dispatcher(runs, concurrency=1)
    d.submit("q", "first")
    d.submit("q", "second")
    wait_for(lambda: runs.ids == ["first"], 1)
    t0 = time.monotonic()
    d.stop(2)
    assert time.monotonic() - t0 >= 0.1  # it waited for "first"
    gevent.sleep(0.3)
    assert runs.ids == ["first"]


# ================================================================ scheduler: more


def test_scheduler_order_and_live_keys_survive_a_compaction():
    import random

    rng = random.Random(7)
    s = Scheduler(lambda key: None, clock=lambda: 0.0)
    times = {f"k{i}": rng.uniform(0, 100) for i in range(300)}
    for k, w in times.items():
        s.schedule(k, w)
    for i in range(5000):  # stale entries of one key pile up (each one the new head,
        s.schedule("same", -float(i))  # so they are spread through the heap): rebuilt
    assert len(s._heap) < 2 * len(s) + 1100
    got = s.pop_due(150.0)
    assert got == ["same"] + sorted(times, key=times.get)


def test_scheduler_pops_at_most_1000_by_default():
    s = Scheduler(lambda key: None, clock=lambda: 0.0)
    for i in range(1001):
        s.schedule(str(i), 1.0)
    assert len(s.pop_due(1.0)) == 1000
    assert s.pop_due(1.0) == ["1000"]


def test_scheduler_fires_every_key_when_more_than_a_batch_is_due():
    fired: list[str] = []
    s = Scheduler(fired.append)
    now = time.time()
    for i in range(2500):
        s.schedule(str(i), now - 1.0)
    s.start()
    try:
        wait_for(lambda: len(fired) == 2500, 0.8)
    finally:
        s.stop()


def test_scheduler_keeps_working_after_its_heap_empties_and_after_a_handler_fails():
    fired: list[str] = []

    def on_due(key: str) -> None:
        if key == "bad":
            raise RuntimeError("handler bug")
        fired.append(key)

    s = Scheduler(on_due)
    s.start()
    try:
        s.schedule("bad", time.time())
        s.schedule("one", time.time() + 0.02)
        wait_for(lambda: fired == ["one"], 2)
        gevent.sleep(0.05)  # nothing left: the timer waits to be woken
        s.schedule("two", time.time() + 0.02)
        wait_for(lambda: fired == ["one", "two"], 2)
    finally:
        s.stop()


def test_scheduler_sleeps_while_nothing_is_due():
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        return time.time()

    fired: list[str] = []
    s = Scheduler(fired.append, clock=clock)
    s.start()
    try:
        s.schedule("later", time.time() + 0.4)
        gevent.sleep(0.2)
        assert calls[0] < 50, calls[0]  # no busy loop
        wait_for(lambda: fired == ["later"], 2)
    finally:
        s.stop()


def test_scheduler_stop_stops_firing():
    fired: list[str] = []
    s = Scheduler(fired.append)
    s.start()
    s.schedule("first", time.time())
    wait_for(lambda: fired == ["first"], 2)
    s.stop()
    s.stop()  # twice is fine
    s.schedule("after-stop", time.time())
    gevent.sleep(0.1)
    assert fired == ["first"]


# ================================================================ validate: boundaries


from urllib.parse import urlencode  # noqa: E402

from miyamoto.wire import checks
from miyamoto.tasks import validate as v  # noqa: E402

NOW = 1_700_000_000.0
URL = "http://worker.example/w"


def build(limits: "v.Limits | None" = None, **fields):
    fields.setdefault("url", URL)
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
    ok = urlencode([("task.url", URL)] + [(f"p{i}", "x") for i in range(9999)]).encode()
    assert len(v.form_fields(ok)["params"]) == 9999
    over = urlencode([("task.url", URL)] + [(f"p{i}", "x") for i in range(10000)]).encode()
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
    refused("headers.X-A", build, headers={"X-A": "€"})


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


def test_validate_batch_of_exactly_the_limit():
    import json

    one = json.dumps([{"url": URL}]).encode()
    lim = v.Limits(max_body=len(one))
    assert len(v.parse_batch(one, path_queue=None, limits=lim, now=NOW, max_batch=10)) == 1
    refused("body", v.parse_batch, one + b" ", path_queue=None, limits=lim, now=NOW,
            max_batch=10, status=413)
    lim = v.Limits(max_body=len(one) + 20)
    assert v.parse_enqueue("application/json", json.dumps({"url": URL}).encode(),
                           path_queue=None, idempotency_key=None, limits=lim, now=NOW)


# ================================================================ dispatcher: more


def test_dispatch_a_viewed_queue_has_the_whole_rate():
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, rate=12), 4)
    assert d.view("new").bucket.rate == 12


def test_dispatch_stop_kills_deliveries_that_outlast_its_timeout():
    ended: list[str] = []

    def run(task_id: str) -> None:
        try:
            gevent.sleep(5)
        finally:
            ended.append(task_id)

    d = dispatcher(run)
    d.submit("q", "long")
    wait_for(lambda: d.busy == 1, 1)
    t0 = time.monotonic()
    d.stop(0.1)
    assert ended == ["long"] and time.monotonic() - t0 < 2


def test_dispatch_waits_for_the_nearest_token_of_several_queues():
    runs = Runs()
    d = dispatcher(runs, {"slow": QueueConfig(name="slow", rate=0.3, burst=1),
                          "quick": QueueConfig(name="quick", rate=10, burst=1)})
    try:
        for i in range(2):
            d.submit("slow", f"s{i}")
            d.submit("quick", f"q{i}")
        # q1's token comes 0.1 s after q0's, s1's only after 3.3 s
        wait_for(lambda: "q1" in runs.ids, 1.0)
        assert "s1" not in runs.ids
    finally:
        d.stop(1)


def cpu_while(seconds: float) -> float:
    t0 = time.process_time()
    gevent.sleep(seconds)
    return time.process_time() - t0


def test_dispatch_an_idle_or_waiting_pump_does_not_spin():
    runs = Runs()
    d = dispatcher(runs, {"r": QueueConfig(name="r", rate=1, burst=1)})
    try:
        assert cpu_while(0.3) < 0.1  # idle
        d.submit("r", "a")
        d.submit("r", "b")  # waits exactly 1.0 s for its token
        wait_for(lambda: runs.ids == ["a"], 1)
        assert cpu_while(0.3) < 0.1  # waiting for a token
        wait_for(lambda: runs.ids == ["a", "b"], 3)
    finally:
        d.stop(1)


# ================================================================ replication and delivery


from miyamoto.replicas import placement as replication  # noqa: E402
from miyamoto.delivery.attempt import Outcome  # noqa: E402
from miyamoto.tasks.task import Task  # noqa: E402


def test_replication_empty_ring_places_nothing():
    t = Task(id="t1", queue="q", url=URL)
    assert replication.place([], 2, t, 0) == ()


def test_replication_two_copies_fire_one_offset_apart_after_a_claim():
    assert replication.rank(1, 0, 2) == 1 and replication.rank(0, 1, 2) == 1
    assert replication.sibling_fire_at(10.0, 1, 0, 2, 5.0) == 15.0
    assert replication.rank(0, 0, 1) == 0
    assert replication.rank(2, 0, 3) == 2 and replication.rank(0, 2, 3) == 1


def test_replication_replacement_wraps_around_the_ring():
    ring = ["a", "b", "c"]
    # "d" was lost; nothing after it holds no copy: the first free member from the start
    assert replication.replacement(ring, ("c", "d"), "d") == "a"
    assert replication.replacement(ring, ("a", "d"), "d") == "b"
    assert replication.replacement(["a", "b", "c", "e"], ("b", "d"), "d") == "e"


def test_outcome_defaults():
    o = Outcome(ok=True)
    assert (o.status, o.headers, o.body, o.error, o.at) == (None, None, b"", None, 0.0)
    assert o.record()["at"] == 0.0


def test_dispatch_waiting_exactly_one_second_for_a_token_does_not_spin():
    runs = Runs()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name, rate=1, burst=1), 4,
                   clock=lambda: 1000.0)  # time stands still: the wait is exactly 1.0 s
    d.start()
    try:
        d.submit("r", "a")
        d.submit("r", "b")
        wait_for(lambda: runs.ids == ["a"], 1)
        assert cpu_while(0.3) < 0.1
        assert runs.ids == ["a"]
    finally:
        d.stop(1)


# ================================================================ membership: payload checks


from miyamoto.membership import machine as mb  # noqa: E402
from miyamoto.wire.verbs import DecodeError  # noqa: E402


def test_payload_integer_and_name_bounds():
    assert checks.MAX_INT == 2**53 - 1 and checks.MAX_NAME == 512
    assert checks.integer({"k": 2**53 - 1}, "k") == 2**53 - 1
    with pytest.raises(DecodeError):
        checks.integer({"k": 2**53}, "k")
    assert checks.string({"k": "x" * 512}, "k") == "x" * 512
    with pytest.raises(DecodeError):
        checks.string({"k": "x" * 513}, "k")


def test_payload_string_lists():
    assert checks.str_list({"k": ["a", "x" * 512]}, "k") == ("a", "x" * 512)
    for bad in ("ab", ["a", ""], ["x" * 513], [1], None, ["a"] * (checks.MAX_MEMBERS + 1)):
        with pytest.raises(DecodeError):
            checks.str_list({"k": bad}, "k")


def test_membership_roster_needs_one_incarnation_per_member():
    a, b = mb.Member("a", "tcp://127.0.0.1:1", "127.0.0.1:2"), \
        mb.Member("b", "tcp://127.0.0.1:3", "127.0.0.1:4")
    assert mb.Roster(1, 1, "a", (b, a), ("ib", "ia")).incarnations == ("ia", "ib")
    with pytest.raises(ValueError):
        mb.Roster(1, 1, "a", (a, b), ("ia",))
    assert mb.EMPTY.version == 0 and mb.EMPTY.term == 0 and mb.EMPTY.members == ()
