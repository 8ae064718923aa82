"""Flow-control keys: the key table (miyamoto.delivery.flow), the dispatcher's use of it
with a fake clock, and the fields' checks. A real node with two queues sharing a key's
rate and its parallelism is in tests/nodes/test_delivery_node.py.
"""

from __future__ import annotations

import pytest

from dispatchkit import FakeClock, Gates, pump_once
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.delivery.flow import FlowSpec, FlowTable, spec_of
from miyamoto.wire.verbs import DecodeError
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, ValidationError, build_task

H, G = "http://h:80", "http://g:80"


# ================================================================ units: the key table


@pytest.mark.timeout(10)
def test_flow_limits_are_shared_among_members_and_the_last_task_seen_sets_them():
    table = FlowTable()
    f = table.configure(FlowSpec("k", 6.0, 5), 0.0)
    assert f.limit == 5 and f.bucket.rate == 6.0
    table.set_share(3)
    assert f.limit == 1 and f.bucket.rate == 2.0  # 5 // 3, rate / 3
    table.set_share(10)
    assert f.limit == 1 and f.bucket.rate == pytest.approx(0.6)  # at least one per node
    table.set_share(1)
    table.configure(FlowSpec("k", 1.0, 2), 1.0)  # a later task changes the key's limits
    assert table.get("k") is f and f.limit == 2 and f.bucket.rate == 1.0
    table.configure(FlowSpec("k", None, None), 2.0)  # one without limits leaves them
    assert f.limit == 2 and f.bucket.rate == 1.0
    unlimited = table.configure(FlowSpec("free", None, None), 0.0)
    assert unlimited.blocked_until(0.0) is None


@pytest.mark.timeout(10)
def test_flow_table_is_bounded_and_evicts_idle_keys_first():
    table = FlowTable(size=3)
    busy = table.configure(FlowSpec("busy", None, 1), 0.0)
    busy.inflight = 1
    for i in range(10):
        table.configure(FlowSpec(f"k{i}", 1.0, None), 0.0)
    assert len(table) == 3 and table.get("busy") is busy  # in flight: kept
    assert table.get("k9") is not None and table.get("k0") is None


@pytest.mark.timeout(10)
def test_flow_table_keeps_ten_thousand_keys_by_default():
    table = FlowTable()
    for i in range(10_000):
        table.configure(FlowSpec(f"k{i}", 1.0, None), 0.0)
    assert len(table) == 10_000 and table.get("k0") is not None
    table.configure(FlowSpec("one-more", 1.0, None), 0.0)
    assert len(table) == 10_000 and table.get("k0") is None  # the least recently used


@pytest.mark.timeout(10)
def test_flow_table_a_key_seen_again_is_the_most_recently_used():
    table = FlowTable(size=3)
    for k in ("k0", "k1", "k2"):
        table.configure(FlowSpec(k, 1.0, None), 0.0)
    table.configure(FlowSpec("k0", None, None), 0.0)  # k0's task again
    table.configure(FlowSpec("k3", 1.0, None), 0.0)
    assert table.get("k0") is not None and table.get("k1") is None


@pytest.mark.timeout(10)
def test_flow_a_rate_is_a_spacing_without_burst():
    f = FlowTable().configure(FlowSpec("k", 5.0, None), 100.0)
    assert f.blocked_until(100.0) is None and f.bucket.take(100.0)
    assert f.blocked_until(100.0) == pytest.approx(100.2)
    assert f.blocked_until(100.2) is None


# ================================================================ units: the dispatcher


@pytest.mark.timeout(10)
def test_dispatch_a_full_key_holds_its_tasks_across_queues_but_not_the_others():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 64, FakeClock())
    one = FlowSpec("k", None, 1)
    d.submit("a", "a1", H, flow=one)
    d.submit("b", "b1", G, flow=one)
    d.submit("a", "a2", H, flow=one)
    d.submit("a", "free", H)  # no key: not held up by the full one
    d.submit("b", "other", G, flow=FlowSpec("other", None, 1))
    pump_once(d)
    assert sorted(runs.started) == ["a1", "free", "other"]
    assert d.flows.get("k").inflight == 1
    for done in ("a1", "b1", "a2"):  # each freed slot starts one more task of the key
        runs.finish(done)
        pump_once(d)
        assert d.flows.get("k").inflight == (0 if done == "a2" else 1)
    assert sorted(runs.started) == ["a1", "a2", "b1", "free", "other"]
    assert runs.started.index("a1") < runs.started.index("a2")  # FIFO within a queue
    runs.finish(*runs.started)
    assert d.flows.get("k").inflight == 0 and d.busy == 0


@pytest.mark.timeout(10)
def test_dispatch_a_key_rate_spends_no_queue_token_and_wakes_on_a_timer():
    runs, clock = Gates(), FakeClock()
    qc = QueueConfig(name="q", rate=0.001, burst=3)  # three queue tokens, then one per 1000 s
    d = Dispatcher(runs, lambda name: qc, 64, clock)
    slow = FlowSpec("k", 0.5, None)  # one every 2 s
    for i in range(3):
        d.submit("q", f"k{i}", H, flow=slow)
    d.submit("q", "g", G)
    wait = pump_once(d)
    assert runs.started == ["k0", "g"] and wait == pytest.approx(2.0)
    clock.now += 2.0
    pump_once(d)
    assert runs.started == ["k0", "g", "k1"]  # the third queue token: none was wasted


# ================================================================ units: the fields


def _task(**fields) -> Task:
    return build_task({"url": "http://example.com/x", **fields}, path_queue=None,
                      idempotency_key=None, limits=Limits(), now=1000.0)


@pytest.mark.timeout(10)
def test_flow_a_tasks_key_and_limits_make_its_spec():
    t = _task(flow_key="customer-42", flow_rate="2.5", flow_parallelism=3)
    assert spec_of(t) == FlowSpec("customer-42", 2.5, 3)
    assert spec_of(t).gate == "flow:customer-42"
    assert spec_of(_task(flow_key="k")) == FlowSpec("k", None, None)
    assert spec_of(_task()) is None  # no key: no flow control


@pytest.mark.timeout(10)
def test_flow_fields_checks_and_round_trip():
    t = _task(flow_key="customer-42", flow_rate="2.5", flow_parallelism=3)
    assert (t.flow_key, t.flow_rate, t.flow_parallelism) == ("customer-42", 2.5, 3)
    back = Task.decode(t.encode())
    assert (back.flow_key, back.flow_rate, back.flow_parallelism) == ("customer-42", 2.5, 3)
    assert back.summary()["flow_key"] == "customer-42"
    assert _task(flow_key="k").flow_rate is None
    for fields, name in (({"flow_rate": 1}, "flow_rate"), ({"flow_parallelism": 1},
                          "flow_parallelism"), ({"flow_key": ""}, "flow_key"),
                         ({"flow_key": "x" * 201}, "flow_key"), ({"flow_key": "a\nb"}, "flow_key"),
                         ({"flow_key": 7}, "flow_key"),
                         ({"flow_key": "k", "flow_rate": 0}, "flow_rate"),
                         ({"flow_key": "k", "flow_rate": True}, "flow_rate"),
                         ({"flow_key": "k", "flow_rate": "nan"}, "flow_rate"),
                         ({"flow_key": "k", "flow_parallelism": 0}, "flow_parallelism"),
                         ({"flow_key": "k", "flow_parallelism": 1.5}, "flow_parallelism")):
        with pytest.raises(ValidationError) as e:
            _task(**fields)
        assert e.value.field == name and e.value.status == 400, fields
    for bad in ({"flow_rate": 1.0}, {"flow_key": "k", "flow_rate": -1.0},
                {"flow_key": "k", "flow_parallelism": 0}, {"flow_key": 3}):
        with pytest.raises(DecodeError):
            Task.decode({**_task().encode(), **bad})
