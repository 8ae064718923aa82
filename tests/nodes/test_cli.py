"""The ``miyamoto`` client commands, run as real processes against a real node and sink.

Exit codes: 0 done, 1 the node said no or cannot be reached, 2 bad usage.
"""

from __future__ import annotations

import datetime
import fcntl
import http.server
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from helpers import REPO, NodeProcess, NotifySocket, run_cli, wait_until
from miyamoto import Client
from miyamoto.version import __version__  # noqa: F401  (the package under test is importable)

ADMIN = "admin-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"


def cli_env(node) -> dict[str, str]:
    return {"MIYAMOTO_SERVER": node.url}


def ok(cp: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert cp.returncode == 0, (cp.returncode, cp.stdout, cp.stderr)
    assert "Traceback" not in cp.stderr
    return cp


def jsonl(path: Path, tasks: list[dict]) -> str:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


@pytest.mark.timeout(60)
def test_enqueue_with_every_task_field(node, sink):
    env = cli_env(node)
    out = json.loads(ok(run_cli(
        "enqueue", f"{sink.url}/put", "--method", "PUT", "--queue", "clique",
        "-H", "X-Foo: bar baz", "--header", "X-Two:2", "--json", '{"k": [1, 2]}',
        "--max-attempts", "2", "--timeout", "4", "--countdown", "0.2", "--name", "the-one",
        "--callback", f"{sink.url}/cb", "--failure-callback", f"{sink.url}/fcb", env=env)).stdout)
    assert out["status"] == "scheduled" and out["queue"] == "clique" and out["name"] == "the-one"
    (req,) = sink.wait_for(count=1, path="/put")
    assert req.method == "PUT" and req.json() == {"k": [1, 2]}
    assert req.headers["X-Foo"] == "bar baz" and req.headers["X-Two"] == "2"
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["X-Task-Name"] == "the-one"
    sink.wait_for(count=1, path="/cb")
    task = node.wait_task_state(out["id"], "succeeded")
    assert task["max_attempts"] == 2 and task["timeout"] == 4 and task["queue"] == "clique"
    assert task["failure_callback"] == f"{sink.url}/fcb"

    ok(run_cli("enqueue", f"{sink.url}/raw", "--body", "<x/>", "--content-type",
               "application/xml", env=env))
    (raw,) = sink.wait_for(count=1, path="/raw")
    assert raw.body == b"<x/>" and raw.headers["Content-Type"] == "application/xml"
    ok(run_cli("enqueue", f"{sink.url}/form", "a=1", "tag=x", "tag=y", env=env))
    (form,) = sink.wait_for(count=1, path="/form")
    assert form.form == {"a": ["1"], "tag": ["x", "y"]}

    cp = run_cli("enqueue", f"{sink.url}/put", "--name", "the-one", "--queue", "clique", env=env)
    assert cp.returncode == 1 and out["id"] in cp.stderr and "duplicate" in cp.stderr
    cp = run_cli("enqueue", f"{sink.url}/x", "--max-attempts", "0", env=env)
    assert cp.returncode == 1 and "max_attempts" in cp.stderr, cp.stderr
    cp = run_cli("enqueue", f"{sink.url}/x", "--server", "http://127.0.0.1:9")
    assert cp.returncode == 1 and "cannot reach" in cp.stderr and "Traceback" not in cp.stderr
    # several nodes: a refused connection moves on to the next (here, the live node)
    servers = f"127.0.0.1:9,{node.url}"
    cp = ok(run_cli("enqueue", f"{sink.url}/y", "--server", servers, "--request-timeout", "5"))
    assert json.loads(cp.stdout)["status"] == "scheduled"
    ok(run_cli("status", "--server", servers, "--request-timeout", "5"))


@pytest.mark.timeout(60)
def test_bad_usage_exits_2(node, sink, tmp_path):
    env = cli_env(node)
    for args in (["enqueue"], ["enqueue", f"{sink.url}/x", "novalue"],
                 ["enqueue", f"{sink.url}/x", "--json", "{nope"],
                 ["enqueue", f"{sink.url}/x", "-H", "NoColon"],
                 ["enqueue", "--file", str(tmp_path / "missing.jsonl")],
                 ["enqueue", f"{sink.url}/x", "--file", jsonl(tmp_path / "a.jsonl", [{"url": "x"}])],
                 ["tasks", "--state", "bogus"], ["nosuchcommand"],
                 # params and a body: the node would refuse them (the README's line did this)
                 ["enqueue", f"{sink.url}/x", "k=v", "--json", '{"a": 1}'],
                 ["enqueue", f"{sink.url}/x", "--eta", "tomorrow"]):
        cp = run_cli(*args, env=env)
        assert cp.returncode == 2, (args, cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stderr
    assert sum(node.counts().values()) == 0


@pytest.mark.timeout(90)
def test_task_cancel_retry_tasks_pause_resume_purge(node, sink):
    env = cli_env(node)
    sink.reply("/flaky", 500, 200)
    failed = json.loads(ok(run_cli("enqueue", f"{sink.url}/flaky", "--max-attempts", "1",
                                   env=env)).stdout)["id"]
    node.wait_task_state(failed, "failed")
    assert json.loads(ok(run_cli("task", failed, env=env)).stdout)["state"] == "failed"
    table = ok(run_cli("tasks", "--state", "failed", env=env)).stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "STATE", "ATTEMPTS"]
    assert [line.split()[:3] for line in table[1:]] == [[failed, "failed", "1"]]
    ok(run_cli("retry", failed, env=env))
    node.wait_task_state(failed, "succeeded")

    later = json.loads(ok(run_cli("enqueue", f"{sink.url}/later", "--countdown", "60",
                                  env=env)).stdout)["id"]
    raw = json.loads(ok(run_cli("tasks", "default", "--json", env=env)).stdout)
    assert [t["id"] for t in raw["tasks"]] == [later] and raw["state"] == "scheduled"
    assert json.loads(ok(run_cli("cancel", later, env=env)).stdout)["state"] == "cancelled"
    cp = run_cli("cancel", failed, env=env)  # it has succeeded since: too late
    assert cp.returncode == 1 and "(409)" in cp.stderr and "Traceback" not in cp.stderr
    cp = run_cli("task", "no-such-task", env=env)
    assert cp.returncode == 1 and "(404)" in cp.stderr

    cp = run_cli("pause", "held", env=env)  # a queue nobody made: a control creates none
    assert cp.returncode == 1 and "names no queue" in cp.stderr and "(404)" in cp.stderr
    with Client(node.url) as c:
        c.enqueue(f"{sink.url}/later", queue="held", countdown=600)  # now it exists
    ok(run_cli("pause", "held", env=env))
    with Client(node.url) as c:
        assert c.queue("held")["paused"] is True
        held = c.enqueue(f"{sink.url}/held", queue="held")["id"]
        c.enqueue(f"{sink.url}/marker")
        sink.wait_for(count=1, path="/marker")
        assert sink.count("/held") == 0 and c.get(held)["state"] == "scheduled"
        ok(run_cli("resume", "held", env=env))
        sink.wait_for(count=1, path="/held")
        c.enqueue_batch([{"url": f"{sink.url}/never", "countdown": 60}] * 4, queue="doomed")
    assert json.loads(ok(run_cli("purge", "doomed", env=env)).stdout)["purged"] == 4
    assert node.counts("doomed")["scheduled"] == 0


@pytest.mark.timeout(90)
def test_file_of_500_tasks_all_delivered(node, sink, tmp_path):
    tasks = [{"url": f"{sink.url}/bulk", "params": {"i": i}} for i in range(490)]
    tasks += [{"url": f"{sink.url}/bulk", "params": {"i": 490 + i}, "queue": "other"}
              for i in range(10)]
    path = jsonl(tmp_path / "tasks.jsonl", tasks)
    cp = ok(run_cli("enqueue", "--file", path, "--batch-size", "64", env=cli_env(node)))
    assert json.loads(cp.stdout) == {"tasks": 500, "scheduled": 500, "duplicate": 0, "error": 0}
    assert cp.stderr == ""  # piped: no progress bar
    reqs = sink.wait_for(count=500, path="/bulk", timeout=60)
    assert sorted(int(r.form["i"][0]) for r in reqs) == list(range(500))
    assert len({r.task_id for r in reqs}) == 500
    assert node.counts("other")["succeeded"] == 10

    # a bad line is found before anything is sent; a field the node refuses names its line
    bad = jsonl(tmp_path / "bad.jsonl", [{"url": f"{sink.url}/b"}] * 3)
    Path(bad).write_text(Path(bad).read_text() + "{not json\n")
    cp = run_cli("enqueue", "--file", bad, env=cli_env(node))
    assert cp.returncode == 2 and "line 4" in cp.stderr
    refused = jsonl(tmp_path / "refused.jsonl", [{"url": f"{sink.url}/b"}, {"url": "ftp://x/"}])
    cp = run_cli("enqueue", "--file", refused, env=cli_env(node))
    assert cp.returncode == 1 and "line 2: url" in cp.stderr, cp.stderr
    named = jsonl(tmp_path / "named.jsonl", [{"url": f"{sink.url}/n", "name": "n"}] * 2)
    cp = run_cli("enqueue", "--file", named, env=cli_env(node))
    assert cp.returncode == 1 and json.loads(cp.stdout)["duplicate"] == 1
    sink.wait_for(count=1, path="/n")
    assert sink.count("/b") == 0


@pytest.mark.timeout(60)
def test_progress_bar_only_on_a_terminal(node, sink, tmp_path):
    path = jsonl(tmp_path / "t.jsonl", [{"url": f"{sink.url}/p"}] * 20)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real size
    try:
        cp = subprocess.run([sys.executable, "-m", "miyamoto", "enqueue", "--file", path,
                             "--batch-size", "5"], stdout=subprocess.PIPE, stderr=slave,
                            env=dict(os.environ, PYTHONPATH=str(REPO), **cli_env(node)),
                            timeout=30, text=True)
        os.close(slave)
        drawn = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(master)
    assert cp.returncode == 0
    assert b"20/20" in drawn, drawn
    sink.wait_for(count=20, path="/p")


@pytest.mark.timeout(60)
def test_status_table_json_and_a_closed_pipe(node, sink, tmp_path):
    env = cli_env(node)
    with Client(node.url) as c:
        node.wait_task_state(c.enqueue(f"{sink.url}/s")["id"], "succeeded")
        c.enqueue_batch([{"url": f"{sink.url}/later", "countdown": 60, "params": {"i": i}}
                         for i in range(700)], queue="big")
    lines = ok(run_cli("status", env=env)).stdout.splitlines()
    assert lines[0].startswith(f"node {node.node_id} (leader), leader {node.node_id}")
    header = [line for line in lines if line.startswith("QUEUE")][0].split()
    assert header == ["QUEUE", "PAUSED", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED",
                      "CANCELLED", "EXPIRED", "COPIES"]  # tasks by state; copies of them (one per replica)
    rows = {line.split()[0]: line.split()[1:] for line in lines[lines.index(
        [x for x in lines if x.startswith("QUEUE")][0]) + 1:]}
    assert rows["default"] == ["no", "0", "0", "1", "0", "0", "0", "1"]
    assert rows["big"] == ["no", "700", "0", "0", "0", "0", "0", "700"]
    assert any(line.split()[:2] == [node.node_id, "*"] for line in lines)
    raw = json.loads(ok(run_cli("status", "--json", env=env)).stdout)
    assert raw["cluster"]["leader"] == node.node_id
    assert {q["name"] for q in raw["queues"]} >= {"default", "big"}

    # a reader that is gone before anything is written: every write fails (EPIPE)
    r, w = os.pipe()
    os.close(r)
    child_env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    for args in (["status"], ["tasks", "big", "--json", "--limit", "1000"]):
        cp = subprocess.run([sys.executable, "-m", "miyamoto", *args], stdout=w,
                            stderr=subprocess.PIPE, env=child_env, timeout=30, text=True)
        assert cp.stderr == "" and cp.returncode == 141, (args, cp.returncode, cp.stderr)
    os.close(w)
    # and the shell's way: head reads one line and leaves (the tasks answer is > 64 KiB)
    for args in ("status", "tasks big --json --limit 1000"):
        cp = subprocess.run(["sh", "-c", f"{sys.executable} -m miyamoto {args} | head -1"],
                            capture_output=True, env=child_env, timeout=30, text=True)
        assert cp.returncode == 0 and cp.stderr == "", cp.stderr
        assert len(cp.stdout.splitlines()) == 1


@pytest.mark.timeout(60)
def test_tokens_by_flag_and_environment(node_factory, sink):
    n = node_factory("guarded", env={"MIYAMOTO_API_TOKENS": f"admin:{ADMIN},read:{READ}"})
    env = cli_env(n)
    cp = run_cli("status", env=env)
    assert cp.returncode == 1 and "(401)" in cp.stderr and "missing" in cp.stderr
    ok(run_cli("status", "--token", READ, env=env))
    ok(run_cli("status", env=dict(env, MIYAMOTO_TOKEN=READ)))
    ok(run_cli("status", env=dict(env, MIYAMOTO_API_TOKEN=READ)))  # the older name
    cp = run_cli("enqueue", f"{sink.url}/t", env=dict(env, MIYAMOTO_TOKEN=READ))
    assert cp.returncode == 1 and "(403)" in cp.stderr
    cp = run_cli("pause", "default", "--token", "not-a-token-at-all-0123", env=env)
    assert cp.returncode == 1 and "(401)" in cp.stderr
    # the flag wins over the environment
    ok(run_cli("enqueue", f"{sink.url}/t", "--token", ADMIN, env=dict(env, MIYAMOTO_TOKEN=READ)))
    sink.wait_for(count=1, path="/t")
    assert ADMIN not in n.log_text() and READ not in n.log_text()


def cli_on_a_terminal(args: list[str], typed: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the CLI with a pty as its stdin (a person at a terminal) who types ``typed``."""
    master, slave = pty.openpty()
    try:
        os.write(master, typed.encode())  # waits in the tty's line buffer until read
        cp = subprocess.run([sys.executable, "-m", "miyamoto", *args], stdin=slave,
                            capture_output=True, text=True, timeout=30,
                            env=dict(os.environ, PYTHONPATH=str(REPO), **env))
    finally:
        os.close(slave)
        os.close(master)
    return cp


@pytest.mark.timeout(90)
def test_failed_list_retry_and_delete(node, sink):
    env = cli_env(node)
    sink.reply("/dead", 500)
    with Client(node.url) as c:
        ids = [c.enqueue(f"{sink.url}/dead", {"i": i}, queue="dlq", max_attempts=1,
                         name=f"dead-{i}" if i == 0 else None)["id"] for i in range(3)]
    for task_id in ids:
        node.wait_task_state(task_id, "failed")
    table = ok(run_cli("failed", "list", "dlq", env=env)).stdout.splitlines()
    assert table[0].split() == ["ID", "ATTEMPTS", "FAILED", "LAST", "NAME", "URL"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert set(rows) == set(ids)
    assert all("HTTP 500" in row and "ago" in row for row in rows.values()), table
    assert "dead-0" in rows[ids[0]]
    raw = json.loads(ok(run_cli("failed", "list", "dlq", "--json", env=env)).stdout)
    assert sorted(t["id"] for t in raw["tasks"]) == sorted(ids) and raw["state"] == "failed"
    assert ok(run_cli("failed", "list", env=env)).stdout.splitlines()[1:] == []  # default

    # delete: never without --yes when nobody can answer; at a terminal, only on "y"
    cp = subprocess.run([sys.executable, "-m", "miyamoto", "failed", "delete", "dlq"],
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                        env=dict(os.environ, PYTHONPATH=str(REPO), **env))
    assert cp.returncode == 2 and "--yes" in cp.stderr and "Traceback" not in cp.stderr
    cp = cli_on_a_terminal(["failed", "delete", "dlq"], "n\n", env)
    assert cp.returncode == 1 and "3 failed task(s)" in cp.stderr and "not deleted" in cp.stderr
    assert node.counts("dlq")["failed"] == 3

    # retry the whole list: the target works now
    sink.reply("/dead", 200)
    out = json.loads(ok(run_cli("failed", "retry", "dlq", env=env)).stdout)
    assert {k: out[k] for k in ("queue", "action", "count", "more")} == \
        {"queue": "dlq", "action": "retry", "count": 3, "more": False}
    for task_id in ids:
        node.wait_task_state(task_id, "succeeded")
    assert len(sink.wait_for(count=6, path="/dead")) == 6  # 3 failed + 3 retried

    sink.reply("/gone", 500)
    with Client(node.url) as c:
        doomed = [c.enqueue(f"{sink.url}/gone", queue="dlq", max_attempts=1)["id"]
                  for _ in range(2)]
    for task_id in doomed:
        node.wait_task_state(task_id, "failed")
    cp = ok(cli_on_a_terminal(["failed", "delete", "dlq"], "y\n", env))
    assert json.loads(cp.stdout)["count"] == 2 and "2 failed task(s)" in cp.stderr
    assert node.counts("dlq")["failed"] == 0
    with Client(node.url) as c:
        again = c.enqueue(f"{sink.url}/gone", queue="dlq", max_attempts=1)["id"]
    node.wait_task_state(again, "failed")
    out = json.loads(ok(run_cli("failed", "delete", "dlq", "--yes", env=env)).stdout)
    assert out["count"] == 1 and node.counts("dlq")["failed"] == 0
    cp = run_cli("failed", "retry", "dlq", "--server", "http://127.0.0.1:9")
    assert cp.returncode == 1 and "cannot reach" in cp.stderr


@pytest.mark.timeout(60)
def test_enqueue_dedupe_content_and_a_server_without_scheme(node, sink):
    env = {"MIYAMOTO_SERVER": node.url.removeprefix("http://")}
    args = ("enqueue", f"{sink.url}/d", "k=v", "-H", "X-A: 1", "--dedupe", "content")
    first = json.loads(ok(run_cli(*args, env=env)).stdout)
    assert first["name"].startswith("content:")
    cp = run_cli(*args, env=env)
    assert cp.returncode == 1 and "duplicate" in cp.stderr and first["id"] in cp.stderr
    ok(run_cli("enqueue", f"{sink.url}/d", "k=w", "--dedupe", "content", env=env))
    cp = run_cli("enqueue", f"{sink.url}/d", "--dedupe", "content", "--name", "n", env=env)
    assert cp.returncode == 1 and "dedupe" in cp.stderr, cp.stderr
    cp = run_cli("enqueue", f"{sink.url}/d", "--dedupe", "body", env=env)
    assert cp.returncode == 2
    reqs = sink.wait_for(count=2, path="/d")
    assert sorted(r.form["k"][0] for r in reqs) == ["v", "w"]


@pytest.mark.timeout(10)
def test_failed_table_layout_with_a_fake_clock():
    from miyamoto.cli.tables import LAST_CHARS, failed_lines

    long_error = "ConnectTimeout: " + "x" * 100 + "\nsecond line"
    lines = failed_lines([
        {"id": "a1", "attempts": 3, "finished": 990.0, "last_response": {"status": 503},
         "name": None, "url": "http://t/1"},
        {"id": "b22", "attempts": 1, "finished": 999.5, "name": "nm", "url": "http://t/2",
         "last_response": {"status": None, "error": long_error}},
        {"id": "c", "attempts": 0, "finished": None, "last_response": None},
    ], now=1000.0)
    assert lines[0].split() == ["ID", "ATTEMPTS", "FAILED", "LAST", "NAME", "URL"]
    assert lines[1].split() == ["a1", "3", "10.0", "s", "ago", "HTTP", "503", "-", "http://t/1"]
    cell = lines[2][lines[0].index("LAST"):lines[0].index("NAME")].rstrip()
    assert cell.startswith("ConnectTimeout: xxx") and cell.endswith("...")
    assert len(cell) == LAST_CHARS and "second" not in lines[2]
    assert lines[3].split() == ["c", "0", "-", "-", "-", "-"]


class _NotANode(http.server.BaseHTTPRequestHandler):
    """Another service on the port: a 200 with JSON that is no roster, or a 404 page."""

    def do_GET(self):
        found = self.path == "/cluster" and self.server.answer_cluster  # type: ignore[attr-defined]
        body = b'{"hello": "world"}' if found else b"<!DOCTYPE html>\n<html>\n<p>Not Found</p>\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.timeout(30)
@pytest.mark.parametrize("answer_cluster,says", [
    (True, "GET /cluster answered without a roster"), (False, "GET /cluster answered 404")])
def test_status_against_something_that_is_not_a_node_says_so(answer_cluster, says):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotANode)
    server.answer_cluster = answer_cluster  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        cp = run_cli("status", "--server", url)
    finally:
        server.shutdown()
    # was "node None (None), leader None" and exit 0
    assert cp.returncode == 1 and cp.stdout == "", (cp.returncode, cp.stdout, cp.stderr)
    assert cp.stderr.startswith(f"miyamoto: {url} is not a Miyamoto node: {says}"), cp.stderr
    assert len(cp.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(60)
def test_times_are_rfc3339_unless_raw_and_eta_takes_either(node, sink):
    env = cli_env(node)
    eta = int(time.time()) + 3 * 86400 + 600
    text = datetime.datetime.fromtimestamp(eta, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = json.loads(ok(run_cli("enqueue", f"{sink.url}/t", "--eta", text, env=env)).stdout)
    shown = json.loads(ok(run_cli("task", out["id"], env=env)).stdout)
    assert shown["eta"] == text and shown["next_attempt"] == text, shown  # was 1796178233.03
    assert shown["created"].endswith("Z") and "T" in shown["created"]
    raw = json.loads(ok(run_cli("task", out["id"], "--raw", env=env)).stdout)
    assert raw["eta"] == eta
    table = ok(run_cli("tasks", env=env)).stdout.splitlines()
    assert table[1].split()[3:7] == ["in", "3", "d", "0"], table  # WHEN: in 3 d 0 h


@pytest.mark.timeout(60)
def test_serve_with_a_secret_file_it_cannot_read_exits_2_naming_it(tmp_path):
    missing = tmp_path / "no-such-secret"
    cp = run_cli("serve", "--data-dir", ":memory:",
                 env={"MIYAMOTO_CURVE_SECRET_FILE": str(missing)})
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert f"curve_secret_file: cannot read {missing}" in cp.stderr and "Traceback" not in cp.stderr


@pytest.mark.timeout(60)
def test_serve_tells_systemd_it_is_ready_and_then_stopping(tmp_path, proc_registry):
    """sd_notify: READY=1 from the node's own pid once it serves, STOPPING=1 at SIGTERM."""
    listener = NotifySocket()
    try:
        node = NodeProcess(tmp_path, "n", registry=proc_registry,
                           raw_env={"NOTIFY_SOCKET": listener.name}).start().wait_ready()
        ready = wait_until(lambda: [m for m in listener.poll() if m[1].startswith("READY=1")],
                           timeout=10, what="READY=1")
        assert ready == [(node.pid, f"READY=1\nSTATUS=serving http://{node.http_addr}")]
        assert node.stop() == 0
        assert listener.poll()[-1] == (node.pid, "STOPPING=1\nSTATUS=draining")
    finally:
        listener.close()
