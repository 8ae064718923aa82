"""The delivery package's limits on a real node against real sinks: a dead target's
breaker, fair slots when a queue or a target hangs, flow-control keys shared by queues,
and priorities when a paused queue resumes. Their units (the state machines and the
dispatcher on a fake clock) are in tests/unit/delivery/."""

from __future__ import annotations

import json
import math
import time

import pytest

from helpers import HarnessError, Reply, Sink, run_cli, wait_until
from miyamoto import Client


# ================================================================ the breaker: a dead target beside a healthy one


@pytest.mark.timeout(90)
def test_node_a_dead_target_costs_few_attempts_and_does_not_slow_a_healthy_one(node_factory):
    """The issue's case: 200 tasks to a target answering 503 (retried every 0.05-0.2 s,
    without end) beside a healthy target in the same queue. With breaker_failures 5 and
    breaker_cooldown 1 s the dead one gets at most 5 + the attempts in flight when it
    opened (max_per_host 2) + about one probe per cooldown (1, 2, 4 s...); without the
    breaker it would get hundreds. The healthy one keeps a prompt delivery meanwhile."""
    dead, healthy = Sink().start(), Sink().start()
    try:
        dead.reply("/dead", Reply(503))
        node = node_factory(data_dir=":memory:", options={
            "breaker_failures": 5, "breaker_cooldown": 1.0, "max_per_host": 2},
            queues={"mix": {"max_attempts": 10000, "min_backoff": 0.05, "max_backoff": 0.2}})
        r = node.post("/queue/mix/batch", json=[{"url": dead.url_for("/dead"), "params": {
            "i": i}} for i in range(200)])
        assert r.status_code == 200, r.text
        client = Client(node.url)

        def dead_state() -> str | None:
            for t in client.targets():
                if t["origin"] == f"http://127.0.0.1:{dead.port}":
                    return t["state"]
            return None

        wait_until(lambda: dead_state() == "open", 20, what="the dead target's breaker")
        t_open, n_open = time.monotonic(), dead.count("/dead")
        assert n_open <= 5 + 2, n_open
        # the healthy target, meanwhile: 20 tasks due over 4 s (several cooldowns), each
        # delivered promptly after its eta
        etas = {}
        for i in range(20):
            answer = node.enqueue("mix", url=healthy.url_for("/ok"), params={"i": i},
                                  countdown=0.2 * (i + 1))
            etas[str(i)] = answer["eta"]
        reqs = healthy.wait_for(count=20, path="/ok", timeout=30)
        lat = [r.time - etas[r.form["i"][0]] for r in reqs]
        attempts, elapsed = dead.count("/dead"), time.monotonic() - t_open
        # cooldowns 1, 2, 4, 8 s...: probes within `elapsed` s, plus one for slack
        probes, at, cd = 0, 1.0, 1.0
        while at <= elapsed + 0.5:
            probes, cd = probes + 1, min(cd * 2, 10.0)
            at += cd
        print(f"\ndead target: {n_open} attempts to open, {attempts} after {elapsed:.1f} s "
              f"(allowed {n_open + probes + 1}); healthy latency max {max(lat) * 1000:.0f} ms, "
              f"median {sorted(lat)[len(lat) // 2] * 1000:.0f} ms")
        assert attempts <= n_open + probes + 1, (attempts, n_open, probes)
        assert sorted(lat)[len(lat) // 2] < 0.5 and max(lat) < 2.0, lat
        assert dead_state() in ("open", "half_open")
        metrics = node.get("/metrics").text
        assert f'miyamoto_target_breaker_state{{origin="http://127.0.0.1:{dead.port}",' \
               f'state="open"}} 1.0' in metrics or dead_state() == "half_open"
        assert "miyamoto_target_breaker_opens_total" in metrics
        cp = run_cli("targets", env={"MIYAMOTO_SERVER": node.url})
        assert cp.returncode == 0, cp.stderr
        listed = {t["origin"]: t for t in json.loads(cp.stdout)}
        assert listed[f"http://127.0.0.1:{healthy.port}"]["state"] == "closed"
        assert set(listed[f"http://127.0.0.1:{dead.port}"]) == {
            "origin", "state", "failures", "inflight", "retry_at"}
    finally:
        dead.stop()
        healthy.stop()


@pytest.mark.timeout(90)
def test_node_its_own_pause_does_not_open_a_healthy_targets_breaker(node_factory):
    """Six deliveries in flight to a target that answers in 1 s; the node is paused
    (SIGSTOP) for 3.5 s, past their 2 s timeout, so on resume each ends with no answer.
    Those failures are the node's, not the target's: with breaker_failures 3 and a 30 s
    cooldown, counting them would hold the target's next tasks for 30 s. They go at
    once, and the breaker stays closed."""
    sink = Sink().start()
    try:
        sink.reply("/slow", Reply(200, delay=1.0))
        node = node_factory(data_dir=":memory:", options={
            "breaker_failures": 3, "breaker_cooldown": 30.0},
            queues={"q": {"timeout": 2, "min_backoff": 0.1, "max_backoff": 0.2}})
        for i in range(6):
            node.enqueue("q", url=sink.url_for("/slow"), params={"i": i})
        wait_until(lambda: sink.inflight >= 6, 20, what="six deliveries in flight")
        node.pause()
        try:
            time.sleep(3.5)  # the fault itself: a pause longer than the attempts' timeout
        finally:
            node.resume()
        for i in range(5):
            node.enqueue("q", url=sink.url_for("/ok"), params={"i": i})
        sink.wait_for(count=5, path="/ok", timeout=10)  # not after a 30 s cooldown
        states = {t["origin"]: t["state"] for t in Client(node.url).targets()}
        assert states[f"http://127.0.0.1:{sink.port}"] == "closed", states
        assert "miyamoto_target_breaker_opens_total 0.0" in node.get("/metrics").text
        wait_until(lambda: "not counted against their targets" in node.log_text(), 10,
                   what="the log line saying the pause's failures were not counted")
        wait_until(lambda: {r.form["i"][0] for r in sink.requests("/slow") if r.done}
                   == {str(i) for i in range(6)}, 30, what="the six retried and answered")
    finally:
        sink.stop()


# ================================================================ fair slots: a hanging queue, a capped host, a stuck target


def _p(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(pct / 100 * len(s)) - 1)]


def _latencies(sink: Sink, path: str, sent: dict[str, float], timeout: float) -> list[float]:
    """Enqueue-to-delivery seconds of the tasks in ``sent`` (by param i), waiting up to
    ``timeout`` for all of them; printed, so ``-s`` shows the figures on any outcome."""
    try:
        sink.wait_for(count=len(sent), path=path, timeout=timeout)
    except HarnessError:
        pass
    first: dict[str, float] = {}
    for r in sink.requests(path):
        first.setdefault(r.form["i"][0], r.time)
    lat = [first[i] - t0 for i, t0 in sent.items() if i in first]
    if lat:
        print(f"\n{path}: {len(lat)}/{len(sent)} delivered; enqueue-to-delivery ms "
              f"p50 {_p(lat, 50) * 1000:.1f} p99 {_p(lat, 99) * 1000:.1f} "
              f"max {max(lat) * 1000:.1f}")
    else:
        print(f"\n{path}: 0/{len(sent)} delivered within {timeout:g} s")
    return lat


@pytest.mark.timeout(60)
def test_node_a_hanging_queue_does_not_hold_up_another(node_factory):
    """The issue's case: a worker hangs 10 s for 1,000 tasks of queue "slow"; queue
    "fast" (another target) is delivered meanwhile, none of it waiting for the hang."""
    slow, fast = Sink().start(), Sink().start()
    try:
        slow.reply("/hang", Reply(200, delay=10.0))
        # in memory: a disk's fsync on this shared box varies by tens of ms, and the
        # slots, not the journal, are what this measures
        node = node_factory(data_dir=":memory:", queues={"slow": {"timeout": 20}, "fast": {}})
        r = node.post("/queue/slow/batch", json=[{"url": slow.url_for("/hang"),
                                                  "params": {"i": i}} for i in range(1000)])
        assert r.status_code == 200, r.text
        # the stuck target holds its share (max_per_host, 128) and no more
        wait_until(lambda: slow.inflight >= 128, 10, what="the slow worker to fill up")
        sent: dict[str, float] = {}
        for i in range(100):
            sent[str(i)] = time.time()
            node.enqueue("fast", url=fast.url_for("/fast"), params={"i": i})
        lat = _latencies(fast, "/fast", sent, timeout=25)
        assert len(lat) == 100, f"{len(lat)}/100 fast tasks delivered"
        # not held up: every fast task went while the slow ones still hung (the p99 is
        # printed; about 10 ms idle, it is a timing, not the behaviour: at a load of 9 it
        # was 284 ms)
        assert max(lat) < 5.0, f"fast queue max {max(lat) * 1000:.0f} ms: held up by the hang"
        assert slow.max_inflight == 128 and slow.count("/hang") == 128
        assert all(r.done is None for r in slow.requests("/hang"))  # still hanging throughout
    finally:
        slow.stop()  # ends the hang early: the test needs no 10 s
        fast.stop()


@pytest.mark.timeout(30)
def test_node_max_per_host_caps_a_target_across_queues_without_spending_attempts(node_factory):
    sink = Sink().start()
    try:
        sink.reply("/slow", Reply(200, delay=0.3))
        node = node_factory(options={"max_per_host": 8})
        for q in ("a", "b"):
            r = node.post(f"/queue/{q}/batch",
                          json=[{"url": sink.url_for("/slow"), "params": {"i": f"{q}{i}"}}
                                for i in range(30)])
            assert r.status_code == 200, r.text
        reqs = sink.wait_for(count=60, path="/slow", timeout=20)
        sink.wait_idle()
        assert sink.max_inflight_by_path["/slow"] == 8, sink.max_inflight_by_path
        # a task that waited for the target spent no attempt: each went once, first try
        assert sorted(r.form["i"][0] for r in reqs) == sorted(
            f"{q}{i}" for q in "ab" for i in range(30))
        assert {r.headers["X-Task-Retry-Count"] for r in reqs} == {"0"}
        a_times = [r.time for r in reqs if r.form["i"][0][0] == "a"]
        b_times = [r.time for r in reqs if r.form["i"][0][0] == "b"]
        assert min(b_times) < sorted(a_times)[15]  # both queues got turns at the target
    finally:
        sink.stop()


@pytest.mark.timeout(30)
def test_node_a_stuck_target_does_not_block_its_queue_for_other_targets(node_factory):
    slow, fast = Sink().start(), Sink().start()
    try:
        slow.reply("/hang", Reply(200, delay=10.0))
        node = node_factory(options={"max_per_host": 4}, queues={"mixed": {"timeout": 20}})
        sent: dict[str, float] = {}
        batch = [{"url": slow.url_for("/hang"), "params": {"i": f"s{i}"}} for i in range(20)]
        batch += [{"url": fast.url_for("/fast"), "params": {"i": str(i)}} for i in range(20)]
        t0 = time.time()
        r = node.post("/queue/mixed/batch", json=batch)
        assert r.status_code == 200, r.text
        sent = {str(i): t0 for i in range(20)}
        lat = _latencies(fast, "/fast", sent, timeout=5)
        assert len(lat) == 20 and max(lat) < 2.0
        # the fourth stuck delivery may reach the sink after the fast ones on a loaded
        # box; none is answered for 10 s, so none beyond max_per_host may come meanwhile
        slow.wait_for(count=4, path="/hang", timeout=5)
        assert slow.max_inflight == 4 and slow.count("/hang") == 4
    finally:
        slow.stop()
        fast.stop()


# ================================================================ flow-control keys: a shared rate, a parallelism of 1


@pytest.mark.timeout(60)
def test_node_two_queues_share_a_key_rate(node_factory):
    """The issue's case: one key at 5 tasks/s across two queues: 20 tasks take about
    4 s in all (19 gaps of 0.2 s), and all arrive; a task of the same queue without
    the key goes meanwhile."""
    sink = Sink().start()
    try:
        node = node_factory(data_dir=":memory:")
        batch = lambda q: [{"url": sink.url_for("/k"), "params": {"i": f"{q}{i}"},  # noqa: E731
                            "flow_key": "partner", "flow_rate": 5} for i in range(10)]
        for q in ("a", "b"):
            r = node.post(f"/queue/{q}/batch", json=batch(q))
            assert r.status_code == 200, r.text
        node.enqueue("a", url=sink.url_for("/free"), params={"i": "free"})
        reqs = sink.wait_for(count=20, path="/k", timeout=30)
        times = sorted(r.time for r in reqs)
        span = times[-1] - times[0]
        free = sink.wait_for(count=1, path="/free", timeout=5)[0].time
        print(f"\n20 tasks at 5/s: {span:.2f} s from first to last; the unkeyed task came "
              f"{free - times[0]:.2f} s after the first")
        assert span >= 3.0, span
        assert sorted(r.form["i"][0] for r in reqs) == sorted(
            f"{q}{i}" for q in "ab" for i in range(10))
        assert free < times[-1] - 1.0  # not held behind the key
        assert {r.headers["X-Task-Retry-Count"] for r in reqs} == {"0"}  # no attempt spent
    finally:
        sink.stop()


@pytest.mark.timeout(60)
def test_node_parallelism_1_never_has_two_in_flight(node_factory):
    sink = Sink().start()
    try:
        sink.reply("/one", Reply(200, delay=0.1))
        node = node_factory(data_dir=":memory:")
        for q in ("a", "b"):
            r = node.post(f"/queue/{q}/batch", json=[
                {"url": sink.url_for("/one"), "params": {"i": f"{q}{i}"}, "flow_key": "solo",
                 "flow_parallelism": 1} for i in range(8)])
            assert r.status_code == 200, r.text
        reqs = sink.wait_for(count=16, path="/one", timeout=30)
        assert len({r.form["i"][0] for r in reqs}) == 16
        assert sink.max_inflight_by_path["/one"] == 1, sink.max_inflight_by_path
        task = node.get("/queues/a/tasks?state=succeeded").json()["tasks"]
        assert task and all(t.get("flow_key", "solo") == "solo" for t in task)
    finally:
        sink.stop()


# ================================================================ priorities: a resumed queue


@pytest.mark.timeout(60)
def test_node_a_resumed_queue_delivers_the_high_priority_tasks_first(node_factory):
    """The issue's case: a paused queue with 20 tasks at priority 1, then 5 at 9,
    resumed with max_concurrent = 1: the five 9s arrive first, the 1s in order."""
    sink = Sink().start()
    try:
        node = node_factory(data_dir=":memory:", queues={"prio": {"max_concurrent": 1}})
        assert node.post("/queues/prio/pause").status_code == 200
        low = [{"url": sink.url_for("/p"), "params": {"i": f"low{i}"}, "priority": 1}
               for i in range(20)]
        r = node.post("/queue/prio/batch", json=low)
        assert r.status_code == 200, r.text
        ids = []
        for i in range(5):  # one by one, the form way: task.priority
            r = node.post("/queue/prio", data={"task.url": sink.url_for("/p"),
                                               "task.priority": "9", "i": f"high{i}"})
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        assert node.get(f"/tasks/{ids[0]}").json()["priority"] == 9
        # every task is due and waiting in the paused queue's line before it resumes
        wait_until(lambda: node.get("/queues/prio").json()["counts"]["scheduled"] == 25, 10)
        assert sink.count("/p") == 0
        assert node.post("/queues/prio/resume").status_code == 200
        reqs = sink.wait_for(count=25, path="/p", timeout=30)
        order = [r.form["i"][0] for r in sorted(reqs, key=lambda r: r.time)]
        print("\ndelivery order:", order)
        assert order[:5] == [f"high{i}" for i in range(5)], order
        assert order[5:] == [f"low{i}" for i in range(20)], order
        assert sink.max_inflight_by_path["/p"] == 1
    finally:
        sink.stop()
