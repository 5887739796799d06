"""Render the g2rpo chart offline (helm-python-sdk, the Helm v4 library) and look at the result.

Shared by the chart tests: the values sets every check runs over, rendering into parsed
documents, the CRD schemas from ``../shared/crds/`` (the repository's parent holds ``shared/``),
and the pod templates found anywhere in a rendered object.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import yaml

from tests.shared_checkout import shared_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "g2rpo"
# ``../shared/crds`` beside the repository (CI); a clone without it skips the CRD-schema tests.
CRD_DIR = shared_path("crds")
RELEASE = "g2rpo"
NAMESPACE = "kubeflow"
KUBE_VERSION = "1.33.0"

RULES_FILE = "rules/g2rpo-rules.yaml"
DASHBOARD_FILE = "dashboards/g2rpo.json"

EVERYTHING_ON: dict[str, Any] = {
    "trainingRuntime": {"enabled": True, "rdma": {"enabled": True}, "sharedVolume": {"claimName": "g2rpo-runs"}},
    "retraining": {"enabled": True, "kfpTokenAudience": "pipelines.kubeflow.org", "args": ["--experiment", "g2rpo"]},
    "monitoring": {
        "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "pushgateway": {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True, "namespace": "monitoring"},
    },
    "s3": {"endpoint": "http://minio.minio.svc:9000", "registryUri": "s3://g2rpo/registry"},
    "kfp": {"launcherConfig": {"enabled": True, "pipelineRoot": "s3://g2rpo/pipeline-root"}},
    "images": {"pullSecrets": ["ghcr-pull"]},
    "networkPolicy": {"enabled": True},
}
EVERYTHING_OFF: dict[str, Any] = {
    "serviceAccount": {"create": False, "name": "pipeline-runner"},
    "rbac": {"create": False},
    "trainingRuntime": {"enabled": False},
    "retraining": {"enabled": False},
    "networkPolicy": {"enabled": False},
}
MULTI_NODE: dict[str, Any] = {
    "placement": {"numNodes": 4, "gpusPerNode": 8, "shmSize": "512Gi"},
    "trainingRuntime": {
        "rdma": {"enabled": True, "resource": "rdma/hca_shared_devices_a"},
        "sharedVolume": {"claimName": "lustre-runs", "mountPath": "/mnt/runs"},
    },
    "retraining": {"enabled": True},
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything_on": EVERYTHING_ON,
    "everything_off": EVERYTHING_OFF,
    "multi_node": MULTI_NODE,
}

# Kinds whose schemas come from the CRDs rather than from kubernetes-validate.
CUSTOM_GROUPS = ("trainer.kubeflow.org", "monitoring.coreos.com", "jobset.x-k8s.io", "kubeflow.org")


def chart_with_monitoring_files(destination: Path) -> Path:
    """A copy of the chart that holds a rules file and a dashboard, for the wrapping templates.

    The observability tooling generates both into the chart; where they have not landed yet, the
    copy gets a small real pair (a rule on ``up`` and a one-panel dashboard) so that the
    PrometheusRule and dashboard templates are rendered and validated all the same.
    """
    copy = destination / "g2rpo"
    shutil.copytree(CHART, copy)
    rules = copy / RULES_FILE
    if not rules.exists():
        rules.parent.mkdir(parents=True, exist_ok=True)
        rules.write_text(
            yaml.safe_dump(
                {
                    "groups": [
                        {
                            "name": "g2rpo-training",
                            "rules": [
                                {
                                    "alert": "G2RPOTrainerDown",
                                    "expr": 'up{job=~".*g2rpo-trainer"} == 0',
                                    "for": "10m",
                                    "labels": {"severity": "warning"},
                                    "annotations": {"summary": "a g2rpo training pod stopped answering scrapes"},
                                }
                            ],
                        }
                    ]
                }
            )
        )
    dashboard = copy / DASHBOARD_FILE
    if not dashboard.exists():
        dashboard.parent.mkdir(parents=True, exist_ok=True)
        panel = {"type": "timeseries", "title": "up", "targets": [{"refId": "A", "expr": "up"}]}
        dashboard.write_text(json.dumps({"title": "g2rpo", "uid": "g2rpo", "panels": [panel]}, indent=2))
    return copy


def render(values: dict[str, Any] | None = None, chart: Path = CHART, namespace: str = NAMESPACE) -> list[dict]:
    """Every object the chart renders for ``values`` (an install of release ``g2rpo``)."""
    manifests = helm_python.Chart.load(chart).render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    docs = []
    for path in sorted(manifests):
        if not path.endswith((".yaml", ".yml")):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(manifests[path]) if doc)
    return docs


def training_runtime(values: dict[str, Any] | None = None) -> dict:
    """The ClusterTrainingRuntime the chart renders for ``values``."""
    (runtime,) = [doc for doc in render(values) if doc["kind"] == "ClusterTrainingRuntime"]
    return runtime


def kinds(docs: list[dict]) -> list[str]:
    return sorted(doc["kind"] for doc in docs)


def is_custom(doc: dict) -> bool:
    return doc["apiVersion"].split("/")[0] in CUSTOM_GROUPS


def load_crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> openAPIV3Schema, from every CRD file in ``../shared/crds/``."""
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def closed(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever the CRD lists the fields.

    The API server silently prunes unknown fields of a structural schema, so a misspelt or
    removed field (``mlPolicy.torch.numProcPerNode`` left master in 2026) would be dropped
    without a word; validating against the closed schema turns that into a failure.
    """
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if isinstance(out.get("pattern"), str) and "(?i)" in out["pattern"]:
        # Go's RE2 takes a flag group anywhere (``^(?i)...``); Python only at the start.
        out["pattern"] = "(?i)" + out["pattern"].replace("(?i)", "")
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def pod_specs(node: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every pod spec (a mapping with ``containers``) inside a rendered object, with its path."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield path, node
            return
        for key, value in node.items():
            yield from pod_specs(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from pod_specs(value, f"{path}[{index}]")
