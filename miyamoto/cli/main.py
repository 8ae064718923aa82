"""The `miyamoto` command: serve, keygen, and the client commands (commands.py).

`serve` monkey-patches gevent first thing, before the server modules are imported;
nothing else in the package patches anything. The client commands (enqueue, status,
task, cancel, retry, tasks, pause, resume, purge, failed, schedules, topics) run on
``miyamoto.Client`` (requests) and need no gevent at all.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import Sequence

from miyamoto.cli import sdnotify
from miyamoto.cli.commands import add_commands
from miyamoto.cli.work import split_command
from miyamoto.config.settings import SETTINGS, Config, ConfigError, add_flags, check_environment, \
    load
from miyamoto.version import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    head, command = split_command(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(head)
    if command is not None:  # ``work QUEUE -- command args``: the command is not parsed
        args.argv = command
    if args.command is None:
        args = parser.parse_args(["serve", *(argv or [])])
    try:
        check_environment(os.environ)  # a misspelt MIYAMOTO_SERVER would go unnoticed
    except ConfigError as e:
        print(f"miyamoto: bad variable {e}", file=sys.stderr)
        return 2
    try:
        code = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_gone()
    except KeyboardInterrupt:
        return 128 + 2
    return code


def _stdout_gone() -> int:
    """stdout's reader left (``miyamoto status | head -1``): stop quietly, as a program
    killed by SIGPIPE would, with no traceback. stdout is pointed at /dev/null so the
    interpreter's flush at exit does not fail again (the recipe in Python's signal docs).
    SIGPIPE itself stays ignored, so a socket the node closes is an error, not a death."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13  # 128 + SIGPIPE, the shell's code for a reader that went away


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miyamoto", description="A clustered webhook task queue.")
    parser.add_argument("--version", action="version", version=f"miyamoto {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser(
        "serve", help="run a node", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a node. Every option is also an INI key (in --config FILE, section\n"
        "[miyamoto], or [node:ID] for one node of a cluster file) and a MIYAMOTO_<NAME>\n"
        "environment variable: flags win over the environment, the environment over the\n"
        "file. Queues are [queue:NAME] sections of the file; cluster.example.ini shows\n"
        "every option. The secrets and curve_public may also be read from a file named\n"
        "by MIYAMOTO_<NAME>_FILE (MIYAMOTO_CURVE_SECRET_FILE=/run/secrets/curve_secret).")
    add_flags(serve)
    serve.set_defaults(func=_serve)

    add_commands(sub)

    keygen = sub.add_parser(
        "keygen", help="make the cluster's CurveZMQ key pair",
        description="Make the cluster's CurveZMQ key pair (give the same pair to every node: "
        "it is the join secret; each node makes its own pair in its data dir). "
        "Without --env-file it prints a [miyamoto] section for the config file. Z85 keys hold "
        "$ % < > { & and the like, so for a shell, docker compose or systemd use --env-file.")
    keygen.add_argument("--env-file", metavar="PATH",
                        help="write MIYAMOTO_CURVE_PUBLIC and MIYAMOTO_CURVE_SECRET, single-"
                             "quoted, to a new file of mode 0600 (read as is by `set -a; . PATH`, "
                             "compose's env_file, docker run --env-file and systemd's "
                             "EnvironmentFile); print only the public key")
    keygen.set_defaults(func=_keygen)
    return parser


# ---------------------------------------------------------------- serve
def _patch_all() -> None:
    """gevent's ``patch_all``, reading the installed entry points once. It looks its plugin
    hooks up in them for each module it patches, and each lookup reads every installed
    distribution's metadata: 26 reads, about 0.1 s of CPU in a venv of 120 packages, a
    quarter of a node's start-up. Nothing is installed meanwhile, so one read answers
    them all (``EntryPoints.select`` is what ``entry_points(group=...)`` runs)."""
    from importlib import metadata

    from gevent import monkey  # gevent loads only to serve: the client commands need none

    read = metadata.entry_points
    every = read()
    metadata.entry_points = lambda **params: every.select(**params)  # type: ignore[assignment]
    try:
        monkey.patch_all()
    finally:
        metadata.entry_points = read


# generation 0 of the cyclic collector every this many allocations (Python's default is
# 700), and the older ones as by default: see _tune_collector
COLLECT_EVERY = (10_000, 10, 10)


def _tune_collector() -> None:
    """Once the node is up, what start-up made (modules, the config, the node's parts)
    lives as long as the process: it is frozen out of the collector's sweeps, and young
    objects are collected every 10,000 allocations, not 700. A task's dicts and records
    are mostly freed by their counts, not by the collector. With the defaults,
    collections took about 6 % of a saturated node's CPU (gc.callbacks, 20,000 tasks;
    each full one swept every module), and with these about 2 %."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECT_EVERY)


def _serve(args: argparse.Namespace) -> int:
    _patch_all()
    # Everything below is imported after patch_all, so what it makes (sockets, locks,
    # threads) is gevent's; the client commands never load any of it.
    flags = {k: getattr(args, k) for k in [s.name for s in SETTINGS] + ["config"]
             if getattr(args, k, None) is not None}
    try:
        config = load(flags=flags)
    except ConfigError as e:
        print(f"miyamoto: bad option {e}", file=sys.stderr)
        return 2
    from miyamoto import logs  # after patch_all, as above

    logs.configure(config.log_level, config.log_format)
    if config.processes > 1:
        from miyamoto.cli.processes import supervise  # after patch_all, as above

        try:
            return supervise(config, flags)
        except ConfigError as e:
            print(f"miyamoto: bad option {e}", file=sys.stderr)
            return 2
    return _run_node(config)


def _run_node(config: Config) -> int:
    """Start a node (gevent patched already), tell systemd, and serve until a signal."""
    import logging  # after patch_all, as above
    import signal

    import gevent

    from miyamoto.node import Node  # after patch_all: the server modules must see gevent's
    from miyamoto.store.datadir import DataDirLocked  # after patch_all, as above
    from miyamoto.wire.identity import BadKeyFile  # after patch_all, as above

    try:
        node = Node(config)
    except BadKeyFile as e:  # the node's own key pair: refused as a bad option is
        print(f"miyamoto: cannot start: {e}", file=sys.stderr)
        return 2
    try:
        node.start()
    except DataDirLocked as e:  # a second node on one journal: a usage error, like a bad option
        print(f"miyamoto: cannot start: {e.strerror}", file=sys.stderr)
        return 2
    except OSError as e:
        logging.getLogger("miyamoto").error("cannot start: %s", e)
        return 1

    _tune_collector()
    sdnotify.notify(f"READY=1\nSTATUS=serving http://{config.http}")

    def on_signal() -> None:
        sdnotify.notify("STOPPING=1\nSTATUS=draining")
        gevent.spawn(node.stop)

    def on_hangup() -> None:  # reload the TLS certificate and key
        gevent.spawn(node.reload_tls)

    gevent.signal_handler(signal.SIGTERM, on_signal)
    gevent.signal_handler(signal.SIGINT, on_signal)
    gevent.signal_handler(signal.SIGHUP, on_hangup)
    node.serve_forever()
    return 0


# ---------------------------------------------------------------- keygen
def _keygen(args: argparse.Namespace) -> int:
    """A new key pair: a config file section on stdout, or an env file (--env-file).

    The env file's values are single-quoted: a Z85 key never holds a quote, a backslash or
    a space, so quoting makes every character literal for sh, compose's env_file and
    systemd's EnvironmentFile (none of which then expands ``$`` or ``%``); docker run
    --env-file keeps the quotes, which the key's parser strips (values.z85_key)."""
    import zmq  # only keygen needs it: the other commands start without loading libzmq

    public, secret = (k.decode("ascii") for k in zmq.curve_keypair())
    if args.env_file is None:
        print("; the cluster key pair: the same on every node (for a shell, docker compose or "
              "systemd: miyamoto keygen --env-file PATH)")
        print("[miyamoto]")
        print(f"curve_public = {public}")
        print(f"curve_secret = {secret}")
        return 0
    text = f"MIYAMOTO_CURVE_PUBLIC='{public}'\nMIYAMOTO_CURVE_SECRET='{secret}'\n"
    try:  # a new file only, made 0600 from the start: no window in which others may read it
        fd = os.open(args.env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        print(f"miyamoto keygen: cannot create {args.env_file}: {e.strerror}"
              + (" (it would replace a key pair; remove it first)" if e.errno == errno.EEXIST
                 else ""), file=sys.stderr)
        return 1
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)
    print(f"wrote the key pair to {args.env_file} (mode 0600); its public key: {public}")
    return 0
