"""The deployment the cluster tier's tests share: one cluster for the session, the chart installed as a user does.

One cluster (``../shared/tools/cluster``) for the whole session, torn down in ``finally`` and checked to leave
nothing behind on the host. SeaweedFS serves S3 at ``cluster ip`` (where pods reach the host). The component image
built by buildah is loaded into the cluster's containerd under the name the compiled pipeline and the chart use,
and tagged there under the trainer image's name too (the trainer image's ``nvidia/cuda`` base cannot be had here,
so the component image serves as the trainer image: same library, same ``g2rpo`` entry point, CPU torch use).

Installed as a user installs it (docs/deployment.md): a namespace enforcing Pod Security "restricted", the S3
Secret, then the chart's objects — rendered by Helm's own engine (``helm-python-sdk``; no helm binary exists
here) and applied server-side — after ``cluster trainer-up`` (the Trainer CRDs and its live webhooks admit the
ClusterTrainingRuntime).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import boto3
import helm_python
import yaml
from botocore.config import Config

from components.images import G2RPO_IMAGE, TRAINER_IMAGE
from g2rpo.artifacts.publish import publish_dir
from g2rpo.rewards.shapes import IN_DOMAIN, IN_DOMAIN_CHECKS, OUT_OF_DOMAIN
from g2rpo.tasks.shapes import write_prompts
from pipelines.local import LEARNED_REWARDS
from tests.cluster.kfp_backend import NAMESPACE as KFP_NAMESPACE
from tests.cluster.kfp_backend import KfpBackend
from tests.cluster.kube import Cluster, host_snapshot, leftovers, processes_naming
from tests.s3server import REGION, S3Env

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "g2rpo"
IMAGE_MODELS = "/opt/venv/lib/python3.11/site-packages/g2rpo/models"  # where the image installs the shipped models
# The base model as production passes it: published to S3 (manifest, sha256 of every file); the train pods fetch it.
BASE_MODEL_KEY = "models/shapes_flux"
NAMESPACE = "team-a"
RELEASE = "g2rpo"
SERVICE_ACCOUNT = "g2rpo"  # the profile's service_account (g2rpo/steps/profiles/h200.yaml), created by the chart
BUCKET = "g2rpo"
PIPELINE_ROOT = f"s3://{BUCKET}/pipeline-root"  # the chart's kfp-launcher ConfigMap: where KFP puts the runs' artifacts


@dataclass(frozen=True)
class ToolS3:
    """The SeaweedFS S3 ``kfp up`` runs at ``cluster ip`` (keys enforced): the one object store of the tier — KFP's
    pipeline root, the project's store and registry. ``kfp down`` stops it."""

    endpoint_url: str
    access_key: str
    secret_key: str

    @classmethod
    def of(cls, backend: KfpBackend) -> ToolS3:
        return cls(backend.s3_endpoint, *backend.s3_credentials())


@dataclass
class Deployment:
    cluster: Cluster
    s3: ToolS3
    kfp: KfpBackend
    timings: dict[str, float] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)  # KFP runs a later test compares with: label -> run id

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.s3.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.s3.access_key,
            aws_secret_access_key=self.s3.secret_key,
            config=Config(s3={"addressing_style": "path"}),
        )


def _render_chart(values: dict, namespace: str = NAMESPACE) -> list[dict]:
    manifests = helm_python.Chart.load(CHART).render(values, name=RELEASE, namespace=namespace, is_install=True)
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
            # null deletes the chart's default key: Helm merges a map given in values ({}) with the default one,
            # so `nodeSelector: {}` would keep nvidia.com/gpu.product=NVIDIA-H200 and no pod would schedule here.
            "nodeSelector": {"nvidia.com/gpu.product": None},
            "tolerations": [],
            "shmSize": "1Gi",
            "gpusPerNode": 1,
            # Requests two training pods and the waiting train pod fit on the node's 2 cores beside each other.
            "cpuPerNode": "500m",
            "memoryPerNode": "4Gi",
        },
    }


def deployed(workdir: Path):
    """Up, Kubeflow Pipelines' backend with its S3, image, Trainer, the chart (in ``team-a`` and in KFP's namespace),
    and what every test's run reads (bucket, prompts, gates, the launcher's ConfigMap, two advertised GPUs); yields
    the :class:`Deployment`; everything down in ``finally`` and the host checked."""
    cluster = Cluster(workdir)
    before = host_snapshot(workdir.parent)
    backend = KfpBackend(cluster)
    timings: dict[str, float] = {}
    try:
        timings["cluster up"] = cluster.up()
        backend.system()  # the tool's images and `kfp up`: ML Metadata, the S3, Argo
        s3 = ToolS3.of(backend)
        timings["load-image"] = cluster.load_image(G2RPO_IMAGE)
        tag_in_node(cluster, G2RPO_IMAGE, TRAINER_IMAGE)
        timings["trainer-up"] = cluster.trainer_up()
        start = time.monotonic()
        install(cluster, s3)
        timings["chart install"] = time.monotonic() - start
        backend.server()  # MariaDB, the KFP API server, the persistence agent
        start = time.monotonic()
        install(cluster, s3, namespace=KFP_NAMESPACE)
        timings["chart install (kubeflow)"] = time.monotonic() - start
        deployment = Deployment(cluster, s3, backend, timings)
        prepare_inputs(deployment)
        yield deployment
    finally:
        timings.update(backend.timings)
        start = time.monotonic()
        try:
            backend.down()
        finally:
            timings["kfp down"] = time.monotonic() - start
            timings["cluster down"] = cluster.down()
        print("\ncluster tier timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        left = leftovers(before, host_snapshot(workdir.parent))
        left.update({"processes": processes_naming(workdir.parent)} if processes_naming(workdir.parent) else {})
        assert not left, f"the cluster left these behind on the host: {left} (see {workdir}/logs)"


def tag_in_node(cluster: Cluster, image: str, alias: str) -> None:
    """Tag ``image`` as ``alias`` in the node's containerd (``ctr``, the cluster's own socket): the component
    image serves as the trainer image here, under the name the compiled pipeline gives the TrainJob."""
    socket = cluster.workdir / "containerd" / "containerd.sock"
    done = subprocess.run(
        ["ctr", "--address", str(socket), "-n", "k8s.io", "images", "tag", "--force", image, alias],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr images tag {image} {alias} failed: {done.stderr}")


def prepare_inputs(deployment: Deployment) -> None:
    """The bucket, the prompts file, the base model and the gates every run reads, and the GPU count."""
    cluster, client = deployment.cluster, deployment.client()
    client.create_bucket(Bucket=BUCKET)
    prompts = Path(os.environ.get("TMPDIR", "/tmp")) / f"shapes-{uuid.uuid4().hex[:8]}.txt"
    write_prompts(prompts)
    client.upload_file(str(prompts), BUCKET, "prompts/shapes.txt")
    prompts.unlink()
    client.upload_file(str(REPO / "configs" / "shapes-gates.yaml"), BUCKET, "gates/shapes-gates.yaml")
    with mock.patch.dict(os.environ, S3Env(deployment.s3, BUCKET).env):  # the AWS chain g2rpo reads
        publish_dir(REPO / "g2rpo" / "models" / "shapes_flux", f"s3://{BUCKET}/{BASE_MODEL_KEY}")
    advertise_gpus(cluster, 2)


def install(cluster: Cluster, s3: ToolS3, namespace: str = NAMESPACE) -> None:
    """What docs/deployment.md tells a platform team to do, in its order.

    In ``team-a`` (Pod Security "restricted"): the ClusterTrainingRuntime with it. In KFP's own namespace (a
    single-user KFP runs every pipeline there): the same chart with the runtime off (it is cluster-scoped and
    installed once) and the chart's ``kfp-launcher`` ConfigMap on, which sends the runs' artifacts to this S3
    under ``s3://g2rpo/pipeline-root``; it replaces the one ``kfp up`` made for its own bucket. No shared volume:
    the runtime has none, as on the many clusters without ReadWriteMany storage, so a multi-node TrainJob keeps each
    node's part of a checkpoint in its pod's emptyDir and S3 is the only store its nodes share."""
    kfp = namespace == KFP_NAMESPACE
    if not kfp:
        labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
        cluster.apply(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
        )
    cluster.kubectl(
        "-n", namespace, "create", "secret", "generic", "g2rpo-s3",
        f"--from-literal=AWS_ACCESS_KEY_ID={s3.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={s3.secret_key}",
        f"--from-literal=AWS_ENDPOINT_URL_S3={s3.endpoint_url}",
    )  # fmt: skip
    values = chart_values(s3.endpoint_url)
    if kfp:
        cluster.kubectl("-n", namespace, "delete", "configmap", "kfp-launcher", "--ignore-not-found")
        values["trainingRuntime"] = {"enabled": False}
        values["kfp"] = {"launcherConfig": {"enabled": True, "pipelineRoot": PIPELINE_ROOT}}
    out = cluster.apply(yaml.safe_dump_all(_render_chart(values, namespace)))
    assert "Warning" not in out, out


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
    """The smallest shapes run: 2 iterations of G²RPO from the shipped model, 4 held-out prompts × 1 seed.

    Trained on the learned rewards the demo trains on (``pipelines.local.LEARNED_REWARDS``: hps_v21, clip; the
    image's copies), the exact shapes scores at weight 0, as ``configs/shapes-gates.yaml`` gates them."""
    rewards = [
        {"name": name, "weight": 1.0, "weights": f"{IMAGE_MODELS}/{path.name}"}
        for name, path in LEARNED_REWARDS.items()
    ]
    rewards += [{"name": name, "weight": 0.0} for name in (*IN_DOMAIN, *IN_DOMAIN_CHECKS, *OUT_OF_DOMAIN)]
    return {
        "config_uri": "configs/shapes-cpu.yaml",
        # What production passes: an s3:// base model (the shipped shapes model, published by prepare_inputs). The
        # train pods fetch it into their verified cache; evaluation resolves the export's base through it.
        "base_model_uri": f"s3://{bucket}/{BASE_MODEL_KEY}",
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
