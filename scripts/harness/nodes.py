"""Node processes: ``python -m miyamoto serve`` on OS-assigned 127.0.0.1 ports.

One class for the tests, the benchmark and the fault scripts. A node's output goes to a
log file; ``restart()`` reuses its ports and data dir; ``pause()``/``resume()`` are
SIGSTOP/SIGCONT. The caller's ``MIYAMOTO_*`` variables are not inherited unless asked
(a test must not pick up a developer's shell settings; the bench passes them on).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import requests

from .waits import LOCALHOST, HarnessError, NodeDied, free_ports, wait_until

REPO = Path(__file__).resolve().parents[2]


def _keypair() -> tuple[str, str]:
    import zmq

    public, secret = zmq.curve_keypair()
    return public.decode("ascii"), secret.decode("ascii")


# The cluster key pair every node this process starts gets (CurveZMQ is required for a
# cluster): made fresh per process, so no two runs share one. Tests that need a node
# without it say so (curve_public/curve_secret empty, or insecure_cluster).
CLUSTER_KEYS = _keypair()
_KEY_OPTIONS = ("curve_public", "curve_secret", "insecure_cluster")
PROGRAM = (sys.executable, "-m", "miyamoto")

_ALL_PROCS: "weakref.WeakSet[NodeProcess]" = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:  # a safety net; owners stop their processes themselves
    for p in list(_ALL_PROCS):
        try:
            p.kill()
        except Exception:
            pass


try:  # resolved here, not in the forked child (which should call as little as it can)
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the node when the thread that started it dies (Linux
    PR_SET_PDEATHSIG), so a script killed outright leaves no node behind; SIGKILL, not
    SIGTERM, because a node the script had paused (SIGSTOP) would never act on SIGTERM."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_env(overrides: Mapping[str, Any] | None = None, *, inherit_miyamoto: bool = False,
              raw: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``python -m miyamoto`` child: PYTHONPATH leads to this repo.

    ``overrides`` maps option names or ``MIYAMOTO_*`` names to values; ``raw`` is set
    verbatim (any name)."""
    env = {k: v for k, v in os.environ.items()
           if inherit_miyamoto or not k.startswith("MIYAMOTO_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k, v in (overrides or {}).items():
        env[k if k.startswith("MIYAMOTO_") else "MIYAMOTO_" + k.upper()] = str(v)
    env.update(raw or {})
    return env


class ProcessRegistry:
    """Every process one owner (a test, a script) started; ``kill_all`` in its finalizer."""

    def __init__(self) -> None:
        self.procs: list[NodeProcess] = []

    def add(self, proc: "NodeProcess") -> None:
        if proc not in self.procs:
            self.procs.append(proc)

    def kill_all(self) -> None:
        for p in self.procs:
            try:
                p.kill()
            except Exception:
                pass

    def stop_all(self, timeout: float = 10.0) -> dict[str, int | None]:
        return stop_all(self.procs, timeout)

    def logs(self, tail: int = 200) -> list[tuple[str, str]]:
        return [(f"node {p.node_id} log ({p.log_path})", p.log_text(tail)) for p in self.procs]


class NodeProcess:
    """A ``miyamoto serve`` subprocess on OS-assigned ports.

    ``env`` maps option names or ``MIYAMOTO_*`` names to values (e.g.
    ``{"replica_offset": 1}``); ``raw_env`` is passed verbatim; ``extra_args`` are
    appended to the command line; ``program`` replaces ``python -m miyamoto``.
    ``data_dir`` defaults to ``<base_dir>/data-<id>`` (``":memory:"`` works). Without
    ``address_flags`` the node takes its addresses and data dir from ``config`` (a
    ``[node:ID]`` section), as ``scripts/cluster.py`` runs cluster.example.ini. With
    ``output="pipe"`` its output is ``proc.stdout`` instead of the log file.
    ``http_host``/``cluster_host`` (default 127.0.0.1) are the addresses it binds: a
    ``harness.netns`` host's, with ``program`` = ``ip netns exec NS python -m miyamoto``.
    ``tls_ca``: the node serves https (its options name the certificate), verified with
    this CA file; ``tls_client``: the (certificate, key) files to show it (mutual TLS).
    """

    def __init__(self, base_dir: os.PathLike | str, node_id: str | None = None, *,
                 http_port: int | None = None, cluster_port: int | None = None,
                 data_dir: str | None = None, seeds: Iterable[str] = (),
                 config: str | os.PathLike | None = None, extra_args: Sequence[str] = (),
                 env: Mapping[str, Any] | None = None, registry: ProcessRegistry | None = None,
                 with_cluster_flags: bool = True, raw_env: Mapping[str, str] | None = None,
                 inherit_miyamoto_env: bool = False, program: Sequence[str] = PROGRAM,
                 cwd: str | os.PathLike | None = None, own_session: bool = False,
                 address_flags: bool = True, output: str = "log",
                 http_host: str = LOCALHOST, cluster_host: str | None = None,
                 tls_ca: str | None = None, tls_client: tuple[str, str] | None = None):
        self.http_host = http_host
        self.tls_ca = tls_ca
        self.tls_client = tls_client
        self.cluster_host = cluster_host or http_host
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.address_flags = address_flags
        if output not in ("log", "pipe"):
            raise ValueError(f"output is 'log' or 'pipe', not {output!r}")
        self.output = output
        # ports we picked ourselves may be picked again if another process took them
        self.own_ports = address_flags and http_port is None and cluster_port is None
        if address_flags and (http_port is None or cluster_port is None):
            p1, p2 = free_ports(2)
            http_port = http_port or p1
            cluster_port = cluster_port or p2
        self.http_port = http_port
        self.cluster_port = cluster_port
        self.node_id = node_id or f"n{http_port}"
        self.data_dir = data_dir if data_dir is not None else str(self.base_dir / f"data-{self.node_id}")
        self.seeds = list(seeds)
        self.config = str(config) if config is not None else None
        self.extra_args = list(extra_args)
        self.env_overrides = dict(env or {})
        self.raw_env = dict(raw_env or {})
        self.inherit_miyamoto_env = inherit_miyamoto_env
        self.with_cluster_flags = with_cluster_flags
        self.program = list(program)
        self.cwd = str(cwd) if cwd is not None else str(self.base_dir)
        # own_session: a terminal's Ctrl-C reaches the script only, which then stops the
        # node itself; the node also gets SIGKILL if the script dies (PR_SET_PDEATHSIG).
        self.own_session = own_session
        self.log_path = self.base_dir / f"node-{self.node_id}.log"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self._log_file: Any = None
        self.starts = 0
        self.session = requests.Session()
        if http_host != LOCALHOST:  # a namespace address must never go through a proxy
            self.session.trust_env = False
        if registry is not None:
            registry.add(self)
        _ALL_PROCS.add(self)

    # ------------------------------------------------------------ addresses
    @property
    def url(self) -> str:
        return f"{'https' if self.tls_ca else 'http'}://{self.http_host}:{self.http_port}"

    @property
    def http_addr(self) -> str:
        return f"{self.http_host}:{self.http_port}"

    @property
    def cluster_addr(self) -> str:
        return f"tcp://{self.cluster_host}:{self.cluster_port}"

    # ------------------------------------------------------------ lifecycle
    def command(self) -> list[str]:
        cmd = self.program + ["serve", "--node", self.node_id]
        if self.address_flags:
            cmd += ["--http", self.http_addr, "--data-dir", self.data_dir]
        if self.address_flags and self.with_cluster_flags:
            cmd += ["--cluster", self.cluster_addr]
            if self.seeds:
                cmd += ["--seeds", ",".join(self.seeds)]
        if self.config:
            cmd += ["--config", self.config]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        overrides = dict(self.env_overrides)
        named = {k.lower().removeprefix("miyamoto_") for k in [*overrides, *self.raw_env]}
        if self.config is None and not named & set(_KEY_OPTIONS):  # an INI carries its own
            overrides["curve_public"], overrides["curve_secret"] = CLUSTER_KEYS
        return child_env(overrides, inherit_miyamoto=self.inherit_miyamoto_env,
                         raw=self.raw_env)

    def start(self) -> "NodeProcess":
        if self.running:
            raise RuntimeError(f"node {self.node_id} is already running")
        self._close_log()
        self.starts += 1
        if self.output == "log":
            self._log_file = open(self.log_path, "ab")
            self._log_file.write(f"===== start #{self.starts}: {shlex.join(self.command())}\n"
                                 .encode())
            self._log_file.flush()
        extra: dict[str, Any] = {}
        if self.own_session:
            extra = {"start_new_session": True, "preexec_fn": _die_with_parent}
        out = subprocess.PIPE if self.output == "pipe" else self._log_file
        self.proc = subprocess.Popen(self.command(), stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.environment(), cwd=self.cwd, **extra)
        self.paused = False
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def wait_ready(self, timeout: float = 15.0, ready: bool = True) -> "NodeProcess":
        """Wait until GET /healthz (and, with ``ready``, GET /readyz) answers 200."""
        paths = ["/healthz"] + (["/readyz"] if ready else [])

        def up() -> bool:
            if not self.running:
                raise NodeDied(f"node {self.node_id} exited with {self.returncode} while "
                               f"starting:\n{self.log_text(60)}")
            get = requests.get if self.session.trust_env else self.session.get  # no proxy
            return all(get(self.url + p, timeout=1.0, verify=self.tls_ca or True,
                           cert=self.tls_client).status_code == 200 for p in paths)

        try:
            wait_until(up, timeout, interval=0.03, what=f"node {self.node_id} to be ready")
        except NodeDied:
            if self.own_ports and self.starts < 4 and port_taken(self.log_text(20)):
                # a port the OS gave us went to another process (an outgoing connection
                # of a parallel test, say) before the node bound it: take two fresh ones
                self.http_port, self.cluster_port = free_ports(2)
                return self.start().wait_ready(timeout, ready)
            raise
        except HarnessError:
            raise HarnessError(f"node {self.node_id} not ready after {timeout:g}s:\n"
                               f"{self.log_text(60)}") from None
        return self

    def wait_exit(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"node {self.node_id} still running after {timeout:g}s:\n"
                               f"{self.log_text(60)}") from None

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap; a no-op when not running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.paused = False
        self._close_log()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but runs nothing (a VM freeze, a GC pause)."""
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self.signal(signal.SIGCONT)
        self.paused = False

    def terminate(self) -> None:
        """Send SIGTERM (and SIGCONT, so a paused node sees it); do not wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.paused:
                self.resume()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait for the exit (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            raise RuntimeError("never started")
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise HarnessError(f"node {self.node_id} ignored SIGTERM for {timeout:g}s:\n"
                                   f"{self.log_text(60)}") from None
        self._close_log()
        return self.proc.returncode

    def restart(self) -> "NodeProcess":
        """Kill (if running) and start again on the same ports and data dir."""
        self.kill()
        return self.start()

    def _close_log(self) -> None:
        if self._log_file is not None:
            try:
                self._log_file.close()
            except OSError:
                pass
            self._log_file = None

    def log_text(self, tail: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    # ------------------------------------------------------------ HTTP helpers
    def request(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 10)
        if self.tls_ca:  # per request: REQUESTS_CA_BUNDLE would win over the session's
            kw.setdefault("verify", self.tls_ca)
            kw.setdefault("cert", self.tls_client)
        return self.session.request(method, self.url + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> requests.Response:
        return self.request("DELETE", path, **kw)

    def enqueue(self, queue: str | None = None, **fields: Any) -> dict[str, Any]:
        """POST a JSON task; assert 200 and return the answer."""
        r = self.post("/queue" + (f"/{queue}" if queue else ""), json=fields)
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.get(f"/tasks/{task_id}")
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()

    def wait_task_state(self, task_id: str, state: str, timeout: float = 10.0) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            last.clear()
            last.update(self.task(task_id))
            return dict(last) if last.get("state") == state else None

        try:
            return wait_until(check, timeout, what=f"task {task_id} to be {state}")
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {last}") from None

    def counts(self, queue: str = "default") -> dict[str, int]:
        r = self.get(f"/queues/{queue}")
        assert r.status_code == 200, (r.status_code, r.text)
        return r.json()["counts"]

    def close(self) -> None:
        self.session.close()


def stop_all(nodes: Iterable[NodeProcess], timeout: float = 10.0) -> dict[str, int | None]:
    """SIGTERM every running node at once, SIGKILL what is left after ``timeout`` s;
    returns each started node's exit code (-9: it had to be killed)."""
    started = [n for n in nodes if n.proc is not None]
    for n in started:
        n.terminate()
    deadline = time.monotonic() + timeout
    for n in started:
        assert n.proc is not None
        try:
            n.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.kill()
        n._close_log()
    return {n.node_id: n.returncode for n in started}


def plan_cluster(base_dir: os.PathLike | str, ids: Sequence[str], *,
                 seed_all: bool = True, alone: bool = False, **kw: Any) -> list[NodeProcess]:
    """``len(ids)`` nodes on fresh ports. With ``seed_all`` each is seeded with every
    cluster address (itself included, as in cluster.example.ini), else with the first
    node's only (the first has none); with ``alone`` none is seeded (each a cluster of
    one). ``kw`` goes to every ``NodeProcess``."""
    ports = free_ports(2 * len(ids))
    addrs = [f"tcp://{LOCALHOST}:{ports[2 * i + 1]}" for i in range(len(ids))]
    nodes = []
    for i, node_id in enumerate(ids):
        seeds = [] if alone else addrs if seed_all else ([] if i == 0 else addrs[:1])
        nodes.append(NodeProcess(base_dir, node_id, http_port=ports[2 * i],
                                 cluster_port=ports[2 * i + 1], seeds=seeds, **kw))
    return nodes


def run_cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = 30.0,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m miyamoto ARGS`` to completion; returns the CompletedProcess (text)."""
    e = child_env()
    e.update(env or {})
    return subprocess.run([*PROGRAM, *args], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd)


def write_ini(path: os.PathLike | str, sections: Mapping[str, Mapping[str, Any]]) -> str:
    """Write ``{"miyamoto": {...}, "queue:default": {...}}`` as an INI file; returns the path."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {v}" for k, v in values.items())
        lines.append("")
    Path(path).write_text("\n".join(lines))
    return str(path)


def port_taken(log_tail: str) -> bool:
    """The node could not bind a port another process holds (HTTP or ZeroMQ)."""
    return "Address already in use" in log_tail
