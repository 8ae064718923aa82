"""The OpenAPI description as code generators read it: openapi-python-client generates a
Python client that enqueues (as JSON and as a form), reads and cancels a task against a
real node, and openapi-typescript generates types that tsc holds a task request to.

Both generators read what the node serves at /openapi.json. Their output is cached per
spec (and generator) hash in the temp dir, so a second run costs a node and a few calls;
openapi-typescript and typescript are installed from npm into a cached folder of the temp
dir. Without npm the TypeScript test skips, except in CI (env CI set), where .ci/run
installs npm and its absence is a failure.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from helpers import NodeProcess

CACHE = Path(tempfile.gettempdir()) / "miyamoto-openapi-clients"
NPM_PACKAGES = ("openapi-typescript@7", "typescript@5")
PACKAGE = "miyamoto_generated"  # the generated Python client's package name


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: in CI, .ci/run must install npm (and pip the test extra)")
    pytest.skip(why)


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _cached(kind: str, spec: dict[str, Any], version: str, make) -> Path:
    """The folder ``make(folder)`` fills for this spec and generator version: made once
    (in a scratch folder renamed into place, so a parallel run never sees half of it)."""
    key = hashlib.sha256(json.dumps([spec, version], sort_keys=True).encode()).hexdigest()
    done = CACHE / f"{kind}-{key[:16]}"
    if not done.is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=CACHE))
        make(scratch)
        try:
            scratch.rename(done)
        except OSError:  # another run got there first
            shutil.rmtree(scratch, ignore_errors=True)
    return done


def _spec(node: NodeProcess) -> dict[str, Any]:
    r = node.get("/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()


# ================================================================ Python


def _python_client(spec: dict[str, Any]) -> Path:
    """The folder holding the generated client package PACKAGE for ``spec``."""
    try:
        import openapi_python_client
    except ImportError:
        _unavailable("no openapi-python-client (pip install -e '.[test]')")
    version = getattr(openapi_python_client, "__version__", "?")

    def make(folder: Path) -> None:
        (folder / "spec.json").write_text(json.dumps(spec))
        (folder / "config.yaml").write_text("post_hooks: []\n")  # no ruff needed
        r = _run([sys.executable, "-m", "openapi_python_client", "generate",
                  "--path", "spec.json", "--config", "config.yaml", "--meta", "none",
                  "--output-path", PACKAGE], folder)
        assert r.returncode == 0, r.stdout + r.stderr
        # a schema it cannot type (it maps it to Any) is a warning, not an error: none
        assert "Warning" not in r.stdout + r.stderr, r.stdout + r.stderr

    return _cached("python", spec, version, make)


@pytest.mark.timeout(120)
def test_a_generated_python_client_enqueues_reads_and_cancels(node: NodeProcess, sink,
                                                             monkeypatch) -> None:
    folder = _python_client(_spec(node))
    monkeypatch.syspath_prepend(str(folder))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]  # a client of another spec, generated earlier in this process
    importlib.invalidate_caches()
    gen = importlib.import_module(PACKAGE)
    models = importlib.import_module(f"{PACKAGE}.models")
    # the functions are named by the operationIds, filed by the tags
    enqueue = importlib.import_module(f"{PACKAGE}.api.tasks.enqueue")
    get_task = importlib.import_module(f"{PACKAGE}.api.tasks.get_task")
    cancel_task = importlib.import_module(f"{PACKAGE}.api.tasks.cancel_task")

    client = gen.Client(base_url=node.url, timeout=10.0, raise_on_unexpected_status=True)
    url = sink.url_for("/never")
    # POST /queue's JSON task: TaskRequest and the repeat fields (on_duplicate, debounce)
    body = models.EnqueueTaskRequest(url=url, countdown=120, name="generated-json",
                                     params=models.EnqueueTaskRequestParamsType0.from_dict(
                                         {"a": "1"}))
    got = enqueue.sync(client=client, body=body)
    assert isinstance(got, models.Enqueued), got
    form = models.TaskForm.from_dict({"task.url": url, "task.countdown": "120", "b": "2"})
    by_form = enqueue.sync(client=client, body=form)
    assert isinstance(by_form, models.Enqueued), by_form
    assert by_form.id != got.id

    task = get_task.sync(client=client, id=got.id)
    assert isinstance(task, models.Task), task
    assert (task.id, task.name, task.url, str(task.state)) == \
        (got.id, "generated-json", url, "scheduled")
    assert str(get_task.sync(client=client, id=by_form.id).state) == "scheduled"

    cancelled = cancel_task.sync(client=client, id=got.id)
    assert isinstance(cancelled, models.Task) and str(cancelled.state) == "cancelled"
    assert node.task(got.id)["state"] == "cancelled"  # as the node itself says
    missing = get_task.sync_detailed(client=gen.Client(base_url=node.url), id="no-such-task")
    assert missing.status_code == 404 and isinstance(missing.parsed, models.Error)
    assert sink.requests("/never") == []


# ================================================================ TypeScript


def _npm_tools() -> Path:
    """A folder with openapi-typescript and tsc installed from npm (once per machine)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        _unavailable("no npm and node (apt-get install npm)")
    tools = CACHE / ("npm-" + hashlib.sha256(" ".join(NPM_PACKAGES).encode()).hexdigest()[:12])
    bins = tools / "node_modules" / ".bin"
    if not (bins / "openapi-typescript").exists() or not (bins / "tsc").exists():
        tools.mkdir(parents=True, exist_ok=True)
        r = _run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(tools),
                  *NPM_PACKAGES], tools, timeout=90)
        if r.returncode != 0:
            _unavailable(f"npm install {' '.join(NPM_PACKAGES)} failed: {r.stderr[-500:]}")
    return bins


# a field with a default (method, priority) is optional to send: by default
# openapi-typescript 7 makes it required, which fits answers, not requests
TS_ARGS = ("spec.json", "-o", "miyamoto.ts", "--default-non-nullable", "false")
GOOD_TS = """\
import type { components, operations } from "./miyamoto";
type TaskRequest = components["schemas"]["TaskRequest"];
const task: TaskRequest = { url: "http://127.0.0.1:9/w", countdown: 5, params: { a: "1" } };
type Enqueue = operations["enqueue"]["requestBody"];
const body: NonNullable<Enqueue>["content"]["application/json"] = task;
type Got = operations["getTask"]["responses"]["200"]["content"]["application/json"];
const state: Got["state"] = "cancelled";
type Cancel = operations["cancelTask"]["parameters"]["path"];
const where: Cancel = { id: "abc" };
export { body, state, where };
"""
# not a task: no url, a state that is none
BAD_TS = """\
import type { components } from "./miyamoto";
const task: components["schemas"]["TaskRequest"] = { countdown: 5 };
const state: components["schemas"]["Task"]["state"] = "exploded";
export { task, state };
"""


@pytest.mark.timeout(150)
def test_generated_typescript_types_hold_a_task_request(node: NodeProcess) -> None:
    spec = _spec(node)
    bins = _npm_tools()

    def make(folder: Path) -> None:
        (folder / "spec.json").write_text(json.dumps(spec))
        r = _run([str(bins / "openapi-typescript"), *TS_ARGS], folder)
        assert r.returncode == 0, r.stdout + r.stderr

    folder = _cached("typescript", spec, " ".join([*NPM_PACKAGES, *TS_ARGS]), make)
    types = (folder / "miyamoto.ts").read_text()
    for op in ("enqueue", "getTask", "cancelTask", "listQueues", "putSchedule"):
        assert f"    {op}: {{" in types, op
    with tempfile.TemporaryDirectory(prefix="miyamoto-tsc-") as tmp:
        work = Path(tmp)
        shutil.copy(folder / "miyamoto.ts", work / "miyamoto.ts")
        (work / "good.ts").write_text(GOOD_TS)
        (work / "bad.ts").write_text(BAD_TS)
        tsc = [str(bins / "tsc"), "--noEmit", "--strict", "--target", "es2020",
               "--module", "es2020", "--moduleResolution", "node"]
        good = _run([*tsc, "good.ts"], work)
        assert good.returncode == 0, good.stdout + good.stderr
        bad = _run([*tsc, "bad.ts"], work)
        assert bad.returncode != 0, "tsc took a task request with no url"
        assert "'url' is missing" in bad.stdout and '"exploded"' in bad.stdout, bad.stdout
