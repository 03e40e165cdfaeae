"""deploy/kubernetes/ against the Kubernetes schemas, the LeaderWorkerSet CRD and the daemon itself.

Built-in kinds (ConfigMap, Service, Secret, the pod templates as PodTemplateSpec, the volume claim
templates as PersistentVolumeClaim) go through kubernetes-validate's schemas, strict (an unknown
field is an error, as the API server's field validation makes it). The LWS object's own fields go
through the CRD's schema vendored in tests/deploy/lws-v1-schema.json. Then the pieces must fit
together: the daemon's command, its config's mount, token, state volume, ports and probes.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from deploy_files import (
    CONFIG_PATH,
    DAEMON_ARGV,
    KUBE,
    LEADER_ADDRESS,
    NAMESPACE,
    closed,
    config_text,
    config_toml,
    documents,
    lws_schema,
    node_env,
    one,
    pod_templates,
    substituted,
)

from supervisor.common.apitoken import load_token
from supervisor.common.configerror import ConfigError
from supervisor.config.render import dump_toml, render_rung
from supervisor.config.settings import ApiSettings, Settings, settings_from_mapping

# The oldest Kubernetes LWS v1 runs on that we check against, and the newest the validator knows.
K8S_VERSIONS = ["1.29", kubernetes_validate.latest_version()]
LWS_ENV_NAMES = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}


def validate_builtin(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def as_pod_template(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def as_claim(template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", **template}


def validate_lws(lws: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(closed(lws_schema())).validate(lws)


def container(template: dict[str, Any]) -> dict[str, Any]:
    (c,) = template["spec"]["containers"]
    return c


def test_the_files_hold_the_objects_a_deployment_needs() -> None:
    found = sorted((d["kind"], d["metadata"]["name"]) for d in documents())
    assert found == [
        ("ConfigMap", "sglang-supervisor-config"),
        ("LeaderWorkerSet", "sglang"),
        ("Service", "sglang-leader"),
    ]
    example = documents("examples/secret.yaml")
    assert [(d["kind"], d["metadata"]["name"]) for d in example] == [("Secret", "sglang-supervisor-token")]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_objects_validate_strictly(version: str) -> None:
    for doc in [*documents(), *documents("examples/secret.yaml")]:
        if doc["kind"] != "LeaderWorkerSet":
            validate_builtin(doc, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_pod_templates_validate_as_pod_template_specs(version: str) -> None:
    lws = one("LeaderWorkerSet")
    for role, template in pod_templates(lws).items():
        validate_builtin(as_pod_template(f"sglang-{role}", template), version)
    for claim in lws["spec"]["leaderWorkerTemplate"]["volumeClaimTemplates"]:
        validate_builtin(as_claim(claim), version)


def test_the_leaderworkerset_validates_against_the_lws_crd() -> None:
    validate_lws(one("LeaderWorkerSet"))


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("crd", lambda d: d["spec"]["leaderWorkerTemplate"].__setitem__("restartPolicy", "RecreateGroupOnRestart")),
        ("crd", lambda d: d["spec"]["leaderWorkerTemplate"].__setitem__("sise", 2)),
        ("crd", lambda d: d["spec"].__setitem__("startupPolicy", "LeaderStarted")),
        ("crd", lambda d: d["spec"]["leaderWorkerTemplate"].__setitem__("size", "2")),
        ("pod", lambda d: container(pod_templates(d)["leader"]).__setitem__("livenesProbe", {})),
        ("pod", lambda d: container(pod_templates(d)["worker"])["resources"].__setitem__("limit", {})),
        ("pod", lambda d: pod_templates(d)["worker"]["spec"]["volumes"][0].__setitem__("configMap", {"nam": "x"})),
    ],
)
def test_a_mistake_in_the_manifest_is_caught(where: str, change: Any) -> None:
    """The checks above can fail: each of these edits is refused by the check that owns it."""
    lws = copy.deepcopy(one("LeaderWorkerSet"))
    change(lws)
    if where == "crd":
        with pytest.raises(jsonschema.ValidationError):
            validate_lws(lws)
        return
    with pytest.raises(kubernetes_validate.ValidationError):
        for role, template in pod_templates(lws).items():
            validate_builtin(as_pod_template(role, template), K8S_VERSIONS[-1])


def test_one_group_of_two_8_gpu_nodes_recreated_as_one() -> None:
    lws = one("LeaderWorkerSet")
    spec = lws["spec"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    # LeaderReady would wait for a leader that is ready only once its worker has joined.
    assert spec.get("startupPolicy", "LeaderCreated") == "LeaderCreated"
    for template in pod_templates(lws).values():
        assert container(template)["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_each_pod_runs_the_daemon_which_launches_sglang() -> None:
    config = config_toml()
    for role, template in pod_templates(one("LeaderWorkerSet")).items():
        c = container(template)
        assert c["command"] == DAEMON_ARGV, role
        assert "args" not in c, role
        assert "SYS_PTRACE" in c["securityContext"]["capabilities"]["add"], role
        grace = template["spec"]["terminationGracePeriodSeconds"]
        assert grace > config["restart"]["stop_grace_s"] + config["restart"]["release_timeout_s"], role
    assert config["server"]["command"] == ["python3", "-m", "sglang.launch_server"]


def _mounts(template: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container(template)["volumeMounts"]}


def _volumes(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in template["spec"]["volumes"]}


def test_config_token_state_and_shm_are_mounted_where_the_daemon_looks() -> None:
    lws = one("LeaderWorkerSet")
    config = config_toml()
    configmap = one("ConfigMap", "configmap.yaml")
    claims = {c["metadata"]["name"] for c in lws["spec"]["leaderWorkerTemplate"]["volumeClaimTemplates"]}
    token_file = Path(config["api"]["token_file"])
    for role, template in pod_templates(lws).items():
        mounts, volumes = _mounts(template), _volumes(template)
        config_dir = Path(CONFIG_PATH)
        assert mounts["config"] == str(config_dir.parent), role
        assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
        assert config_dir.name in configmap["data"]
        assert mounts["token"] == str(token_file.parent), role
        assert volumes["token"]["secret"]["secretName"] == "sglang-supervisor-token"
        assert volumes["token"]["secret"]["defaultMode"] == 0o400  # the daemon refuses a token others can read
        # The state directory is a per-pod claim: evidence and the ladder's memory outlive the pod.
        assert "state" in claims and "state" not in volumes
        assert mounts["state"] == config["paths"]["state_dir"], role
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory" and mounts["dshm"] == "/dev/shm", role
    secret = one("Secret", "examples/secret.yaml")
    # The group secret sits beside the token, in the same private volume.
    group_secret = Path(config["group"]["secret_file"])
    assert group_secret.parent == token_file.parent
    assert set(secret["stringData"]) == {token_file.name, group_secret.name}


def test_the_kernel_caches_live_on_the_state_claim_and_fit_it() -> None:
    """Issue 36: a recreated pod reuses its compiled kernels, so `[paths] cache_dir` is on the per-pod
    claim (never the container's /tmp or an emptyDir), and the claim holds `[caches] max_gb` beside the
    diagnostics' bound."""
    lws = one("LeaderWorkerSet")
    config = config_toml()
    claims = lws["spec"]["leaderWorkerTemplate"]["volumeClaimTemplates"]
    (claim,) = [c for c in claims if c["metadata"]["name"] == "state"]
    size = claim["spec"]["resources"]["requests"]["storage"]
    assert size.endswith("Gi")
    cache_dir = Path(config["paths"]["cache_dir"])
    for role, template in pod_templates(lws).items():
        state_mount = Path(_mounts(template)["state"])
        assert cache_dir.is_relative_to(state_mount), (role, cache_dir, state_mount)
    need_gb = float(config["caches"]["max_gb"]) + float(config["diagnostics"]["max_mb"]) / 1024
    assert float(size[:-2]) >= need_gb + 10, (size, need_gb)  # 10 GiB for the server's logs and state


def test_probes_ask_the_daemon_api_livez_and_readyz() -> None:
    api_port = config_toml()["api"]["port"]
    for role, template in pod_templates(one("LeaderWorkerSet")).items():
        c = container(template)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["api"] == api_port, role
        for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
            got = c[probe]["httpGet"]
            assert (got["path"], ports[got["port"]]) == (path, api_port), (role, probe)
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, role  # generous
        # A liveness probe that fails only after several misses: a loop stuck for 30 s is a 503.
        assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30, role


def test_the_service_reaches_the_leader_pod() -> None:
    service = one("Service", "service.yaml")
    lws = one("LeaderWorkerSet")
    leader = pod_templates(lws)["leader"]
    labels = {**leader["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"]}
    assert service["spec"]["selector"].items() <= labels.items()
    assert pod_templates(lws)["worker"]["metadata"]["labels"]["role"] != service["spec"]["selector"]["role"]
    ports = {p["name"]: p["containerPort"] for p in container(leader)["ports"]}
    config = config_toml()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    assert ports["http"] == config["server"]["port"] and ports["api"] == config["api"]["port"]


def test_one_config_for_every_node_from_lws_variables() -> None:
    config = config_toml()
    group, args = config["group"], config["server"]["args"]
    assert group["nnodes"] == "${LWS_GROUP_SIZE}"
    assert group["node_rank"] == "${LWS_WORKER_INDEX}"
    assert group["restart"] == "lws"
    assert group["leader"] == f"${{LWS_LEADER_ADDRESS}}:{config['api']['port']}"
    assert args["dist-init-addr"] == "${LWS_LEADER_ADDRESS}:20000"
    assert (args["nnodes"], args["node-rank"]) == ("${LWS_GROUP_SIZE}", "${LWS_WORKER_INDEX}")
    # Every variable the config names is set in the pod: by LWS, or by the templates' own env.
    named = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", config_text()))
    for role, template in pod_templates(one("LeaderWorkerSet")).items():
        given = {e["name"] for e in container(template).get("env", [])}
        assert named <= LWS_ENV_NAMES | given, (role, named - LWS_ENV_NAMES - given)


def _flags(argv: tuple[str, ...]) -> dict[str, str]:
    """`--key value` pairs; a flag followed by another flag (or nothing) is a switch, ""."""
    out: dict[str, str] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else "--"
            out[word] = "" if nxt.startswith("--") else nxt
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_the_config_validates_for_the_leader_and_the_worker(rank: int) -> None:
    """Everything but `[group]` through the real settings model and the real command renderer."""
    data = substituted(config_toml(), node_env(rank))
    data.pop("group")
    settings = settings_from_mapping(data)
    argv = render_rung(settings.server, settings.ladder[0]).argv
    flags = _flags(argv[3:])  # after python3 -m sglang.launch_server
    assert flags["--nnodes"] == "2" and flags["--node-rank"] == str(rank)
    assert flags["--dist-init-addr"] == f"{LEADER_ADDRESS}:20000"
    assert flags["--tp-size"] == "16" and flags["--trust-remote-code"] == ""
    assert (flags["--host"], flags["--port"]) == ("0.0.0.0", "30000")
    assert settings.api.host == "0.0.0.0" and settings.api.token_file is not None


NEEDS_GROUP = pytest.mark.skipif(
    "group" not in Settings.model_fields,
    reason="supervisor.config.settings has no [group] section on this branch yet (issue 23's group half); "
    "the lead merges it, then this test loads the ConfigMap's config as each node does",
)


@NEEDS_GROUP
@pytest.mark.parametrize("rank", [0, 1])
def test_the_configmap_config_loads_as_each_node_through_the_real_loader(rank: int, tmp_path: Path) -> None:
    from supervisor.config.settings import load_settings

    path = tmp_path / "config.toml"
    path.write_text(config_text())
    settings = load_settings(path, env=node_env(rank))  # type: ignore[call-arg]
    group: Any = settings.group  # type: ignore[attr-defined]
    assert (group.nnodes, group.node_rank, group.restart) == (2, rank, "lws")
    assert group.leader == f"{LEADER_ADDRESS}:8900"
    assert tuple(group.members) == (f"sglang-0-1.sglang.{NAMESPACE}:8900",)
    argv = render_rung(settings.server, settings.ladder[0]).argv
    assert "--node-rank" in argv and argv[argv.index("--node-rank") + 1] == str(rank)
    assert argv[argv.index("--dist-init-addr") + 1] == f"{LEADER_ADDRESS}:20000"


@NEEDS_GROUP
def test_the_configmap_config_outside_lws_is_refused_naming_the_variable(tmp_path: Path) -> None:
    """Run without LWS's variables (a copy on a laptop, a pod of another controller), the daemon
    refuses to start rather than join a group it was not placed in."""
    from supervisor.config.settings import load_settings

    path = tmp_path / "config.toml"
    path.write_text(config_text())
    with pytest.raises(ConfigError, match=r"\$\{LWS_[A-Z_]+\}"):
        load_settings(path, env={})  # type: ignore[call-arg]


def _check_config(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "supervisor", "check-config", "--config", str(config)]
    return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def _token_file(tmp_path: Path) -> Path:
    """Where the Secret would be: a private file holding a token."""
    token = tmp_path / "token"
    token.write_text("k8s-test-token-0123456789abcdef\n")
    token.chmod(0o400)
    return token


def _group_secret(tmp_path: Path) -> Path:
    secret = tmp_path / "group-secret"
    secret.write_text("k8s-test-group-secret-0123456789\n")
    secret.chmod(0o400)
    return secret


@pytest.mark.integration
@pytest.mark.parametrize("rank", [0, 1])
def test_check_config_in_the_pod_accepts_the_config_for_each_node(rank: int, tmp_path: Path) -> None:
    """`kubectl exec <pod> -- sglang-supervisor check-config --config ...` as each node would run it
    (everything but `[group]` until that section is merged; then the next test runs it whole)."""
    data = substituted(config_toml(), node_env(rank))
    data.pop("group")
    data["api"]["token_file"] = str(_token_file(tmp_path))
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(settings_from_mapping(data)))
    done = _check_config(path, {})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--node-rank {rank} --dist-init-addr {LEADER_ADDRESS}:20000" in done.stdout
    assert "config OK" in done.stdout


@NEEDS_GROUP
@pytest.mark.integration
@pytest.mark.parametrize("rank", [0, 1])
def test_check_config_in_the_pod_accepts_the_configmap_text_with_lws_variables(rank: int, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    text = config_text().replace("/run/secrets/sglang-supervisor/token", str(_token_file(tmp_path)))
    path.write_text(text.replace("/run/secrets/sglang-supervisor/group-secret", str(_group_secret(tmp_path))))
    done = _check_config(path, node_env(rank))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--node-rank {rank} --dist-init-addr {LEADER_ADDRESS}:20000" in done.stdout


def test_the_example_secrets_placeholder_is_refused_as_a_token(tmp_path: Path) -> None:
    """Applied unedited, the example cannot become a password: the daemon refuses to start."""
    placeholder = one("Secret", "examples/secret.yaml")["stringData"]["token"]
    token = tmp_path / "token"
    token.write_text(placeholder)
    token.chmod(0o400)
    with pytest.raises(ConfigError, match="without spaces"):
        load_token(ApiSettings(token_file=str(token)), {})


def test_nothing_else_is_applied_with_the_directory() -> None:
    """`kubectl apply -f deploy/kubernetes/` takes the top-level files only: the example Secret is not one."""
    assert sorted(p.name for p in KUBE.glob("*.yaml")) == ["configmap.yaml", "leaderworkerset.yaml", "service.yaml"]
