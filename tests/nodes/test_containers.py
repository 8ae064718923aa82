"""The OCI image and the compose cluster, run for real with podman: the Dockerfile builds
on a base made from Debian's packages (.ci/base-image, started in the background by .ci/run),
a container serves, passes its HEALTHCHECK, refuses an open API without tokens (exit 2),
and drains on SIGTERM; compose.yaml's three nodes form a cluster, take tasks through one
node, lose another to `podman stop`, and deliver every task once.

All container tests live in this one file (one xdist worker). Containers use the host's
network on ports from the OS. Without podman they skip, except in CI (env CI set), where
.ci/run installs it and its absence is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests

from helpers import REPO, Reply, Sink, copy_sources, free_ports, loaded, wait_until

BASE = "localhost/miyamoto-base:bookworm"
BASE_RC = Path("/tmp/miyamoto-base-image.rc")  # .ci/base-image's exit code, when it ends
RUNC = "/usr/sbin/runc"  # Debian's runc: the default crun fails on this kernel's cgroups
LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
TOKEN = "deploy-test-" + uuid.uuid4().hex  # admin token of the compose cluster
COMPOSE = [sys.executable, "-m", "podman_compose", f"--podman-args=--runtime {RUNC}"]
# compose's nodes with the tests' short cluster timings (tests/conftest.py FAST_OPTIONS)
FAST = {"MIYAMOTO_REPLICA_OFFSET": "1", "MIYAMOTO_HEARTBEAT_INTERVAL": "0.1",
        "MIYAMOTO_FAILURE_TIMEOUT": "1", "MIYAMOTO_ELECTION_TIMEOUT_MIN": "0.3",
        "MIYAMOTO_ELECTION_TIMEOUT_MAX": "0.6", "MIYAMOTO_SHUTDOWN_TIMEOUT": "5"}
PACKAGE = ["miyamoto", "setup.py", "README", "LICENSE"]  # what a wheel is built from


def _unavailable(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: in CI, .ci/run installs podman, runc and mmdebstrap and makes {BASE}")
    pytest.skip(why)


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", "--runtime", RUNC, *args], capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


def _base_ready() -> bool:
    """The base image exists; a failed .ci/base-image ends the wait at once."""
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return True
    if BASE_RC.exists() and BASE_RC.read_text().strip() not in ("", "0"):
        pytest.fail(f".ci/base-image failed (exit {BASE_RC.read_text().strip()}): "
                    "see /tmp/miyamoto-base-image.log")
    return False


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Dockerfile built on the Debian base from wheels made here (no package index in
    the build): the tag, removed at the end."""
    if shutil.which("podman") is None or not os.path.exists(RUNC):
        _unavailable("no podman or no /usr/sbin/runc (apt-get install podman runc mmdebstrap)")
    if not _base_ready():
        if not os.environ.get("CI"):
            pytest.skip(f"no {BASE}: make it with .ci/base-image")
        wait_until(_base_ready, timeout=600, interval=1, what=f"{BASE} (.ci/base-image)")
    ctx = tmp_path_factory.mktemp("image")
    src = ctx / "src"
    copy_sources(src, PACKAGE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                    str(src), "-w", str(ctx / "wheels")], check=True, timeout=300,
                   capture_output=True)
    shutil.rmtree(src)
    tag = f"localhost/miyamoto:test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    podman("build", "--format", "docker", "--layers=false", *LIMITS, "-f", str(REPO / "Dockerfile"),
           "--build-arg", f"BASE={BASE}",
           "--build-arg", "INSTALL=--no-index --find-links /src/wheels miyamoto",
           "-t", tag, str(ctx), timeout=300)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    print(f"image {tag}: built in {time.monotonic() - started:.1f} s, {size / 1e6:.0f} MB "
          f"({BASE} included)")
    yield tag
    podman("rmi", "-f", tag, check=False)


# as the Kubernetes manifests run it: a read-only root, no capabilities, no privilege gain
LOCKED = ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
          "--security-opt", "no-new-privileges"]


def _run(image: str, name: str, *args: str, env: dict[str, str]) -> None:
    flags = [f for k, v in env.items() for f in ("-e", f"{k}={v}")]
    podman("run", "-d", "--name", name, "--network", "host", *LIMITS, *LOCKED, *flags, *args,
           image)


@pytest.mark.timeout(900)
def test_image_serves_checks_health_and_drains_on_sigterm(image: str, sink: Sink) -> None:
    config = podman("image", "inspect", "--format",
                    "{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Healthcheck.Test}}",
                    image).stdout
    assert config.startswith("miyamoto:miyamoto [\"/opt/miyamoto/bin/miyamoto\"]"), config
    assert "/readyz" in config, config
    # the final stage holds no compiler and the venv no pip
    bare = podman("run", "--rm", "--network", "none", *LIMITS, "--entrypoint", "/bin/sh", image,
                  "-c", "for c in gcc cc c++ pip pip3 /opt/miyamoto/bin/pip python3; do "
                  "command -v $c || true; done")
    found = bare.stdout.split()  # python3 alone: the check itself finds what is there
    assert len(found) == 1 and found[0].endswith("/python3"), bare.stdout
    # the image's own address is 0.0.0.0: without tokens the node refuses to start
    refused = podman("run", "--rm", "--network", "none", *LIMITS, image, check=False)
    assert refused.returncode == 2 and "api_tokens" in refused.stderr, refused.stderr
    http, cluster = free_ports(2)
    name, volume = f"miyamoto-test-{uuid.uuid4().hex[:8]}", f"miyamoto-test-{uuid.uuid4().hex[:8]}"
    try:
        _run(image, name, "-v", f"{volume}:/data", env={
            "MIYAMOTO_HTTP": f"127.0.0.1:{http}", "MIYAMOTO_CLUSTER": f"tcp://127.0.0.1:{cluster}"})
        url = f"http://127.0.0.1:{http}"
        wait_until(lambda: requests.get(url + "/readyz", timeout=2).ok, timeout=loaded(30),
                   what="/readyz")
        assert podman("healthcheck", "run", name, check=False).returncode == 0
        assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
        sink.reply("/slow", Reply(200, delay=1.5))  # in flight at the SIGTERM
        r = requests.post(url + "/queue", json={"url": sink.url + "/slow"}, timeout=5)
        assert r.status_code == 200, r.text
        sink.wait_for(count=1, path="/slow", timeout=10)
        podman("stop", "--time", "20", name, timeout=60)
        logs = podman("logs", name).stderr
        assert podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0", logs
        assert "stopped" in logs, logs[-3000:]
        # the drain finished the delivery and the journal in /data kept its outcome
        podman("rm", name)
        _run(image, name, "-v", f"{volume}:/data", env={
            "MIYAMOTO_HTTP": f"127.0.0.1:{http}", "MIYAMOTO_CLUSTER": f"tcp://127.0.0.1:{cluster}"})
        wait_until(lambda: requests.get(url + "/readyz", timeout=2).ok, timeout=loaded(30),
                   what="/readyz")
        task = requests.get(f"{url}/tasks/{r.json()['id']}", timeout=5).json()
        assert task["state"] == "succeeded" and sink.count("/slow") == 1, task
    finally:
        podman("rm", "-f", "--time", "1", name, check=False)
        podman("volume", "rm", "-f", volume, check=False)


def _compose_env(project: str, image: str) -> dict[str, str]:
    ports = free_ports(6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIYAMOTO_")}
    env.update({"MIYAMOTO_IMAGE": image, "MIYAMOTO_API_TOKENS": f"admin:{TOKEN}",
                "COMPOSE_PROJECT_NAME": project})
    for i, node in enumerate("ABC"):
        env[f"HTTP_{node}"], env[f"CLUSTER_{node}"] = str(ports[i]), str(ports[3 + i])
    return env


def _override(path: Path) -> Path:
    """compose.yaml's nodes with the tests' short timings, as a second compose file."""
    lines = ["services:"]
    for node in "abc":
        lines += [f"  {node}:", "    environment:"]
        lines += [f"      {k}: \"{v}\"" for k, v in FAST.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _compose(env: dict[str, str], files: list[Path], *args: str, timeout: float = 180
             ) -> subprocess.CompletedProcess:
    cmd = [*COMPOSE, *[f for p in files for f in ("-f", str(p))], *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


def _members(url: str) -> int:
    r = requests.get(url + "/cluster", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2)
    return len(r.json()["members"]) if r.ok else 0


@pytest.mark.timeout(900)
def test_compose_cluster_delivers_every_task_once_with_a_node_stopped(
        image: str, sink: Sink, tmp_path: Path) -> None:
    project = f"miyamoto-test-{uuid.uuid4().hex[:8]}"
    env = _compose_env(project, image)
    files = [REPO / "compose.yaml", _override(tmp_path / "fast.yaml")]
    urls = {n: f"http://127.0.0.1:{env['HTTP_' + n.upper()]}" for n in "abc"}
    started = time.monotonic()
    try:
        _compose(env, files, "up", "-d")
        for n, url in urls.items():
            wait_until(lambda: _members(url) == 3, timeout=loaded(60),
                       what=f"node {n} in a cluster of 3")
        print(f"compose: 3 nodes up and joined in {time.monotonic() - started:.1f} s")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert requests.post(urls["a"] + "/queue", json={"url": sink.url + "/w"},
                             timeout=5).status_code == 401  # the tokens are in force
        ids = set()
        for i in range(30):
            r = requests.post(urls["a"] + "/queue", headers=auth, timeout=5,
                              json={"url": sink.url + "/w", "params": {"i": i}, "countdown": 2})
            assert r.status_code == 200, r.text
            ids.add(r.json()["id"])
        stopped = time.monotonic()
        podman("stop", "--time", "20", f"{project}_c_1", timeout=60)
        print(f"compose: node c stopped in {time.monotonic() - stopped:.1f} s")
        sink.wait_for(lambda reqs: {q.headers["X-Task-Id"] for q in reqs} >= ids, path="/w",
                      timeout=loaded(60))
        for url in (urls["a"], urls["b"]):  # every copy knows its task is done
            wait_until(lambda: all(requests.get(f"{url}/tasks/{t}", headers=auth, timeout=5)
                                   .json()["state"] == "succeeded" for t in ids),
                       timeout=loaded(30), interval=0.5, what="every task succeeded")
        got = [q.headers["X-Task-Id"] for q in sink.requests("/w")]
        assert sorted(got) == sorted(ids), f"{len(got)} deliveries of {len(ids)} tasks"
        print(f"compose: {len(ids)} tasks delivered once each, "
              f"{time.monotonic() - started:.1f} s from up")
    finally:
        subprocess.run([*COMPOSE, *[f for p in files for f in ("-f", str(p))], "down", "-v",
                        "-t", "10"], env=env, capture_output=True, timeout=120)
