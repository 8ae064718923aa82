"""The CLI's schedule and topic commands (``miyamoto schedules``, ``schedule add|show|
delete|pause|resume``, ``topics``, ``topic put|show|delete|publish``), each a thin layer
over ``miyamoto.Client``; added to the parser by ``miyamoto.cli.commands``."""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable


def add_def_commands(sub: Any, common: argparse.ArgumentParser,
                     command: Callable[[Callable], Callable]) -> None:
    from miyamoto.cli.commands import UsageError, _params, _print

    p = sub.add_parser("schedules", parents=[common], help="list the recurring schedules")
    p.set_defaults(func=command(lambda c, a: _show(_print, c.schedules())))

    sched = sub.add_parser("schedule", help="add, show, delete, pause or resume a schedule")
    ops = sched.add_subparsers(dest="op", required=True, metavar="OP")
    add = ops.add_parser("add", parents=[common], help="create or replace a schedule")
    add.add_argument("name")
    add.add_argument("url", help="target URL of each tick's task")
    add.add_argument("params", nargs="*", help="key=value params")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='cron expression, e.g. "0 3 * * *"')
    when.add_argument("--every", type=int, metavar="SECONDS", help="a tick every N seconds")
    add.add_argument("--timezone", help="IANA zone of the cron expression (default UTC)")
    add.add_argument("--catch-up", choices=("last", "none"),
                     help="ticks missed without a leader: the newest fires, or none")
    add.add_argument("--queue", help="queue of the tasks")
    add.add_argument("--method", help="HTTP method of the tasks")
    add.add_argument("--task-json", metavar="JSON", help="more enqueue fields, as JSON")

    def do_add(c: Any, a: argparse.Namespace) -> int:
        try:
            task = json.loads(a.task_json) if a.task_json else {}
        except ValueError as e:
            raise UsageError(f"--task-json is not JSON: {e}") from None
        if not isinstance(task, dict):
            raise UsageError("--task-json must be a JSON object")
        task["url"] = a.url
        task.update({k: v for k, v in (("params", _params(a.params) or None),
                                       ("queue", a.queue), ("method", a.method)) if v})
        _print(c.schedule(a.name, task, cron=a.cron, every=a.every, timezone=a.timezone,
                          catch_up=a.catch_up))
        return 0
    add.set_defaults(func=command(do_add))
    for op, fn in (("show", "get_schedule"), ("delete", "unschedule"),
                   ("pause", "pause_schedule"), ("resume", "resume_schedule")):
        q = ops.add_parser(op, parents=[common], help=f"{op} a schedule")
        q.add_argument("name")
        q.set_defaults(func=command(lambda c, a, fn=fn: _show(_print, getattr(c, fn)(a.name))))

    _topic_commands(sub, common, command)


def _topic_commands(sub: Any, common: argparse.ArgumentParser,
                    command: Callable[[Callable], Callable]) -> None:
    from miyamoto.cli.commands import _params, _print

    p = sub.add_parser("topics", parents=[common], help="list the fan-out topics")
    p.set_defaults(func=command(lambda c, a: _show(_print, c.topics())))
    topic = sub.add_parser("topic", help="put, show, delete or publish to a fan-out topic")
    ops = topic.add_subparsers(dest="op", required=True, metavar="OP")
    put = ops.add_parser("put", parents=[common], help="create or replace a topic")
    put.add_argument("name")
    put.add_argument("urls", nargs="+", help="the topic's URLs")
    put.set_defaults(func=command(lambda c, a: _show(_print, c.put_topic(a.name, a.urls))))
    for op, fn in (("show", "topic"), ("delete", "delete_topic")):
        q = ops.add_parser(op, parents=[common], help=f"{op} a topic")
        q.add_argument("name")
        q.set_defaults(func=command(lambda c, a, fn=fn: _show(_print, getattr(c, fn)(a.name))))
    pub = ops.add_parser("publish", parents=[common], help="enqueue one task per URL")
    pub.add_argument("name")
    pub.add_argument("params", nargs="*", help="key=value params")
    pub.add_argument("--task-name", help="de-duplication name (suffixed per URL)")
    pub.add_argument("--queue", help="queue of the tasks")
    pub.set_defaults(func=command(lambda c, a: _show(_print, c.publish(
        a.name, _params(a.params) or None, name=a.task_name, queue=a.queue))))


def _show(printer: Callable[[Any], None], data: Any) -> int:
    printer(data)
    return 0
