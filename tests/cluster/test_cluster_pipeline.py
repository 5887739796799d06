"""Every step of the compiled pipeline run as a pod on the chart installed on a real one-node Kubernetes.

The deployment (one cluster for the session, the chart under Pod Security "restricted", S3 at ``cluster ip``) is
:mod:`tests.cluster.deploy`'s, shared with the other modules of the tier.

Each step is the pod KFP 2.17 would start (:mod:`tests.cluster.kfp_tasks`): the compiled command and arguments
unchanged, the executor input as the launcher writes it, outputs under the pipeline root in S3. Two things
differ from a KFP cluster, both stated here: the launcher's part is played by :mod:`tests.cluster.kfp_launch`
(KFP's launcher binary and ML Metadata are not available), and train/evaluate run in the component image (the
trainer image's ``nvidia/cuda`` base cannot be had here). The node advertises two ``nvidia.com/gpu`` as an
extended resource (a count, no device), so the GPU limits the driver puts on train and evaluate schedule; the
shapes config trains on the CPU.
"""

from __future__ import annotations

import json
import uuid

from tests.cluster.deploy import (
    BUCKET,
    LAUNCHER_CONFIGMAP,
    NAMESPACE,
    SERVICE_ACCOUNT,
    run_arguments,
    run_step,
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


def test_every_step_of_the_compiled_pipeline_runs_as_a_pod_to_a_promoted_champion(deployment, capsys):
    client = deployment.client()
    pipeline = CompiledPipeline.load()
    run_id = str(uuid.uuid4())
    run = Run(pipeline, run_arguments(BUCKET), run_id, f"{pipeline.name}-{run_id[:5]}", f"s3://{BUCKET}/pipeline-root")

    prepared = run_step(deployment, run, "prepare-data")
    data = prepared["artifacts"]["data"]
    assert data["metadata"]["test"] == 64 and data["metadata"]["train"] > 0, data

    trained = run_step(deployment, run, "train")
    export_uri = trained["artifacts"]["model"]["metadata"]["export_uri"]
    assert export_uri.startswith(f"s3://{BUCKET}/store/exports/g2rpo-shapes"), trained

    evaluated = run_step(deployment, run, "evaluate")
    assert evaluated["artifacts"]["evaluation"]["metadata"]["challenger_means"], evaluated

    decided = run_step(deployment, run, "decide")
    # The gate's condition, as the compiled triggerPolicy reads decide's output.
    assert decided["parameters"]["Output"] is True, decided
    report_key = decided["artifacts"]["report"]["uri"].split("/", 3)[3]
    report = client.get_object(Bucket=BUCKET, Key=report_key)["Body"].read().decode()
    assert "<title>g2rpo-shapes v1: decision</title>" in report, report[:500]

    promoted = run_step(deployment, run, "promote")
    state = json.loads(client.get_object(Bucket=BUCKET, Key="registry/models/g2rpo-shapes/state.json")["Body"].read())
    assert state["aliases"].get("champion") == promoted["parameters"]["Output"] == 1, (state, promoted)
    # The exit task, told what KFP 2.17's driver tells it (ML Metadata's COMPLETE), records a success.
    reported = run_step(deployment, run, "report-status")
    record_key = reported["artifacts"]["record"]["uri"].split("/", 3)[3]
    status = json.loads(client.get_object(Bucket=BUCKET, Key=record_key)["Body"].read())
    assert (status["state"], status["outcome"], status["failed_task"]) == ("COMPLETE", "succeeded", ""), status
    with capsys.disabled():
        print(
            "\npipeline steps as pods (s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in deployment.timings.items() if k.startswith("pod "))
        )
