"""Regenerate lws-v1-schema.json from LeaderWorkerSet's CRD (run by hand, not a test).

    python tests/deploy/vendor_lws_schema.py leaderworkerset.x-k8s.io_leaderworkersets.yaml COMMIT

The CRD (kubernetes-sigs/lws, config/crd/bases/) is 1.3 MB, almost all of it two copies of the
PodTemplateSpec schema. Those two (`leaderTemplate.spec`, `workerTemplate.spec`) and the
PersistentVolumeClaim schema of `volumeClaimTemplates` are cut to "any object": the tests
validate those parts with kubernetes-validate's own Kubernetes schemas instead. Descriptions go;
everything else (types, enums, required, defaults, bounds) stays as the CRD has it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).with_name("lws-v1-schema.json")
SOURCE = "kubernetes-sigs/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
CHECKED_ELSEWHERE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def prune(crd: dict[str, Any], commit: str) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strip(version["schema"]["openAPIV3Schema"])
    template = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    for part in ("leaderTemplate", "workerTemplate"):
        template[part]["properties"]["spec"] = dict(CHECKED_ELSEWHERE)
    template["volumeClaimTemplates"]["items"] = dict(CHECKED_ELSEWHERE)
    comment = (
        f"From {SOURCE} at commit {commit}, the v1 openAPIV3Schema; pod template specs and "
        "volumeClaimTemplates' items cut to any object (validated as PodTemplateSpec and "
        "PersistentVolumeClaim by kubernetes-validate), descriptions removed. "
        "Regenerate with tests/deploy/vendor_lws_schema.py."
    )
    return {"$comment": comment, **schema}


if __name__ == "__main__":
    crd_path, commit = sys.argv[1], sys.argv[2]
    crd = yaml.safe_load(Path(crd_path).read_text())
    OUT.write_text(json.dumps(prune(crd, commit), indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
