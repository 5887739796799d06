"""The chart installed on a real one-node Kubernetes under Pod Security "restricted": its objects, its RBAC, and
what the namespace refuses.

The deployment (one cluster for the session, the chart in ``team-a`` and in KFP's namespace, S3 at ``cluster ip``)
is :mod:`tests.cluster.deploy`'s, shared with the other modules of the tier. The pipeline itself runs through
Kubeflow Pipelines' real backend in :mod:`tests.cluster.test_cluster_kfp` (this module's earlier walk of the DAG,
one pod per step with stand-ins for KFP's driver and launcher, is gone with it).
"""

from __future__ import annotations

import json

import pytest

from tests.cluster.deploy import NAMESPACE, SERVICE_ACCOUNT
from tests.cluster.kfp_runs import executor_pods


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
        ("delete", "trainjobs.trainer.kubeflow.org"),
        ("get", "trainingruntimes.trainer.kubeflow.org"),
        ("get", "clustertrainingruntimes.trainer.kubeflow.org"),
        ("list", "pods"),
        ("get", "pods/log"),
    }
    refused = {
        ("get", "secrets"),
        ("create", "pods"),
        ("patch", "trainjobs.trainer.kubeflow.org"),
        ("list", "trainjobs.trainer.kubeflow.org"),
    }
    answers = {pair: can(*pair) for pair in allowed | refused}
    assert {pair for pair, answer in answers.items() if answer == "yes"} == allowed, sorted(answers.items())
    assert can("get", "configmaps/kubeflow-trainer-public", "kubeflow-system") == "yes"


def _as_new_pod(pod: dict, namespace: str) -> dict:
    """A pod read from the cluster as a new object of ``namespace``: its spec (less the node it ran on), no status."""
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    metadata = {"name": f"{pod['metadata']['name'][:40]}-copy", "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def test_kfps_executor_pod_is_refused_by_a_restricted_namespace_for_its_run_as_non_root(deployment, capsys):
    """KFP 2.17's executor template sets runAsNonRoot on its init container only: the real executor pod of the KFP
    test's first run (``prepare-data``, as Argo made it in ``kubeflow``) is refused by ``team-a``'s Pod Security
    "restricted" for that, among what else the level names; with runAsNonRoot at pod level that reason is gone."""
    first = deployment.runs.get("first")
    if first is None:
        pytest.fail("the first run of test_cluster_kfp.py is this test's input: run the tier, not this test alone")
    executors = executor_pods(deployment, first, "prepare-data")
    assert executors, f"no prepare-data executor pod of run {first} left to read"
    pod = _as_new_pod(executors[0], NAMESPACE)
    pod["spec"]["serviceAccountName"] = SERVICE_ACCOUNT

    def refusal(candidate: dict) -> str:
        done = deployment.cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=json.dumps(candidate), check=False
        )
        return "" if done.returncode == 0 else done.stderr

    as_made = refusal(pod)
    assert "runAsNonRoot != true" in as_made, as_made or "admitted"
    pod["spec"].setdefault("securityContext", {})["runAsNonRoot"] = True
    with_pod_level = refusal(pod)
    assert "runAsNonRoot" not in with_pod_level, with_pod_level
    with capsys.disabled():
        print(f"\nrestricted namespace, KFP's executor pod as made: {as_made.strip()[-600:]}")
        print(f"with runAsNonRoot at pod level: {with_pod_level.strip()[-600:] or 'admitted'}")
