"""Release hygiene: the version is written in one place; `python -m build` makes a wheel
and an sdist (the wheel is built from the sdist, so the sdist is complete); the wheel
installs in a fresh venv, without this repo on the path, and that copy answers
`--version` and runs a node that serves /healthz and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import requests

from helpers import REPO, copy_sources, free_ports, wait_until
from miyamoto.version import __version__

SOURCES = ["miyamoto", "setup.py", "README", "LICENSE", "CHANGELOG.md", "MANIFEST.in"]
STATIC = ["miyamoto/http/static/dashboard.html", "miyamoto/http/static/dashboard.js",
          "miyamoto/http/static/dashboard.css"]


def test_version_is_written_in_one_place() -> None:
    """Only miyamoto/version.py spells the version out (and the changelog's headings):
    setup.py, the CLI, the User-Agent and the OpenAPI document all import it."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    spelt_out = re.compile(rf"(?<![\d.]){re.escape(__version__)}(?![\d.])")  # not 10.1.0.0/16
    # the kustomization pins the image tag: checked against the version below
    spelt = [p for p in tracked if p not in ("miyamoto/version.py", "CHANGELOG.md",
                                             "deploy/kubernetes/kustomization.yaml")
             and (REPO / p).is_file() and spelt_out.search((REPO / p).read_text(errors="replace"))]
    assert spelt == [], f"{spelt} spell the version {__version__}: import it instead"
    assert f'newTag: "{__version__}"' in (REPO / "deploy/kubernetes/kustomization.yaml").read_text()
    assert re.search(rf"^## \[{re.escape(__version__)}\]", (REPO / "CHANGELOG.md").read_text(), re.M)


def _child_env() -> dict[str, str]:
    """The test's environment less this repo's path and the MIYAMOTO_* variables."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("MIYAMOTO_")}


@pytest.mark.timeout(600)
def test_build_makes_a_wheel_and_sdist_that_install_and_serve(tmp_path: Path) -> None:
    src = tmp_path / "src"
    copy_sources(src, SOURCES)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "-o", str(dist), str(src)], check=True,
                   capture_output=True, timeout=300)
    wheel, sdist = dist / f"miyamoto-{__version__}-py3-none-any.whl", dist / f"miyamoto-{__version__}.tar.gz"
    assert sorted(dist.iterdir()) == sorted([wheel, sdist])
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"setup.py", "README", "LICENSE", "CHANGELOG.md", *STATIC} <= names, names
    assert set(STATIC) <= set(zipfile.ZipFile(wheel).namelist())

    venv = tmp_path / "venv"  # no system site packages, no pip of its own: the test's pip fills it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "-q", "--disable-pip-version-check", str(wheel)],
                   check=True, capture_output=True, timeout=300,
                   env=_child_env())  # a PYTHONPATH to a checkout would look installed
    env, exe = _child_env(), str(venv / "bin" / "miyamoto")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import miyamoto; print(miyamoto.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(venv)), where.stdout
    version = subprocess.run([exe, "--version"], env=env, capture_output=True, text=True, timeout=30)
    assert version.stdout.strip() == f"miyamoto {__version__}", version
    http, cluster = free_ports(2)
    with open(tmp_path / "node.log", "wb") as log:
        node = subprocess.Popen([exe, "serve", "--http", f"127.0.0.1:{http}", "--cluster",
                                 f"tcp://127.0.0.1:{cluster}", "--data-dir", str(tmp_path / "data")],
                                env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: node.poll() is not None or requests.get(
            f"http://127.0.0.1:{http}/healthz", timeout=2).ok, timeout=30, what="/healthz")
        assert node.poll() is None, (tmp_path / "node.log").read_text()
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0, (tmp_path / "node.log").read_text()
    finally:
        node.kill()
        node.wait()
