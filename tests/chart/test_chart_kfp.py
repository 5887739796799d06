"""What the chart gives Kubeflow Pipelines in the namespace the runs run in: the ``kfp-launcher`` ConfigMap (the
runs' pipeline root on the chart's S3) and, in rbac.yaml, the runner Role (tests/chart/test_chart_rbac.py).

KFP 2.17 reads ``defaultPipelineRoot`` and ``providers`` (a YAML string: ``s3.default`` with ``endpoint`` without a
scheme, ``disableSSL``, ``region``, ``forcePathStyle`` and ``credentials.secretRef``) from it; the cluster tier runs
the pipeline through KFP's real driver and launcher with this ConfigMap (docs/cluster.md).
"""

from __future__ import annotations

import helm_python
import pytest
import yaml

from tests.chart.chart_render import render

ON = {"kfp": {"launcherConfig": {"enabled": True, "pipelineRoot": "s3://g2rpo/pipeline-root"}}}


def launcher_config(values: dict) -> dict | None:
    found = [d for d in render(values) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kfp-launcher"]
    return found[0] if found else None


def test_off_by_default():
    assert launcher_config({}) is None


@pytest.mark.parametrize(
    ("endpoint", "host", "plain"),
    [("http://seaweedfs.s3:8333", "seaweedfs.s3:8333", True), ("https://s3.example.com/", "s3.example.com", False)],
)
def test_the_pipeline_root_and_the_store_kfp_reads(endpoint, host, plain):
    config = launcher_config({**ON, "s3": {"endpoint": endpoint, "existingSecret": "team-s3"}})
    assert config["data"]["defaultPipelineRoot"] == "s3://g2rpo/pipeline-root"
    store = yaml.safe_load(config["data"]["providers"])["s3"]["default"]
    assert store["endpoint"] == host and store["disableSSL"] is plain and store["forcePathStyle"] is True
    assert store["credentials"] == {
        "fromEnv": False,
        "secretRef": {
            "secretName": "team-s3",
            "accessKeyKey": "AWS_ACCESS_KEY_ID",
            "secretKeyKey": "AWS_SECRET_ACCESS_KEY",
        },
    }


def test_aws_without_an_endpoint():
    store = yaml.safe_load(launcher_config(ON)["data"]["providers"])["s3"]["default"]
    assert "endpoint" not in store and "disableSSL" not in store and store["region"] == "us-east-1"


@pytest.mark.parametrize("root", ["", "gs://bucket/root", "s3://Bad_Bucket/x"])
def test_a_missing_or_foreign_pipeline_root_is_refused_naming_the_field(root):
    with pytest.raises(helm_python.HelmError, match="pipelineRoot"):
        render({"kfp": {"launcherConfig": {"enabled": True, "pipelineRoot": root}}})
