"""The CLI's client commands, each a thin layer over ``miyamoto.Client``.

Exit codes: 0 done; 1 the node said no (any MiyamotoError) or could not be reached;
2 bad usage (argparse's own code). Answers go to stdout as JSON, or as a table where a
person reads them (``status``, ``tasks``; ``--json`` for the raw answer); errors go to
stderr as one ``miyamoto: ...`` line. Nothing here imports requests until a command
runs, so building the parser for ``serve`` stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from miyamoto.cli.tables import failed_lines, status_lines, task_lines
from miyamoto.cli import work
from miyamoto.cli.times import parse_time, readable
from miyamoto.cli.usage import UsageError

DEFAULT_SERVER = "http://127.0.0.1:8088"
WORD_SETTINGS = ("mode",)  # queue settings whose value is a word, not JSON
BATCH_SIZE = 200


def _common() -> argparse.ArgumentParser:
    """The arguments every client command takes: where the node is, how to reach it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help=f"node to talk to, or several (a,b,c: a call that is "
                                         f"safe to repeat moves to the next on a refused "
                                         f"connection or a 503); default $MIYAMOTO_SERVER "
                                         f"or {DEFAULT_SERVER}")
    common.add_argument("--token", help="API bearer token (default $MIYAMOTO_TOKEN; never put "
                                        "one in shell history)")
    common.add_argument("--cacert", metavar="PEM",
                        help="CA certificate to verify an https node with (default "
                             "$MIYAMOTO_CACERT, else the system's CAs)")
    common.add_argument("--cert", metavar="PEM", help="client certificate for a node that "
                        "asks for one (mutual TLS; default $MIYAMOTO_CLIENT_CERT)")
    common.add_argument("--key", metavar="PEM", help="its private key, if not in --cert's "
                        "file (default $MIYAMOTO_CLIENT_KEY)")
    common.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="bound on each call to the node, retries included (default 30)")
    common.add_argument("--raw", action="store_true",
                        help="print the node's answer as it is, times in unix seconds (by "
                             "default they are shown in RFC 3339, UTC)")
    return common


# a task's states, as GET /tasks?state= and /queues/<q>/tasks?state= take them (the server's
# State enum; spelt here so the CLI's start-up does not load the task module)
STATES = ("scheduled", "running", "succeeded", "failed", "cancelled", "expired")

def add_commands(sub: Any) -> None:
    """Add every client command to the ``miyamoto`` subparsers."""
    common = _common()

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue a task (or --file many)")
    _enqueue_args(enq)
    enq.set_defaults(func=_command(_enqueue))

    for name, helptext, fn in (("task", "show one task", _task),
                               ("cancel", "cancel a scheduled task", _cancel),
                               ("retry", "run a failed task again", _retry)):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("id", help="task id")
        p.set_defaults(func=_command(fn))

    _resend_command(sub, common)
    _long_task_commands(sub, common)
    work.add_commands(sub, common, _command)  # pull queues: lease, ack, nack, extend, work

    find = sub.add_parser("find", parents=[common], help="show the task holding a name")
    find.add_argument("name", help="the task's name")
    find.add_argument("--queue", default="default", help="its queue (default: default)")
    find.set_defaults(func=_command(_find))

    tasks = sub.add_parser("tasks", parents=[common], help="list a queue's tasks in one state")
    tasks.add_argument("queue", nargs="?", default="default", help="queue (default: default)")
    tasks.add_argument("--state", default="scheduled",
                       choices=STATES)
    tasks.add_argument("--limit", type=int, default=100, help="at most this many (1-1000)")
    tasks.add_argument("--json", action="store_true", help="the raw answer, not a table")
    tasks.set_defaults(func=_command(_tasks))

    _browse_command(sub, common)

    for name, helptext in (("pause", "stop starting a queue's deliveries, cluster-wide"),
                           ("resume", "start a paused queue again"),
                           ("purge", "drop every scheduled task of a queue")):
        p = sub.add_parser(name, parents=[common], help=helptext)
        p.add_argument("queue", help="queue name")
        p.set_defaults(func=_command(_control), action=name)

    _failed_commands(sub, common)
    targets = sub.add_parser("targets", parents=[common],
                             help="target origins: circuit breaker state, failures, in flight")
    targets.set_defaults(func=_command(lambda client, args: _show(client.targets(), args)))

    status = sub.add_parser("status", parents=[common], help="cluster, queues and counts")
    status.add_argument("--json", action="store_true", help="the raw answers, not tables")
    status.set_defaults(func=_command(_status))

    _schedule_commands(sub, common)
    _topic_commands(sub, common)
    _queue_commands(sub, common)


def _long_task_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto complete URL|ID`` and ``miyamoto heartbeat URL|ID``: a long task's worker
    (a script, a shell job) reports, or extends its lease."""
    done = sub.add_parser("complete", parents=[common],
                          help="report a long task's outcome at its completion URL")
    done.add_argument("target", metavar="URL|ID",
                      help="the X-Task-Complete-Url the delivery carried, or the task id")
    done.add_argument("--state", default="succeeded", choices=("succeeded", "failed"))
    done.add_argument("--result", metavar="JSON", help="the result, any JSON (4 KiB at most)")
    done.add_argument("--completion-token", dest="completion_token",
                      help="the completion token, with a task id")
    done.set_defaults(func=_command(_complete))
    beat = sub.add_parser("heartbeat", parents=[common],
                          help="extend a long task's lease from now")
    beat.add_argument("target", metavar="URL|ID",
                      help="its X-Task-Heartbeat-Url (or complete URL), or the task id")
    beat.add_argument("--lease", type=float, metavar="SECONDS",
                      help="seconds from now (default: the task's own lease)")
    beat.add_argument("--completion-token", dest="completion_token",
                      help="the completion token, with a task id")
    beat.set_defaults(func=_command(_heartbeat))


def _complete(client: Any, args: argparse.Namespace) -> int:
    result = None
    if args.result is not None:
        try:
            result = json.loads(args.result)
        except ValueError as e:
            raise UsageError(f"--result is not JSON: {e}") from None
    _print(client.complete(args.target, args.state, result, token=args.completion_token), args)
    return 0


def _heartbeat(client: Any, args: argparse.Namespace) -> int:
    _print(client.heartbeat(args.target, args.lease, token=args.completion_token), args)
    return 0


def _resend_command(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto resend ID`` or ``miyamoto resend --queue Q [filters]``."""
    resend = sub.add_parser("resend", parents=[common],
                            help="run an ended task again (ID), or a queue's ended tasks")
    resend.add_argument("id", nargs="?", help="task id (else: --queue and the filters)")
    resend.add_argument("--queue", help="resend this queue's tasks in --state (default failed)")
    resend.add_argument("--state", default=None, choices=("succeeded", "failed", "cancelled",
                                                         "expired"))
    resend.add_argument("--target", help="only tasks whose URL starts with this")
    resend.add_argument("--since", type=_eta, metavar="TIME", help="only tasks ended since")
    resend.add_argument("--until", type=_eta, metavar="TIME", help="only tasks ended before")
    resend.set_defaults(func=_command(_resend))


def _queue_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto queue set|show|reset NAME``: a queue's settings, cluster-wide."""
    queue = sub.add_parser("queue", help="set, show or reset a queue's settings, cluster-wide")
    ops = queue.add_subparsers(dest="op", required=True, metavar="OP")
    put = ops.add_parser("set", parents=[common], help="set settings (makes the queue)")
    put.add_argument("name")
    put.add_argument("settings", nargs="+", metavar="KEY=VALUE",
                     help="rate=5 burst=10 max_concurrent=4 max_attempts=3 min_backoff=1 "
                          "max_backoff=60 max_doublings=4 max_retry_duration=3600 "
                          "timeout=30 paused=true; KEY=null goes back to the config's")
    put.set_defaults(func=_command(lambda c, a: _show(c.set_queue(
        a.name, **_settings(a.settings)), a)))
    for op, fn, helptext in (("show", "queue", "a queue, each setting with its source"),
                             ("reset", "reset_queue", "drop the settings set, back to the "
                                                      "config's")):
        q = ops.add_parser(op, parents=[common], help=helptext)
        q.add_argument("name")
        q.set_defaults(func=_command(lambda c, a, fn=fn: _show(getattr(c, fn)(a.name), a)))


def _settings(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE arguments, each value read as JSON (5, 0.5, true, null); the node checks
    what they mean and names a bad one."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            raise UsageError(f"{pair!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(text)
        except ValueError:
            if key not in WORD_SETTINGS:
                raise UsageError(f"{key}: {text!r} is not a number, true, false or null") \
                    from None
            out[key] = text  # a word (mode=pull): the node checks it
    return out


def _browse_command(sub: Any, common: argparse.ArgumentParser) -> None:
    browse = sub.add_parser("browse", parents=[common],
                            help="page through tasks in one state, over every queue or one")
    browse.add_argument("--state", default="scheduled",
                        choices=STATES)
    browse.add_argument("--queue", help="only this queue's tasks")
    browse.add_argument("--target", help="only tasks whose URL starts with this")
    browse.add_argument("--name-prefix", help="only tasks whose name starts with this")
    browse.add_argument("--label", metavar="K=V", help="only tasks with this label")
    browse.add_argument("--since", type=_eta, metavar="TIME",
                        help="only tasks due (ended: that ended) at or after TIME")
    browse.add_argument("--until", type=_eta, metavar="TIME", help="... and before TIME")
    browse.add_argument("--cursor", help="the next page: the cursor the last one printed")
    browse.add_argument("--limit", type=int, default=50, help="at most this many (1-500)")
    browse.add_argument("--json", action="store_true", help="the raw answer, not a table")
    browse.set_defaults(func=_command(_browse))


def _failed_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto failed list|retry|delete QUEUE``: the queue's dead letters."""
    failed = sub.add_parser("failed", help="a queue's failed tasks: list, retry or delete them")
    actions = failed.add_subparsers(dest="failed_action", metavar="{list,retry,delete}",
                                    required=True)
    ls = actions.add_parser("list", parents=[common], help="the failed tasks, as a table")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (1-1000)")
    ls.add_argument("--json", action="store_true", help="the raw answer, not a table")
    retry = actions.add_parser("retry", parents=[common],
                               help="run every failed task of the queue again, cluster-wide")
    delete = actions.add_parser("delete", parents=[common],
                                help="delete every failed task of the queue, cluster-wide")
    delete.add_argument("-y", "--yes", action="store_true",
                        help="do not ask (required when stdin is not a terminal)")
    for p, fn in ((ls, _failed_list), (retry, _failed_bulk), (delete, _failed_bulk)):
        p.add_argument("queue", nargs="?", default="default", help="queue (default: default)")
        p.set_defaults(func=_command(fn))


def _schedule_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto schedules`` and ``schedule add|show|delete|pause|resume``."""
    p = sub.add_parser("schedules", parents=[common], help="list the recurring schedules")
    p.set_defaults(func=_command(lambda c, a: _show(c.schedules(), a)))

    sched = sub.add_parser("schedule", help="add, show, delete, pause, resume or run a schedule")
    ops = sched.add_subparsers(dest="op", required=True, metavar="OP")
    add = ops.add_parser("add", parents=[common], help="create or replace a schedule")
    add.add_argument("name")
    add.add_argument("url", help="target URL of each tick's task")
    add.add_argument("params", nargs="*", help="key=value params")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='cron expression, e.g. "0 3 * * *" or @daily')
    add.add_argument("--cron-seconds-last", action="store_true",
                     help="--cron has 6 fields, the sixth croniter's seconds (seconds last)")
    when.add_argument("--every", type=int, metavar="SECONDS", help="a tick every N seconds")
    add.add_argument("--timezone", help="IANA zone of the cron expression (default UTC)")
    add.add_argument("--catch-up", choices=("last", "none"),
                     help="ticks missed without a leader: the newest fires, or none")
    add.add_argument("--queue", help="queue of the tasks")
    add.add_argument("--method", help="HTTP method of the tasks")
    add.add_argument("--task-json", metavar="JSON", help="more enqueue fields, as JSON")
    add.set_defaults(func=_command(_schedule_add))
    for op, fn in (("show", "get_schedule"), ("delete", "unschedule"),
                   ("pause", "pause_schedule"), ("resume", "resume_schedule"),
                   ("run", "run_schedule")):
        q = ops.add_parser(op, parents=[common], help=f"{op} a schedule")
        q.add_argument("name")
        q.set_defaults(func=_command(lambda c, a, fn=fn: _show(getattr(c, fn)(a.name), a)))


def _topic_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``miyamoto topics`` and ``topic put|show|delete|publish``."""
    p = sub.add_parser("topics", parents=[common], help="list the fan-out topics")
    p.set_defaults(func=_command(lambda c, a: _show(c.topics(), a)))
    topic = sub.add_parser("topic", help="put, show, delete or publish to a fan-out topic")
    ops = topic.add_subparsers(dest="op", required=True, metavar="OP")
    put = ops.add_parser("put", parents=[common], help="create or replace a topic")
    put.add_argument("name")
    put.add_argument("urls", nargs="+", help="the topic's URLs")
    put.set_defaults(func=_command(lambda c, a: _show(c.put_topic(a.name, a.urls), a)))
    for op, fn in (("show", "topic"), ("delete", "delete_topic")):
        q = ops.add_parser(op, parents=[common], help=f"{op} a topic")
        q.add_argument("name")
        q.set_defaults(func=_command(lambda c, a, fn=fn: _show(getattr(c, fn)(a.name), a)))
    pub = ops.add_parser("publish", parents=[common], help="enqueue one task per URL")
    pub.add_argument("name")
    pub.add_argument("params", nargs="*", help="key=value params")
    pub.add_argument("--task-name", help="de-duplication name (suffixed per URL)")
    pub.add_argument("--queue", help="queue of the tasks")
    pub.set_defaults(func=_command(lambda c, a: _show(c.publish(
        a.name, _params(a.params) or None, name=a.task_name, queue=a.queue), a)))


def _enqueue_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", nargs="?", help="target URL the task calls")
    p.add_argument("params", nargs="*", help="key=value params (a repeated key makes a list)")
    p.add_argument("--file", metavar="JSONL",
                   help="enqueue every task of a JSON-lines file ('-' for stdin) in batches")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                   help=f"tasks per batch request with --file (default {BATCH_SIZE})")
    p.add_argument("--method", help="HTTP method (default POST)")
    p.add_argument("--countdown", type=float, help="delay in seconds")
    p.add_argument("--eta", type=_eta, metavar="TIME",
                   help="when to run: unix seconds or RFC 3339 (2026-12-02T03:00:00Z)")
    p.add_argument("--queue", help="queue name")
    p.add_argument("--name", help="de-duplication name")
    p.add_argument("--dedupe", choices=("content",),
                   help="content: name the task after a hash of its request, so an "
                        "identical task is a duplicate")
    p.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="extra header for the target (repeatable)")
    p.add_argument("--json", dest="json_body", metavar="JSON",
                   help="a JSON body instead of params")
    p.add_argument("--body", help="a raw body instead of params")
    p.add_argument("--content-type", help="content type of --body or --json")
    p.add_argument("--callback", help="URL told of the task's success")
    p.add_argument("--failure-callback", help="URL told of the task's final failure")
    p.add_argument("--max-attempts", type=int, help="override the queue's retry limit")
    p.add_argument("--timeout", type=float, help="override the queue's dispatch deadline (s)")
    p.add_argument("--priority", type=int, help="0-9, higher goes first (default 5)")
    p.add_argument("--flow-key", help="flow-control key: tasks sharing it share its limits")
    p.add_argument("--flow-rate", type=float, help="tasks/s for --flow-key")
    p.add_argument("--flow-parallelism", type=int, help="deliveries in flight for --flow-key")
    p.add_argument("--ttl", type=float, help="seconds from now: a task not started by then "
                                             "ends as expired")
    p.add_argument("--expires-at", type=_eta, metavar="TIME",
                   help="as --ttl, a time: unix seconds or RFC 3339")
    p.add_argument("--retry-delays", type=_delays, metavar="S,S,...",
                   help="seconds before each retry instead of the backoff, the last "
                        "repeating (1,10,60)")
    p.add_argument("--label", action="append", metavar="K=V",
                   help="a label to find the task by (repeat for more, at most 10)")
    p.add_argument("--on-duplicate", choices=("reject", "replace", "keep"),
                   help="a repeat of a held --name: reject (the default), keep the held "
                        "task, or replace its params, body and eta while it has not started")
    p.add_argument("--debounce", type=float, metavar="S",
                   help="with --name: each repeat pushes the held task's eta to now + S")
    p.add_argument("--debounce-max", type=float, metavar="S",
                   help="the eta never passes the first enqueue + S (default 10 x --debounce)")
    p.add_argument("--async", dest="async_", action="store_true", default=None,
                   help="a long task: a 202 keeps it running until the worker reports at "
                        "its X-Task-Complete-Url (lease 300 s unless --lease)")
    p.add_argument("--lease", type=float, metavar="SECONDS",
                   help="a long task's lease (implies --async; at most 7 days)")


def _eta(text: str) -> float:
    try:
        return parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _command(fn: Callable[[Any, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run ``fn(client, args)``; a MiyamotoError is one stderr line and exit 1."""

    def run(args: argparse.Namespace) -> int:
        # here, not at the top: requests (and ssl) load only when a client command runs
        from miyamoto.client import Client, DuplicateTask, MiyamotoError

        token = args.token or os.environ.get("MIYAMOTO_TOKEN") or \
            os.environ.get("MIYAMOTO_API_TOKEN")  # the older name, kept as an alias
        server = args.server or os.environ.get("MIYAMOTO_SERVER") or DEFAULT_SERVER
        servers = _servers(server)
        try:
            with Client(servers, token=token, timeout=args.request_timeout,
                        **_tls(args)) as client:
                return fn(client, args)
        except UsageError as e:
            print(f"miyamoto {args.command}: {e}", file=sys.stderr)
            return 2
        except NotANode as e:
            print(f"miyamoto: {server} is not a Miyamoto node: {e} (is it the node's HTTP "
                  "address, not its cluster port or another service?)", file=sys.stderr)
            return 1
        except DuplicateTask as e:
            print(f"miyamoto: duplicate: {_holders(e.id, e.body)}", file=sys.stderr)
            return 1
        except MiyamotoError as e:
            where = f" ({e.status})" if e.status else ""
            print(f"miyamoto: {_one_line(e.message)}{where}", file=sys.stderr)
            return 1

    return run


def _tls(args: argparse.Namespace) -> dict[str, Any]:
    """The Client's ``ca`` and ``cert`` from the flags or their variables."""
    env = os.environ
    ca = args.cacert or env.get("MIYAMOTO_CACERT") or None
    cert = args.cert or env.get("MIYAMOTO_CLIENT_CERT") or None
    key = args.key or env.get("MIYAMOTO_CLIENT_KEY") or None
    if key and not cert:
        raise UsageError("--key needs --cert")
    return {"ca": ca, "cert": (cert, key) if cert and key else cert}


def _servers(text: str) -> list[str]:
    """``a,b,c`` -> one URL each; 127.0.0.1:8088, as the node's own --http option is
    given, gets http://."""
    urls = [s.strip() for s in text.split(",") if s.strip()]
    return [u if "://" in u else "http://" + u for u in urls] or [DEFAULT_SERVER]


def _holders(task_id: Any, body: dict[str, Any]) -> str:
    """Who holds the name: one task's id, or a topic's tasks' (a publish names one per URL)."""
    if task_id is not None:
        return f"the name is taken by task {task_id}"
    ids = [t.get("id") for t in body.get("tasks", []) if isinstance(t, dict)]
    if ids:
        return f"the names are taken by tasks {', '.join(map(str, ids))}"
    return "the name is taken"


def _one_line(text: str) -> str:
    """An error on one line (a non-node's HTML page would take twenty), cut short."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= 300 else flat[:297] + "..."


def _print(data: Any, args: argparse.Namespace) -> None:
    """The answer as JSON, its unix times in RFC 3339 (``--raw``: as the node gave it)."""
    shown = data if getattr(args, "raw", False) else readable(data)
    print(json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False))


def _show(data: Any, args: argparse.Namespace) -> int:
    """Print the node's answer; the command is done (exit 0)."""
    _print(data, args)
    return 0


# ---------------------------------------------------------------- enqueue
def _enqueue(client: Any, args: argparse.Namespace) -> int:
    fields = _fields(args)
    if args.file is not None:
        if args.url or args.params:
            raise UsageError("give either --file or a URL with params, not both")
        if args.name:
            raise UsageError("--name names one task; give names in the file's lines")
        return _enqueue_file(client, args, fields)
    if args.url and "=" in args.url and "://" not in args.url:  # a param: a pull queue's task
        args.url, args.params = None, [args.url, *args.params]
    if not args.url and not args.queue:
        raise UsageError("a target URL (or --file) is required (but in a pull queue: --queue)")
    if args.params and (args.json_body is not None or args.body is not None):
        raise UsageError("give key=value params or a body (--json, --body), not both")
    _print(client.enqueue(args.url or None, _params(args.params) or None, **fields), args)
    return 0


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The task fields given as flags (None: not given, the node's default)."""
    fields: dict[str, Any] = {k: getattr(args, k) for k in (
        "method", "countdown", "eta", "queue", "name", "body", "content_type", "callback",
        "failure_callback", "max_attempts", "timeout", "priority", "flow_key", "flow_rate",
        "flow_parallelism", "dedupe", "ttl", "expires_at", "retry_delays", "on_duplicate",
        "debounce", "debounce_max", "lease")}
    fields["async"] = args.async_
    if args.json_body is not None:
        try:
            fields["json"] = json.loads(args.json_body)
        except ValueError as e:
            raise UsageError(f"--json is not JSON: {e}") from None
    if args.header:
        fields["headers"] = _headers(args.header)
    if getattr(args, "label", None):
        fields["labels"] = dict(kv.partition("=")[::2] for kv in args.label)
    return {k: v for k, v in fields.items() if v is not None}


def _delays(value: str) -> list[float]:
    """``--retry-delays 1,10,60``: the node checks the bounds and says which is wrong."""
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not seconds separated by commas") from None


def _params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise UsageError(f"param {kv!r} is not key=value")
        if key in params:
            prev = params[key]
            params[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            params[key] = value
    return params


def _headers(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"header {item!r} is not 'Name: value'")
        out[name.strip()] = value.strip()
    return out


def _enqueue_file(client: Any, args: argparse.Namespace, fields: dict[str, Any]) -> int:
    from miyamoto.cli import bulk  # it imports the client, so requests: load it on use

    if not 1 <= args.batch_size <= 1000:
        raise UsageError("--batch-size must be between 1 and 1000")
    queue = fields.pop("queue", None)
    try:
        if args.file == "-":
            lines = bulk.read_lines(sys.stdin, queue)
        else:
            with open(args.file, encoding="utf-8") as f:
                lines = bulk.read_lines(f, queue)
    except (OSError, UnicodeDecodeError, bulk.BadFile) as e:
        raise UsageError(f"--file {args.file}: {e}") from None
    for line in lines:  # flags are defaults for every line
        for k, v in fields.items():
            line.task.setdefault(k, v)
    outcome = bulk.run(client, lines, args.batch_size)
    for err in outcome.errors[:20]:
        print(f"miyamoto: {err}", file=sys.stderr)
    _print({"tasks": len(lines), **outcome.counts}, args)
    return 0 if outcome.ok else 1


# ---------------------------------------------------------------- the rest
def _task(client: Any, args: argparse.Namespace) -> int:
    _print(client.get(args.id), args)
    return 0


def _find(client: Any, args: argparse.Namespace) -> int:
    _print(client.find(args.name, args.queue), args)
    return 0


def _cancel(client: Any, args: argparse.Namespace) -> int:
    _print(client.cancel(args.id), args)
    return 0


def _retry(client: Any, args: argparse.Namespace) -> int:
    _print(client.retry(args.id), args)
    return 0


def _browse(client: Any, args: argparse.Namespace) -> int:
    """A page of tasks; the next page's cursor on stderr (stdout stays the table)."""
    page = client.browse(args.state, queue=args.queue, target=args.target,
                         name_prefix=args.name_prefix, label=args.label, since=args.since,
                         until=args.until, cursor=args.cursor, limit=args.limit)
    if args.json:
        _print(page, args)
    else:
        print("\n".join(task_lines(page.get("tasks", []))))
        cursor = page.get("next_cursor")
        print(f"next page: --cursor {cursor}" if cursor else "(the last page)", file=sys.stderr)
    return 0


def _resend(client: Any, args: argparse.Namespace) -> int:
    bulk = {k: getattr(args, k) for k in ("state", "target", "since", "until")}
    if args.id is not None:
        if args.queue is not None or any(v is not None for v in bulk.values()):
            raise UsageError("give a task id, or --queue with filters, not both")
        _print(client.resend(args.id), args)
        return 0
    if args.queue is None:
        raise UsageError("a task id, or --queue (with --state, --target, --since, --until)")
    _print(client.resend_many(args.queue, **{k: v for k, v in bulk.items() if v is not None}),
           args)
    return 0


def _tasks(client: Any, args: argparse.Namespace) -> int:
    tasks = client.tasks(args.queue, args.state, args.limit)
    if args.json:
        _print({"queue": args.queue, "state": args.state, "tasks": tasks}, args)
    else:
        print("\n".join(task_lines(tasks)))
    return 0


def _control(client: Any, args: argparse.Namespace) -> int:
    _print(getattr(client, args.action)(args.queue), args)
    return 0


def _failed_list(client: Any, args: argparse.Namespace) -> int:
    tasks = client.tasks(args.queue, "failed", args.limit)
    if args.json:
        _print({"queue": args.queue, "state": "failed", "tasks": tasks}, args)
    else:
        print("\n".join(failed_lines(tasks)))
    return 0


def _failed_bulk(client: Any, args: argparse.Namespace) -> int:
    """Retry or delete the whole failed list; delete asks first (or wants --yes)."""
    if args.failed_action == "delete" and not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("refusing to delete without --yes: stdin is not a terminal")
        count = (client.queue(args.queue).get("counts") or {}).get("failed", "?")
        print(f"Delete the {count} failed task(s) of queue {args.queue!r} on every node? "
              "[y/N] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("miyamoto: not deleted", file=sys.stderr)
            return 1
    fn = client.retry_failed if args.failed_action == "retry" else client.delete_failed
    result = fn(args.queue)
    _print({"queue": args.queue, "action": args.failed_action, **result}, args)
    if result.get("more"):
        print("miyamoto: some node holds more failed tasks than one request takes; run it "
              "again", file=sys.stderr)
    return 0


def _schedule_add(client: Any, args: argparse.Namespace) -> int:
    """``schedule add``: the flags and ``--task-json`` make the schedule's task."""
    try:
        task = json.loads(args.task_json) if args.task_json else {}
    except ValueError as e:
        raise UsageError(f"--task-json is not JSON: {e}") from None
    if not isinstance(task, dict):
        raise UsageError("--task-json must be a JSON object")
    task["url"] = args.url
    task.update({k: v for k, v in (("params", _params(args.params) or None),
                                   ("queue", args.queue), ("method", args.method)) if v})
    _print(client.schedule(args.name, task, cron=args.cron, every=args.every,
                           timezone=args.timezone, catch_up=args.catch_up,
                           cron_seconds_last=args.cron_seconds_last or None), args)
    return 0


class NotANode(Exception):
    """The --server answered, but not as a Miyamoto node does."""


def _status(client: Any, args: argparse.Namespace) -> int:
    from miyamoto.client import MiyamotoError  # loaded already: the command runs on it

    try:
        cluster = client.cluster()
    except MiyamotoError as e:
        if e.status is None or e.status in (401, 403, 503):  # unreachable, a token, stopping
            raise
        raise NotANode(f"GET /cluster answered {e.status}") from None
    if not (isinstance(cluster.get("node"), str) and isinstance(cluster.get("members"), list)):
        raise NotANode("GET /cluster answered without a roster")
    queues = client.queues()
    if args.json:
        _print({"cluster": cluster, "queues": queues}, args)
    else:
        print("\n".join(status_lines(cluster, queues)))
    return 0
