"""Recurring schedules: their validation, their ticks, their firing.

A schedule is a cluster-wide definition (``miyamoto.definitions.machine``, kind "schedule"): a
``cron`` expression in a ``timezone``, or ``every`` N seconds (ticks at the unix times that
are multiples of N), and the ``task`` it enqueues, checked like an enqueue when the schedule
is posted.

What ``cron`` takes, and why
    5 fields, or croniter's aliases (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``,
    ``@yearly``), as Cloud Scheduler takes them. A bad field is a 400 that names it, with
    croniter's own words; an expression no date matches (``0 0 31 2 *``) is a 400 too, as it
    would be stored and never fire. A sixth field is croniter's seconds, *last*, where Quartz
    and Spring put seconds first: ``*/5 * * * * *`` would tick every second of every fifth
    minute, not every 5 s. So 6 fields are taken only with ``cron_seconds_last: true``.

Who fires, and why a tick fires once
    Only the leader fires, and only once it holds a majority's definitions (``ready``),
    hears a majority and has its clock placed within ``max_clock_skew`` of the
    cluster's (``miyamoto.cluster.clocks``; a leader further off steps down). Ticks are
    judged on the cluster's clock. For each schedule it takes the latest tick due (``latest``)
    and, if that tick is newer than the schedule's cursor, enqueues the task through
    the normal enqueue path (replicated like a client's task) under the name
    ``schedule:<name>:<tick>``. Then it writes the cursor (kind "cursor": the tick and
    the last task ids) through the definitions, majority-acked. A leader that dies after
    the enqueue and before the cursor write leaves the next leader to enqueue the same
    name again: the name is still reserved (``dedup_window``, 1 h, far longer than a
    leader change takes), so it answers "duplicate" and the tick is not delivered
    twice; the cursor is what keeps a tick older than the window (a daily cron after a
    long outage) from firing again.

Ticks missed while no leader existed (``catch_up``, a per-schedule field whose default
is the ``schedule_catch_up`` option)
    ``last``: the newest missed tick fires once when a leader is back (older ones are
    skipped: a backlog of identical ticks helps nobody). ``none``: a tick fires only
    within ``GRACE`` seconds of its time; missed ones are skipped.

Last task ids: kept in the replicated cursor (the last ``LAST_IDS``), so every member
answers ``GET /schedules/<name>`` alike and a new leader knows them.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any, Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import gevent
import gevent.pool
from croniter import CroniterBadDateError, CroniterError, croniter

from miyamoto.definitions.messages import MAX_VALUE, fits
from miyamoto.definitions.sync import DefSync
from miyamoto.errors import Duplicate, Unavailable
from miyamoto.tasks.task import Task
from miyamoto.tasks.validate import Limits, ValidationError, build_task

log = logging.getLogger(__name__)

PERIOD = 0.2        # seconds between the leader's looks at its schedules
GRACE = 2.0         # catch_up = none: how late a tick may still fire
LAST_IDS = 10       # task ids kept per schedule
MAX_EVERY = 366 * 86400
MAX_SCHEDULES = 1000
FIRE_PARALLEL = 32  # enqueues in flight at once when many ticks are due together
NAME_CHARS = 100
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_FIELDS = {"name", "cron", "cron_seconds_last", "every", "timezone", "task", "catch_up",
           "paused"}
_CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week", "second")
_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


def check_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS or set(name) - _NAME_OK:
        raise ValidationError(field, f"must be 1-{NAME_CHARS} characters of A-Z a-z 0-9 _ - .")
    return name


def parse_schedule(data: Any, *, limits: Limits, now: float, catch_up: str) -> dict[str, Any]:
    """The stored value of a POSTed schedule, or ValidationError naming the field."""
    if not isinstance(data, dict):
        raise ValidationError("body", "must be a JSON object")
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValidationError(sorted(unknown)[0], "unknown field")
    name = check_name(data.get("name"))
    value: dict[str, Any] = {"name": name, "created": math.floor(now)}
    if ("cron" in data) == ("every" in data):
        raise ValidationError("cron", "give exactly one of cron and every")
    tz = check_timezone(data.get("timezone", "UTC"))
    if "cron" in data:
        value.update(check_cron(data["cron"], data.get("cron_seconds_last", False), tz, now))
    else:
        if "cron_seconds_last" in data:
            raise ValidationError("cron_seconds_last", "goes with cron, not every")
        every = data["every"]
        if type(every) is not int or not 1 <= every <= MAX_EVERY:
            raise ValidationError("every", f"must be an integer of seconds, 1 to {MAX_EVERY}")
        value["every"] = every
    value["timezone"] = tz
    value["catch_up"] = data.get("catch_up", catch_up)
    if value["catch_up"] not in ("last", "none"):
        raise ValidationError("catch_up", "must be last or none")
    if not isinstance(data.get("paused", False), bool):
        raise ValidationError("paused", "must be true or false")
    value["paused"] = data.get("paused", False)
    task = data.get("task")
    if not isinstance(task, dict):
        raise ValidationError("task", "must be an object of enqueue fields")
    for banned in ("name", "eta"):
        if banned in task:
            raise ValidationError(f"task.{banned}", "is set by the schedule")
    try:
        build_task(task, path_queue=None, idempotency_key=None, limits=limits, now=now)
    except ValidationError as e:
        raise ValidationError(f"task.{e.field}", e.message, e.status) from None
    value["task"] = task
    if not fits(value):  # no peer would take it: it could never reach a majority
        raise ValidationError("task", f"makes the schedule larger than {MAX_VALUE // 1024} KiB "
                                      "as JSON, the most one definition may be", 413)
    return value


def check_timezone(tz: Any) -> str:
    try:
        if not isinstance(tz, str) or not tz or len(tz) > 64:
            raise ValueError(tz)
        ZoneInfo(tz)
    except (ValueError, ZoneInfoNotFoundError):
        raise ValidationError("timezone", "must be an IANA time zone, e.g. Europe/Paris") \
            from None
    return tz


def check_cron(cron: Any, seconds_last: Any, tz: str, now: float) -> dict[str, Any]:
    """The stored cron fields of a schedule (see "What cron takes" above), or
    ValidationError naming ``cron`` (or ``cron_seconds_last``) in croniter's words."""
    if not isinstance(seconds_last, bool):
        raise ValidationError("cron_seconds_last", "must be true or false")
    if not isinstance(cron, str) or not cron.strip():
        raise ValidationError("cron", 'must be a cron expression of 5 fields, e.g. "0 3 * * *", '
                                      "or an alias such as @daily")
    parts = cron.split()
    if len(parts) == 1 and parts[0].startswith("@"):
        if parts[0].lower() not in _ALIASES:
            raise ValidationError("cron", f"{parts[0]!r} is not one of " + ", ".join(_ALIASES))
        parts = [parts[0].lower()]
    elif len(parts) == 6 and not seconds_last:
        raise ValidationError("cron", "has 6 fields: croniter reads the sixth as seconds, last "
                              "(Quartz and Spring put seconds first), so */5 * * * * * would "
                              "tick every second of every fifth minute; for ticks under a "
                              'minute use "every", or send "cron_seconds_last": true to mean '
                              "seconds last")
    elif len(parts) not in (5, 6):
        raise ValidationError("cron", f"has {len(parts)} fields: a cron expression has 5 "
                              "(minute hour day-of-month month day-of-week)")
    if seconds_last and len(parts) != 6:
        raise ValidationError("cron_seconds_last", "needs a cron of 6 fields, seconds last")
    expr = " ".join(parts)
    try:
        croniter(expr, datetime.fromtimestamp(now, ZoneInfo(tz))).get_next(float)
    except CroniterBadDateError:
        raise ValidationError("cron", f"{expr!r} matches no date, so it would never fire") \
            from None
    except (CroniterError, ValueError, KeyError) as e:  # croniter's words, and the field's name
        raise ValidationError("cron", _bad_field(parts) + str(e)) from None
    return {"cron": expr, **({"cron_seconds_last": True} if seconds_last else {})}


def _bad_field(parts: list[str]) -> str:
    """``has a bad minute field '61': `` for the first field croniter refuses alone."""
    for i, part in enumerate(parts if len(parts) > 1 else []):
        probe = ["*"] * len(parts)
        probe[i] = part
        if not croniter.is_valid(" ".join(probe)):
            return f"has a bad {_CRON_FIELDS[i]} field {part!r}: "
    return "is not a cron expression: "


def latest(value: dict, now: float) -> float | None:
    """The newest tick at or before ``now`` (and not before the schedule was made)."""
    if "every" in value:
        t = math.floor(now / value["every"]) * value["every"]
    else:
        it = croniter(value["cron"], datetime.fromtimestamp(math.floor(now) + 1,
                                                            ZoneInfo(value["timezone"])))
        t = it.get_prev(float)
    return float(t) if t >= value.get("created", 0) else None


def upcoming(value: dict, now: float, n: int = 5) -> list[float]:
    """The next ``n`` ticks after ``now``."""
    if "every" in value:
        e = value["every"]
        first = (math.floor(now / e) + 1) * e
        return [float(first + i * e) for i in range(n)]
    it = croniter(value["cron"], datetime.fromtimestamp(now, ZoneInfo(value["timezone"])))
    return [it.get_next(float) for _ in range(n)]


def view(value: dict, cursor: dict | None, now: float) -> dict[str, Any]:
    """A schedule as GET /schedules answers it: ``next`` in unix seconds, ``next_at`` the
    same times in RFC 3339 in the schedule's time zone. A stored cron that matches no date
    (taken before such a cron was refused, or from an older peer) shows, with its
    ``error``, so it can be seen and deleted."""
    out: dict[str, Any] = {"name": value["name"]}
    if "cron" in value:
        out["cron"] = value["cron"]
        if value.get("cron_seconds_last"):
            out["cron_seconds_last"] = True
    else:
        out["every"] = value["every"]
    try:
        nxt = [] if value["paused"] else upcoming(value, now)
    except CroniterBadDateError:
        nxt, out["error"] = [], "the cron expression matches no date: it never fires"
    zone = ZoneInfo(value["timezone"])
    out.update(timezone=value["timezone"], catch_up=value["catch_up"],
               paused=value["paused"], next=nxt,
               next_at=[datetime.fromtimestamp(t, zone).isoformat() for t in nxt],
               last_tick=(cursor or {}).get("tick"),
               last_task_ids=list((cursor or {}).get("ids", [])), task=value["task"])
    return out


def due(value: dict, cursor: dict | None, now: float) -> float | None:
    """The tick to fire now, if any (see ``catch_up`` in the module docstring)."""
    if value.get("paused"):
        return None
    t = latest(value, now)
    if t is None or (cursor is not None and t <= cursor.get("tick", -1)):
        return None
    if value.get("catch_up") == "none" and now - t > GRACE:
        return None
    return t


class Ticker:
    """The leader's loop over its schedules (a greenlet the node owns)."""

    def __init__(self, defs: DefSync, enqueue: Callable[[Task], Task],
                 may_fire: Callable[[], bool], limits: Limits, clock: Callable[[], float],
                 offset: Callable[[], float] = lambda: 0.0):
        self.defs = defs
        self.enqueue = enqueue
        self.may_fire = may_fire
        self.limits = limits
        self.clock = clock    # ours: the enqueued task's times
        self.offset = offset  # the cluster's clock minus ours: ticks are on the cluster's
        self.fired = 0
        self._pool = gevent.pool.Pool(FIRE_PARALLEL)
        self._unfit: dict[str, dict] = {}  # name -> a value that cannot fire, logged once

    def run(self) -> None:
        while True:
            try:
                if self.defs.machine.ready and self.may_fire():
                    self.fire_due()
            except Exception:
                log.exception("schedules: a round failed")
            gevent.sleep(PERIOD)

    def fire_due(self) -> None:
        """Enqueue every due tick (in parallel: a thousand schedules must not take a
        thousand round trips), then record them all in one replicated write. A tick is
        due by the cluster's clock (a leader 30 s ahead fired every tick 30 s early); its
        task is due at once, on ours."""
        local = self.clock()
        now = local + self.offset()
        items = self.defs.machine.items("schedule")
        names = {name for name, _ in items}
        self._unfit = {n: v for n, v in self._unfit.items() if n in names}
        cursors = [c for c in self._pool.imap(lambda item: self._fire(*item, now, local),
                                              items) if c is not None]
        if cursors:
            try:
                self.defs.write(cursors)
            except Exception as e:  # not confirmed: the names dedupe the next try
                log.warning("schedules: cursors not confirmed: %s", e)

    def _fire(self, name: str, value: dict, now: float, local: float
              ) -> tuple[str, str, dict | None] | None:
        """The new cursor of schedule ``name`` if a tick of it was enqueued now."""
        try:
            cursor = self.defs.machine.get("cursor", name)
            tick = due(value, cursor, now)
            if tick is None:
                return None
            task_id = self._enqueue(name, value, tick, local)
        except (ValueError, KeyError, TypeError) as e:  # a bad value: skip, say so once
            if self._unfit.get(name) != value:
                self._unfit[name] = value
                log.warning("schedules: %s cannot fire until it is replaced or deleted: %s",
                            name, e)
            return None
        self._unfit.pop(name, None)
        if task_id is None:
            return None
        ids = (list((cursor or {}).get("ids", [])) + [task_id])[-LAST_IDS:]
        return ("cursor", name, {"tick": tick, "ids": ids})

    def _enqueue(self, name: str, value: dict, tick: float, now: float) -> str | None:
        fields = dict(value["task"], name=f"schedule:{name}:{int(tick)}")
        task = build_task(fields, path_queue=None, idempotency_key=None, limits=self.limits,
                          now=now)
        try:
            stored = self.enqueue(task)
        except Duplicate as e:
            return e.original_id
        except (Unavailable, ValidationError) as e:
            log.warning("schedules: tick %d of %s not enqueued: %s", tick, name, e)
            return None
        self.fired += 1
        log.info("schedules: %s fired tick %d as task %s", name, tick, stored.id)
        return stored.id
