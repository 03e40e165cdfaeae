"""The deploy files as the tests read them: the manifests, the config inside the ConfigMap, the
daemon's command line, and the LWS CRD's schema closed the way the API server treats it."""

from __future__ import annotations

import copy
import json
import string
import sys
from pathlib import Path
from typing import Any

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "deploy"
KUBE = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
LWS_SCHEMA = TESTS / "lws-v1-schema.json"
CONFIG_PATH = "/etc/sglang-supervisor/config.toml"
DAEMON_ARGV = ["sglang-supervisor", "run", "--config", CONFIG_PATH]

# What LeaderWorkerSet injects into every container of a group (pkg/utils/pod/pod_utils.go), for
# the leader and the worker of group 0 of the LWS `sglang` in namespace `inference`.
NAMESPACE = "inference"
LEADER_ADDRESS = f"sglang-0.sglang.{NAMESPACE}"
LWS_ENV = {
    0: {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"},
    1: {"LWS_LEADER_ADDRESS": LEADER_ADDRESS, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"},
}
# What the pod templates add through the downward API (their `env`).
DOWNWARD_ENV = {"GROUP_INDEX": "0", "POD_NAMESPACE": NAMESPACE}


def documents(*names: str) -> list[dict[str, Any]]:
    """Every YAML document of the named files under deploy/kubernetes/ (all top-level files if none)."""
    paths = [KUBE / n for n in names] if names else sorted(KUBE.glob("*.yaml"))
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d is not None]


def one(kind: str, *names: str) -> dict[str, Any]:
    (found,) = [d for d in documents(*names) if d["kind"] == kind]
    return found


def pod_templates(lws: dict[str, Any]) -> dict[str, dict[str, Any]]:
    t = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": t["leaderTemplate"], "worker": t["workerTemplate"]}


def config_text() -> str:
    text: str = one("ConfigMap", "configmap.yaml")["data"]["config.toml"]
    return text


def config_toml() -> dict[str, Any]:
    return tomllib.loads(config_text())


def node_env(rank: int) -> dict[str, str]:
    return {**LWS_ENV[rank], **DOWNWARD_ENV}


def substituted(data: Any, env: dict[str, str]) -> Any:
    """The config with `${VAR}` filled in, for checking its other sections before `[group]` exists
    in the settings (the daemon's own expansion does this, and more, at load)."""
    if isinstance(data, str):
        return string.Template(data).substitute(env)
    if isinstance(data, dict):
        return {k: substituted(v, env) for k, v in data.items()}
    if isinstance(data, list):
        return [substituted(v, env) for v in data]
    return data


def closed(schema: Any) -> Any:
    """The CRD's structural schema as the API server applies it: an object with `properties` takes
    no other field (server-side field validation refuses an unknown one, e.g. a misspelt key),
    unless it says `x-kubernetes-preserve-unknown-fields` or has `additionalProperties`."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


def lws_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(LWS_SCHEMA.read_text())
    return schema
