"""The `miyamoto` command: serve, enqueue, status, task, keygen.

`serve` monkey-patches gevent first thing, before the server modules are imported;
nothing else in the package patches anything. The client commands use requests and
need no gevent at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

DEFAULT_SERVER = "http://127.0.0.1:8088"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["serve", *(argv or [])])
    return args.func(args)


def _parser() -> argparse.ArgumentParser:
    from miyamoto.version import __version__

    parser = argparse.ArgumentParser(prog="miyamoto", description="A clustered webhook task queue.")
    parser.add_argument("--version", action="version", version=f"miyamoto {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run a node")
    from miyamoto.config import add_flags

    add_flags(serve)
    serve.set_defaults(func=_serve)

    server_help = f"node to talk to (default $MIYAMOTO_SERVER or {DEFAULT_SERVER})"
    token_help = "API bearer token (default $MIYAMOTO_API_TOKEN; never put one in shell history)"
    enq = sub.add_parser("enqueue", help="enqueue a task")
    enq.add_argument("url", help="target URL the task POSTs to")
    enq.add_argument("params", nargs="*", help="key=value params")
    enq.add_argument("--countdown", type=float, help="delay in seconds")
    enq.add_argument("--eta", type=float, help="unix time to run at")
    enq.add_argument("--queue", help="queue name")
    enq.add_argument("--name", help="de-duplication name")
    enq.add_argument("--method", help="HTTP method (default POST)")
    enq.add_argument("--server", help=server_help)
    enq.add_argument("--token", help=token_help)
    enq.set_defaults(func=_enqueue)

    status = sub.add_parser("status", help="cluster, queues and counts")
    status.add_argument("--server", help=server_help)
    status.add_argument("--token", help=token_help)
    status.set_defaults(func=_status)

    task = sub.add_parser("task", help="show one task")
    task.add_argument("id")
    task.add_argument("--server", help=server_help)
    task.add_argument("--token", help=token_help)
    task.set_defaults(func=_task)

    keygen = sub.add_parser("keygen", help="print a CurveZMQ key pair for the cluster")
    keygen.set_defaults(func=_keygen)
    return parser


# ---------------------------------------------------------------- serve
def _serve(args: argparse.Namespace) -> int:
    from gevent import monkey

    monkey.patch_all()

    import logging
    import signal

    import gevent

    from miyamoto import config as config_mod

    flags = {k: getattr(args, k) for k in [s.name for s in config_mod.SETTINGS] + ["config"]
             if getattr(args, k, None) is not None}
    try:
        config = config_mod.load(flags=flags)
    except config_mod.ConfigError as e:
        print(f"miyamoto: bad option {e}", file=sys.stderr)
        return 2
    from miyamoto import logs

    logs.configure(config.log_level, config.log_format)
    if config.processes > 1:
        from miyamoto.processes import supervise

        try:
            return supervise(config, flags)
        except config_mod.ConfigError as e:
            print(f"miyamoto: bad option {e}", file=sys.stderr)
            return 2
    from miyamoto.node import Node

    node = Node(config)
    try:
        node.start()
    except OSError as e:
        logging.getLogger("miyamoto").error("cannot start: %s", e)
        return 1

    def on_signal() -> None:
        gevent.spawn(node.stop)

    gevent.signal_handler(signal.SIGTERM, on_signal)
    gevent.signal_handler(signal.SIGINT, on_signal)
    node.serve_forever()
    return 0


# ---------------------------------------------------------------- client commands
def _server(args: argparse.Namespace) -> str:
    return (args.server or os.environ.get("MIYAMOTO_SERVER") or DEFAULT_SERVER).rstrip("/")


def _auth(args: argparse.Namespace) -> dict[str, str]:
    token = getattr(args, "token", None) or os.environ.get("MIYAMOTO_API_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _call(method: str, url: str, args: argparse.Namespace, **kw: Any) -> tuple[int, Any]:
    import requests

    try:
        resp = requests.request(method, url, timeout=30, headers=_auth(args), **kw)
    except requests.RequestException as e:
        print(f"miyamoto: cannot reach {url}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, {"status": "error", "error": resp.text[:500]}


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))


def _enqueue(args: argparse.Namespace) -> int:
    params: dict[str, Any] = {}
    for kv in args.params:
        key, sep, value = kv.partition("=")
        if not sep:
            print(f"miyamoto: param {kv!r} is not key=value", file=sys.stderr)
            return 2
        params[key] = value
    body: dict[str, Any] = {"url": args.url, "params": params}
    for field in ("countdown", "eta", "queue", "name", "method"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    status, data = _call("POST", _server(args) + "/queue", args, json=body)
    _print(data)
    return 0 if status == 200 else 1


def _status(args: argparse.Namespace) -> int:
    base = _server(args)
    s1, cluster = _call("GET", base + "/cluster", args)
    s2, queues = _call("GET", base + "/queues", args)
    _print({"cluster": cluster, "queues": queues.get("queues", queues)})
    return 0 if s1 == 200 and s2 == 200 else 1


def _task(args: argparse.Namespace) -> int:
    status, data = _call("GET", f"{_server(args)}/tasks/{args.id}", args)
    _print(data)
    return 0 if status == 200 else 1


def _keygen(args: argparse.Namespace) -> int:
    import zmq

    public, secret = zmq.curve_keypair()
    print("[miyamoto]")
    print(f"curve_public = {public.decode()}")
    print(f"curve_secret = {secret.decode()}")
    return 0
