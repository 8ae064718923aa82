"""The Python client of a Miyamoto node's HTTP API: ``from miyamoto import Client``.

It is what the CLI's client commands run on, and what applications use to enqueue
tasks. It is plain blocking ``requests`` over one keep-alive ``Session``; it imports
neither gevent nor zmq (an application may run under threads, asyncio or nothing), and
``import miyamoto`` does not import it until ``miyamoto.Client`` is first used.

Errors are exceptions, one per kind of answer (``MiyamotoError`` is the base): a taken
name is ``DuplicateTask`` carrying the original ``.id``, a rejected field is
``InvalidTask`` carrying ``.field``, 401 is ``Unauthorized``, 403 ``Forbidden``, 404
``NotFound``, another 409 ``Conflict``, and a 503 or a node that cannot be reached is
``Unavailable``.

Several nodes, failover and retries: ``Client(["http://a:8088", "http://b:8088"])``
talks to one node at a time and moves to the next on a failure that says "this node
cannot serve you now": a refused connection (or one that timed out while connecting),
a 503 (the node is not (yet) a roster member, cannot hear a majority, is stopping, or
too few replicas stored the task), a reset or a read timeout. Which of these a call
retries depends on whether it is safe to send twice (``retry_policy``):

* a refused connection, or a connect timeout, never reached a node: every call retries it;
* a 503, a reset or a read timeout came after the request may have been acted on: only a
  *safe* call retries them. Safe: every read (GET), every control call (pause, resume,
  purge, cancel, retry, the failed-list calls: each leaves the same state when repeated;
  a repeat of a cancel or retry that was done answers Conflict or NotFound), every schedule
  and topic write (a put replaces; a delete of what is gone is NotFound), and an enqueue
  whose every task is *named* (a ``name``, or ``dedupe="content"``, which the server turns
  into one): the server de-duplicates names, so a named task sent twice is stored once.
  An unnamed enqueue sent again after its answer was lost could be stored twice, so that
  is left to the caller. (A named enqueue whose earlier try was stored, its answer lost,
  answers ``DuplicateTask`` on the retry: its ``.id`` is that stored task.)

A node that failed is left for the next one in the list (for later calls too: the client
stays on the node that last answered). Switching to a node this call has not tried yet
is immediate; going back to one that already failed waits an exponential backoff with
full jitter (AWS's "Exponential Backoff and Jitter": no herd of clients retrying in
step), a Retry-After as its floor. Attempts are bounded (``retries``) and all of them,
waits included, fit in ``timeout``.
"""

from __future__ import annotations

import logging
import re
import random
import time
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import quote, urlsplit

import requests
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError

from miyamoto.version import __version__

log = logging.getLogger(__name__)

BACKOFF_BASE = 0.1  # s: the first retry waits up to this, doubling per attempt
BACKOFF_CAP = 2.0  # s: no single wait is longer


class MiyamotoError(Exception):
    """Any answer that is not a success. ``status`` is the HTTP status (None when the
    node could not be reached), ``body`` the decoded JSON answer (or {})."""

    def __init__(self, message: str, status: int | None = None,
                 body: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = dict(body or {})


class InvalidTask(MiyamotoError):
    """400/413/415: the node rejected the request; ``field`` names the culprit (for a
    batch, as ``tasks[i].field``), or is None when the answer named none."""

    def __init__(self, message: str, status: int | None = None,
                 body: Mapping[str, Any] | None = None):
        super().__init__(message, status, body)
        field = self.body.get("field")
        self.field: str | None = field if isinstance(field, str) else None


class DuplicateTask(MiyamotoError):
    """409: the task's name is taken; ``id`` is the id of the task that holds it."""

    def __init__(self, message: str, status: int | None = None,
                 body: Mapping[str, Any] | None = None):
        super().__init__(message, status, body)
        self.id: str | None = self.body.get("id")


class Conflict(MiyamotoError):
    """409 for anything but a name: the task's state does not allow the operation."""


class NotFound(MiyamotoError):
    """404: no such task (or route)."""


class Unauthorized(MiyamotoError):
    """401: no token, or a token the node does not know."""


class Forbidden(MiyamotoError):
    """403: a valid token whose scope does not allow the route."""


class Unavailable(MiyamotoError):
    """503 (the node is stopping, or too few replicas stored the task), or the node
    could not be reached at all (``status`` None). ``retry_after``: the answer's
    Retry-After in seconds, if it gave one; ``reached``: False when the request never
    got to a node (connection refused, connect timeout), so it cannot have been acted on."""

    retry_after: float | None = None
    reached: bool = True


def retry_policy(safe: bool, error: Unavailable) -> bool:
    """Whether a call may be sent again (to the next node) after ``error``: always when
    the request never reached a node, else only for a call that is ``safe`` to repeat
    (see the module docstring for which calls are)."""
    return safe or not error.reached


_BY_STATUS: dict[int, type[MiyamotoError]] = {
    400: InvalidTask, 411: InvalidTask, 413: InvalidTask, 415: InvalidTask,
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 503: Unavailable,
}


def error_for(status: int, body: Mapping[str, Any]) -> MiyamotoError:
    """The exception for a non-2xx answer and its decoded JSON body."""
    if status == 409 and body.get("status") == "duplicate":
        return DuplicateTask(f"a task with this name exists: {body.get('id')}", status, body)
    message = body.get("error") if isinstance(body.get("error"), str) else f"HTTP {status}"
    cls = _BY_STATUS.get(status) or (InvalidTask if 400 <= status < 500 else MiyamotoError)
    return cls(message, status, body)


class Client:
    """A cluster's API, through one or more of its nodes. ``base_url`` is one node, e.g.
    ``http://127.0.0.1:8088``, or a list of them (a string of comma-separated URLs too):
    the client fails over between them (see the module docstring). ``token`` is an API
    bearer token (see the server's ``api_tokens``); ``timeout`` bounds each call,
    retries included; ``retries`` is the most attempts a call makes. Over https, ``ca``
    is the PEM file of the CA that signed the nodes' certificate (default: the system's),
    ``cert`` the client certificate for mutual TLS: a PEM path holding certificate and
    key, or a (certificate, key) pair of paths."""

    def __init__(self, base_url: str | Sequence[str] = "http://127.0.0.1:8088",
                 token: str | None = None, timeout: float = 30.0, retries: int = 10,
                 session: requests.Session | None = None, rng: random.Random | None = None,
                 *, ca: str | None = None, cert: str | tuple[str, str] | None = None):
        urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
        self.urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not self.urls:
            raise ValueError("Client needs at least one node URL")
        self._at = 0  # the node the next call goes to
        self.timeout = float(timeout)
        self.retries = max(1, int(retries))
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"miyamoto-client/{__version__}"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        # per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a
        # session's verify (psf/requests#3829), so a given CA is passed with each call
        self._verify: str | None = ca or None  # None: as requests decides without one
        if cert:
            self.session.cert = cert
        self._rng = rng or random.Random()

    def clone(self) -> "Client":
        """A client of the same nodes, token, TLS and limits on a session of its own (a
        session is not shared between threads: ``miyamoto work`` gives each its own)."""
        other = Client(self.urls, timeout=self.timeout, retries=self.retries, rng=self._rng,
                       ca=self._verify, cert=self.session.cert)
        other.session.headers.update(self.session.headers)
        return other

    @property
    def base_url(self) -> str:
        """The node the next call goes to."""
        return self.urls[self._at % len(self.urls)]

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:  # never the token
        return f"Client({self.urls[0] if len(self.urls) == 1 else self.urls!r})"

    # ------------------------------------------------------------ tasks
    def enqueue(self, url: str | None, params: Mapping[str, Any] | None = None,
                **fields: Any) -> dict[str, Any]:
        """Enqueue one task; returns the node's answer (``status``, ``id``, ``eta`` ...).

        ``fields`` are the task fields of the API (method, countdown, eta, name, queue,
        headers, json, body, content_type, max_attempts, timeout, callback,
        failure_callback, priority, flow_key, flow_rate, flow_parallelism,
        dedupe="content", ttl, expires_at, retry_delays=[1, 10, 60], labels={"k": "v"};
        ``url`` None: a task of a pull queue, which workers lease (``lease``);
        with a name:
        on_duplicate="keep"|"replace", debounce, debounce_max, when the answer's ``status``
        is ``kept``, ``replaced`` or ``debounced`` and its ``id`` the held task's); None
        values are left out. Raises DuplicateTask, InvalidTask, Unavailable ... A task named by the
        server after its content is retried on a 503 like a named one: sent twice, it is
        stored once."""
        task = _task(url, params, fields)
        named = task.get("name") is not None or task.get("dedupe") == "content"
        return self._call("POST", "/queue", json=task, safe=named)

    def enqueue_batch(self, tasks: Iterable[Mapping[str, Any]],
                      queue: str = "default") -> list[dict[str, Any]]:
        """Enqueue task dicts (each with ``url`` and the fields of ``enqueue``) into one
        queue in one request; all are valid or none is stored. Returns one result per
        task, in order: ``status`` is ``scheduled``, ``duplicate`` (``id`` the original)
        or ``error`` (``error`` says why; that one was not stored)."""
        body = [{k: v for k, v in t.items() if v is not None} for t in tasks]
        named = bool(body) and all(t.get("name") is not None or t.get("dedupe") == "content"
                                   for t in body)
        answer = self._call("POST", f"/queue/{_seg(queue)}/batch", json=body, safe=named)
        return list(answer.get("tasks", []))

    def get(self, task_id: str) -> dict[str, Any]:
        """A task's state, attempts, last response, replicas; NotFound if unknown."""
        return self._call("GET", f"/tasks/{_seg(task_id)}")

    def find(self, name: str, queue: str = "default") -> dict[str, Any]:
        """The task holding ``name`` in ``queue`` (while the dedup window keeps the name);
        NotFound if none."""
        return self._call("GET", "/tasks", params={"name": name, "queue": queue})

    def cancel(self, task_id: str) -> dict[str, Any]:
        """Cancel a scheduled task on every replica, or delete a failed one (state
        "deleted"); Conflict if it succeeded."""
        return self._call("DELETE", f"/tasks/{_seg(task_id)}", safe=True)

    def retry(self, task_id: str) -> dict[str, Any]:
        """Run a failed (or cancelled) task again."""
        return self._call("POST", f"/tasks/{_seg(task_id)}/retry", safe=True)

    def resend(self, task_id: str) -> dict[str, Any]:
        """Run an ended task again (a succeeded one too), under the same id; Conflict if
        it has not ended."""
        return self._call("POST", f"/tasks/{_seg(task_id)}/resend")

    def complete(self, url_or_id: str, state: str = "succeeded", result: Any = None, *,
                 token: str | None = None) -> dict[str, Any]:
        """A long task's worker reports: ``url_or_id`` is the X-Task-Complete-Url its
        delivery carried (sent to that node), or the task's id with ``token`` (sent to
        this client's nodes). ``state``: succeeded or failed; ``result``: any JSON, at
        most 4 KiB. Forbidden for a bad token, Conflict when the attempt is over."""
        body: dict[str, Any] = {"state": state}
        if result is not None:
            body["result"] = result
        return self._long_task(url_or_id, "complete", token, json=body)

    def heartbeat(self, url_or_id: str, lease: float | None = None, *,
                  token: str | None = None) -> dict[str, Any]:
        """Extend a long task's lease from now (by ``lease`` seconds, else its own):
        ``url_or_id`` as for ``complete`` (its complete or heartbeat URL)."""
        return self._long_task(url_or_id, "heartbeat", token,
                               json={} if lease is None else {"lease": lease})

    def _long_task(self, url_or_id: str, action: str, token: str | None,
                   **kw: Any) -> dict[str, Any]:
        parts = urlsplit(url_or_id)
        if parts.scheme in ("http", "https"):
            path = re.sub(r"/(complete|heartbeat)$", "/" + action, parts.path)
            base = f"{parts.scheme}://{parts.netloc}"
            return self._once("POST", base, f"{path}?{parts.query}", self.timeout, **kw)
        if not token:
            raise MiyamotoError("give the completion URL, or the task's id and its token")
        return self._call("POST", f"/tasks/{_seg(url_or_id)}/{action}",
                          params={"token": token}, **kw)

    # pull queues: a worker leases due tasks and answers each with its lease's token
    def lease(self, queue: str = "default", max_tasks: int = 1, lease_s: float = 60.0,
              wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Up to ``max_tasks`` (1-100) due tasks of a pull queue, each leased for
        ``lease_s`` seconds, waiting up to ``wait_s`` (at most 60) for the first. Each
        is a dict with ``id``, ``params``/``body``, ``headers``, ``attempt``, ``token``
        and ``lease_until``; answer it with ``ack``, ``nack`` or ``extend`` before the
        lease ends, or it is retried. Conflict for a push queue, NotFound for an
        unknown one. A lost answer's leases run out and are leased again, so the call
        fails over to the next node."""
        body = {"max_tasks": max_tasks, "lease_s": lease_s, "wait_s": wait_s}
        answer = self._call("POST", f"/queues/{_seg(queue)}/lease", safe=True,
                            budget=self.timeout + wait_s, json=body)
        return list(answer.get("tasks", []))

    def ack(self, task: Mapping[str, Any] | str, token: str | None = None) -> dict[str, Any]:
        """A leased task succeeded: ``task`` as ``lease`` gave it (or its id, with
        ``token``). Forbidden for a bad token, Conflict once the lease is over."""
        task_id, token = _leased(task, token)
        return self._call("POST", f"/tasks/{_seg(task_id)}/ack", json={"token": token})

    def nack(self, task: Mapping[str, Any] | str, token: str | None = None,
             delay: float | None = None) -> dict[str, Any]:
        """A leased task failed this attempt: retried after ``delay`` seconds (else its
        backoff) while attempts last."""
        task_id, token = _leased(task, token)
        body: dict[str, Any] = {"token": token}
        if delay is not None:
            body["delay"] = delay
        return self._call("POST", f"/tasks/{_seg(task_id)}/nack", json=body)

    def extend(self, task: Mapping[str, Any] | str, token: str | None = None,
               lease_s: float | None = None) -> dict[str, Any]:
        """The lease runs ``lease_s`` more seconds from now (else its own span again)."""
        task_id, token = _leased(task, token)
        body: dict[str, Any] = {"token": token}
        if lease_s is not None:
            body["lease_s"] = lease_s
        return self._call("POST", f"/tasks/{_seg(task_id)}/extend", json=body)

    def resend_many(self, queue: str = "default", state: str = "failed",
                    target: str | None = None, since: float | None = None,
                    until: float | None = None) -> dict[str, Any]:
        """Resend a queue's ended tasks in ``state`` whose url starts with ``target`` and
        that ended in [since, until), cluster-wide: ``count``, and ``more`` (call again)."""
        params = {k: v for k, v in (("state", state), ("target", target), ("since", since),
                                    ("until", until)) if v is not None}
        return self._call("POST", f"/queues/{_seg(queue)}/resend", params=params)

    def tasks(self, queue: str = "default", state: str = "scheduled",
              limit: int = 100) -> list[dict[str, Any]]:
        """Up to ``limit`` (1-1000) of a queue's tasks in ``state``."""
        answer = self._call("GET", f"/queues/{_seg(queue)}/tasks",
                            params={"state": state, "limit": str(limit)})
        return list(answer.get("tasks", []))

    def browse(self, state: str = "scheduled", *, queue: str | None = None,
               target: str | None = None, name_prefix: str | None = None,
               label: str | None = None, since: float | None = None,
               until: float | None = None, cursor: str | None = None,
               limit: int = 50) -> dict[str, Any]:
        """A page of tasks in ``state`` over the cluster, filtered by queue, target (a URL
        prefix), name prefix, a ``label`` ("key=value") and a time range (``since`` /
        ``until``: unix times of the page's order, a live task's next attempt, an ended
        one's end): ``tasks`` and ``next_cursor`` (None on the last page), the next
        call's ``cursor``."""
        params = {"state": state, "limit": str(limit), "queue": queue, "target": target,
                  "name_prefix": name_prefix, "label": label, "cursor": cursor,
                  "since": None if since is None else repr(float(since)),
                  "until": None if until is None else repr(float(until))}
        return self._call("GET", "/tasks", params={k: v for k, v in params.items()
                                                   if v is not None})

    def rates(self, seconds: int = 300, node: str | None = None) -> dict[str, Any]:
        """Tasks enqueued, delivered and failed over the last ``seconds`` (60-3600), in
        points of ``step`` seconds: the cluster's sum, or ``node``'s own."""
        params = {"seconds": str(seconds), **({"node": node} if node else {})}
        return self._call("GET", "/rates", params=params)

    # ------------------------------------------------------------ queues
    def queues(self) -> list[dict[str, Any]]:
        """Every queue's config, paused flag and counts per state (every page of them)."""
        out: list[dict[str, Any]] = []
        cursor = None
        while True:
            answer = self._call("GET", "/queues",
                                params=None if cursor is None else {"cursor": cursor})
            out.extend(answer.get("queues", []))
            cursor = answer.get("next_cursor")
            if not cursor:
                return out

    def queue(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/queues/{_seg(name)}")

    def set_queue(self, name: str, **settings: Any) -> dict[str, Any]:
        """Set a queue's settings on every node (``rate``, ``burst``, ``max_concurrent``,
        ``max_attempts``, ``min_backoff``, ``max_backoff``, ``max_doublings``,
        ``max_retry_duration``, ``timeout``, ``paused``); None drops the value set
        before (back to the config's), a setting not given keeps it. Makes the queue.
        Returns the queue with each setting's ``sources``; InvalidTask names a bad one."""
        return self._call("PUT", f"/queues/{_seg(name)}", json=settings, safe=True)

    def reset_queue(self, name: str) -> dict[str, Any]:
        """Drop every setting made through set_queue (NotFound if none was)."""
        return self._call("DELETE", f"/queues/{_seg(name)}", safe=True)

    def pause(self, queue: str) -> dict[str, Any]:
        """Stop starting deliveries of a queue, on every node."""
        return self._call("POST", f"/queues/{_seg(queue)}/pause", safe=True)

    def resume(self, queue: str) -> dict[str, Any]:
        return self._call("POST", f"/queues/{_seg(queue)}/resume", safe=True)

    def purge(self, queue: str) -> dict[str, Any]:
        """Drop every scheduled task of a queue; the answer's ``purged`` counts them."""
        return self._call("POST", f"/queues/{_seg(queue)}/purge", safe=True)

    def retry_failed(self, queue: str) -> dict[str, Any]:
        """Run every failed task of a queue again: ``count`` tasks, ``more`` if some
        node held more than one request does (call again)."""
        return self._call("POST", f"/queues/{_seg(queue)}/failed/retry", safe=True)

    def delete_failed(self, queue: str) -> dict[str, Any]:
        """Delete every failed task of a queue (``count``, ``more`` as retry_failed)."""
        return self._call("POST", f"/queues/{_seg(queue)}/failed/delete", safe=True)

    # ------------------------------------------------------------ schedules
    def schedule(self, name: str, task: Mapping[str, Any], *, cron: str | None = None,
                 every: int | None = None, timezone: str | None = None,
                 catch_up: str | None = None, paused: bool | None = None,
                 cron_seconds_last: bool | None = None) -> dict[str, Any]:
        """Create or replace a recurring schedule: ``task`` holds enqueue fields (``url``,
        ``params``, ``queue``...); give ``cron`` ("0 3 * * *", "@daily") or ``every``
        (seconds); a 6-field cron (croniter's seconds, last) needs ``cron_seconds_last``.
        Returns the schedule with its next fire times; InvalidTask names a bad field."""
        body: dict[str, Any] = {"name": name, "task": dict(task)}
        for key, value in (("cron", cron), ("every", every), ("timezone", timezone),
                           ("catch_up", catch_up), ("paused", paused),
                           ("cron_seconds_last", cron_seconds_last)):
            if value is not None:
                body[key] = value
        return self._call("POST", "/schedules", json=body, safe=True)

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule with its next fire times and last task ids."""
        return list(self._call("GET", "/schedules").get("schedules", []))

    def get_schedule(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/schedules/{_seg(name)}")

    def unschedule(self, name: str) -> dict[str, Any]:
        """Delete a schedule (NotFound if there is none)."""
        return self._call("DELETE", f"/schedules/{_seg(name)}", safe=True)

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/schedules/{_seg(name)}/pause", safe=True)

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/schedules/{_seg(name)}/resume", safe=True)

    def run_schedule(self, name: str, idempotency_key: str | None = None) -> dict[str, Any]:
        """Enqueue the schedule's task once, now (``schedule``, ``status``, ``id``);
        NotFound if there is no such schedule. With a key, a repeat is DuplicateTask
        (so it is retried on a 503 like a named enqueue)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._call("POST", f"/schedules/{_seg(name)}/run", headers=headers,
                          safe=idempotency_key is not None)

    # ------------------------------------------------------------ topics
    def put_topic(self, name: str, urls: Sequence[str]) -> dict[str, Any]:
        """Create or replace a fan-out topic: enqueueing with it makes one task per URL."""
        return self._call("PUT", f"/topics/{_seg(name)}", json={"urls": list(urls)},
                          safe=True)

    def topics(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/topics").get("topics", []))

    def topic(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/topics/{_seg(name)}")

    def delete_topic(self, name: str) -> dict[str, Any]:
        return self._call("DELETE", f"/topics/{_seg(name)}", safe=True)

    def publish(self, topic: str, params: Mapping[str, Any] | None = None,
                **fields: Any) -> dict[str, Any]:
        """Enqueue one task per URL of ``topic``: ``{"status", "ids", "tasks": [{"url",
        "id"}...]}``. ``fields`` as ``enqueue`` takes them (a ``name`` is suffixed per URL)."""
        body: dict[str, Any] = {"topic": topic}
        if params:
            body["params"] = dict(params)
        body.update({k: v for k, v in fields.items() if v is not None})
        return self._call("POST", "/queue", json=body, safe=body.get("name") is not None)

    # ------------------------------------------------------------ operations
    def cluster(self) -> dict[str, Any]:
        """The roster, leader, term, this node, and the peers' health."""
        return self._call("GET", "/cluster")

    def targets(self) -> list[dict[str, Any]]:
        """The target origins this node delivered to recently: ``origin``, breaker
        ``state`` (closed, open, half_open), ``failures``, ``inflight``, ``retry_at``."""
        return list(self._call("GET", "/targets").get("targets", []))

    # ------------------------------------------------------------ the wire
    def _call(self, method: str, path: str, *, safe: bool | None = None,
              budget: float | None = None, **kw: Any) -> dict[str, Any]:
        """One API call, failing over between the nodes as ``retry_policy`` allows while
        attempts and the deadline (``budget``, else the client's timeout) last.
        ``safe``: the call may be sent twice (default: a GET is, nothing else)."""
        safe = method == "GET" if safe is None else safe
        deadline = time.monotonic() + (self.timeout if budget is None else budget)
        failed: set[int] = set()  # nodes that failed during this call
        attempt = 0
        while True:
            attempt += 1
            at = self._at % len(self.urls)
            try:
                return self._once(method, self.urls[at], path,
                                  max(deadline - time.monotonic(), 0.001), **kw)
            except Unavailable as e:
                failed.add(at)
                self._at = at + 1  # this node failed: the next call starts elsewhere
                wait = 0.0 if self._at % len(self.urls) not in failed else \
                    self._backoff(attempt, e)
                if (not retry_policy(safe, e) or attempt >= self.retries
                        or time.monotonic() + wait >= deadline):
                    raise
                log.info("miyamoto client: %s %s: %s; attempt %d to %s in %.2f s", method,
                         path, e.message, attempt + 1, self.base_url, wait)
                time.sleep(wait)

    def _backoff(self, attempt: int, error: "Unavailable") -> float:
        """Full jitter over an exponential cap; a Retry-After (seconds) is a floor."""
        wait = self._rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1)))
        after = error.retry_after
        return wait if after is None else max(wait, min(after, BACKOFF_CAP))

    def _once(self, method: str, base: str, path: str, timeout: float,
              **kw: Any) -> dict[str, Any]:
        url = base + path
        try:
            resp = self.session.request(method, url, timeout=timeout, allow_redirects=False,
                                        verify=self._verify, **kw)
        except requests.ConnectTimeout:
            raise _unreached(f"cannot reach {base}: no connection within {timeout:.3g} s") from None
        except requests.exceptions.SSLError as e:  # a setup to fix, not a node to skip
            raise MiyamotoError(f"cannot talk TLS to {base}: {_reason(e)} (the CA that signed "
                                "its certificate: ca=, --cacert; for mutual TLS a client "
                                "certificate: cert=, --cert)") from None
        except requests.ConnectionError as e:
            error = Unavailable(f"cannot reach {base}: {_reason(e)}")
            error.reached = not _never_sent(e)
            raise error from None
        except requests.Timeout:
            raise Unavailable(f"{base} did not answer within {timeout:.3g} s") from None
        except requests.RequestException as e:
            raise MiyamotoError(f"{method} {url}: {e}") from None
        body = _json(resp)
        if 200 <= resp.status_code < 300:
            return body
        error = error_for(resp.status_code, body)
        if isinstance(error, Unavailable):
            error.retry_after = _retry_after(resp.headers.get("Retry-After"))
        raise error


def _unreached(message: str) -> Unavailable:
    error = Unavailable(message)
    error.reached = False
    return error


def _never_sent(e: BaseException) -> bool:
    """Whether a connection error happened before a byte of the request left: urllib3's
    NewConnectionError (refused, unreachable, no such host) is raised while connecting;
    a reset or a closed connection after that may follow a request the node acted on."""
    seen: BaseException | None = e
    for _ in range(10):  # requests wraps urllib3's MaxRetryError, whose reason is the cause
        if seen is None:
            return False
        if isinstance(seen, (NewConnectionError, ConnectTimeoutError, ConnectionRefusedError)):
            return True
        if isinstance(seen, MaxRetryError):
            seen = seen.reason
            continue
        nxt = seen.__cause__ or seen.__context__
        if nxt is None and seen.args and isinstance(seen.args[0], BaseException):
            nxt = seen.args[0]
        seen = nxt
    return False


def _task(url: str | None, params: Mapping[str, Any] | None,
          fields: Mapping[str, Any]) -> dict[str, Any]:
    task: dict[str, Any] = {} if url is None else {"url": url}
    if params:
        task["params"] = dict(params)
    task.update({k: v for k, v in fields.items() if v is not None})
    return task


def _leased(task: Mapping[str, Any] | str, token: str | None) -> tuple[str, str]:
    """(id, token) of a leased task given as ``lease`` answered it, or as its id."""
    if isinstance(task, Mapping):
        task_id, token = str(task.get("id", "")), token or task.get("token")
    else:
        task_id = task
    if not task_id or not token:
        raise MiyamotoError("give the leased task as lease answered it, or its id and token")
    return task_id, str(token)


def _seg(value: str) -> str:
    """One path segment, so an id or queue name can never reach another route."""
    return quote(str(value), safe="")


def _json(resp: requests.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"status": "error", "error": f"HTTP {resp.status_code}: {resp.text[:200]}"}
    return data if isinstance(data, dict) else {"result": data}


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _reason(e: BaseException) -> str:
    """The innermost cause of a connection error ("Connection refused"), not urllib3's
    long chain of reprs."""
    inner: BaseException = e
    for _ in range(10):
        nxt = inner.__cause__ or inner.__context__
        if nxt is None:
            break
        inner = nxt
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(inner) or type(inner).__name__
