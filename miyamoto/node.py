"""One Miyamoto node: it builds its parts, hands each what it needs, and owns their
lifecycles.

``Node`` builds the journal, the delivery client and its target guard, the engine (by a
recipe the cluster layer completes with its hooks: the two call each other), the
cluster layer, the schedules' ticker and the HTTP front, and is the service the API
calls (``http.api.ApiService``) and the view /metrics reads (``metrics.Scraped``).
Enqueues go through the cluster's replication and reads ask peers for what this node
does not hold; alone it is a cluster of one. ``stop()`` takes the parts down in order:
refuse new work, drain deliveries, close the journal.
"""

from __future__ import annotations

import functools
import logging
import random
import socket
import time
from typing import Any, Callable

import gevent
import gevent.event
import gevent.pool
import gevent.ssl

from miyamoto.cluster.layer import Cluster
from miyamoto.cluster.queries import BREAKER_PREFIX, COPIES_PREFIX, LATENCY_PREFIX, TOTAL_PREFIX
from miyamoto.config.settings import Config, QueueConfig
from miyamoto.config.tls import TLSFileError, server_context
from miyamoto.definitions.schedules import Ticker
from miyamoto.delivery import completion
from miyamoto.delivery.fairness import queue_limit
from miyamoto.delivery.httpclient import HTTPClient
from miyamoto.delivery.identity import Identity
from miyamoto.delivery.targets import TargetGuard
from miyamoto.engine import browse
from miyamoto.engine.engine import Engine
from miyamoto.engine.history import BUCKETS, quantiles
from miyamoto.engine.queues import page
from miyamoto.definitions import queues as queue_defs
from miyamoto.errors import Conflict, Duplicate, Unavailable
from miyamoto.http.api import Api
from miyamoto.http.auth import Tokens
from miyamoto.http.fdlimit import connection_cap
from miyamoto.http.server import BACKLOG, HTTPServer
from miyamoto.logs import AccessLog
from miyamoto.metrics import Metrics
from miyamoto.store.journal import Journal
from miyamoto.tasks import repeat
from miyamoto.tasks.task import State, Task
from miyamoto.tasks.validate import Limits
from miyamoto.tracing import traces, wanted

log = logging.getLogger(__name__)

_HOLDING = (State.SCHEDULED.value, State.RUNNING.value, State.FAILED.value)  # listed
_STATES = tuple(s.value for s in State)  # (an Enum's .value costs ~1 us: 8,000 a page)
CLIENT_CONCURRENCY_MAX = 256  # the delivery client's bound, as the engine builds its own


class Node:
    def __init__(self, config: Config, clock: Callable[[], float] = time.time):
        self.config = config
        self.clock = clock
        self.node_id = config.node
        self.server: HTTPServer | None = None  # built by start(): it may bind a socket
        self.draining = False
        self._tracing = False  # this node started the process's tracing (miyamoto.tracing)
        self._stopped = gevent.event.Event()
        self._group = gevent.pool.Group()  # the ticker's greenlet
        self.metrics = Metrics()  # its own registry: several nodes may share a process
        self.journal = Journal(config.data_dir, on_commit=self.metrics.journal_commit)
        # the delivery client refuses, at connect, this node's and the members' endpoints;
        # the API checks enqueued URLs against the same guard
        self._endpoints: tuple[int | None, tuple] = (-1, ())  # (bound port, endpoints)
        self.targets = TargetGuard.from_config(config, endpoints=self._own_endpoints)
        client = HTTPClient(concurrency=min(config.concurrency, CLIENT_CONCURRENCY_MAX),
                            guard=self.targets)
        rng = random.Random()
        self.identity = Identity.from_config(config)  # keys the deliveries sign with
        self.cluster = Cluster(
            config, self.journal,
            functools.partial(Engine, config, self.journal, client, clock=clock, rng=rng,
                              metrics=self.metrics, identity=self.identity),
            clock=clock, monotonic=time.monotonic, rng=rng)
        self.engine = self.cluster.engine
        self.definitions = self.cluster.defs  # schedules, topics, queue settings
        limits = Limits(max_body=config.max_body, max_url=config.max_url,
                        max_delay=config.max_delay, max_name=config.max_name,
                        targets=self.targets.check_literal, oidc=self.identity.mints)
        self.api = Api(self, limits, config.max_batch, clock, Tokens(config.api_tokens),
                       self.identity)
        self.ticker = Ticker(self.definitions, self.cluster.enqueue, self.cluster.may_fire,
                             limits, clock, offset=self.cluster.clock_offset)
        self.metrics.watch(self)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if wanted(self.config.tracing) and not traces.on:  # one provider per process
            self._tracing = traces.start(self.node_id)
            if self._tracing:
                log.info("tracing: on, spans exported by OTLP/HTTP (the OTEL_* variables)")
        self.journal.open()
        self.engine.start()
        self.definitions.load()  # before any peer can ask for it
        self.definitions.settle()  # the queue settings it holds, in effect before any HTTP
        self.cluster.start()
        self.definitions.start()
        self._group.spawn(self.ticker.run)  # fires schedules while this node leads
        c = self.config
        address: Any = (c.http_host, c.http_port)
        if c.reuse_port:  # several processes of this host share the port
            address = _shared_listener(c.http_host.strip("[]"), c.http_port)
        app = AccessLog(self.api) if c.access_log else self.api
        self.server = HTTPServer(
            address, app,
            max_connections=connection_cap(c.max_connections, other_fds=c.concurrency),
            header_timeout=c.http_header_timeout, idle_timeout=c.http_idle_timeout,
            max_header_bytes=c.max_header_bytes, tls=self._tls_context())
        self.server.start()
        log.info("node %s serving %s://%s (cluster %s, data %s)", self.node_id,
                 "https" if c.tls_cert else "http", self.config.http,
                 "none: no key" if self.cluster.solo else self.config.cluster,
                 self.config.data_dir)

    def _tls_context(self) -> gevent.ssl.SSLContext | None:
        c = self.config
        if not c.tls_cert:
            return None
        return server_context(c.tls_cert, c.tls_key, c.tls_client_ca,
                              factory=gevent.ssl.SSLContext)

    def reload_tls(self) -> bool:
        """SIGHUP: read tls_cert, tls_key and tls_client_ca again (a renewed certificate)
        for the connections accepted from now on; the listener and the open connections
        stay. Files that do not serve are logged and the old ones kept. True: reloaded."""
        if self.server is None or not self.config.tls_cert:
            return False
        try:
            ctx = self._tls_context()
        except TLSFileError as e:
            log.error("tls: reload failed, still serving the previous certificate: %s", e)
            return False
        assert ctx is not None
        self.server.use_tls(ctx)
        log.info("tls: reloaded %s", self.config.tls_cert)
        return True

    @property
    def http_port(self) -> int:
        assert self.server is not None
        return self.server.server_port

    def _own_endpoints(self) -> tuple[tuple[str, int], ...]:
        """This node's HTTP and cluster endpoints, which no task may target (the HTTP
        port as bound, in case the configured one was 0). Every enqueue asks: the same
        tuple is answered while the bound port stays (the guard then compares only it)."""
        port = self.server.server_port if self.server is not None else None
        if self._endpoints[0] != port:
            self._endpoints = (port, self._list_endpoints())
        return self._endpoints[1]

    def _list_endpoints(self) -> tuple[tuple[str, int], ...]:
        out = [(self.config.http_host, self.config.http_port)]
        if self.server is not None and self.server.server_port:
            out.append((self.config.http_host, self.server.server_port))
        for endpoint in (self.config.cluster, self.config.advertise):
            host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            if host and port.isdigit():
                out.append((host, int(port)))
        return tuple(out)

    def serve_forever(self) -> None:
        self._stopped.wait()

    def stop(self) -> None:
        """Graceful stop: 503 for new tasks, hand due work to siblings, drain, close."""
        if self.draining:
            self._stopped.wait()
            return
        self.draining = True
        log.info("node %s stopping", self.node_id)
        self.cluster.leave()
        self.engine.stop(self.config.shutdown_timeout)
        self._group.kill()
        self.cluster.stop()
        if self.server is not None:
            self.server.stop(timeout=1)
        self.journal.close()
        if self._tracing:
            traces.stop()  # what the exporter holds goes out
        log.info("node %s stopped", self.node_id)
        self._stopped.set()

    # ------------------------------------------------------------ tasks
    def _check_open(self) -> None:
        if self.draining:
            raise Unavailable("node is stopping")

    def enqueue(self, task: Task, again: repeat.Repeat = repeat.REJECT) -> dict[str, Any]:
        """Store a new task; a repeat of a held name does what ``again`` says."""
        self._check_open()
        self.engine.queues.admit(task.queue, self.clock())  # 400 naming queue past the cap
        try:
            if traces.on:
                with traces.enqueue([task]) as traced:
                    stored = self.cluster.enqueue(traced[0])
            else:
                stored = self.cluster.enqueue(task)
        except Duplicate as e:
            if again is repeat.REJECT:
                raise
            return self._repeated(e, task, again)
        return {"status": "scheduled", "id": stored.id, "queue": stored.queue,
                "eta": stored.eta, "name": stored.name, "replicas": list(stored.replicas)}

    def _repeated(self, dup: Duplicate, task: Task, again: repeat.Repeat) -> dict[str, Any]:
        """The held task kept, or its new version on every copy (``tasks/repeat.py``)."""
        held = self.cluster.queries.get_task(dup.original_id)
        if held is None:  # ended and gone meanwhile: the name is still held
            raise dup
        new = {"params": task.params, "body": task.body, "content_type": task.content_type,
               "eta": task.eta}
        decision = repeat.decide(again, held, new, self.clock())
        status = "kept"
        if not decision.keep:
            held = self.cluster.queries.replace(
                dup.original_id, decision.changes, decision.delay,
                repeat.stamp(time.time_ns(), task.id)) or held
            status = "replaced" if decision.changes else "debounced"
        return {"status": status, "id": held["id"], "queue": held["queue"],
                "eta": held["eta"], "name": held["name"], "replicas": held["replicas"]}

    def enqueue_many(self, tasks: list[Task]) -> list[dict[str, Any]]:
        self._check_open()
        now = self.clock()
        for task in tasks:  # all or none: a queue past the cap refuses the whole batch
            self.engine.queues.admit(task.queue, now)
        if traces.on:
            with traces.enqueue(tasks) as traced:
                return self.cluster.enqueue_many(traced)
        return self.cluster.enqueue_many(tasks)

    def get_task(self, task_id: str) -> dict[str, Any] | None:
        return self.cluster.queries.get_task(task_id)

    def find_task(self, queue: str, name: str) -> dict[str, Any] | None:
        """GET /tasks?name=&queue=: the task holding a name (while it is reserved)."""
        task_id = self.cluster.queries.find_name(queue, name)
        return self.get_task(task_id) if task_id is not None else None

    def browse(self, flt: browse.Filter, after: browse.Key | None,
               limit: int) -> dict[str, Any]:
        """GET /tasks without a name: a page of tasks over the cluster."""
        return self.cluster.queries.browse(flt, after, limit)

    def rates(self, seconds: int, step: int, node: str | None) -> dict[str, Any] | None:
        """GET /rates: the last ``seconds`` of tasks per ``step``, cluster-wide or one
        node's; None if ``node`` is not a member that answers."""
        return self.cluster.queries.rates(seconds, step, node)

    def cancel(self, task_id: str) -> dict[str, Any] | None:
        return self.cluster.queries.cancel(task_id)

    def delete(self, task_id: str) -> dict[str, Any] | None:
        return self.cluster.queries.delete(task_id)

    def rerun(self, task_id: str) -> dict[str, Any] | None:
        self._check_open()
        return self.cluster.queries.rerun(task_id)

    def complete(self, task_id: str, token: str,
                 report: completion.Report) -> dict[str, Any] | None:
        """POST /tasks/<id>/complete: TokenError (403) unless ``token`` is this task's;
        Conflict (409) when its attempt is over; None when no node knows the task."""
        grant = completion.verify(self.engine.completion_key, task_id, token, self.clock())
        return self.cluster.queries.complete(grant, report)

    def heartbeat(self, task_id: str, token: str, lease: float | None) -> dict[str, Any] | None:
        """POST /tasks/<id>/heartbeat: the lease extended by ``lease`` (else the task's)."""
        grant = completion.verify(self.engine.completion_key, task_id, token, self.clock())
        return self.cluster.queries.heartbeat(grant, lease)

    def is_pull(self, queue: str) -> bool:
        return self.engine.is_pull(queue)

    def lease(self, queue: str, max_tasks: int, lease_s: float,
              wait_s: float) -> list[dict[str, Any]] | None:
        """POST /queues/<name>/lease: up to ``max_tasks`` due tasks of a pull queue,
        each leased for ``lease_s``, waiting up to ``wait_s`` for the first ones;
        Conflict (409) for a push queue, None for a queue this node does not hold."""
        self._check_open()
        if queue not in self.engine.queues:
            return None
        if not self.engine.is_pull(queue):
            raise Conflict(f"queue {queue} is in mode push: its tasks are POSTed to their "
                           "url; lease from a queue in mode pull")
        return self.cluster.queries.lease(queue, max_tasks, lease_s, wait_s)

    def ack(self, task_id: str, token: str) -> dict[str, Any] | None:
        """POST /tasks/<id>/ack: the leased task succeeded (TokenError 403, Conflict 409
        once its lease is over, None if no node knows it)."""
        return self.complete(task_id, token, completion.Report("succeeded"))

    def nack(self, task_id: str, token: str, delay: float | None) -> dict[str, Any] | None:
        """POST /tasks/<id>/nack: the leased task failed this attempt; retried after
        ``delay`` (else its backoff) while attempts last."""
        grant = completion.verify(self.engine.completion_key, task_id, token, self.clock())
        return self.cluster.queries.nack(grant, delay)

    def extend(self, task_id: str, token: str, lease_s: float | None) -> dict[str, Any] | None:
        """POST /tasks/<id>/extend: the lease runs ``lease_s`` more from now."""
        return self.heartbeat(task_id, token, lease_s)

    def resend(self, task_id: str) -> dict[str, Any] | None:
        self._check_open()
        return self.cluster.queries.resend(task_id)

    def resend_many(self, queue: str, f: dict[str, Any]) -> dict[str, Any]:
        """POST /queues/<q>/resend: the queue's ended tasks that ``f`` picks, cluster-wide."""
        self._check_open()
        result = self.cluster.queries.resend_many(queue, f)
        return {"status": "ok", "queue": queue, "action": "resend", **result}

    # ------------------------------------------------------------ queues
    def queues(self, limit: int, cursor: str = "") -> dict[str, Any]:
        """GET /queues: a page of the queues this node holds and those holding tasks on
        any node, by name after ``cursor``; ``next_cursor`` names the next page."""
        counts = self.cluster.queries.queue_counts()
        names, after = page(self._queue_names(counts), limit, cursor)
        blocked = self.cluster.queries.blocked()
        return {"queues": [self._queue_view(n, counts.get(n, {}), blocked.get(n, []))
                           for n in names],
                "next_cursor": after}

    def _queue_names(self, counts: dict[str, dict[str, int]]) -> list[str]:
        held = {q for q, c in counts.items() if any(c.get(s) for s in _HOLDING)}
        return sorted(held.union(self.engine.queues.names()))

    def queue(self, name: str) -> dict[str, Any] | None:
        """GET /queues/<name>; None if no node holds such a queue. ``sources`` says where
        each setting comes from (``definitions.queues.sources``)."""
        counts = self.cluster.queries.queue_counts()
        if name not in self.engine.queues and name not in counts:
            return None
        view = self._queue_view(name, counts.get(name, {}),
                                self.cluster.queries.blocked().get(name, []))
        sources = queue_defs.sources(self.config.queue(name), self.engine.api_settings(name))
        if view["paused"] != self.engine.queue_config(name).paused:
            sources["paused"] = "control"  # POST /queues/<name>/pause or resume
        view["sources"] = sources
        return view

    def _queue_view(self, name: str, counts: dict[str, int],
                    blocked: list[dict[str, str]]) -> dict[str, Any]:
        c, paused, limit = self.engine.dispatcher.summary(name)
        return {
            "name": name, "paused": paused, "limit": limit, "mode": c.mode,
            # its ordering keys held by a failed task (ordering_on_failure = block)
            "blocked_keys": blocked,
            "config": _settings(c),
            # a pull queue's running tasks are those a worker holds a lease on
            "leased": counts.get("running", 0) if c.mode == "pull" else 0,
            # tasks, each once; "copies" counts every replica of them
            "counts": {s: counts.get(s, 0) for s in _STATES},
            "copies": {s: counts.get(COPIES_PREFIX + s, 0) for s in _STATES},
            # since the nodes started, summed over the cluster: rates for the dashboard
            "totals": {k: counts.get(TOTAL_PREFIX + k, 0)
                       for k in ("enqueued", "delivered", "failed")},
            **_console_view(counts),
        }

    # PUT and DELETE /queues/<name>: settings through the API, cluster-wide
    def put_queue(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Set (or, None, drop) the API's values of a queue's settings on every node, once
        a majority has them on disk; the queue exists from then on. The answer shows
        the settings as written (a follower may apply them a moment after)."""
        base = self.config.queue(name)
        queue_defs.check(base, queue_defs.merged(
            self.definitions.machine.get(queue_defs.KIND, name), changes))
        self.engine.queues.room_for(name)
        status, body = self.definitions.op("merge", queue_defs.KIND, name, changes)
        _definition_answer(status, body)
        return self._settings_view(name, body.get("value") or {}, {})

    def reset_queue(self, name: str) -> dict[str, Any] | None:
        """Drop every value the API set for the queue (back to the config's); None if it
        set none."""
        status, body = self.definitions.op("delete", queue_defs.KIND, name)
        if status == 404:
            return None
        _definition_answer(status, body)
        return self._settings_view(name, None, body.get("value") or {})

    def _settings_view(self, name: str, api: dict[str, Any] | None,
                       before: dict[str, Any]) -> dict[str, Any]:
        """The queue's view with the API's settings ``api`` as written (``before``: what
        they were, when dropped)."""
        self.definitions.settle()  # in effect here at once if this node has them already
        view = self._queue_view(name, self.cluster.queries.queue_counts().get(name, {}),
                                self.cluster.queries.blocked().get(name, []))
        base = self.config.queue(name)
        q = queue_defs.resolve(base, api)
        view["config"], view["limit"] = _settings(q), queue_limit(q, self.config.concurrency)
        if api and "paused" in api:
            view["paused"] = api["paused"]
        elif "paused" in before:
            view["paused"] = base.paused
        view["sources"] = queue_defs.sources(base, api)
        return view

    def list_tasks(self, queue: str, state: State, limit: int) -> list[dict[str, Any]]:
        return self.cluster.queries.list_tasks(queue, state, limit)

    def control(self, queue: str, action: str) -> dict[str, Any] | None:
        """Pause, resume or purge a queue, cluster-wide; None (404) if no node holds it:
        a control creates no queue."""
        if queue not in self.engine.queues and queue not in self.cluster.queries.queue_counts():
            return None
        if action != "purge" and self.definitions.machine.get(queue_defs.KIND, queue) is not None:
            # the API's settings of the queue say paused too: they must not say otherwise
            status, body = self.definitions.op(action, queue_defs.KIND, queue)
            if status != 404:  # (deleted meanwhile: nothing to keep in step)
                _definition_answer(status, body)
        result = self.cluster.queries.control(queue, action)
        return {"status": "ok", "queue": queue, "action": action, **result}

    def failed(self, queue: str, action: str) -> dict[str, Any]:
        """POST /queues/<q>/failed/retry|delete: the queue's whole dead-letter list."""
        if action == "retry":
            self._check_open()
        result = self.cluster.queries.failed(queue, action)
        return {"status": "ok", "queue": queue, "action": action, **result}

    # ------------------------------------------------------------ operations
    def cluster_info(self) -> dict[str, Any]:
        """GET /cluster. A node without a cluster key binds no cluster port, so its member
        shows ``cluster: null``, not the endpoint it would bind with a key."""
        info = self.cluster.info()
        if self.cluster.solo:
            info["members"] = [dict(m, cluster=None) if m.get("id") == self.node_id else m
                               for m in info.get("members", [])]
        return info

    def target_states(self) -> list[dict[str, Any]]:
        """GET /targets: this node's view of the origins it delivers to (breakers)."""
        return self.engine.dispatcher.targets()

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "stopping"
        if not self.journal.health.ok:  # its commits fail: enqueues would get 503
            return False, f"journal: {self.journal.health.problem}"
        return self.cluster.ready()

    def clock_offset(self) -> float:
        """The cluster's clock minus ours: a client's absolute eta is on the cluster's."""
        return self.cluster.clock_offset()

    def metrics_body(self) -> bytes:
        """GET /metrics: Prometheus text exposition (``miyamoto.metrics``)."""
        return self.metrics.render()


def _settings(c: QueueConfig) -> dict[str, Any]:
    """A queue's settings as GET /queues shows them (``paused`` apart: its state)."""
    return {"rate": c.rate, "burst": c.burst, "max_concurrent": c.max_concurrent,
            "max_attempts": c.max_attempts, "min_backoff": c.min_backoff,
            "max_backoff": c.max_backoff, "max_doublings": c.max_doublings,
            "max_retry_duration": c.max_retry_duration, "timeout": c.timeout,
            "mode": c.mode, "ordering_on_failure": c.ordering_on_failure}


def _definition_answer(status: int, body: dict[str, Any]) -> None:
    """A definitions write's (status, body) as the API's exceptions: 503 Unavailable,
    409 Conflict (the cluster holds as many definitions as it may)."""
    if status == 200:
        return
    message = str(body.get("error") or "the definitions could not be written")
    if status == 409:
        raise Conflict(message)
    raise Unavailable(message)


def _console_view(counts: dict[str, int]) -> dict[str, Any]:
    """A queue's delivery latency (p50, p99 over the last minutes, from the cluster's
    summed buckets) and its targets whose breaker is open on some node (how many)."""
    buckets: dict[int, int] = {}
    breakers: dict[str, int] = {}
    for k, n in counts.items():
        if k.startswith(LATENCY_PREFIX):
            b = k[len(LATENCY_PREFIX):]
            if b.isdigit() and int(b) < BUCKETS and n > 0:
                buckets[int(b)] = n
        elif k.startswith(BREAKER_PREFIX) and n > 0:
            breakers[k[len(BREAKER_PREFIX):]] = n
    return {"latency": quantiles(buckets),
            "breakers": [{"origin": o, "nodes": n} for o, n in sorted(breakers.items())]}


def _shared_listener(host: str, port: int) -> socket.socket:
    """A listening socket with SO_REUSEPORT: the kernel spreads connections over every
    process bound to the address (``miyamoto serve --processes N``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock
