"""The deploy files, checked without running them: the systemd unit with systemd-analyze
verify, the Kubernetes manifests against a current Kubernetes schema (kubernetes-validate,
strict), and every file's MIYAMOTO_* names and timings against the options they set
(miyamoto/config/settings.py): a stop grace above shutdown_timeout, an open-file limit above
max_connections, a disruption budget that keeps a majority. The image and compose.yaml are
run for real in tests/nodes/test_containers.py.

Without systemd-analyze the unit's test skips, except in CI (env CI set), where .ci/run
installs Debian's systemd and its absence is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from miyamoto.config.settings import SETTINGS, check_environment

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
UNIT = REPO / "deploy" / "systemd" / "miyamoto.service"
ENV_EXAMPLE = REPO / "deploy" / "systemd" / "miyamoto.env.example"
DEFAULTS = {s.name: s.default for s in SETTINGS}
KUBERNETES = "1.37"  # the newest schema kubernetes-validate ships; a current cluster's


def _unit() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def _seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min)?", text.strip())
    assert m, f"not a duration in seconds: {text!r}"
    return float(m[1]) * (60 if m[2] == "min" else 1)


@pytest.mark.timeout(60)
def test_systemd_unit_verifies() -> None:
    """systemd-analyze verify passes it with not one warning (an unknown key is only a
    warning on stderr, exit 0, so stderr must be empty too)."""
    if shutil.which("systemd-analyze") is None:
        if os.environ.get("CI"):
            pytest.fail("no systemd-analyze: in CI, .ci/run installs Debian's systemd")
        pytest.skip("no systemd-analyze (apt-get install systemd)")
    exe = Path(sys.executable).with_name("miyamoto")  # verify wants ExecStart to exist
    assert exe.exists(), exe
    text = UNIT.read_text().replace("/opt/miyamoto/bin/miyamoto", str(exe))
    unit = Path(os.environ.get("TMPDIR", "/tmp")) / f"miyamoto-verify-{os.getpid()}.service"
    try:
        unit.write_text(text)
        proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                              text=True, timeout=30)
    finally:
        unit.unlink(missing_ok=True)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_systemd_unit_limits_and_hardening() -> None:
    unit = _unit()
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]  # cli/sdnotify.py
    assert unit["Restart"] == ["on-failure"]
    assert unit["KillSignal"] == ["SIGTERM"]
    assert _seconds(unit["TimeoutStopSec"][0]) > DEFAULTS["shutdown_timeout"]
    assert int(unit["LimitNOFILE"][0]) > DEFAULTS["max_connections"]
    assert unit["DynamicUser"] == ["yes"] and unit["StateDirectory"] == ["miyamoto"]
    assert unit["Environment"] == ["MIYAMOTO_DATA_DIR=/var/lib/miyamoto"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert unit[key] == ["yes"], key
    assert unit["ProtectSystem"] == ["strict"]


def _env_names(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"#?(MIYAMOTO_[A-Z_]+)=(.*)", line.strip())
        if m:
            out[m[1]] = m[2]
    return out


def test_env_example_names_only_options() -> None:
    names = _env_names(ENV_EXAMPLE.read_text())
    assert {"MIYAMOTO_CURVE_PUBLIC", "MIYAMOTO_CURVE_SECRET", "MIYAMOTO_API_TOKENS"} <= set(names)
    check_environment(names)  # a misspelt name raises ConfigError


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifests() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    out = {}
    for name in kustomization["resources"]:
        for doc in _documents(KUBE / name):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_kubernetes_manifests_validate_against_the_schema() -> None:
    """Every resource the kustomization lists passes strict validation (an unknown or
    misplaced field fails), and the kustomization names every manifest in the folder."""
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    files = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    manifests = _manifests()
    assert set(manifests) == {"Secret/miyamoto", "Service/miyamoto-peers", "Service/miyamoto",
                              "StatefulSet/miyamoto", "PodDisruptionBudget/miyamoto"}
    for name, doc in manifests.items():
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_kubernetes_validation_catches_a_misplaced_field() -> None:
    bad = _manifests()["StatefulSet/miyamoto"]
    bad["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def _container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = manifests["StatefulSet/miyamoto"]["spec"]["template"]["spec"]["containers"]
    return container


def test_statefulset_seeds_zone_probes_and_stop_grace() -> None:
    m = _manifests()
    sts, peers = m["StatefulSet/miyamoto"], m["Service/miyamoto-peers"]
    pod = sts["spec"]["template"]["spec"]
    env = {e["name"]: e for e in _container(m)["env"]}
    assert sts["spec"]["serviceName"] == "miyamoto-peers"
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    seeds = env["MIYAMOTO_SEEDS"]["value"].split(",")
    assert [s.split(".")[0] for s in seeds] == [
        f"tcp://miyamoto-{i}" for i in range(sts["spec"]["replicas"])]
    assert all(".miyamoto-peers." in s for s in seeds + [env["MIYAMOTO_ADVERTISE"]["value"]])
    assert env["MIYAMOTO_ZONE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['topology.kubernetes.io/zone']"
    shutdown = float(env["MIYAMOTO_SHUTDOWN_TIMEOUT"]["value"])
    assert pod["terminationGracePeriodSeconds"] > shutdown
    # a Service named miyamoto would put MIYAMOTO_PORT and the like in the environment,
    # which the node refuses as misspelt options
    assert pod["enableServiceLinks"] is False
    assert _container(m)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert _container(m)["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pdb = m["PodDisruptionBudget/miyamoto"]["spec"]
    assert pdb["minAvailable"] > sts["spec"]["replicas"] // 2  # a majority stays up


def test_kubernetes_names_only_options() -> None:
    m = _manifests()
    names = {e["name"]: "" for e in _container(m)["env"] if e["name"].startswith("MIYAMOTO_")}
    names.update(dict.fromkeys(m["Secret/miyamoto"]["stringData"], ""))
    check_environment(names)
    assert _container(m)["envFrom"][0]["secretRef"]["name"] == "miyamoto"


def test_compose_names_options_and_stop_grace() -> None:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    nodes = {k: v for k, v in compose["services"].items() if k != "keygen"}
    assert sorted(nodes) == ["a", "b", "c"]
    for name, service in nodes.items():
        check_environment(service["environment"])
        assert service["depends_on"]["keygen"]["condition"] == "service_completed_successfully"
        assert _seconds(service["stop_grace_period"]) > DEFAULTS["shutdown_timeout"]
        assert service["ulimits"]["nofile"]["hard"] > DEFAULTS["max_connections"]
        assert "/readyz" in " ".join(service["healthcheck"]["test"])
        assert f"data-{name}:/data" in service["volumes"], name
