"""Cluster-wide queries and queue control: what one node cannot answer alone.

A task's copies live on several nodes and a queue's tasks on all of them, so reading a
task, cancelling it, rerunning it, counting or listing a queue and pausing, resuming or
purging it ask every other member (REQUEST) and merge the answers (REPLY) with this
node's own. ``serve`` answers the same operations for a peer. A peer's answers are
untrusted: every merged value is type-checked, and a summary that does not fit is left out.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Callable, Protocol

from miyamoto.cluster.requests import Requests
from miyamoto.delivery import completion
from miyamoto.engine import browse, history, pull
from miyamoto.engine.engine import Engine
from miyamoto.errors import Conflict, Unavailable
from miyamoto.tasks import options, redact
from miyamoto.tasks.task import ENDED, HISTORY_MAX, State, Task
from miyamoto.wire import checks
from miyamoto.wire.verbs import DecodeError

log = logging.getLogger(__name__)

_ORDER = {"deleted": 5, "succeeded": 4, "failed": 4, "cancelled": 4, "expired": 4,
          "running": 2,
          "scheduled": 1}
BULK_MAX = 10_000  # failed copies one node retries or deletes per request
TOTAL_PREFIX = "total:"  # a queue's totals among its state counts (see counts_local)
COPIES_PREFIX = "copies:"  # a queue's copies per state, every replica counted
IDS_PREFIX = "ids:"  # the ids of a node's copies per state
LATENCY_PREFIX = "latency:"  # a queue's deliveries per latency bucket (engine.history)
BREAKER_PREFIX = "breaker:"  # 1 per node whose breaker for a queue's target is not closed
IDS_FLAG = "*ids"  # true if a node's counts carry the ids of all its copies (not a queue name)
# A node sends the ids of up to this many copies with its counts (about 1 MB), so the
# cluster counts tasks, not copies: a task's copies are one per replica, and a copy
# restored while its holder was down makes two first copies once the holder is back.
# Past it, the counts are sums of first copies, which such a copy counts twice.
IDS_MAX = 20_000
PEER_POLL = 1.0  # s: a waiting lease asks the peers for their due copies this often
LEASE_GRACE = 0.5  # s: a lease waits this long for the siblings' answers to its asks
BLOCKED_MAX = 100  # blocked ordering keys shown per queue
_STATES = tuple(s.value for s in State)


def summary_ok(s: Any) -> bool:
    """A task summary from a peer with the fields we sort and pick by, well typed."""
    return (isinstance(s, dict) and isinstance(s.get("id"), str) and s.get("state") in _ORDER
            and type(s.get("attempts")) is int and type(s.get("replica")) is int)


def attempt_over(t: Task | None, run: int, attempt: int) -> bool:
    """Whether copy ``t``, which does not hold the accepted ``attempt`` of ``run``,
    knows that attempt is over: it ended, heard of the attempt's end (its attempts
    counted it) or of a later run. A sibling's waiting copy knows nothing (a CLAIM
    carries no attempts): its 409 told a worker whose node was down to drop a report
    that was still due, and the task ran again after the lease."""
    if t is None:
        return False
    if t.reruns != run:
        return t.reruns > run
    return t.state.ended or t.attempts >= attempt


def pick(results: list[Any]) -> dict[str, Any] | None:
    """One answer from many copies: a done operation beats a conflict beats nothing."""
    done = [r for r in results if isinstance(r, dict) and "conflict" not in r and summary_ok(r)]
    if done:
        return min(done, key=lambda r: r.get("replica", 0))
    conflicts = [r for r in results if isinstance(r, dict) and "conflict" in r]
    if conflicts:
        raise Conflict(str(conflicts[0]["conflict"]))
    return None


class Peers(Protocol):
    """What the queries need of the cluster layer (``miyamoto.cluster.layer``)."""

    def others(self) -> list[str]:
        """The other members: whom a cluster-wide query asks."""

    def replay(self, task_id: str) -> None:
        """Our copy was just rerun: apply the siblings' news kept while it had ended."""


class Queries:
    def __init__(self, me: str, engine: Engine, requests: Requests, peers: Peers,
                 timeout: float, offset: float, clock: Callable[[], float],
                 monotonic: Callable[[], float] = time.monotonic):
        self.me = me
        self.engine = engine
        self.requests = requests
        self.peers = peers
        self.timeout = timeout
        self.offset = offset
        self.clock = clock
        self.monotonic = monotonic  # a lease's long poll and grace (the node's, as its timers)

    def ask(self, op: str, args: dict, members: list[str] | None = None) -> dict[str, Any]:
        members = self.peers.others() if members is None else members
        if not members:
            return {}
        return self.requests.ask_all(members, op, args, self.timeout)

    # ------------------------------------------------------------ tasks
    def get_task(self, task_id: str) -> dict[str, Any] | None:
        found: list[dict] = []
        local = self.engine.get(task_id)
        if local is not None:
            found.append(dict(self._view(local), node=self.me, **redact.request_view(local)))
        # ask the siblings even when this copy has ended: ``copies`` lists every copy
        for member, result in self.ask("get", {"id": task_id}).items():
            if isinstance(result, dict):
                found.append(dict(result, node=member))
        found = [s for s in found if summary_ok(s)]
        if not found:
            return None
        best = dict(max(found, key=lambda s: (_ORDER[s["state"]], s["attempts"], -s["replica"])))
        best["history"] = merge_history(s.get("history") for s in found)
        # the request is the same on every copy: any one that carries it (an older peer
        # answers without), checked and redacted again, since it may be a peer's
        best.update(redact.shown(next((s for s in found if "params" in s), {})))
        best["copies"] = sorted(({"node": s["node"], "replica": s["replica"],
                                  "state": s["state"], "next_attempt": s.get("next_attempt")}
                                 for s in found), key=lambda c: c["replica"])
        return best

    def _view(self, t: Task) -> dict[str, Any]:
        """A copy's summary with what this node's line of its ordering key says."""
        s = t.summary()
        if t.ordering_key is not None:
            s["ordering"] = self.engine.ordering_view(t)
        return s

    def blocked(self) -> dict[str, list[dict[str, str]]]:
        """queue -> its ordering keys blocked by a failed task (``block``), over the
        cluster: each key once, with the task that holds it, at most BLOCKED_MAX."""
        answers = [self.blocked_local()]
        answers += [r for r in self.ask("blocked", {}).values() if isinstance(r, dict)]
        out: dict[str, dict[str, str]] = {}
        for answer in answers:
            for q, pairs in answer.items():
                if not isinstance(pairs, list):
                    continue
                keys = out.setdefault(str(q), {})
                for pair in pairs[:BLOCKED_MAX]:
                    if isinstance(pair, list) and len(pair) == 2 and \
                            all(isinstance(x, str) for x in pair) and len(keys) < BLOCKED_MAX:
                        keys.setdefault(pair[0], pair[1])
        return {q: [{"key": k, "task": i} for k, i in sorted(keys.items())]
                for q, keys in out.items() if keys}

    def blocked_local(self) -> dict[str, list[list[str]]]:
        out: dict[str, list[list[str]]] = {}
        for q in self.engine.lines.queues():
            pairs = self.engine.lines.blocked(q)[:BLOCKED_MAX]
            if pairs:
                out[q] = [list(p) for p in pairs]
        return out

    def cancel(self, task_id: str) -> dict[str, Any] | None:
        return self._everywhere("cancel", self.cancel_local, task_id)

    def cancel_local(self, task_id: str) -> dict | None:
        t = self.engine.cancel(task_id)
        return t.summary() if t is not None else None

    def delete(self, task_id: str) -> dict[str, Any] | None:
        return self._everywhere("delete", self.delete_local, task_id)

    def delete_local(self, task_id: str) -> dict | None:
        t = self.engine.get(task_id)
        if t is None:
            return None
        was = t.state
        t = self.engine.delete(task_id)
        if t is None:
            return None
        return dict(t.summary(), state="deleted") if was == State.FAILED else t.summary()

    def rerun(self, task_id: str) -> dict[str, Any] | None:
        return self._everywhere("rerun", self.rerun_local, task_id)

    def _everywhere(self, op: str, local: Callable[[str], dict | None],
                    task_id: str) -> dict[str, Any] | None:
        """``op`` on this node's copy and on every peer's; the most telling answer."""
        results: list[Any] = []
        try:
            found = local(task_id)
            if found is not None:
                results.append(found)
        except Conflict as e:
            results.append({"conflict": str(e)})
        results += list(self.ask(op, {"id": task_id}).values())
        return pick(results)

    def replace(self, task_id: str, changes: dict[str, Any], delay: float | None,
                revision: str) -> dict[str, Any] | None:
        """A repeat's new version on every copy (``tasks/repeat.py``); Conflict if any
        copy refused (it has started: the task runs as it was)."""
        args = {"id": task_id, "changes": changes, "delay": delay, "revision": revision}
        results: list[Any] = []
        try:
            found = self.replace_local(args)
            if found is not None:
                results.append(found)
        except Conflict as e:
            results.append({"conflict": str(e)})
        results += list(self.ask("replace", args).values())
        conflict = next((r for r in results if isinstance(r, dict) and "conflict" in r), None)
        if conflict is not None:
            raise Conflict(str(conflict["conflict"]))
        return pick(results)

    def refresh(self, task_id: str, member: str) -> None:
        """Send ``member`` our copy's version of the task by the replace path (its copy
        asked with an older revision, ``replicas.siblings``): params, body, content_type
        and eta (as a delay: read against its clock), stamped with our revision, so its
        copy becomes ours, or stays if it holds a newer one by then. Not once the task
        has started (a replace would be refused): the asker waits for our copy instead."""
        t = self.engine.get(task_id)
        if t is None or t.state != State.SCHEDULED or t.attempts or not t.revision:
            return  # started, our eta is a retry's: its copy waits for ours to deliver
        changes = {"params": t.params, "body": t.body, "content_type": t.content_type}
        args = {"id": task_id, "changes": changes, "revision": t.revision,
                "delay": max(0.0, t.eta - self.clock())}
        if not self.ask("replace", args, [member]):
            log.info("cluster: %s did not take task %s's newer version", member, task_id)

    def replace_local(self, args: dict) -> dict | None:
        t = self.engine.replace(checks.string(args, "id"), _replace_changes(args),
                                _opt_delay(args), checks.string(args, "revision"),
                                self.offset)
        return t.summary() if t is not None else None

    def resend(self, task_id: str) -> dict[str, Any] | None:
        return self._everywhere("resend", self.resend_local, task_id)

    def resend_local(self, task_id: str) -> dict | None:
        return self.rerun_local(task_id, resend=True)

    def rerun_local(self, task_id: str, resend: bool = False) -> dict | None:
        t = self.engine.get(task_id)
        if t is None:
            return None
        t = self.engine.rerun(task_id, delay=t.replica * self.offset, resend=resend)
        if t is None:
            return None
        self.peers.replay(task_id)  # a sibling's rerun copy may already have claimed or finished
        return (self.engine.get(task_id) or t).summary()

    def join_run(self, task_id: str, reruns: int) -> None:
        """Our ended copy joins run ``reruns`` of its task, under way on a sibling (a
        rejoin's probe heard of it): rerun as ``rerun_local`` does, in that run."""
        t = self.engine.get(task_id)
        if t is None or not t.state.ended or t.reruns >= reruns:
            return
        try:
            self.engine.rerun(task_id, delay=t.replica * self.offset, resend=True,
                              reruns=reruns)
        except Conflict:  # live meanwhile (a rerun reached it): nothing to join
            return
        self.peers.replay(task_id)

    # ------------------------------------------------------------ long tasks
    def complete(self, grant: completion.Grant,
                 report: completion.Report) -> dict[str, Any] | None:
        """A long task's report, on whichever node holds its accepted attempt (the
        worker may reach any node; the others answer a conflict or nothing)."""
        args = _grant_args(grant, state=report.state, result=report.result)
        return self._held("complete", args, lambda: self.engine.complete(grant, report))

    def heartbeat(self, grant: completion.Grant, lease: float | None) -> dict[str, Any] | None:
        """A long task's lease extended, on whichever node holds its accepted attempt."""
        args = _grant_args(grant, lease=lease)
        return self._held("heartbeat", args, lambda: self.engine.heartbeat(grant, lease))

    def _held(self, op: str, args: dict, local: Callable[[], Task]) -> dict[str, Any] | None:
        """``local`` here if our copy holds the attempt, else ``op`` on the peers.
        Unavailable (503, try again) when no node could say and a copy still waits
        (ours, or a peer's ``waiting``): the attempt's holder is down or cut off, its
        worker's report still due."""
        results: list[Any] = []
        waiting = False
        try:
            return local().summary()
        except Conflict as e:
            mine = self.engine.get(args["id"])
            if attempt_over(mine, args["run"], args["attempt"]):
                results.append({"conflict": str(e)})
            waiting = mine is not None and not mine.state.ended
        answers = list(self.ask(op, args).values())
        waiting = waiting or any(isinstance(r, dict) and r.get("waiting") is True
                                 for r in answers)
        found = pick([*results, *answers])
        if found is None and waiting:
            raise Unavailable("the node holding this attempt did not answer: report again "
                              "in a moment")
        return found

    def serve_held(self, op: str, args: dict) -> dict[str, Any] | None:
        """A peer's ``complete`` or ``heartbeat``: only our own copy is tried."""
        grant = completion.Grant(checks.string(args, "id"), checks.integer(args, "run"),
                                 checks.integer(args, "attempt", 1), 0.0)
        try:
            if op == "complete":
                report = completion.parse_report({"state": args.get("state"),
                                                  "result": args.get("result")})
                return self.engine.complete(grant, report).summary()
            if op == "nack":
                delay = args.get("delay")
                if delay is not None and not pull.within(delay, 0, pull.DELAY_MAX):
                    raise DecodeError("nack delay is out of range")
                return self.engine.nack(grant, delay).summary()
            lease = args.get("lease")
            if lease is not None and not options.check_lease(lease):
                raise DecodeError("heartbeat lease is out of range")
            return self.engine.heartbeat(grant, lease).summary()
        except completion.ReportError as e:
            raise DecodeError(str(e)) from e
        except Conflict as e:
            mine = self.engine.get(grant.task_id)
            if attempt_over(mine, grant.run, grant.attempt):
                return {"conflict": str(e)}
            return {"waiting": True} if mine is not None and not mine.state.ended else None

    # ------------------------------------------------------------ pull queues
    def lease(self, queue: str, max_tasks: int, lease_s: float,
              wait_s: float) -> list[dict[str, Any]]:
        """Up to ``max_tasks`` due tasks of pull queue ``queue``, each leased for
        ``lease_s``, from this node's copies first, then from the peers' (asked one at a
        time, in random order, for what is still missing: a task's copies live on
        ``replication`` nodes only, and a worker of one node must get the others' too);
        while it has none, it waits up to ``wait_s`` for new due copies here, asking the
        peers again every PEER_POLL, and answers with the first it gets. Each lease is held by the node whose copy it leased; its
        token's ack, nack or extend reaches it from any node (``_held``)."""
        deadline = self.monotonic() + wait_s
        out = self.lease_local(queue, max_tasks, lease_s)
        if len(out) < max_tasks:
            out += self._lease_peers(queue, max_tasks - len(out), lease_s)
        next_poll = self.monotonic() + PEER_POLL
        while not out:  # a long poll ends with the first tasks: their leases are running
            now = self.monotonic()
            if now >= deadline:
                break
            if now >= next_poll:
                out += self._lease_peers(queue, max_tasks, lease_s)
                next_poll = self.monotonic() + PEER_POLL
                continue
            self.engine.pull_wait(queue, min(deadline, next_poll) - now)
            out += self.lease_local(queue, max_tasks, lease_s)
        return out

    def lease_local(self, queue: str, n: int, lease_s: float,
                    grace: float = LEASE_GRACE) -> list[dict[str, Any]]:
        """This node's leases; copies whose siblings were just asked come back within a
        round trip, so they are waited for up to ``grace``."""
        until = self.monotonic() + grace
        taken = self.engine.lease(queue, n, lease_s)
        out = [_leased(t, token, self.clock()) for t, token in taken.leased]
        while len(out) < n and taken.asking and self.monotonic() < until:
            self.engine.pull_wait(queue, until - self.monotonic())
            taken = self.engine.lease(queue, n - len(out), lease_s)
            out += [_leased(t, token, self.clock()) for t, token in taken.leased]
        return out

    def _lease_peers(self, queue: str, n: int, lease_s: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        peers = self.peers.others()
        random.shuffle(peers)
        for peer in peers:
            if len(out) >= n:
                break
            got = self.ask("lease", {"queue": queue, "n": n - len(out), "lease": lease_s},
                           [peer]).get(peer)
            now = self.clock()
            for d in got if isinstance(got, list) else ():
                if leased_ok(d) and len(out) < n:
                    out.append(dict(d, lease_until=now + d["lease_left"]))
        return out

    def nack(self, grant: completion.Grant, delay: float | None) -> dict[str, Any] | None:
        """A leased task given back, on whichever node holds its lease."""
        args = _grant_args(grant, delay=delay)
        return self._held("nack", args, lambda: self.engine.nack(grant, delay))

    # ------------------------------------------------------------ queues
    def find_name(self, queue: str, name: str) -> str | None:
        """The id of the task holding ``name`` in ``queue`` on any node (names are kept
        by the task's copies while the dedup window lasts), or None."""
        held = self.name_local(queue, name)
        if held is not None:
            return held
        found = [r for r in self.ask("name", {"queue": queue, "name": name}).values()
                 if isinstance(r, str) and r]
        return min(found) if found else None

    def name_local(self, queue: str, name: str) -> str | None:
        held = self.engine.name_holder(queue, name)  # memory's recent ones, else the journal's
        return held[0] if held is not None and held[1] > self.engine.clock() else None

    def counts_local(self) -> dict[str, Any]:
        """This node's counts per queue and state: its first copies, its ``totals``
        under TOTAL_PREFIX keys, all its copies under COPIES_PREFIX, its deliveries per
        latency bucket under LATENCY_PREFIX and its open breakers of the queue's targets
        under BREAKER_PREFIX (a peer adds these up as it adds up states); and, up to
        IDS_MAX copies, their ids per state under IDS_PREFIX, with IDS_FLAG true, so
        the cluster counts each task once."""
        counts: dict[str, Any] = dict(self.engine.queue_counts(primary_only=True))
        for q, states in self.engine.queue_counts().items():
            mine = counts.setdefault(q, {})
            for st, n in states.items():
                mine[COPIES_PREFIX + st] = n
        for q, totals in self.engine.stats.totals.items():
            mine = counts.setdefault(q, {})
            for k, n in totals.items():
                mine[TOTAL_PREFIX + k] = n
        for q, buckets in self.engine.stats.latency.buckets(self.clock()).items():
            mine = counts.setdefault(q, {})
            for b, n in buckets.items():
                mine[f"{LATENCY_PREFIX}{b}"] = n
        breakers = {t["origin"] for t in self.engine.dispatcher.targets()
                    if t["state"] != "closed"}
        for q, origins in self.engine.stats.targets.items():
            for o in origins:
                if o in breakers:
                    counts.setdefault(q, {})[BREAKER_PREFIX + o] = 1
        ids = self.engine.copy_states(IDS_MAX)
        for q, states in (ids or {}).items():
            mine = counts.setdefault(q, {})
            for st, task_ids in states.items():
                mine[IDS_PREFIX + st] = task_ids
        counts[IDS_FLAG] = ids is not None
        return counts

    def queue_counts(self) -> dict[str, dict[str, int]]:
        """Per queue: each state's tasks (each counted once, at its most advanced copy,
        when every answering node sent its ids; else the sum of the first copies), the
        totals (TOTAL_PREFIX) and every copy (COPIES_PREFIX), over the cluster. A node
        that does not answer is left out; its tasks' other copies still count them."""
        answers = [self.counts_local()]
        answers += [r for r in self.ask("counts", {}).values() if isinstance(r, dict)]
        total: dict[str, dict[str, int]] = {}
        for result in answers:
            for q, states in result.items():
                if isinstance(states, dict):
                    mine = total.setdefault(str(q), {})
                    for st, n in states.items():
                        if type(n) is int:
                            mine[str(st)] = mine.get(str(st), 0) + n
        tasks = _tasks_by_id(answers)
        if tasks is not None:
            for q, states in total.items():
                for st in _STATES:
                    states[st] = 0
                for st in tasks.get(q, {}).values():
                    states[st] += 1
        return total

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]:
        seen = {t.id: t.summary() for t in self.engine.list(queue, state, limit)}
        args = {"queue": queue, "state": state.value, "limit": limit}
        for result in self.ask("list", args).values():
            if isinstance(result, list):
                for s in result:
                    if isinstance(s, dict) and isinstance(s.get("id"), str):
                        seen.setdefault(s["id"], s)
        out = sorted(seen.values(), key=lambda s: s.get("next_attempt") or s.get("finished") or 0)
        return out[:limit]

    def browse(self, flt: browse.Filter, after: browse.Key | None,
               limit: int) -> dict[str, Any]:
        """A page of tasks over the cluster (``engine.browse``): ``tasks`` and the
        ``next_cursor`` (None on the last page); ``nodes`` names who answered."""
        pages = [self.engine.browse(flt, after, limit)]
        args = {"filter": flt.payload(), "after": list(after) if after else None,
                "limit": limit}
        answered = [self.me]
        for member, result in self.ask("browse", args).items():
            page = browse.page_of(result)
            if page is not None:
                pages.append(page)
                answered.append(member)
        tasks, cursor = browse.merge(pages, limit, flt.descending)
        tasks = [s for s in tasks if summary_ok(s)]
        return {"tasks": tasks, "next_cursor": browse.encode_cursor(cursor),
                "nodes": sorted(answered)}

    def browse_local(self, args: dict) -> dict[str, Any]:
        flt = browse.filter_of(args.get("filter"))
        if flt is None:
            raise DecodeError("not a task filter")
        after = args.get("after")
        key = browse.key_of(after) if after is not None else None
        if after is not None and key is None:
            raise DecodeError("not a browse cursor")
        limit = checks.integer(args, "limit", 1, browse.MAX_LIMIT)
        return browse.page_payload(self.engine.browse(flt, key, limit))

    def rates(self, seconds: int, step: int, node: str | None) -> dict[str, Any] | None:
        """Tasks enqueued, delivered and failed per ``step`` seconds over the last
        ``seconds`` (engine.history): summed over the cluster, or ``node``'s alone
        (None if that node is not a member or does not answer); ``nodes`` who answered."""
        mine = self.rates_local(seconds, step)
        args = {"seconds": seconds, "step": step}
        if node is None or node == self.me:
            series, answered = mine, [self.me]
            if node is None:
                for member, result in self.ask("rates", args).items():
                    if history.add_series(series, result):
                        answered.append(member)
        else:
            if node not in self.peers.others():
                return None
            series = dict(mine, **{k: [0] * len(mine[k]) for k in history.KINDS})
            if not history.add_series(series, self.ask("rates", args, [node]).get(node)):
                return None
            answered = [node]
        return dict(series, seconds=seconds, nodes=sorted(answered))

    def rates_local(self, seconds: int, step: int) -> dict[str, Any]:
        return self.engine.stats.rates.series(self.clock(), seconds, step)

    def control(self, queue: str, action: str) -> dict[str, Any]:
        result = self.control_local(queue, action)
        for r in self.ask("control", {"queue": queue, "action": action}).values():
            if isinstance(r, dict) and type(r.get("purged")) is int:
                result["purged"] = result.get("purged", 0) + r["purged"]
        return result

    def control_local(self, queue: str, action: str) -> dict[str, Any]:
        if action == "purge":
            return {"purged": self.engine.purge(queue)}
        if action == "resume":
            self._restagger(queue)
        self.engine.pause(queue, action == "pause")
        return {}

    def failed(self, queue: str, action: str) -> dict[str, Any]:
        """Retry or delete every failed task of the queue, on every node: ``count``
        distinct tasks (``bulk_total``), ``more`` if some node had more than BULK_MAX."""
        mine = self.failed_local(queue, action)
        return bulk_total(mine, self.ask("failed", {"queue": queue, "action": action}))

    def failed_local(self, queue: str, action: str) -> dict[str, Any]:
        """This node's failed copies of ``queue`` (up to BULK_MAX), each rerun as
        ``rerun_local`` does (copy i fires i offsets late: the siblings' claims let one
        deliver) or deleted; one journal commit for them all."""
        copies = self.engine.journal.list(queue, State.FAILED.value, BULK_MAX + 1)
        more, copies = len(copies) > BULK_MAX, copies[:BULK_MAX]
        for t in copies:
            if action == "retry":
                self.engine.rerun(t.id, wait=False, delay=t.replica * self.offset)
                self.peers.replay(t.id)
            else:
                self.engine.delete(t.id)
        if copies:
            self.engine.journal.flush()
        return {"count": sum(1 for t in copies if t.replica == 0), "more": more,
                "ids": [t.id for t in copies]}

    def resend_many(self, queue: str, f: dict[str, Any]) -> dict[str, Any]:
        """Resend the queue's ended tasks that ``f`` picks (``resend_filter``), on every
        node: ``count`` distinct tasks (``bulk_total``), ``more`` if some node had more
        to look through."""
        mine = self.resend_many_local(queue, f)
        return bulk_total(mine, self.ask("resend_many", {"queue": queue, **f}))

    def resend_many_local(self, queue: str, f: dict[str, Any]) -> dict[str, Any]:
        """This node's copies of ``queue`` in state ``f["state"]`` (the last BULK_MAX to
        end), those that ended within [since, until) and whose url starts with target
        resent as ``resend_local`` does; one journal commit for them all."""
        copies = self.engine.journal.list(queue, f["state"], BULK_MAX + 1)
        more, copies = len(copies) > BULK_MAX, copies[:BULK_MAX]
        since, until, target = f.get("since"), f.get("until"), f.get("target")
        picked = [t for t in copies if (target is None or t.url.startswith(target))
                  and (since is None or (t.finished or 0.0) >= since)
                  and (until is None or (t.finished or 0.0) < until)]
        for t in picked:
            self.engine.rerun(t.id, wait=False, delay=t.replica * self.offset, resend=True)
            self.peers.replay(t.id)
        if picked:
            self.engine.journal.flush()
        return {"count": sum(1 for t in picked if t.replica == 0), "more": more,
                "ids": [t.id for t in picked]}

    def _restagger(self, queue: str) -> None:
        """Before a queue resumes: copies that fell due while it was paused would all fire
        at once, every replica of a task together, their CLAIMs crossing (a duplicate for
        each task). Keep the replicas' offsets, counted from now: copy i fires i offsets
        after the first, which has claimed by then."""
        now = self.clock()
        for t in list(self.engine.live.values()):
            if t.queue == queue and t.state == State.SCHEDULED and t.replica > 0 \
                    and t.fire_at < now + t.replica * self.offset:
                self.engine.apply_remote(t.id, fire_at=now + t.replica * self.offset)

    def sync_pauses(self, source: str) -> None:
        """On (re)joining, take ``source``'s paused/running queues: a pause or resume
        made while this node was away must hold here too."""
        result = self.ask("paused", {}, [source]).get(source)
        if not isinstance(result, dict):
            return
        for queue, paused in result.items():
            if isinstance(queue, str) and isinstance(paused, bool) and \
                    self.engine.dispatcher.view(queue).paused != paused:
                log.info("cluster: queue %s is %s cluster-wide", queue,
                         "paused" if paused else "running")
                self.engine.pause(queue, paused)

    # ------------------------------------------------------------ serving a peer
    def serve(self, op: str, args: dict) -> Any:
        """Answer a peer's REQUEST; DecodeError for arguments that do not fit."""
        if op == "get":
            t = self.engine.get(checks.string(args, "id"))
            return dict(self._view(t), **redact.request_view(t)) if t is not None else None
        local = {"cancel": self.cancel_local, "rerun": self.rerun_local,
                 "resend": self.resend_local, "delete": self.delete_local}.get(op)
        if local is not None:
            try:
                return local(checks.string(args, "id"))
            except Conflict as e:
                return {"conflict": str(e)}
        if op == "replace":
            try:
                return self.replace_local(args)
            except Conflict as e:
                return {"conflict": str(e)}
        if op in ("complete", "heartbeat", "nack"):
            return self.serve_held(op, args)
        if op == "lease":
            lease = args.get("lease")
            if not pull.within(lease, pull.LEASE_MIN, pull.LEASE_MAX):
                raise DecodeError("lease is out of range")
            return self.lease_local(checks.string(args, "queue"),
                                    checks.integer(args, "n", 1, pull.TASKS_MAX), lease)
        if op == "failed":
            action = checks.string(args, "action")
            if action not in ("retry", "delete"):
                raise DecodeError("unknown failed-task action")
            return self.failed_local(checks.string(args, "queue"), action)
        if op == "browse":
            return self.browse_local(args)
        if op == "rates":
            seconds = checks.integer(args, "seconds", 1, history.SECONDS)
            return self.rates_local(seconds, checks.integer(args, "step", 1, seconds))
        if op == "resend_many":
            return self.resend_many_local(checks.string(args, "queue"), resend_filter(args))
        if op == "paused":
            return {n: q.paused for n, q in self.engine.dispatcher.queues.items()}
        if op == "counts":
            return self.counts_local()
        if op == "blocked":
            return self.blocked_local()
        if op == "name":
            return self.name_local(checks.string(args, "queue"), checks.string(args, "name"))
        if op == "list":
            try:
                state = State(checks.string(args, "state"))
            except ValueError as e:
                raise DecodeError("state is not a task state") from e
            limit = checks.integer(args, "limit", 1, 1000)
            return [t.summary() for t in self.engine.list(checks.string(args, "queue"),
                                                          state, limit)]
        action = checks.string(args, "action")  # op == "control" (messages checks the op)
        if action not in ("pause", "resume", "purge"):
            raise DecodeError("unknown control action")
        return self.control_local(checks.string(args, "queue"), action)


def _replace_changes(args: dict) -> dict[str, Any]:
    """A replace's new params, body and content_type (a peer's: checked)."""
    changes = args.get("changes")
    if not isinstance(changes, dict) or not set(changes) <= {"params", "body", "content_type"}:
        raise DecodeError("replace changes are not params, body and content_type")
    params = changes.get("params", {})
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and (isinstance(v, str) or (
                isinstance(v, list) and all(isinstance(x, str) for x in v)))
            for k, v in params.items()):
        raise DecodeError("replace params are not text")
    for k in ("body", "content_type"):
        if changes.get(k) is not None and not isinstance(changes[k], str):
            raise DecodeError(f"replace {k} is not text")
    return {"params": params, "body": changes.get("body"),
            "content_type": changes.get("content_type")} if changes else {}


def _opt_delay(args: dict) -> float | None:
    delay = args.get("delay")
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 1e8:
        raise DecodeError("replace delay is not a number of seconds")
    return float(delay)


def _leased(t: Task, token: str, now: float) -> dict[str, Any]:
    """What a worker gets of a leased task: enough to do it, and the token to answer."""
    return {"id": t.id, "queue": t.queue, "name": t.name, "attempt": t.accepted,
            "token": token, "lease_until": t.fire_at, "lease_left": max(0.0, t.fire_at - now),
            "params": t.params, "body": t.body, "content_type": t.content_type,
            "headers": t.headers, "labels": t.labels, "priority": t.priority, "eta": t.eta,
            "url": t.url or None, "max_attempts": t.max_attempts, "node": t.replicas[
                t.replica] if 0 <= t.replica < len(t.replicas) else None}


def leased_ok(d: Any) -> bool:
    """A leased task from a peer with the fields a worker relies on, well typed."""
    return (isinstance(d, dict) and isinstance(d.get("id"), str)
            and isinstance(d.get("token"), str) and type(d.get("attempt")) is int
            and isinstance(d.get("lease_left"), (int, float)) and d["lease_left"] >= 0
            and isinstance(d.get("params"), dict) and isinstance(d.get("headers"), dict)
            and (d.get("body") is None or isinstance(d["body"], str)))


def _grant_args(grant: completion.Grant, **more: Any) -> dict[str, Any]:
    return {"id": grant.task_id, "run": grant.run, "attempt": grant.attempt, **more}


def bulk_total(mine: dict[str, Any], replies: dict[str, Any]) -> dict[str, Any]:
    """A bulk operation's answer over the cluster: ``count`` the distinct tasks any node
    acted on (the ids of every copy each node touched, so a task whose first copy's
    node is down, or whose copies two nodes both hold as first after a restore, counts
    once), ``more`` if some node had more. A peer that sends no ids (an older node)
    adds its own count of first copies."""
    ids, extra, more = set(mine["ids"]), 0, mine["more"]
    for r in replies.values():
        if not isinstance(r, dict) or type(r.get("count")) is not int \
                or type(r.get("more")) is not bool:
            continue
        more = more or r["more"]
        got = r.get("ids")
        if isinstance(got, list) and all(type(i) is str for i in got):
            ids.update(got)
        else:
            extra += r["count"]
    return {"count": len(ids) + extra, "more": more}


def resend_filter(args: dict) -> dict[str, Any]:
    """A peer's bulk-resend filter, checked: ``state`` (an ended one), optional
    ``target`` (a URL prefix), ``since`` and ``until`` (unix times of the end)."""
    state = checks.string(args, "state")
    if state not in ENDED:
        raise DecodeError("state is not an ended task state")
    f: dict[str, Any] = {"state": state}
    if args.get("target") is not None:
        f["target"] = checks.string(args, "target", 2083)
    for k in ("since", "until"):
        if args.get(k) is not None:
            f[k] = checks.number(args, k)
    return f


def merge_history(histories: Any) -> list[dict[str, Any]]:
    """The attempts every copy knows, each once (by start and node), newest first, at
    most task.HISTORY_MAX; a peer's entry that is not well typed is left out."""
    seen: dict[tuple, dict] = {}
    for h in histories:
        if not isinstance(h, list):
            continue
        for a in h:
            if isinstance(a, dict) and type(a.get("start")) in (int, float) \
                    and isinstance(a.get("node"), str):
                seen.setdefault((a["start"], a["node"]), a)
    return sorted(seen.values(), key=lambda a: a["start"], reverse=True)[:HISTORY_MAX]


def _tasks_by_id(answers: list[dict[str, Any]]) -> dict[str, dict[str, str]] | None:
    """queue -> task id -> the state of its most advanced copy over ``answers``; None
    unless every answer carried its ids (IDS_FLAG) and each list fits IDS_MAX."""
    tasks: dict[str, dict[str, str]] = {}
    for result in answers:
        if result.get(IDS_FLAG) is not True:
            return None
        for q, states in result.items():
            if not isinstance(states, dict):
                continue
            mine = tasks.setdefault(str(q), {})
            for st in _STATES:
                ids = states.get(IDS_PREFIX + st, [])
                if not isinstance(ids, list) or len(ids) > IDS_MAX:
                    return None
                for task_id in ids:
                    if type(task_id) is not str or len(task_id) > checks.MAX_NAME:
                        return None
                    had = mine.get(task_id)
                    if had is None or _ORDER[st] > _ORDER[had]:
                        mine[task_id] = st
    return tasks
