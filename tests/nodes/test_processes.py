"""``miyamoto serve --processes N``: N nodes of one host behind one HTTP port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
import requests

from harness import PROGRAM, child_env
from helpers import NotifySocket, free_port, wait_until
from miyamoto.cli import processes
from miyamoto.config import settings as config_mod


def consecutive_free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free right now (asked of the OS, then checked)."""
    for _ in range(50):
        p = free_port()
        if p + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", p + i))
                socks.append(s)
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


def test_the_plan_gives_each_child_its_own_id_ports_and_data_dir():
    c = config_mod.load(env={}, flags={"processes": "3", "http": "127.0.0.1:9000",
                                       "cluster": "tcp://127.0.0.1:7000", "node": "h",
                                       "data_dir": "/d", "zone": "rack"})
    kids = processes.plan(c, {"http": "127.0.0.1:9000", "log_level": "info"})
    assert len(kids) == 3
    for i, (argv, env) in enumerate(kids):
        a = dict(zip(argv[4::2], argv[5::2]))
        assert a["--node"] == f"h-{i + 1}" and a["--data-dir"] == f"/d/h-{i + 1}"
        assert a["--cluster"] == f"tcp://127.0.0.1:{7000 + i}" and a["--zone"] == "rack"
        assert a["--seeds"] == "tcp://127.0.0.1:7000,tcp://127.0.0.1:7001,tcp://127.0.0.1:7002"
        assert a["--http"] == "127.0.0.1:9000" and a["--reuse-port"] == "true"
        assert len(env["MIYAMOTO_CURVE_SECRET"]) == 40  # a pair for the children
    assert kids[0][1] is kids[1][1]
    with pytest.raises(config_mod.ConfigError, match="processes"):
        processes.plan(config_mod.load(env={}, flags={"processes": "2", "http": "127.0.0.1:0"}),
                       {})


@pytest.mark.timeout(90)
def test_two_processes_share_one_port_and_form_a_cluster(tmp_path, sink):
    http, cport = free_port(), consecutive_free_ports(2)
    log = open(tmp_path / "serve.log", "wb")
    listener = NotifySocket()  # systemd hears the supervisor only, never its children
    proc = subprocess.Popen(
        [*PROGRAM, "serve", "--processes", "2", "--node", "h",
         "--http", f"127.0.0.1:{http}", "--cluster", f"tcp://127.0.0.1:{cport}",
         "--data-dir", str(tmp_path / "data"), "--heartbeat-interval", "0.1",
         "--failure-timeout", "1", "--election-timeout-min", "0.3",
         "--election-timeout-max", "0.6"],
        env={**child_env(), "NOTIFY_SOCKET": listener.name}, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{http}"
    try:
        def both_in_roster() -> bool:
            try:
                v = requests.get(f"{url}/cluster", timeout=2).json()
            except (requests.RequestException, ValueError):
                return False
            return sorted(m["id"] for m in v.get("members", ())) == ["h-1", "h-2"] and \
                bool(v.get("leader"))

        wait_until(both_in_roster, 30, what="h-1 and h-2 in one roster")
        assert listener.poll() == [(proc.pid, "READY=1\nSTATUS=2 nodes started")]
        v = requests.get(f"{url}/cluster", timeout=2).json()
        assert len({m["zone"] for m in v["members"]}) == 1
        # new connections land on both processes
        seen = set()
        deadline = time.monotonic() + 20
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.add(requests.get(f"{url}/healthz", timeout=2).json()["node"])
        assert seen == {"h-1", "h-2"}
        ids = set()
        for i in range(40):
            r = requests.post(f"{url}/queue", data={"task.url": f"{sink.url}/p", "i": str(i)},
                              timeout=10)
            assert r.status_code == 200, r.text
            ids.add(r.json()["id"])
        sink.wait_for(lambda rs: {r.task_id for r in rs} >= ids, path="/p", timeout=20)
        assert sorted(os.listdir(tmp_path / "data")) == ["h-1", "h-2"]

        # a child killed outright is started again
        pids = {int(line.rsplit("pid ", 1)[1].rstrip(")\n")) for line in
                (tmp_path / "serve.log").read_text().splitlines() if "(pid " in line}
        os.kill(min(pids), signal.SIGKILL)
        wait_until(lambda: "starting it again" in (tmp_path / "serve.log").read_text(), 10,
                   what="the supervisor to restart the child")
        wait_until(both_in_roster, 30, what="the restarted child back in the roster")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert listener.poll() == [(proc.pid, "READY=1\nSTATUS=2 nodes started"),
                               (proc.pid, "STOPPING=1")]  # a restarted child said nothing
    listener.close()

