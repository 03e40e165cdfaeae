"""deploy/kubernetes/single-node/: one server on one node as a StatefulSet, validated like the LWS.

Built-in kinds (ConfigMap, StatefulSet, Service, PodDisruptionBudget) go through
kubernetes-validate's schemas, strict, for Kubernetes 1.29 and the newest it knows. The
ServiceMonitor is a CRD with no schema here: it gets a structural check of the fields
prometheus-operator's monitoring.coreos.com/v1 defines for what it uses, closed as the API server
closes a structural schema (an unknown field is an error). Then the pieces must fit: the Service
governs the StatefulSet and selects its pod, the ServiceMonitor selects the Service and scrapes the
daemon's /metrics port, the budget covers the pod, the probes ask the daemon, the state claim is
where the config keeps state and caches, and the config loads and passes check-config.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from deploy_files import CONFIG_PATH, DAEMON_ARGV, KUBE

from supervisor.config.render import render_rung
from supervisor.config.settings import load_settings, settings_from_mapping

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

import yaml

SINGLE = KUBE / "single-node"
K8S_VERSIONS = ["1.29", kubernetes_validate.latest_version()]
BUILTIN = {"ConfigMap", "StatefulSet", "Service", "PodDisruptionBudget"}


def docs() -> list[dict[str, Any]]:
    return [d for p in sorted(SINGLE.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d is not None]


def one(kind: str, found: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (doc,) = [d for d in (found if found is not None else docs()) if d["kind"] == kind]
    return doc


def pod(sts: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = sts["spec"]["template"]
    return template


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod(sts)["spec"]["containers"]
    return c


def config_text() -> str:
    text: str = one("ConfigMap")["data"]["config.toml"]
    return text


def config() -> dict[str, Any]:
    return tomllib.loads(config_text())


# --- ServiceMonitor: monitoring.coreos.com/v1 (prometheus-operator's API reference), the fields
# this manifest may use, each with its type; a closed structure like a CRD's structural schema.
SELECTOR = {"matchLabels": dict, "matchExpressions": list}
ENDPOINT = {
    "port": str, "targetPort": (str, int), "path": str, "scheme": str, "interval": str, "scrapeTimeout": str,
    "honorLabels": bool, "params": dict, "relabelings": list, "metricRelabelings": list,
}  # fmt: skip
SERVICE_MONITOR_SPEC = {
    "selector": SELECTOR, "endpoints": [ENDPOINT], "jobLabel": str, "namespaceSelector": dict,
    "targetLabels": list, "podTargetLabels": list, "sampleLimit": int,
}  # fmt: skip
METADATA = {"name": str, "namespace": str, "labels": dict, "annotations": dict}


def check_structure(value: Any, shape: Any, where: str) -> None:
    """`value` has only the fields `shape` names, each of its type (a dict: an object, a one-element
    list: an array of that shape, a type or tuple of types: a scalar)."""
    if isinstance(shape, dict):
        assert isinstance(value, dict), f"{where}: an object, got {value!r}"
        unknown = set(value) - set(shape)
        assert not unknown, f"{where}: unknown field(s) {sorted(unknown)}"
        for key, sub in value.items():
            check_structure(sub, shape[key], f"{where}.{key}")
    elif isinstance(shape, list):
        assert isinstance(value, list) and value, f"{where}: a non-empty list, got {value!r}"
        for i, item in enumerate(value):
            check_structure(item, shape[0], f"{where}[{i}]")
    else:
        assert isinstance(value, shape) and not (shape is int and isinstance(value, bool)), f"{where}: {value!r}"


def check_service_monitor(sm: dict[str, Any]) -> None:
    check_structure(sm, {"apiVersion": str, "kind": str, "metadata": METADATA, "spec": SERVICE_MONITOR_SPEC}, "sm")
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert sm["spec"]["selector"].get("matchLabels"), "an empty selector would select every Service"
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint.get("scheme", "http") in ("http", "https")
        for key in ("interval", "scrapeTimeout"):
            if key in endpoint:
                assert endpoint[key][:-1].isdigit() and endpoint[key][-1] in "smh", endpoint[key]


# --- the files ---------------------------------------------------------------------------------
def test_the_directory_holds_the_objects_one_node_needs() -> None:
    found = sorted((d["kind"], d["metadata"]["name"]) for d in docs())
    assert found == [
        ("ConfigMap", "sglang-single-config"),
        ("PodDisruptionBudget", "sglang-single"),
        ("Service", "sglang-single"),
        ("ServiceMonitor", "sglang-single"),
        ("StatefulSet", "sglang-single"),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_objects_validate_strictly(version: str) -> None:
    for doc in docs():
        if doc["kind"] in BUILTIN:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_service_monitor_has_the_structure_of_its_crd() -> None:
    check_service_monitor(one("ServiceMonitor"))


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("StatefulSet", lambda d: d["spec"].__setitem__("replica", 1)),
        ("StatefulSet", lambda d: container(d).__setitem__("readinesProbe", {})),
        ("StatefulSet", lambda d: d["spec"]["volumeClaimTemplates"][0]["spec"].__setitem__("accessMode", [])),
        ("PodDisruptionBudget", lambda d: d["spec"].__setitem__("maxUnavailabe", 0)),
        ("Service", lambda d: d["spec"]["ports"][0].__setitem__("port", "http")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].__setitem__("pth", "/metrics")),
        ("ServiceMonitor", lambda d: d["spec"].__setitem__("endpoints", [])),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].__setitem__("interval", "often")),
        ("ServiceMonitor", lambda d: d["spec"]["selector"].__setitem__("matchLabels", {})),
    ],
)
def test_a_mistake_in_the_manifests_is_caught(kind: str, change: Any) -> None:
    """The checks above can fail: each of these edits is refused by the check that owns it."""
    doc = copy.deepcopy(one(kind))
    change(doc)
    if kind == "ServiceMonitor":
        with pytest.raises(AssertionError):
            check_service_monitor(doc)
        return
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


# --- the pieces fit ----------------------------------------------------------------------------
def test_one_pod_under_its_headless_service_and_its_claim_kept() -> None:
    sts, svc = one("StatefulSet"), one("Service")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"  # headless: the pod's stable DNS name
    labels = pod(sts)["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert container(sts)["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert config()["server"]["args"]["tp-size"] == 8


def test_the_service_reaches_sglang_and_the_daemon() -> None:
    sts, svc = one("StatefulSet"), one("Service")
    ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)
    assert ports["http"] == config()["server"]["port"] and ports["api"] == config()["api"]["port"]


def test_the_service_monitor_scrapes_the_daemon_metrics() -> None:
    sm, svc = one("ServiceMonitor"), one("Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    service_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert service_ports[endpoint["port"]] == config()["api"]["port"]
    assert endpoint["path"] == "/metrics"  # the one route besides the probes that needs no token


def test_the_budget_covers_the_pod_and_lets_a_broken_one_go() -> None:
    pdb, sts = one("PodDisruptionBudget"), one("StatefulSet")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod(sts)["metadata"]["labels"].items()
    assert pdb["spec"]["maxUnavailable"] == 0 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_daemon_is_the_process_and_the_probes_ask_it() -> None:
    sts = one("StatefulSet")
    c = container(sts)
    assert c["command"] == DAEMON_ARGV and "args" not in c
    assert "SYS_PTRACE" in c["securityContext"]["capabilities"]["add"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        got = c[probe]["httpGet"]
        assert (got["path"], ports[got["port"]]) == (path, config()["api"]["port"]), probe
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30
    restart = config()["restart"]
    assert pod(sts)["spec"]["terminationGracePeriodSeconds"] > restart["stop_grace_s"] + restart["release_timeout_s"]


def test_config_token_state_and_caches_are_mounted_where_the_daemon_looks() -> None:
    sts = one("StatefulSet")
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod(sts)["spec"]["volumes"]}
    settings = settings_from_mapping(config())
    assert mounts["config"] == str(Path(CONFIG_PATH).parent)
    assert volumes["config"]["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    token = Path(settings.api.token_file or "")
    assert mounts["token"] == str(token.parent)
    assert volumes["token"]["secret"]["defaultMode"] == 0o400  # the daemon refuses a token others can read
    claims = {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]}
    assert "state" in claims and "state" not in volumes
    assert mounts["state"] == settings.paths.state_dir
    # The kernel caches default to <state_dir>/cache: on the claim, never on the pod's own disk.
    assert settings.paths.cache_dir is None or settings.paths.cache_dir.startswith(mounts["state"] + "/")
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"] == "/dev/shm"


def test_the_config_is_one_node_and_loads_through_the_real_loader(tmp_path: Path) -> None:
    assert "group" not in config() and "${" not in config_text()
    path = tmp_path / "config.toml"
    path.write_text(config_text())
    settings = load_settings(path)
    argv = render_rung(settings.server, settings.ladder[0]).argv
    assert argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert "--nnodes" not in argv and argv[argv.index("--tp-size") + 1] == "8"
    assert [r.name for r in settings.ladder][1:] == ["no-cuda-graph", "no-custom-allreduce"]
    assert settings.api.host == "0.0.0.0" and settings.api.token_file is not None


@pytest.mark.integration
def test_check_config_in_the_pod_accepts_it(tmp_path: Path) -> None:
    """`kubectl exec sglang-single-0 -- sglang-supervisor check-config --config ...`, with the
    Secret's file where the pod mounts it replaced by a private file of the test's."""
    token = tmp_path / "token"
    token.write_text("k8s-test-token-0123456789abcdef\n")
    token.chmod(0o400)
    path = tmp_path / "config.toml"
    path.write_text(config_text().replace("/run/secrets/sglang-supervisor/token", str(token)))
    cmd = [sys.executable, "-m", "supervisor", "check-config", "--config", str(path)]
    done = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert "--tp-size 8" in out and "rung 2 no-custom-allreduce" in out, out
    # No SGLang here: its own parser is "could not check", a note, not an error of this file.
    assert not [line for line in out.splitlines() if line.startswith("error:")], out
    assert done.returncode == 0 and "config OK" in done.stdout, out


def test_apply_the_directory_takes_these_files_only() -> None:
    """`kubectl apply -f deploy/kubernetes/single-node/` applies the five objects, and
    `kubectl apply -f deploy/kubernetes/` (the LWS) does not pick them up (apply is not recursive)."""
    assert sorted(p.name for p in SINGLE.iterdir()) == [
        "configmap.yaml", "poddisruptionbudget.yaml", "service.yaml", "servicemonitor.yaml", "statefulset.yaml",
    ]  # fmt: skip
    assert "single-node" not in {p.name for p in KUBE.glob("*.yaml")}
