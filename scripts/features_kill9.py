#!/usr/bin/env python3
"""What the task features do under kill -9, on a real 3-node cluster: one line of figures each.

    python scripts/features_kill9.py [--only NAME[,NAME]] [--keep-dir]

Starts three nodes on 127.0.0.1 (replication 2, ports from the OS, a data dir per node in
a temporary directory, the test suite's short timings: replica_offset 1 s, heartbeat
0.2 s, failure_timeout 2 s, claim_lease 3 s) and a real worker sink (harness.Sink) that
records every delivery with its time. Each scenario drives one feature, kills the node
that matters at the moment that matters with SIGKILL, starts it again on the same data
dir, and prints ``NAME ok|FAIL key=value ...``:

  long_task     a worker answers 202 and holds two tasks; the delivering node is killed
                inside the lease; one task is reported (to another node), one is not
  expiry        tasks with a ttl wait behind a paused queue; a copy holder is down while
                they expire
  replace       a named task replaced again and again while a copy holder is down
  debounce      a named task debounced again and again while a copy holder is down
  labels        labelled tasks searched on the survivors while a node is down, and after
  resend        a single resend, then a bulk resend with a node killed mid-call
  retry_delays  a worker fails twice with retry_delays [1, 3]; the delivering node is
                killed between the attempts
  schedule_run  POST /schedules/<name>/run, the leader killed (and a keyed run retried)

Each scenario is bounded (SCENARIO_S, in count and time). The exit code is 1 when a
safety check failed (a task lost, a delivery not expected, a stale payload, a task the
search did not find), 2 on a harness error. Only 127.0.0.1 is contacted; every node it
started is stopped on exit. tests/nodes/test_features_kill9.py runs the cheap ones.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (CLUSTER_KEYS, HarnessError, NodeProcess, Sink, plan_cluster,  # noqa: E402
                     stop_all, wait_converged, wait_until, write_ini)

SCENARIO_S = 60.0  # the longest a scenario may take (its waits' deadlines sum below it)
READY_S = 30.0     # a node's start, a cluster's agreement, on a loaded box
OPTIONS: dict[str, Any] = {
    "replication": 2, "replica_offset": 1.0, "replication_timeout": 3.0,
    "heartbeat_interval": 0.2, "failure_timeout": 2.0, "election_timeout_min": 0.6,
    "election_timeout_max": 1.2, "claim_lease": 3.0, "shutdown_timeout": 3.0,
    "completion_secret": "features-kill9-shared-completion-secret", "log_level": "info",
}
QUEUES: dict[str, dict[str, Any]] = {
    "default": {"min_backoff": 0.5, "max_backoff": 1.0, "timeout": 5},
    "long": {"min_backoff": 0.5, "max_backoff": 1.0},
    "expiry": {}, "repeat": {}, "labels": {}, "resend": {}, "retry": {"timeout": 5},
    "sched": {},
}


def log(msg: str) -> None:
    print(f"[kill9 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Result:
    """One scenario's figures and the safety checks that failed (``problems``)."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, cond: bool, problem: str) -> None:
        if not cond:
            self.problems.append(problem)

    def line(self) -> str:
        figs = " ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        tail = "" if self.ok else " PROBLEMS: " + "; ".join(self.problems)
        return f"{self.name:<13} {'ok' if self.ok else 'FAIL'} ({self.seconds:.0f}s) {figs}{tail}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v).replace(" ", "_")


class Cluster:
    """Three nodes, one sink, one temporary directory; kill -9 and restart by node."""

    def __init__(self, workdir: str, n: int = 3):
        self.workdir = workdir
        self.sink = Sink().start()
        self.nodes = plan_cluster(workdir, [chr(ord("a") + i) for i in range(n)],
                                  own_session=True)
        for p in self.nodes:
            keys = {"curve_public": CLUSTER_KEYS[0], "curve_secret": CLUSTER_KEYS[1]}
            sections: dict[str, Any] = {"miyamoto": {**OPTIONS, **keys}}
            sections.update({f"queue:{q}": v for q, v in QUEUES.items()})
            p.config = write_ini(os.path.join(workdir, f"{p.node_id}.ini"), sections)

    def start(self) -> "Cluster":
        for p in self.nodes:
            p.start()
        for p in self.nodes:
            p.wait_ready(READY_S)
        self.converge()
        return self

    def stop(self) -> None:
        stop_all(self.nodes, 5.0)
        self.sink.stop()

    def converge(self) -> dict[str, Any]:
        return wait_converged(self.nodes, READY_S)

    def up(self) -> list[NodeProcess]:
        return [p for p in self.nodes if p.running]

    def by_id(self, node_id: str) -> NodeProcess:
        return next(p for p in self.nodes if p.node_id == node_id)

    def by_addr(self, netloc: str) -> NodeProcess:
        return next(p for p in self.nodes if p.http_addr == netloc)

    def others(self, *nodes: NodeProcess) -> list[NodeProcess]:
        return [p for p in self.up() if p not in nodes]

    def leader(self) -> NodeProcess:
        return self.by_id(self.converge()["leader"])

    def follower(self) -> NodeProcess:
        lead = self.leader()
        return next(p for p in self.nodes if p is not lead)

    def kill(self, node: NodeProcess) -> float:
        node.kill()
        log(f"kill -9 {node.node_id}")
        return time.time()

    def restart(self, node: NodeProcess, wait: bool = True) -> float:
        """Start ``node`` again on its data dir; with ``wait``, until all agree again."""
        node.start()
        if wait:
            self.wait_back(node)
        return time.time()

    def wait_back(self, node: NodeProcess) -> None:
        node.wait_ready(READY_S)
        self.converge()
        log(f"{node.node_id} back")

    def view(self, task_id: str, among: Iterable[NodeProcess] | None = None) -> dict[str, Any]:
        """GET /tasks/<id> from the first node up that answers 200 ({} if none)."""
        for p in among if among is not None else self.up():
            try:
                r = p.get(f"/tasks/{task_id}", timeout=5)
            except OSError:
                continue
            if r.status_code == 200:
                return r.json()
        return {}

    def enqueue(self, node: NodeProcess, queue: str, **fields: Any) -> dict[str, Any]:
        r = node.post(f"/queue/{queue}", json=fields, timeout=10)
        if r.status_code != 200:
            raise HarnessError(f"enqueue on {node.node_id}: {r.status_code} {r.text}")
        return r.json()


def deliveries(sink: Sink, path: str) -> dict[str, list[float]]:
    """Each task id's delivery times at ``path``, in arrival order."""
    out: dict[str, list[float]] = {}
    for r in sink.requests(path):
        if r.task_id:
            out.setdefault(r.task_id, []).append(r.time)
    return out


def settle(seconds: float) -> None:
    """Watch for late deliveries: the one wait that is a span of time, not a condition."""
    time.sleep(seconds)


def wait_state(c: Cluster, task_id: str, states: tuple[str, ...], timeout: float,
               among: Iterable[NodeProcess] | None = None) -> dict[str, Any]:
    nodes = list(among) if among is not None else None
    return wait_until(lambda: (v := c.view(task_id, nodes)).get("state") in states and v,
                      timeout, interval=0.1, what=f"task {task_id} {'/'.join(states)}")


def every_copy(c: Cluster, task_id: str, state: str, timeout: float) -> bool:
    """True once every node up shows every copy of ``task_id`` in ``state``."""
    def done() -> bool:
        return all(all(x["state"] == state for x in c.view(task_id, [p]).get("copies", [{}]))
                   for p in c.up())
    try:
        wait_until(done, timeout, interval=0.2, what=f"every copy of {task_id} {state}")
        return True
    except HarnessError:
        return False


# ------------------------------------------------------------------ long tasks
def long_task(c: Cluster, lease: float = 14.0) -> Result:
    """Two long tasks accepted with a 202 by the node that took them; that node is killed
    inside the lease and restarted; task a's worker never reports (it must be retried
    after the lease, not before), task b's reports to another node (it must end)."""
    res = Result("long_task")
    c.sink.reply("/long/a", 202, 200)
    c.sink.reply("/long/b", 202, 200)
    taker = c.follower()
    ids = {k: c.enqueue(taker, "long", url=c.sink.url_for(f"/long/{k}"), lease=lease)["id"]
           for k in "ab"}
    reqs = {k: c.sink.wait_for(count=1, path=f"/long/{k}", timeout=15)[0] for k in "ab"}
    done_url = reqs["b"].headers["X-Task-Complete-Url"]
    holder = c.by_addr(urlsplit(done_url).netloc)
    until = wait_until(lambda: c.view(ids["a"], [holder]).get("lease_until"), 10,
                       what="the 202 taken")
    res.figures["delivered_by_taker"] = holder is taker
    res.figures["sibling_held"] = _sibling_held(c, ids["a"], holder, until)
    c.kill(holder)
    other = c.others(holder)[0]
    there = urlunsplit(urlsplit(done_url)._replace(netloc=other.http_addr))
    res.figures["report_while_down"] = _post_status(there, {"state": "succeeded"})
    c.restart(holder)
    res.figures["report_after_restart"] = (
        _post_status(there, {"state": "succeeded"})
        if res.figures["report_while_down"] != 200 else "-")
    c.sink.wait_for(count=2, path="/long/a", timeout=max(5.0, until + 3 * 3.0 + 15 - time.time()))
    settle(max(0.0, until + 3.0 + 2.0 - time.time()))
    got = deliveries(c.sink, "/long/a").get(ids["a"], [])
    again = [r for r in c.sink.requests("/long/a") if r.task_id == ids["a"]][1:2]
    if again:  # who made the retry: the node its completion URL names
        netloc = urlsplit(again[0].headers.get("X-Task-Complete-Url", "")).netloc
        res.figures["retry_by"] = "holder" if netloc == holder.http_addr else "sibling"
    res.figures["deliveries_a"] = len(got)
    res.figures["deliveries_b"] = len(deliveries(c.sink, "/long/b").get(ids["b"], []))
    if len(got) >= 2:
        res.figures["retry_after_lease_end_s"] = got[1] - until
    res.figures["state_a"] = wait_state(c, ids["a"], ("succeeded", "failed"), 15).get("state")
    res.figures["state_b"] = c.view(ids["b"]).get("state")
    res.check(len(got) == 2, f"task a delivered {len(got)} times, not 2 (202, then a retry)")
    res.check(len(got) < 2 or got[1] >= until - 0.25,
              f"task a delivered again {until - got[1]:.2f}s before its lease ended")
    res.check(res.figures["report_while_down"] != 409, "a report while the holder was down "
              "was told the attempt is over (409): the worker drops a report still due")
    reported = 200 in (res.figures["report_while_down"], res.figures["report_after_restart"])
    res.check(not reported or res.figures["deliveries_b"] == 1,
              f"task b reported, yet delivered {res.figures['deliveries_b']} times")
    res.check(not reported or res.figures["state_b"] == "succeeded",
              f"task b reported, yet {res.figures['state_b']}")
    return res


def _sibling_held(c: Cluster, task_id: str, holder: NodeProcess, until: float) -> bool:
    """Whether a sibling's copy waits on the lease's claim (its next attempt pushed late)."""
    def held() -> bool:
        for p in c.others(holder):
            later = [x["next_attempt"] for x in c.view(task_id, [p]).get("copies", [])
                     if x["state"] == "scheduled" and x["next_attempt"]]
            if later and min(later) >= until - 1.0:
                return True
        return False
    try:
        return bool(wait_until(held, 8, interval=0.1, what="a sibling held by the claim"))
    except HarnessError:
        return False


def _post_status(url: str, body: dict[str, Any]) -> int | str:
    try:
        return requests.post(url, json=body, timeout=10).status_code
    except requests.RequestException as e:
        return type(e).__name__


# ------------------------------------------------------------------ expiry
def expiry(c: Cluster, count: int = 8, ttl: float = 6.0) -> Result:
    """``count`` tasks with a ttl wait behind a paused queue; the node that took them
    (every first copy) is killed two seconds before they expire and started again after;
    then the queue resumes. Each must end as expired once: one failure_callback, no
    delivery."""
    res = Result("expiry")
    first = c.up()[0]
    _ok(first.post("/queues/expiry/pause"), "pause expiry")
    taker = c.follower()
    t0 = time.time()
    ids = [c.enqueue(taker, "expiry", url=c.sink.url_for("/exp/late"), ttl=ttl,
                     failure_callback=c.sink.url_for("/exp/dead"))["id"] for _ in range(count)]
    settle(max(0.0, t0 + ttl - 2.0 - time.time()))
    c.kill(taker)
    settle(max(0.0, t0 + ttl + 3.0 - time.time()))
    states = [c.view(t).get("state") for t in ids]
    res.figures["expired_while_down"] = f"{states.count('expired')}/{count}"
    c.restart(taker)
    deadline = time.time() + 15
    res.figures["all_copies_expired"] = all(
        every_copy(c, t, "expired", max(0.5, deadline - time.time())) for t in ids)
    _ok(c.up()[0].post("/queues/expiry/resume"), "resume expiry")
    try:
        c.sink.wait_for(count=count, path="/exp/dead", timeout=20)
    except HarnessError:
        pass
    settle(4.0)  # a second callback would come a replica_offset or a restagger later
    told: dict[str, int] = {}
    for r in c.sink.requests("/exp/dead"):
        tid = r.json().get("task", {}).get("id")
        told[tid] = told.get(tid, 0) + 1
    per = [told.get(t, 0) for t in ids]
    res.figures["callbacks_per_task"] = f"{min(per)}-{max(per)}"
    res.figures["late_deliveries"] = c.sink.count("/exp/late")
    final = [c.view(t).get("state") for t in ids]
    res.figures["expired"] = f"{final.count('expired')}/{count}"
    res.check(final.count("expired") == count, f"states after: {sorted(set(final))}")
    res.check(per == [1] * count, f"failure_callback calls per task {per}")
    res.check(res.figures["late_deliveries"] == 0,
              f"{res.figures['late_deliveries']} expired tasks delivered late")
    return res


def _ok(r: requests.Response, what: str) -> dict[str, Any]:
    if r.status_code != 200:
        raise HarnessError(f"{what}: {r.status_code} {r.text}")
    return r.json()


# ------------------------------------------------------------------ replace / debounce
def replace(c: Cluster, repeats: int = 8) -> Result:
    """A named task replaced ``repeats`` times (params v=i, eta 8 s on) through every node
    up; its first copy's holder is killed after the second and started again after the
    last. One delivery, with the last payload, not before the last eta."""
    res = Result("replace")
    path, name = "/rep/r", f"k9-replace-{int(time.time())}"
    first = c.enqueue(c.up()[0], "repeat", url=c.sink.url_for(path), name=name,
                      params={"v": "0"}, countdown=8)
    tid, victim = first["id"], c.by_id(first["replicas"][0])
    statuses, eta = [], 0.0
    for i in range(1, repeats + 1):
        if i == 3:
            c.kill(victim)
        via = c.up()[i % len(c.up())]
        eta = time.time() + 8.0
        r = via.post("/queue/repeat", json={"url": c.sink.url_for(path), "name": name,
                                             "params": {"v": str(i)}, "eta": eta,
                                             "on_duplicate": "replace"}, timeout=10)
        statuses.append(r.json().get("status") if r.status_code == 200 else r.status_code)
        settle(0.4)
    c.restart(victim)
    _expect_one(c, res, path, tid, eta, {"v": [str(repeats)]}, statuses)
    return res


def debounce(c: Cluster, repeats: int = 10, wait: float = 2.0) -> Result:
    """A named task debounced ``repeats`` times, 0.5 s apart, through every node up; its
    first copy's holder is killed after the third and started (not waited for) after the
    eighth. One delivery, not before the last repeat + ``wait``."""
    res = Result("debounce")
    path, name = "/rep/d", f"k9-debounce-{int(time.time())}"
    first = c.enqueue(c.up()[0], "repeat", url=c.sink.url_for(path), name=name,
                      countdown=wait, debounce=wait, debounce_max=60)
    tid, victim = first["id"], c.by_id(first["replicas"][0])
    statuses, last = [], 0.0
    for i in range(1, repeats + 1):
        if i == 4:
            c.kill(victim)
        if i == 9:
            c.restart(victim, wait=False)
        via = [p for p in c.up() if p is not victim or i < 4][i % 2]
        r = via.post("/queue/repeat", json={"url": c.sink.url_for(path), "name": name,
                                             "debounce": wait, "debounce_max": 60}, timeout=10)
        last = time.time()
        statuses.append(r.json().get("status") if r.status_code == 200 else r.status_code)
        settle(0.5)
    c.wait_back(victim)
    _expect_one(c, res, path, tid, last + wait, None, statuses)
    return res


def _expect_one(c: Cluster, res: Result, path: str, tid: str, eta: float,
                form: dict[str, list[str]] | None, statuses: list[Any]) -> None:
    """One delivery of ``tid`` at ``path``, not before ``eta``, with ``form`` if given."""
    res.figures["repeats"] = ",".join(str(s) for s in statuses)
    try:
        c.sink.wait_for(lambda rs: any(r.task_id == tid for r in rs), path=path,
                        timeout=max(5.0, eta - time.time() + 15))
    except HarnessError:
        pass
    settle(max(0.0, eta + 2 * OPTIONS["replica_offset"] + 2.0 - time.time()))
    got = [r for r in c.sink.requests(path) if r.task_id == tid]
    res.figures["deliveries"] = len(got)
    res.check(len(got) == 1, f"{len(got)} deliveries, not 1")
    if got:
        res.figures["late_s"] = got[0].time - eta
        res.check(got[0].time >= eta - 0.1, f"delivered {eta - got[0].time:.2f}s early")
        if form is not None:
            res.figures["payload"] = ",".join(got[0].form.get("v", ["?"]))
            res.check(got[0].form == form, f"delivered {got[0].form}, not the last {form}")


# ------------------------------------------------------------------ labels and search
def labels(c: Cluster, count: int = 30, page: int = 7) -> Result:
    """``count`` labelled tasks (due in 10 min) taken by every node in turn; one node is
    killed; a survivor pages through the label's search at once, and again until it finds
    every task (the roster drops the node, its copies are restored); once the node is
    back, every node searches, until no task shows on two pages."""
    res = Result("labels")
    tag = f"run{int(time.time())}"
    ids = {c.enqueue(c.nodes[i % len(c.nodes)], "labels", url=c.sink.url_for("/lab"),
                     countdown=600, labels={"k9": tag})["id"] for i in range(count)}
    victim = c.nodes[0]
    killed = c.kill(victim)
    survivor = c.others(victim)[0]
    # a task whose first copy's node is down is missing until the roster drops the node
    # and its copies are restored (browse lists first copies): a figure, not a problem
    _searched(res, survivor, tag, page, ids, "down", complete=False)
    res.figures["down_complete_after_s"] = _until_clean(survivor, tag, page, ids, killed)
    c.restart(victim)
    for p in c.nodes:
        _searched(res, p, tag, page, ids, f"after_{p.node_id}")
    res.figures["after_clean_s"] = _until_clean(victim, tag, page, ids, time.time())
    res.figures["queue_scheduled"] = _ok(victim.get("/queues/labels"), "queue")["counts"].get(
        "scheduled")
    res.check(res.figures["down_complete_after_s"] is not None,
              "the survivors never found every task while the node was down")
    res.check(res.figures["after_clean_s"] is not None,
              "after the restart some tasks stayed on two pages (or missing) for 20 s")
    _ok(c.up()[0].post("/queues/labels/purge"), "purge labels")
    return res


def _until_clean(node: NodeProcess, tag: str, page: int, ids: set[str],
                 since: float, timeout: float = 20.0) -> float | None:
    """Seconds from ``since`` until a search on ``node`` shows every id once (None:
    not within ``timeout``)."""
    def clean() -> bool:
        seen = _search(node, tag, page)[0]
        return len(seen) == len(ids) and set(seen) == ids
    try:
        wait_until(clean, timeout, interval=0.3, what="a clean search")
        return time.time() - since
    except HarnessError:
        return None


def _searched(res: Result, node: NodeProcess, tag: str, page: int, ids: set[str],
              key: str, complete: bool = True) -> None:
    """Search on ``node``; its figures under ``key``; every id once, none missing (with
    ``complete``; without, only none twice)."""
    seen, nodes, secs = _search(node, tag, page)
    found, repeated = set(seen), len(seen) - len(set(seen))
    res.figures[key] = f"{len(found & ids)}/{len(ids)}"
    res.figures[key + "_repeated"] = repeated
    res.figures[key + "_nodes"] = "+".join(nodes)
    res.figures[key + "_s"] = secs
    res.check(found <= ids and (found == ids or not complete),
              f"{key}: found {len(found & ids)}/{len(ids)}")
    res.check(not repeated, f"{key}: {repeated} ids on two pages "
                            f"(e.g. {[i for i in seen if seen.count(i) > 1][:1]})")


def _search(node: NodeProcess, tag: str, limit: int) -> tuple[list[str], list[str], float]:
    """Page through GET /tasks?label=k9=TAG: the ids in page order, who answered (each
    page's ``nodes``, joined), the seconds it took."""
    t0, seen, answered, cursor = time.time(), [], set(), None
    for _ in range(50):
        params = {"label": f"k9={tag}", "state": "scheduled", "queue": "labels", "limit": limit}
        if cursor:
            params["cursor"] = cursor
        body = _ok(node.get("/tasks", params=params, timeout=20), f"search on {node.node_id}")
        seen.extend(t["id"] for t in body["tasks"])
        answered.update(body.get("nodes", []))
        cursor = body.get("next_cursor")
        if not cursor:
            break
    return seen, sorted(answered), time.time() - t0


# ------------------------------------------------------------------ resend
def resend(c: Cluster, count: int = 120) -> Result:
    """``count`` tasks delivered once; one resent alone; then all resent in bulk (ended
    before a cut, to this run's target) from one node while another is killed mid-call,
    the bulk repeated after its restart until it finds none. Each task must be delivered
    once more per resend (the single one twice more), none twice but those in flight at
    the kill, and each call's count must match what it resent: the call the kill cut
    counts at least the tasks resent before the next call, the later calls no more than
    the tasks first resent after them."""
    res, path = Result("resend"), f"/rs/{int(time.time())}"  # this run's: the target filter
    ids = []
    for i in range(0, count, 40):
        body = [{"url": c.sink.url_for(path)} for _ in range(min(40, count - i))]
        r = _ok(c.nodes[(i // 40) % 3].post("/queue/resend/batch", json=body), "batch")
        ids.extend(t["id"] for t in r["tasks"])
    c.sink.wait_for(lambda rs: len({r.task_id for r in rs}) >= count, path=path, timeout=30)
    single = ids[0]
    _ok(c.nodes[1].post(f"/tasks/{single}/resend"), "resend one")
    c.sink.wait_for(lambda rs: sum(r.task_id == single for r in rs) >= 2, path=path, timeout=15)
    wait_state(c, single, ("succeeded",), 10)
    settle(1.0)
    cut, caller, victim = time.time(), c.nodes[1], c.nodes[2]
    first, killed = _bulk_with_kill(c, caller, victim, cut, c.sink.url_for(path))
    res.figures["bulk_during_kill"] = first
    settle(2 * OPTIONS["replica_offset"] + 1.0)  # a second copy resends an offset late
    c.restart(victim)
    again, counts = time.time(), []
    for _ in range(5):
        r = caller.post("/queues/resend/resend", params={
            "state": "succeeded", "until": cut, "target": c.sink.url_for(path)})
        body = _ok(r, "bulk resend")
        counts.append(body["count"])
        if not body["more"] and body["count"] == 0:
            break
    res.figures["bulk_counts_after"] = counts
    got = _resend_checks(c, res, path, ids, single, cut, killed)
    first_resend = [min(t for t in got.get(i, []) if t > cut) for i in ids
                    if any(t > cut for t in got.get(i, []))]
    early = sum(t < again for t in first_resend)
    res.figures.update(resent_before_next_call=early, resent_after=len(first_resend) - early)
    if isinstance(first[1], int):
        res.check(first[1] >= early, f"the call the kill cut counted {first[1]}, and "
                                     f"{early} tasks were resent before the next call")
    res.check(sum(counts) <= len(first_resend) - early,
              f"the calls after the restart counted {sum(counts)}, and "
              f"{len(first_resend) - early} tasks were first resent after them")
    return res


def _bulk_with_kill(c: Cluster, caller: NodeProcess, victim: NodeProcess,
                    cut: float, target: str) -> tuple[tuple[Any, Any, Any], float]:
    """POST the bulk resend in a thread, kill ``victim`` 20 ms in: ((status, count,
    more), the kill's time)."""
    out: list[Any] = []

    def call() -> None:
        try:
            r = caller.post("/queues/resend/resend", params={
                "state": "succeeded", "until": cut, "target": target}, timeout=30)
            body = r.json() if r.status_code == 200 else {}
            out.append((r.status_code, body.get("count"), body.get("more")))
        except requests.RequestException as e:
            out.append((type(e).__name__, None, None))

    th = threading.Thread(target=call, daemon=True)
    th.start()
    settle(0.02)
    killed = c.kill(victim)
    th.join(35)
    return (out[0] if out else ("no answer", None, None)), killed


def _resend_checks(c: Cluster, res: Result, path: str, ids: list[str], single: str,
                   cut: float, killed: float) -> dict[str, list[float]]:
    """Every task delivered once per resend; a second delivery of a bulk resend is
    excused only when the first had reached the worker by the kill (in flight)."""
    want = {t: 3 if t == single else 2 for t in ids}

    def all_in() -> bool:
        got = deliveries(c.sink, path)
        return all(len(got.get(t, [])) >= n for t, n in want.items())
    try:
        wait_until(all_in, 30, interval=0.2, what="every resent task delivered")
    except HarnessError:
        pass
    settle(2 * OPTIONS["replica_offset"] + 2.0)
    got = deliveries(c.sink, path)
    lost = [t for t, n in want.items() if len(got.get(t, [])) < n]
    doubled = [t for t, n in want.items() if len(got.get(t, [])) > n]
    in_flight = [t for t in doubled if min(x for x in got[t] if x > cut) <= killed + 0.05]
    res.figures.update(tasks=len(ids), lost=len(lost), doubled=len(doubled),
                       doubled_in_flight_at_kill=len(in_flight),
                       single_deliveries=len(got.get(single, [])))
    res.check(not lost, f"{len(lost)} resent tasks not delivered again (e.g. {lost[:2]})")
    res.check(len(doubled) == len(in_flight), f"{len(doubled) - len(in_flight)} tasks "
                                              "delivered twice for one resend, not in flight")
    return got


# ------------------------------------------------------------------ retry delays
def retry_delays(c: Cluster, delays: tuple[float, float] = (1.0, 3.0)) -> Result:
    """A task whose worker answers 500, 500, 200, with ``retry_delays``; the node that
    delivered the first attempt is killed once its answer is written, and started again
    after the second. Three deliveries, each retry against its delay (how late)."""
    res, path = Result("retry_delays"), f"/rd/{int(time.time())}"
    c.sink.reply(path, 500, 500, 200)
    taker = c.follower()
    tid = c.enqueue(taker, "retry", url=c.sink.url_for(path), retry_delays=list(delays))["id"]
    c.sink.wait_for(count=1, path=path, timeout=15)
    wait_until(lambda: c.sink.requests(path)[0].done, 5, what="the first answer written")
    settle(0.1)
    c.kill(taker)
    c.sink.wait_for(count=2, path=path, timeout=20)
    c.restart(taker)
    try:
        c.sink.wait_for(count=3, path=path, timeout=20)
    except HarnessError:
        pass
    state = wait_state(c, tid, ("succeeded", "failed"), 15).get("state")
    settle(2 * OPTIONS["replica_offset"] + 2.0)
    times = [r.time for r in c.sink.requests(path)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    res.figures.update(deliveries=len(times), state=state, gaps_s=gaps, retry_counts=[
        r.headers.get("X-Task-Retry-Count") for r in c.sink.requests(path)],
                       late_s=[g - d for g, d in zip(gaps, delays)])
    res.check(len(times) == 3, f"{len(times)} deliveries, not 3")
    counts = res.figures["retry_counts"]
    res.check(len(set(counts)) == len(counts), f"an attempt delivered twice: retry counts {counts}")
    res.check(state == "succeeded", f"ended {state}")
    # a retry before its delay alone is noted, not failed (an attempt delivered twice,
    # above, is): the node died before its RETRY reached the sibling, which then counts
    # the attempts from its own copy
    res.figures["early_retries"] = sum(g < d - 0.05 for g, d in zip(gaps, delays))
    return res


# ------------------------------------------------------------------ schedule run
def schedule_run(c: Cluster) -> Result:
    """POST /schedules/<name>/run to the leader, its delivery answered; then a keyed run
    sent while the leader is killed and retried (same Idempotency-Key) on another node,
    as a client that got no answer would. The first run is delivered once; the keyed
    one once, or twice only when its first delivery was in flight at the kill."""
    res, name = Result("schedule_run"), f"k9-{int(time.time())}"
    path = f"/sched/{name}"
    leader = c.leader()
    _ok(leader.post("/schedules", json={"name": name, "cron": "@yearly",
                                        "task": {"url": c.sink.url_for(path), "queue": "sched"}}),
        "create schedule")
    wait_until(lambda: all(p.get(f"/schedules/{name}").status_code == 200 for p in c.nodes),
               15, what="the schedule on every node")
    plain = _ok(leader.post(f"/schedules/{name}/run"), "run")["id"]
    wait_until(lambda: any(r.task_id == plain and r.done for r in c.sink.requests(path)), 15,
               what="the run delivered")
    settle(0.5)  # its DONE on its way to the sibling: past that, a repeat is no excuse
    key = {"Idempotency-Key": f"{name}-once"}
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(_run(leader, name, key)), daemon=True)
    th.start()
    killed = c.kill(leader)
    th.join(15)
    retry = _run(c.others(leader)[0], name, key)
    res.figures.update(keyed_first=out[0][0] if out else "no answer", keyed_retry=retry[0])
    c.restart(leader)
    keyed = {i for s, i in [*out, retry] if i}
    settle(2 * OPTIONS["replica_offset"] + 5.0)
    got = deliveries(c.sink, path)
    times = sorted(t for i in keyed for t in got.get(i, []))
    res.figures.update(plain_deliveries=len(got.get(plain, [])), keyed_ids=len(keyed),
                       keyed_deliveries=len(times),
                       keyed_in_flight_at_kill=bool(times) and times[0] <= killed + 0.05,
                       other_deliveries=sum(len(v) for k, v in got.items()
                                            if k != plain and k not in keyed))
    res.check(res.figures["plain_deliveries"] == 1,
              f"the run was delivered {res.figures['plain_deliveries']} times")
    allowed = 2 if res.figures["keyed_in_flight_at_kill"] else 1
    res.check(len(keyed) == 1 and 1 <= len(times) <= allowed,
              f"the keyed run: {len(keyed)} ids, {len(times)} deliveries")
    res.check(res.figures["other_deliveries"] == 0, "a delivery of no run made")
    _ok(c.up()[0].request("DELETE", f"/schedules/{name}"), "delete schedule")
    return res


def _run(node: NodeProcess, name: str, headers: dict[str, str]) -> tuple[Any, str | None]:
    """POST /schedules/<name>/run: (status, the run's id or None)."""
    try:
        r = node.post(f"/schedules/{name}/run", headers=headers, timeout=10)
        return r.status_code, r.json().get("id") if r.status_code in (200, 409) else None
    except requests.RequestException as e:
        return type(e).__name__, None


# ------------------------------------------------------------------ the run
SCENARIOS: dict[str, Callable[..., Result]] = {
    "long_task": long_task, "expiry": expiry, "replace": replace, "debounce": debounce,
    "labels": labels, "resend": resend, "retry_delays": retry_delays,
    "schedule_run": schedule_run,
}


def run_one(c: Cluster, name: str, **kw: Any) -> Result:
    """One scenario (``kw``: its parameters, e.g. a count) on a cluster whose nodes are
    all up; every node is up again after it (a harness error is a failed result)."""
    t0 = time.time()
    try:
        res = SCENARIOS[name](c, **kw)
    except HarnessError as e:
        res = Result(name, problems=[f"harness: {str(e).splitlines()[0]}"])
    for p in c.nodes:
        if not p.running:
            c.restart(p)
    c.converge()
    res.seconds = time.time() - t0
    if res.seconds > SCENARIO_S:
        res.problems.append(f"took {res.seconds:.0f}s, over {SCENARIO_S:.0f}s")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated scenario names: "
                   + ", ".join(SCENARIOS))
    p.add_argument("--keep-dir", action="store_true", help="keep the node logs and data")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or list(SCENARIOS)
    if unknown := [n for n in names if n not in SCENARIOS]:
        p.error(f"unknown scenario {unknown[0]!r}; one of {', '.join(SCENARIOS)}")
    workdir = tempfile.mkdtemp(prefix="miyamoto-kill9-")
    c, results = Cluster(workdir), []
    try:
        c.start()
        for name in names:
            log(f"scenario {name}")
            results.append(run_one(c, name))
            print(results[-1].line(), flush=True)
    except HarnessError as e:
        log(f"harness error: {e}; logs in {workdir}")
        return 2
    finally:
        c.stop()
    failed = [r for r in results if not r.ok]
    if a.keep_dir or failed:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{len(results) - len(failed)}/{len(results)} ok", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
