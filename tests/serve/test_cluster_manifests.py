"""runtime/kuberay and runtime/kserve: the manifests parse, and the slice resources a KubeRay
node advertises are ones the gateway's ray back-end understands (no Kubernetes here: see their
headers for what is tested and what is not)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from medusa.serve.gateway.backends.resources import PREFIX, class_slice

RUNTIME = Path(__file__).parents[2] / "runtime"


def test_the_kuberay_worker_group_advertises_slices_the_gateway_can_use() -> None:
    cluster, catalog = yaml.safe_load_all((RUNTIME / "kuberay" / "raycluster.yaml").read_text())
    assert cluster["kind"] == "RayCluster"
    [group] = cluster["spec"]["workerGroupSpecs"]
    resources = json.loads(json.loads(group["rayStartParams"]["resources"]))
    [(name, count)] = resources.items()
    kind = name.removeprefix(PREFIX)
    assert class_slice(kind, "x").memory == 24 << 30
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[f"nvidia.com/mig-{kind}"] == count  # one slice resource per MIG instance
    gateway = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][1]
    assert gateway["command"][:2] == ["medusa", "gateway"] and "--cluster" in gateway["command"]
    assert "models" in yaml.safe_load(catalog["data"]["models.yaml"])


def test_the_kserve_example_scales_one_model_to_zero() -> None:
    isvc = yaml.safe_load((RUNTIME / "kserve" / "inferenceservice.yaml").read_text())
    predictor = isvc["spec"]["predictor"]
    assert predictor["minReplicas"] == 0
    env = {e["name"]: e["value"] for e in predictor["containers"][0]["env"]}
    assert env["MEDUSA_ROLE"] == "worker" and env["MEDUSA_ARTIFACT"] == "/mnt/models"
