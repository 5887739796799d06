"""The chart installed on a real one-node Kubernetes under Pod Security "restricted": its objects, its RBAC, and
what the namespace refuses.

The deployment (one cluster for the session, the chart in ``team-a`` and in KFP's namespace, S3 at ``cluster ip``)
is :mod:`tests.cluster.deploy`'s, shared with the other modules of the tier. The pipeline itself runs through
Kubeflow Pipelines' real backend in :mod:`tests.cluster.test_cluster_kfp` (this module's earlier walk of the DAG,
one pod per step with stand-ins for KFP's driver and launcher, is gone with it).
"""

from __future__ import annotations

import json

from tests.cluster.deploy import (
    BUCKET,
    LAUNCHER_CONFIGMAP,
    NAMESPACE,
    SERVICE_ACCOUNT,
    run_arguments,
)
from tests.cluster.kfp_tasks import CompiledPipeline, Run


def test_the_chart_installs_under_restricted_pod_security_and_grants_exactly_the_launchers_calls(deployment):
    cluster = deployment.cluster
    runtime = cluster.get("clustertrainingruntime", "g2rpo-torch-distributed")
    assert runtime["spec"]["template"]["spec"]["replicatedJobs"], runtime
    namespace = cluster.get("namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    account = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

    def can(verb: str, resource: str, namespace: str = NAMESPACE) -> str:
        # "pods/log" is a subresource: kubectl auth can-i reads RESOURCE/NAME, so it is passed apart.
        resource, _, sub = resource.partition("/") if resource == "pods/log" else (resource, "", "")
        extra = [f"--subresource={sub}"] if sub else []
        done = cluster.kubectl("auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", account, check=False)
        return done.stdout.strip()

    allowed = {
        ("create", "trainjobs.trainer.kubeflow.org"),
        ("get", "trainjobs.trainer.kubeflow.org"),
        ("get", "trainingruntimes.trainer.kubeflow.org"),
        ("get", "clustertrainingruntimes.trainer.kubeflow.org"),
        ("list", "pods"),
        ("get", "pods/log"),
    }
    refused = {
        ("get", "secrets"),
        ("create", "pods"),
        ("delete", "trainjobs.trainer.kubeflow.org"),
        ("list", "trainjobs.trainer.kubeflow.org"),
    }
    answers = {pair: can(*pair) for pair in allowed | refused}
    assert {pair for pair, answer in answers.items() if answer == "yes"} == allowed, sorted(answers.items())
    assert can("get", "configmaps/kubeflow-trainer-public", "kubeflow-system") == "yes"


def test_the_namespace_enforces_restricted_so_kfps_executor_pod_needs_run_as_non_root(deployment):
    """KFP 2.17's executor template sets runAsNonRoot on its init container only; under "restricted" its pod is
    refused, so the run's pods here (and on a restricted KFP namespace) set it at pod level."""
    pipeline = CompiledPipeline.load()
    run = Run(pipeline, run_arguments(BUCKET), "r0", f"{pipeline.name}-r0", f"s3://{BUCKET}/pipeline-root")
    common = {"namespace": NAMESPACE, "service_account": SERVICE_ACCOUNT, "images": {}}
    as_compiled = run.pod("prepare-data", launcher_configmap=LAUNCHER_CONFIGMAP, **common)
    refused = deployment.cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(as_compiled), check=False
    )
    assert refused.returncode != 0 and "runAsNonRoot != true" in refused.stderr, refused.stdout + refused.stderr
    fixed = run.pod(
        "prepare-data", launcher_configmap=LAUNCHER_CONFIGMAP, pod_security={"runAsNonRoot": True}, **common
    )
    admitted = deployment.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(fixed), check=False)
    assert admitted.returncode == 0, admitted.stderr
