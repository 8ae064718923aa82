"""The README as written: its command blocks run against a real node, in order, from a
work dir laid out as the README assumes (``./miyamoto-data``, ``.venv/bin/...``).

Every command in a code block of the README is in exactly one of three lists: run as it
is (its ``localhost:8088`` and ``localhost:9099`` pointed at the node and the sink, its
``<id>`` at a task), run as the concrete commands given for a synopsis line (``URL``,
``QUEUE`` ...), or skipped with the reason. A README command in none of them, or a list
entry the README lost, fails the test, so the README cannot drift from what runs. The
first README line (install, then ``miyamoto serve``) is the node this test starts: no
cluster key, so no cluster port, HTTP on a free port. The Python client block runs as a
script. The backup recipe is run live, the data dir is then lost, the restore recipe run,
and the node started again must hold the task, the schedule and the topic it had.

``curl`` is run as ``curl -sS --fail-with-body`` (a 4xx or 5xx fails the command) and
``miyamoto``, ``.venv/bin/miyamoto``, ``.venv/bin/python`` lead to this checkout.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.nodes import child_env
from helpers import REPO, NodeProcess, ProcessRegistry, Sink, wait_until
from miyamoto import Client

README = REPO / "README"
_COMMAND = re.compile(r"(curl|miyamoto|\.venv/bin/|python3|nc|sudo|sqlite3|mkdir|cp|rm)\b")

SKIPPED = {
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/miyamoto serve":
        "the install (.ci/run makes it on a fresh clone); the node this test starts is its "
        "last step, on a free port",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pytest":
        "the suite this test is part of",
    "nc -l 9099": "a terminal that prints a request; the sink plays the worker here",
    ".venv/bin/python scripts/cluster.py cluster.example.ini":
        "tests/nodes/test_cluster_script.py runs it (on free ports)",
    ".venv/bin/miyamoto status --server http://127.0.0.1:8081":
        "cluster.example.ini's fixed ports; `status` runs below against this node",
    ".venv/bin/python scripts/chaos.py pause": "minutes of faults on three nodes",
    ".venv/bin/python scripts/chaos.py kill": "minutes of faults on three nodes",
    ".venv/bin/python scripts/features_kill9.py": "minutes of kill -9 on three nodes "
                                                  "(tests/nodes/test_features_kill9.py runs "
                                                  "three of its scenarios)",
    "sudo .venv/bin/python scripts/partition.py all": "needs root (network namespaces)",
    ".venv/bin/python scripts/mutate.py -m siblings -m retry --budget 900": "a 15-min run",
    ".venv/bin/python scripts/mutate.py --package replicas --budget 1800": "a 30-min run",
    ".venv/bin/python scripts/bench.py --tasks 20000 --connections 50": "a benchmark",
    ".venv/bin/python scripts/bench.py --tasks 20000 --connections 50 --memory": "a benchmark",
    ".venv/bin/python scripts/bench.py --paced 100 --tasks 1000": "a benchmark",
    ".venv/bin/python scripts/bench.py --delayed 100000 --rss": "a benchmark",
    ".venv/bin/python scripts/bench.py --prefill 10000000 --delayed 20000": "a benchmark",
    ".venv/bin/python scripts/bench.py --nodes 3 --replication 2": "a benchmark",
    ".venv/bin/python scripts/bench.py --nodes 3 --standalone":
        "a benchmark (tests/nodes/test_bench_standalone.py runs --standalone)",
    ".venv/bin/python scripts/bench.py --nodes 3 --replication 2 --entry 1":
        "a benchmark (tests/nodes/test_bench_entry.py runs --entry)",
    ".venv/bin/python scripts/bench.py --tasks 10000 --connections 20 --qstash": "a benchmark",
    ".venv/bin/python scripts/bench.py --memory --plot latency.png":
        "a benchmark (tests/nodes/test_bench_plot.py runs --plot)",
    ".venv/bin/pip install -e '.[compare]'": "installs celery and redis-py",
    ".venv/bin/python scripts/celery_compare.py --tasks 10000": "a benchmark against Celery",
    ".venv/bin/python scripts/transport_bench.py": "a benchmark",
}

# the commands of each block, in the README's order, run as they are
AS_IS = [
    'curl -d "task.url=http://localhost:9099/worker&task.countdown=5&foo=bar" '
    'http://localhost:8088/queue',
    "curl -H 'Content-Type: application/json' -d '{\"url\": \"http://localhost:9099/worker\", "
    '"params": {"foo": "bar"}, "countdown": 5}\' http://localhost:8088/queue',
    "curl 'http://localhost:8088/queues/default/tasks?state=failed'",
    "curl -X POST http://localhost:8088/tasks/<id>/retry",
    "curl -X DELETE http://localhost:8088/tasks/<id>",
    "curl -X POST http://localhost:8088/queues/default/failed/retry",
    "curl -X POST http://localhost:8088/queues/default/failed/delete",
    "curl -d '{\"name\": \"nightly\", \"cron\": \"0 3 * * *\", \"timezone\": \"Europe/Paris\", "
    '"task": {"url": "http://localhost:9099/report", "params": {"k": "v"}}}\' '
    "-H 'Content-Type: application/json' http://localhost:8088/schedules",
    "curl -X PUT -d '{\"urls\": [\"http://a:9099/hook\", \"http://b:9099/hook\"]}' "
    "-H 'Content-Type: application/json' http://localhost:8088/topics/orders",
    "curl -d 'task.topic=orders&id=42' http://localhost:8088/queue",
    "curl -H 'Upstash-Delay: 5s' -H 'Upstash-Retries: 2' -d 'hello' "
    "http://localhost:8088/v2/publish/http://localhost:9099/qstash",
]
BACKUP = [
    "mkdir -p backups",
    'sqlite3 miyamoto-data/journal.sqlite3 ".backup backups/journal.sqlite3"',
    "cp miyamoto-data/definitions.json backups/",
    ".venv/bin/python -c \"import sqlite3; sqlite3.connect('miyamoto-data/journal.sqlite3')"
    ".backup(sqlite3.connect('backups/journal.sqlite3'))\"",
]
RESTORE = [
    "rm -f miyamoto-data/journal.sqlite3-wal miyamoto-data/journal.sqlite3-shm",
    "mkdir -p miyamoto-data && cp backups/journal.sqlite3 backups/definitions.json miyamoto-data/",
]

# a synopsis line of the command-line block -> the commands that stand for it
# ({sink}: the sink's URL, {later}: a scheduled task's id, {eta}: a time half an hour
# ahead, still ahead when a slow run reaches the last command that names it)
SYNOPSIS = {
    "miyamoto enqueue URL k=v k=v2 --countdown 5 --name N --queue Q --method PUT "
    "-H 'X-Foo: 1' --max-attempts 3 --timeout 10 --callback URL": [
        "miyamoto enqueue {sink}/w k=v k=v2 --countdown 5 --name n1 --queue q --method PUT "
        "-H 'X-Foo: 1' --max-attempts 3 --timeout 10 --callback {sink}/cb"],
    "miyamoto enqueue URL --json '{\"a\": 1}'": ["miyamoto enqueue {sink}/j --json '{{\"a\": 1}}'"],
    "miyamoto enqueue URL --body '<x/>' --content-type application/xml --eta TIME "
    "--failure-callback URL --dedupe content": [
        "miyamoto enqueue {sink}/x --body '<x/>' --content-type application/xml --eta {eta} "
        "--failure-callback {sink}/f --dedupe content"],
    "miyamoto enqueue --file tasks.jsonl": ["miyamoto enqueue --file tasks.jsonl"],
    "miyamoto task ID; miyamoto cancel ID; miyamoto retry ID": [
        "miyamoto task {later}; miyamoto cancel {later}; miyamoto retry {later}"],
    "miyamoto find NAME --queue Q": ["miyamoto find n1 --queue q"],
    "miyamoto browse --state failed --queue Q --name-prefix P [--json]": [
        "miyamoto browse --state failed --queue q --name-prefix n",
        "miyamoto browse --state failed --queue q --name-prefix n --json"],
    "miyamoto tasks QUEUE --state failed --limit 20 [--json]": [
        "miyamoto tasks default --state failed --limit 20",
        "miyamoto tasks default --state failed --limit 20 --json"],
    "miyamoto pause|resume|purge QUEUE": [
        "miyamoto pause q", "miyamoto resume q", "miyamoto purge q"],
    "miyamoto queue set QUEUE rate=5 burst=10 paused=true": [
        "miyamoto queue set q rate=5 burst=10 paused=true"],
    "miyamoto queue show|reset QUEUE": ["miyamoto queue show q", "miyamoto queue reset q"],
    "miyamoto failed list QUEUE [--json]": [
        "miyamoto failed list default", "miyamoto failed list default --json"],
    "miyamoto failed retry QUEUE": ["miyamoto failed retry default"],
    "miyamoto failed delete QUEUE [--yes]": ["miyamoto failed delete default --yes"],
    "miyamoto status [--json]": ["miyamoto status", "miyamoto status --json"],
    "miyamoto targets": ["miyamoto targets"],
    "miyamoto enqueue URL --priority 9 --flow-key partner --flow-rate 5 --flow-parallelism 2": [
        "miyamoto enqueue {sink}/p --priority 9 --flow-key partner --flow-rate 5 "
        "--flow-parallelism 2"],
    "miyamoto schedules; miyamoto schedule add NAME URL k=v (--cron EXPR | --every S) "
    "[--timezone TZ] [--catch-up last|none] [--queue Q] [--task-json JSON]": [
        "miyamoto schedules",
        "miyamoto schedule add daily {sink}/d k=v --cron '0 3 * * *' --timezone Europe/Paris "
        "--catch-up none --queue q --task-json '{{\"max_attempts\": 2}}'",
        "miyamoto schedule add beat {sink}/b --every 3600 --catch-up last"],
    "miyamoto schedule add NAME URL --cron '*/5 * * * * *' --cron-seconds-last": [
        "miyamoto schedule add fast {sink}/s --cron '*/5 * * * * *' --cron-seconds-last"],
    "miyamoto schedule show|delete|pause|resume|run NAME": [
        "miyamoto schedule show daily", "miyamoto schedule pause daily",
        "miyamoto schedule resume daily", "miyamoto schedule run daily",
        "miyamoto schedule delete fast"],
    "miyamoto resend ID; miyamoto resend --queue Q --state expired --target URL --since TIME": [
        "miyamoto resend {later}",  # retried above: it has run (succeeded) since
        "miyamoto resend --queue default --state failed --target {sink}/ --since {eta}"],
    "miyamoto enqueue URL --ttl 300 --retry-delays 1,10,60": [
        "miyamoto enqueue {sink}/ttl --ttl 300 --retry-delays 1,10,60",
        "miyamoto enqueue {sink}/ttl --expires-at {eta}"],
    "miyamoto topics; miyamoto topic put NAME URL...; miyamoto topic show|delete NAME": [
        "miyamoto topics", "miyamoto topic put news {sink}/n1 {sink}/n2",
        "miyamoto topic show news", "miyamoto topic put gone {sink}/g",
        "miyamoto topic delete gone"],
    "miyamoto topic publish NAME k=v [--task-name N] [--queue Q]": [
        "miyamoto topic publish news k=v --task-name once --queue q"],
}


def readme_commands(text: str) -> list[str]:
    """The shell commands of the README's code blocks (4-space indented, or fenced and
    not python), each on one line (continuations joined), comments and outputs left out."""
    commands: list[str] = []
    block: list[str] = []
    fence: str | None = None
    lines = text.split("\n")
    for i, line in enumerate(lines + ["(end)"]):
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
            else:
                commands += _block_commands(block) if fence != "python" else []
                fence, block = None, []
        elif fence is not None:
            block.append(line)
        elif line.startswith("    ") and (block or not lines[i - 1].strip()):
            block.append(line[4:])
        elif line.strip() or not block:
            commands += _block_commands(block)
            block = []
    return commands


def _block_commands(block: list[str]) -> list[str]:
    first = next((b for b in block if b.strip()), "")
    if not _COMMAND.match(first):
        return []  # an example of what is sent or received
    out: list[str] = []
    joined = ""
    for line in block:
        line = re.split(r"\s{2,}#", line.strip())[0]  # a comment: two spaces, then #
        if not line or line.startswith("{"):  # an answer shown under its command
            continue
        if joined:
            line = joined + " " + line
        if line.endswith("\\"):
            joined = line[:-1].rstrip()
            continue
        if not _closed(line):  # a quoted argument that goes on on the next line
            joined = line
            continue
        joined = ""
        out.append(line)
    return out


def _closed(line: str) -> bool:
    try:
        shlex.split(line)
    except ValueError:
        return False
    return True


def python_block(text: str) -> str:
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_every_readme_command_is_run_or_skipped_with_a_reason() -> None:
    listed = [*SKIPPED, *AS_IS, *BACKUP, *RESTORE, *SYNOPSIS]
    assert len(listed) == len(set(listed))
    found = readme_commands(README.read_text())
    assert [c for c in found if c not in listed] == [], "README commands this test ignores"
    assert [c for c in listed if c not in found] == [], "listed commands the README lost"


def test_every_file_the_readme_names_exists() -> None:
    text = README.read_text()
    named = set(re.findall(r"`((?:miyamoto|tests|scripts)/[\w/.-]+|[\w.-]+\.(?:ini|md))`", text))
    named |= set(re.findall(r"\]\(([\w./-]+)\)", text))  # links: [ARCHITECTURE.md](...)
    assert "LICENSE" in named and "miyamoto/replicas/siblings.py" in named
    named.discard("tests/artifacts/")  # where the browser test writes its screenshots
    assert sorted(p for p in named if not (REPO / p).exists()) == []


class Work:
    """The README's working directory: a node (no key, data in ./miyamoto-data), a sink
    as the worker, ``curl`` that fails on an error status, and shims of .venv/bin."""

    def __init__(self, tmp: Path, registry: ProcessRegistry, sink: Sink):
        self.dir = tmp / "work"
        self.sink = sink
        bin_dir, venv = self.dir / "bin", self.dir / ".venv" / "bin"
        for d in (bin_dir, venv):
            d.mkdir(parents=True)
        run_py = f'exec "{sys.executable}"'
        for path, body in ((venv / "python", f'{run_py} "$@"'),
                           (venv / "miyamoto", f'{run_py} -m miyamoto "$@"'),
                           (bin_dir / "miyamoto", f'{run_py} -m miyamoto "$@"'),
                           (bin_dir / "curl", f'exec "{shutil.which("curl")}" -sS '
                                              '--fail-with-body "$@"')):
            path.write_text(f"#!/bin/sh\n{body}\n")
            path.chmod(0o755)
        self.node = NodeProcess(tmp, "readme", data_dir="miyamoto-data", cwd=self.dir,
                                with_cluster_flags=False, registry=registry,
                                env={"curve_public": "", "curve_secret": ""})
        self.env = child_env({"server": self.node.url})
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env['PATH']}"
        self.fields: dict[str, str] = {"sink": sink.url}

    def concrete(self, command: str) -> str:
        for base in ("http://localhost:8088", "http://127.0.0.1:8088"):
            command = command.replace(base, self.node.url)
        command = command.replace("http://localhost:9099", self.sink.url)
        return command.replace("<id>", self.fields.get("id", "<id>"))

    def sh(self, command: str, expect: int = 0) -> subprocess.CompletedProcess:
        cp = subprocess.run(["bash", "-c", command], cwd=self.dir, env=self.env,
                            capture_output=True, text=True, timeout=30)
        assert cp.returncode == expect, (command, cp.returncode, cp.stdout, cp.stderr)
        assert "Traceback" not in cp.stderr, (command, cp.stderr)
        return cp

    def client(self) -> Client:
        return Client(self.node.url)


def _need(program: str) -> None:
    if shutil.which(program) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{program} is missing (.ci/run installs it)")
        pytest.skip(f"no {program} here")


def _failed_task(w: Work) -> str:
    """A task in the failed list, for the README's <id>: its target answers 500."""
    w.sink.reply("/fails", 500)
    with w.client() as c:
        task_id = c.enqueue(f"{w.sink.url}/fails", max_attempts=1)["id"]
        wait_until(lambda: c.get(task_id)["state"] == "failed", timeout=15)
    return task_id


def _run_http_blocks(w: Work) -> None:
    """The curl blocks: enqueue, the failed list (<id> is a failed task), schedules and
    topics. Each answer is a 2xx (curl --fail-with-body) and no error."""
    w.fields["id"] = _failed_task(w)
    for command in AS_IS:
        cp = w.sh(w.concrete(command))
        assert json.loads(cp.stdout).get("status") != "error", (command, cp.stdout)
        if command == "curl -X POST http://localhost:8088/tasks/<id>/retry":
            with w.client() as c:  # it fails again (the target still answers 500)
                wait_until(lambda: c.get(w.fields["id"])["state"] == "failed", timeout=15)


def _run_python_block(w: Work) -> None:
    script = w.dir / "client_example.py"
    script.write_text(w.concrete(python_block(README.read_text())))
    w.sh(f"{sys.executable} {script}")


def _run_cli_block(w: Work) -> None:
    (w.dir / "tasks.jsonl").write_text("".join(
        json.dumps({"url": f"{w.sink.url}/file", "params": {"i": i}}) + "\n" for i in range(3)))
    with w.client() as c:
        w.fields["later"] = c.enqueue(f"{w.sink.url}/later", countdown=3600)["id"]
    w.fields["eta"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1800))
    for synopsis, commands in SYNOPSIS.items():
        for command in commands:
            w.sh(command.format(**w.fields))
    # the same names again: the fan-out's 409 names its tasks (it said "task None")
    again = w.sh(SYNOPSIS[list(SYNOPSIS)[-1]][0].format(**w.fields), expect=1)
    assert again.stderr.startswith("miyamoto: duplicate: the names are taken by tasks "), \
        again.stderr


def _check_keyless_node(w: Work) -> None:
    """"binds no cluster port": the README's first line, and what status shows."""
    with w.client() as c:
        (me,) = c.cluster()["members"]
    assert me["cluster"] is None
    table = w.sh("miyamoto status").stdout.splitlines()
    header = table[2].split()
    row = dict(zip(header, table[3].split()))
    assert row["CLUSTER"] == "-", table


@pytest.mark.timeout(300)  # some 90 commands, each a process start: slow on a loaded box
def test_the_readme_runs_against_a_node_with_its_backup_and_restore(
        tmp_path: Path, proc_registry: ProcessRegistry, sink: Sink) -> None:
    _need("curl")
    _need("sqlite3")
    w = Work(tmp_path, proc_registry, sink)
    w.node.start().wait_ready()
    _check_keyless_node(w)
    _run_http_blocks(w)
    _run_python_block(w)
    _run_cli_block(w)
    with w.client() as c:
        kept = c.enqueue(f"{w.sink.url}/kept", countdown=3600)["id"]
        schedules = {s["name"] for s in c.schedules()}
        topics = {t["name"] for t in c.topics()}
    # the Python block unscheduled nightly and deleted orders; the command line made these
    assert {"daily", "beat"} <= schedules and topics == {"news"}
    sink.wait_for(count=2, path="/worker", timeout=20)  # the curl enqueues, 5 s later
    for command in BACKUP:  # while the node runs and writes
        w.sh(command)
    assert w.node.stop() == 0
    shutil.rmtree(w.dir / "miyamoto-data")  # the disk is lost
    for command in RESTORE:
        w.sh(command)
    w.node.start().wait_ready()
    with w.client() as c:
        assert c.get(kept)["state"] == "scheduled"
        assert {s["name"] for s in c.schedules()} == schedules
        assert {t["name"] for t in c.topics()} == topics
