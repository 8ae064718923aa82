"""``miyamoto serve --processes N``: N nodes on one host, one HTTP port, every core used.

A node is one gevent process, so it uses one core. This supervisor starts N ordinary
nodes that form a cluster among themselves (and with ``seeds``, if given): node ids
``NODE-1`` .. ``NODE-N``, data dirs ``DATA_DIR/NODE-i``, cluster ports ``PORT`` ..
``PORT+N-1``, one zone (the host's), so no task keeps both copies on this host while
the roster has another. They all bind the same HTTP address with ``SO_REUSEPORT`` and
the kernel spreads connections among them: clients see one address.

Without a cluster key pair the supervisor makes one for its children (it never leaves
this host: it travels in their environment). It forwards SIGTERM/SIGINT to every child
and waits for them, and SIGHUP (reload the TLS certificate) to every child; a child that dies otherwise is started again after a second, up to
``MAX_RESTARTS`` times a minute, after which everything stops (exit 1).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Mapping

import zmq

from miyamoto.cli import sdnotify
from miyamoto.config.settings import Config, ConfigError

log = logging.getLogger(__name__)

MAX_RESTARTS = 5  # per child per minute
RESTART_DELAY = 1.0


def plan(config: Config, flags: Mapping[str, Any]) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, extra environment) of each child node."""
    n = config.processes
    host, _, port = config.cluster.removeprefix("tcp://").rpartition(":")
    ahost, _, aport = config.advertise.removeprefix("tcp://").rpartition(":")
    if config.http_port == 0:
        raise ConfigError("processes: several processes share one HTTP port: give http a port")
    if int(port) == 0 or int(port) + n > 65536:
        raise ConfigError("processes: the cluster port must be a fixed port with room for N")
    own = [f"tcp://{ahost}:{int(aport) + i}" for i in range(n)]
    seeds = ",".join(own + [s for s in config.seeds if s not in own])
    base = [a for k, v in flags.items() if k not in _SET_PER_CHILD for a in _flag(k, v)]
    env: dict[str, str] = {"MIYAMOTO_PROCESSES": "1"}
    if not config.curve_secret and not config.insecure_cluster:
        public, secret = zmq.curve_keypair()
        env.update(MIYAMOTO_CURVE_PUBLIC=public.decode(), MIYAMOTO_CURVE_SECRET=secret.decode())
    children = []
    for i in range(n):
        node = f"{config.node}-{i + 1}"
        data = config.data_dir if config.data_dir == ":memory:" else \
            os.path.join(config.data_dir, node)
        argv = [sys.executable, "-m", "miyamoto", "serve", *base, "--processes", "1",
                "--node", node, "--data-dir", data, "--zone", config.zone,
                "--cluster", f"tcp://{host}:{int(port) + i}",
                "--advertise", own[i], "--seeds", seeds, "--reuse-port", "true"]
        children.append((argv, env))
    return children


_SET_PER_CHILD = {"processes", "node", "data_dir", "zone", "cluster", "advertise", "seeds",
                  "reuse_port"}


def _flag(name: str, value: Any) -> list[str]:
    return ["--config" if name == "config" else "--" + name.replace("_", "-"), str(value)]


class Supervisor:
    def __init__(self, children: list[tuple[list[str], dict[str, str]]]):
        self.children = children
        self.procs: list[subprocess.Popen | None] = [None] * len(children)
        self.restarts: list[list[float]] = [[] for _ in children]
        self.stopping = False

    def _start(self, i: int) -> None:
        argv, env = self.children[i]
        # the supervisor speaks to systemd for all: a child's READY=1 would be refused
        # (NotifyAccess=main) or would mark the whole service ready too early
        inherited = {k: v for k, v in os.environ.items() if k != sdnotify.VARIABLE}
        self.procs[i] = subprocess.Popen(argv, env={**inherited, **env})
        log.info("processes: started %s (pid %d)", argv[argv.index("--node") + 1],
                 self.procs[i].pid)

    def stop(self, *_: Any) -> None:
        if not self.stopping:
            sdnotify.notify("STOPPING=1")
        self.stopping = True
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def hangup(self, *_: Any) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGHUP)

    def run(self) -> int:
        for i in range(len(self.children)):
            self._start(i)
        sdnotify.notify(f"READY=1\nSTATUS={len(self.children)} nodes started")
        while True:
            if self.stopping:
                codes = [p.wait() for p in self.procs if p is not None]
                return max((c for c in codes if c > 0), default=0)
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None and not self.stopping:
                    if not self._may_restart(i, p.returncode):
                        self.stop()
                        for q in self.procs:
                            if q is not None:
                                q.wait()
                        return 1
            time.sleep(0.2)

    def _may_restart(self, i: int, code: int) -> bool:
        now = time.monotonic()
        recent = self.restarts[i] = [t for t in self.restarts[i] if now - t < 60] + [now]
        if code == 2 or len(recent) > MAX_RESTARTS:
            log.error("processes: child %d exited with %d; stopping all", i + 1, code)
            return False
        log.warning("processes: child %d exited with %d; starting it again", i + 1, code)
        time.sleep(RESTART_DELAY)
        if not self.stopping:  # a SIGTERM during the delay: do not start it
            self._start(i)
        return True


def supervise(config: Config, flags: Mapping[str, Any]) -> int:
    sup = Supervisor(plan(config, flags))
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    signal.signal(signal.SIGHUP, sup.hangup)
    return sup.run()
