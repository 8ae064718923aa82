"""Fair delivery slots: no queue and no target can take every slot (miyamoto.delivery.fairness).

The unit tests drive the ready line and the dispatcher's passes with plain objects and
a fake clock; tests/nodes/test_delivery_node.py runs a real node against real sinks, one of
which hangs. Found by testing: one queue whose worker took 10 s held all 512 slots,
and another queue's latency went from 3 ms to 13 s.
"""

from __future__ import annotations

import time

import gevent
import gevent.event
import pytest

from dispatchkit import FakeClock, Gates, pump_once
from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.dispatch import Dispatcher
from miyamoto.delivery.fairness import PARK_BATCH, HostSlots, ReadyLine, origin, queue_limit

H, G = "http://h:80", "http://g:80"


# ================================================================ units: pure


def test_origin_is_scheme_host_port():
    assert origin("http://Example.COM/x?y=1") == "http://example.com:80"
    assert origin("https://example.com/x") == "https://example.com:443"
    assert origin("http://127.0.0.1:8080/a") == "http://127.0.0.1:8080"
    assert origin("http://127.0.0.1:8080/a") != origin("http://localhost:8080/a")
    assert origin("http://u:p@h/x") == "http://h:80"
    assert origin("http://h:99999/") == "http://h:99999"  # a bad port never raises here


def test_queue_limit_defaults_below_the_pool_and_is_clamped_to_it():
    assert queue_limit(QueueConfig(), 512) == 256
    assert queue_limit(QueueConfig(), 1) == 1
    assert queue_limit(QueueConfig(), 7) == 3
    assert queue_limit(QueueConfig(max_concurrent=1), 512) == 1
    assert queue_limit(QueueConfig(max_concurrent=4), 512) == 4
    assert queue_limit(QueueConfig(max_concurrent=1000), 512) == 512


def test_line_sets_aside_a_full_target_without_blocking_the_others():
    hosts, line = HostSlots(1), ReadyLine("q")
    for t, h in [("h1", H), ("h2", H), ("g1", G), ("h3", H), ("g2", G)]:
        line.append(t, h)
    starts = []
    while (pick := line.take(hosts)) is not None:
        hosts.take(pick[1])
        starts.append(pick[0])
        if pick[1] == G:  # G answers at once, H hangs
            hosts.release(G)
    assert starts == ["h1", "g1", "g2"]
    assert hosts.waiting(H) == ["q"] and not line.startable()
    assert line.waiting_on() == [H] and len(line) == 2
    line.append("h4", H)  # a later task for H goes behind the ones set aside
    line.append("g3", G)
    assert line.take(hosts) == ("g3", G)
    assert line.take(hosts) is None
    for waiter in hosts.release(H):  # H frees a slot: its oldest task goes first, FIFO
        assert waiter == "q"
        line.wake(H)
    assert line.startable()
    got = []
    while (pick := line.take(hosts)) is not None:
        hosts.take(pick[1])
        got.append(pick[0])
        for waiter in hosts.release(H):
            line.wake(H)
    assert got == ["h2", "h3", "h4"] and len(line) == 0


@pytest.mark.parametrize("n", [3 * PARK_BATCH, 3 * PARK_BATCH - 1])
def test_line_a_wake_costs_no_pass_over_the_tasks_set_aside(n):
    hosts, line = HostSlots(1), ReadyLine("q")
    hosts.take(H)
    for i in range(n):
        line.append(f"h{i}", H)
    line.append("g", G)
    looks = 0
    while (pick := line.take(hosts)) is None:  # each look moves at most PARK_BATCH
        looks += 1
    assert pick == ("g", G) and looks == n // PARK_BATCH
    assert line.take(hosts) is None and len(line) == n
    for _ in range(3):  # each freed slot starts exactly the oldest task set aside
        for waiter in hosts.release(H):
            line.wake(H)
        first = line.take(hosts)
        assert first is not None
        hosts.take(H)
        assert line.take(hosts) is None  # full again: back to waiting, nothing scanned
        assert hosts.waiting(H) == ["q"]
    assert first == ("h2", H) and len(line) == n - 3


def test_hosts_wake_each_waiting_queue_once_and_forget_idle_targets():
    hosts = HostSlots(2)
    assert not hosts.full(H)
    hosts.take(H)
    assert not hosts.full(H) and hosts.busy == {H: 1}
    hosts.take(H)
    assert hosts.full(H) and not hosts.full(G) and not HostSlots(1).full(G)
    hosts.wait("a", H)
    hosts.wait("b", H)
    hosts.wait("a", H)
    assert list(hosts.release(H)) == ["a", "b"]
    assert hosts.busy == {H: 1} and not hosts.full(H)
    assert list(hosts.release(H)) == [] and hosts.busy == {}


def test_line_a_woken_gate_still_closed_waits_again_and_the_next_woken_one_goes():
    hosts, line = HostSlots(1), ReadyLine("q")
    hosts.take(H)
    hosts.take(G)
    line.append("g1", G)
    line.append("h1", H)
    assert line.take(hosts) is None  # both set aside
    for gate in (G, H):  # both free a slot: the line is woken for G, then H
        for _ in hosts.release(gate):
            line.wake(gate)
    hosts.take(G)  # another queue took G's slot meanwhile
    assert line.take(hosts) == ("h1", H)
    assert hosts.waiting(G) == ["q"]  # G's task waits for G again
    for _ in hosts.release(G):
        line.wake(G)
    assert line.take(hosts) == ("g1", G) and len(line) == 0


class _Flow:
    def __init__(self, gate: str):
        self.gate = gate


def test_line_a_woken_task_now_blocked_by_its_flow_key_moves_to_wait_there():
    flow, closed = _Flow("flow:k"), set()
    hosts, line = HostSlots(1), ReadyLine("q")

    def gate(host, f):
        if hosts.full(host):
            return host
        return f.gate if f is not None and f.gate in closed else None

    hosts.take(H)
    line.append("h1", H, flow=flow)
    line.append("h2", H, flow=flow)
    assert line.take(hosts, gate) is None
    closed.add(flow.gate)  # the flow key fills up while H frees its slot
    for _ in hosts.release(H):
        line.wake(H)
    assert line.take(hosts, gate) is None
    assert hosts.waiting(flow.gate) == ["q"] and line.waiting_on() == [flow.gate]
    assert len(line) == 2
    line.append("g1", G)  # the rest of the line is not held up
    assert line.take(hosts, gate) == ("g1", G)
    closed.discard(flow.gate)
    for _ in hosts.opened(flow.gate):
        line.wake(flow.gate)
    assert line.take(hosts, gate) == ("h1", H)
    assert line.take(hosts, gate) == ("h2", H) and len(line) == 0


# ================================================================ units: the dispatcher


def test_dispatch_a_full_target_spends_no_token_and_waits_for_a_slot():
    runs, clock = Gates(), FakeClock()
    qc = QueueConfig(name="q", rate=0.001, burst=2)  # two tokens, then one per 1000 s
    d = Dispatcher(runs, lambda name: qc, 64, clock, max_per_host=1)
    d.submit("q", "h1", H)
    d.submit("q", "h2", H)
    d.submit("q", "g1", G)
    wait = pump_once(d)
    # h2 waits for H without taking a token: g1 got the second one
    assert runs.started == ["h1", "g1"] and wait == pytest.approx(1000.0)  # tokens: 0
    assert d.hosts.busy == {H: 1, G: 1} and d.queue("q").inflight == 2
    runs.finish("h1")  # H is free, but the bucket is empty: h2 waits for a token
    assert d.busy == 1 and d.hosts.busy == {G: 1}
    wait = pump_once(d)
    assert runs.started == ["h1", "g1"] and wait == pytest.approx(1000.0)
    clock.now += 1000.0
    pump_once(d)
    assert runs.started == ["h1", "g1", "h2"]
    runs.finish("g1", "h2")
    assert d.busy == 0 and d.hosts.busy == {} and d.queue("q").inflight == 0


def test_dispatch_slots_freed_one_at_a_time_go_round_the_waiting_queues():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 64, FakeClock(), max_per_host=1)
    for i in range(4):
        d.submit("a", f"a{i}", H)
    for i in range(4):
        d.submit("b", f"b{i}", H)
    for _ in range(8):
        pump_once(d)
        runs.finish(*runs.started)
    assert runs.started == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_dispatch_a_look_that_finds_only_full_targets_gives_its_token_back():
    runs, clock = Gates(), FakeClock()
    qc = QueueConfig(name="q", rate=0.001, burst=2)
    d = Dispatcher(runs, lambda name: qc, 64, clock, max_per_host=1)
    d.submit("q", "h1", H)
    d.submit("q", "h2", H)
    assert pump_once(d) is None  # h1 took a token; h2's look found H full and gave it back
    assert runs.started == ["h1"]
    d.submit("q", "g1", G)
    pump_once(d)
    assert runs.started == ["h1", "g1"]


def test_dispatch_a_queue_takes_its_share_and_leaves_the_rest_of_the_pool():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 8, FakeClock())
    for i in range(20):  # each to its own target: only the queue's share limits it
        d.submit("slow", f"s{i}", f"http://s{i}:80")
    pump_once(d)
    assert len(runs.started) == 4 == d.queue("slow").limit  # half of 8
    for i in range(6):
        d.submit("fast", f"f{i}", G)
    pump_once(d)
    assert [t for t in runs.started if t.startswith("f")] == ["f0", "f1", "f2", "f3"]
    assert d.busy == 8
    d.submit("other", "o1", G)
    pump_once(d)
    assert "o1" not in runs.started and d.busy == 8  # the pool is full
    runs.finish("f0", "f1")
    pump_once(d)
    assert set(runs.started[-2:]) <= {"f4", "f5", "o1"} and d.busy == 8  # to those waiting
    runs.finish(*runs.started[-2:])
    pump_once(d)
    assert {"f4", "f5", "o1"} <= set(runs.started) and d.busy == 7
    assert len([t for t in runs.started if t.startswith("s")]) == 4


def test_dispatch_a_target_is_capped_across_queues_and_a_slot_wakes_the_waiters():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 64, FakeClock(), max_per_host=3)
    for i in range(5):
        d.submit("a", f"a{i}", H)
        d.submit("b", f"b{i}", H)
    pump_once(d)
    assert len(runs.started) == 3 and d.hosts.busy == {H: 3}
    assert sorted(d.hosts.waiting(H)) == ["a", "b"]
    pump_once(d)  # nothing startable: both queues leave the active set until H frees a slot
    assert len(runs.started) == 3 and not d._active
    runs.finish(*runs.started)
    while pump_once(d) is None and len(runs.started) < 10:
        assert d.hosts.busy.get(H, 0) <= 3
        runs.finish(*runs.started)
    assert sorted(runs.started) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])
    for q in "ab":  # FIFO within a (queue, target)
        assert [t for t in runs.started if t[0] == q] == [f"{q}{i}" for i in range(5)]


@pytest.mark.timeout(10)
def test_dispatch_a_long_line_for_a_stuck_target_is_moved_over_several_passes():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 64, max_per_host=2)
    d.start()
    try:
        for i in range(3 * PARK_BATCH):
            d.submit("q", f"h{i}", H)
        d.submit("q", "g", G)
        deadline = time.monotonic() + 1  # greenlets run in this process: wait in gevent
        while "g" not in runs.started and time.monotonic() < deadline:
            gevent.sleep(0.005)
        assert runs.started == ["h0", "h1", "g"]
    finally:
        runs.finish(*runs.started)
        d.stop(1)


def test_dispatch_a_configured_limit_above_the_pool_is_clamped_and_logged(caplog):
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, max_concurrent=1000), 16)
    with caplog.at_level("WARNING", logger="miyamoto.delivery.dispatch"):
        assert d.queue("big").limit == 16
    assert "max_concurrent 1000 is above concurrency 16" in caplog.text
    assert d.view("other").limit == 16 and "other" not in d.queues
    caplog.clear()
    d = Dispatcher(lambda t: None, lambda name: QueueConfig(name=name, max_concurrent=16), 16)
    with caplog.at_level("WARNING", logger="miyamoto.delivery.dispatch"):
        assert d.queue("all").limit == 16
    assert caplog.text == ""  # the whole pool, asked for exactly: nothing to warn about
    assert d.queue_config("nosuch").name == "nosuch" and "nosuch" not in d.queues
    assert d.queue_config("all") is d.queues["all"].config


def test_dispatch_a_paused_queue_does_not_hold_up_the_queues_after_it():
    runs = Gates()
    d = Dispatcher(runs, lambda name: QueueConfig(name=name), 64, FakeClock())
    for i in range(20):  # the open queue comes last in turn order
        d.pause(f"p{i}", True)
        d.submit(f"p{i}", f"p{i}-task", H)
    d.submit("open", "o", G)
    pump_once(d)
    assert runs.started == ["o"]
