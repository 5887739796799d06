"""The chart installed on a real one-node Kubernetes and every step of the compiled pipeline run there as a pod.

One cluster for the module (``../shared/tools/cluster``), torn down in ``finally`` and checked to leave nothing
behind on the host. SeaweedFS serves S3 at ``cluster ip`` (where pods reach the host). The component image built
by buildah is loaded into the cluster's containerd under the name the compiled pipeline and the chart use.

Installed as a user installs it (docs/deployment.md): a namespace enforcing Pod Security "restricted", the S3
Secret, then the chart's objects — rendered by Helm's own engine (``helm-python-sdk``; no helm binary exists
here) and applied server-side — after ``cluster trainer-up`` (the Trainer CRDs and its live webhooks admit the
ClusterTrainingRuntime).

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
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import helm_python
import pytest
import yaml
from botocore.config import Config

from components.images import G2RPO_IMAGE, TRAINER_IMAGE
from g2rpo.rewards.shapes import IN_DOMAIN, IN_DOMAIN_CHECKS, OUT_OF_DOMAIN
from g2rpo.tasks.shapes import write_prompts
from tests.cluster.kfp_tasks import CompiledPipeline, Run
from tests.cluster.kube import Cluster, host_snapshot, leftovers, processes_naming
from tests.s3server import REGION, SeaweedServer

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "g2rpo"
IMAGE_SHAPES_MODEL = "/opt/venv/lib/python3.11/site-packages/g2rpo/models/shapes_flux"  # where the image installs it
NAMESPACE = "team-a"
RELEASE = "g2rpo"
SERVICE_ACCOUNT = "g2rpo"  # the profile's service_account (pipelines/profiles/h200.yaml), created by the chart
LAUNCHER_CONFIGMAP = "kfp-launch"
BUCKET = "g2rpo"
STEP_TIMEOUT_S = 1800


@dataclass
class Deployment:
    cluster: Cluster
    s3: SeaweedServer
    timings: dict[str, float] = field(default_factory=dict)

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.s3.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.s3.access_key,
            aws_secret_access_key=self.s3.secret_key,
            config=Config(s3={"addressing_style": "path"}),
        )


def _render_chart(values: dict) -> list[dict]:
    manifests = helm_python.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path in sorted(manifests):
        if path.endswith((".yaml", ".yml")):
            docs.extend(doc for doc in yaml.safe_load_all(manifests[path]) if doc)
    return docs


def chart_values(endpoint: str) -> dict:
    """The install's values: this S3, and a placement a CPU node satisfies (no GPU product label, no taint)."""
    return {
        "s3": {"endpoint": endpoint, "registryUri": f"s3://{BUCKET}/registry"},
        "placement": {
            "nodeSelector": {},
            "tolerations": [],
            "gpusPerNode": 1,
            "cpuPerNode": "2",
            "memoryPerNode": "6Gi",
        },
    }


@pytest.fixture(scope="module")
def deployment(component_image, tmp_path_factory):
    workdir = Path(os.environ.get("G2RPO_CLUSTER_WORKDIR") or tmp_path_factory.mktemp("k8s")) / "k"
    cluster = Cluster(workdir)
    before = host_snapshot(workdir.parent)
    s3 = None
    timings: dict[str, float] = {}
    try:
        timings["cluster up"] = cluster.up()
        s3 = SeaweedServer(workdir.parent / "seaweed", host=cluster.ip()).start()
        timings["load-image"] = cluster.load_image(G2RPO_IMAGE)
        timings["trainer-up"] = cluster.trainer_up()
        start = time.monotonic()
        install(cluster, s3)
        timings["chart install"] = time.monotonic() - start
        yield Deployment(cluster, s3, timings)
    finally:
        if s3 is not None:
            s3.stop()
        timings["cluster down"] = cluster.down()
        print("\ncluster tier timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        left = leftovers(before, host_snapshot(workdir.parent))
        left.update({"processes": processes_naming(workdir.parent)} if processes_naming(workdir.parent) else {})
        assert not left, f"the cluster left these behind on the host: {left} (see {workdir}/logs)"


def install(cluster: Cluster, s3: SeaweedServer) -> None:
    """What docs/deployment.md tells a platform team to do, in its order."""
    cluster.apply(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {
                        f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")
                    },
                },
            }
        )
    )
    cluster.kubectl(
        "-n", NAMESPACE, "create", "secret", "generic", "g2rpo-s3",
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
        f"--from-literal=AWS_ENDPOINT_URL_S3={s3.endpoint_url}",
    )  # fmt: skip
    docs = _render_chart(chart_values(s3.endpoint_url))
    out = cluster.apply(yaml.safe_dump_all(docs))
    assert "Warning" not in out, out


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


def advertise_gpus(cluster: Cluster, count: int) -> None:
    """The node's status gets ``count`` ``nvidia.com/gpu`` (Kubernetes' documented way to advertise an extended
    resource): a count for the scheduler only; no device exists and nothing here uses one."""
    node = "kc-node"
    patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(count)}]
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(patch))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cluster.get("node", node)["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(count):
            return
        time.sleep(1)
    raise TimeoutError(f"node {node} does not show {count} allocatable nvidia.com/gpu")


def run_arguments(bucket: str) -> dict:
    """The smallest shapes run: 2 iterations of G²RPO from the shipped model, 4 held-out prompts × 1 seed."""
    rewards = [{"name": name, "weight": 1.0} for name in IN_DOMAIN]
    rewards += [{"name": name, "weight": 0.0} for name in (*IN_DOMAIN_CHECKS, *OUT_OF_DOMAIN)]
    return {
        "config_uri": "configs/shapes-cpu.yaml",
        # The shipped model inside the image. An s3:// base model is what production passes, and training cannot
        # read one yet: the trainer loads model.path as a local folder (docs/cluster.md, "Found by this tier").
        "base_model_uri": IMAGE_SHAPES_MODEL,
        "prompts_uri": f"s3://{bucket}/prompts/shapes.txt",
        "store_uri": f"s3://{bucket}/store",
        "registry_uri": f"s3://{bucket}/registry",
        "gates_uri": f"s3://{bucket}/gates/shapes-gates.yaml",
        "model_name": "g2rpo-shapes",
        "rewards": rewards,
        "num_steps": 4,
        "group_size": 4,
        "granularities": [1, 2],
        "iterations": 2,
        "learning_rate": 1e-4,
        "overrides": [
            "train.prompts_per_iteration=2",
            "train.checkpoint_every=1",
            "train.progress=false",
            "train.validation.enabled=false",
        ],
        "test_size": 64,
        "eval_num_prompts": 4,
        "eval_seeds": [0],
        "node_selector": {},
        "tolerations": [],
        "gpus_per_node": "1",
        "train_pod_gpus": "1",
        "train_pod_cpu": "2",
        "train_pod_memory": "6Gi",
    }


def run_step(deployment: Deployment, run: Run, task: str) -> dict:
    """Start the task's pod, wait for it, and return the launcher's record of its outputs."""
    cluster = deployment.cluster
    images = {G2RPO_IMAGE: G2RPO_IMAGE, TRAINER_IMAGE: G2RPO_IMAGE}
    pod = run.pod(
        task,
        namespace=NAMESPACE,
        service_account=SERVICE_ACCOUNT,
        images=images,
        launcher_configmap=LAUNCHER_CONFIGMAP,
        pod_security={"runAsNonRoot": True},
    )
    name = pod["metadata"]["name"]
    start = time.monotonic()
    cluster.apply(json.dumps(pod))
    phase = cluster.wait_pod_done(name, NAMESPACE, STEP_TIMEOUT_S)
    deployment.timings[f"pod {task}"] = time.monotonic() - start
    log = cluster.logs(name, NAMESPACE)
    assert phase == "Succeeded", f"pod {name} {phase}; its log ends:\n{log[-6000:]}"
    body = deployment.client().get_object(Bucket=BUCKET, Key=run.record_uri(task).split("/", 3)[3])["Body"].read()
    record = json.loads(body)
    run.outputs[task] = record
    return record


def test_every_step_of_the_compiled_pipeline_runs_as_a_pod_to_a_promoted_champion(deployment, capsys):
    cluster, client = deployment.cluster, deployment.client()
    client.create_bucket(Bucket=BUCKET)
    prompts = Path(os.environ.get("TMPDIR", "/tmp")) / f"shapes-{uuid.uuid4().hex[:8]}.txt"
    write_prompts(prompts)
    client.upload_file(str(prompts), BUCKET, "prompts/shapes.txt")
    prompts.unlink()
    client.upload_file(str(REPO / "configs" / "shapes-gates.yaml"), BUCKET, "gates/shapes-gates.yaml")
    cluster.kubectl(
        "-n", NAMESPACE, "create", "configmap", LAUNCHER_CONFIGMAP,
        f"--from-file=kfp_launch.py={Path(__file__).with_name('kfp_launch.py')}",
    )  # fmt: skip
    advertise_gpus(cluster, 2)

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
    with capsys.disabled():
        print(
            "\npipeline steps as pods (s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in deployment.timings.items() if k.startswith("pod "))
        )
