"""A two-node run of the pipeline on the tier's cluster: its arguments, its TrainJob's objects and pods, logs, S3.

Shared by the TrainJob tests and usable by hand against a cluster left up (``G2RPO_CLUSTER_WORKDIR``).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from g2rpo.launch.trainjob import job_name
from tests.cluster.deploy import BUCKET, Deployment, run_arguments
from tests.cluster.kfp_backend import NAMESPACE
from tests.cluster.kube import CLUSTER, Cluster

TRAIN_TASK = "train"
ITERATIONS = 6


def trainjob_arguments(bucket: str = BUCKET, iterations: int = ITERATIONS) -> dict:
    """The tier's smallest shapes run (T = 4, G = 4, 2 prompts per iteration, one per rank) on two nodes, as
    ``g2rpo pipeline submit`` takes it: the train task's own pod holds no GPU and little CPU; each TrainJob pod gets
    one of the node's two advertised GPUs. ``node_selector`` is merged over the profile's labels, so the H200 label
    (no such node here) is removed with null."""
    args = run_arguments(bucket)
    args["node_selector"] = {"nvidia.com/gpu.product": None}
    args.update(
        {
            "nodes": 2,
            "iterations": iterations,
            "train_pod_gpus": "0",
            "train_pod_cpu": "500m",
            "train_pod_memory": "2Gi",
        }
    )
    args["overrides"] = [*args["overrides"], "deepspeed.enabled=true"]  # more than one rank trains under DeepSpeed
    return args


def trainjob_of(run_id: str) -> str:
    return job_name(run_id, TRAIN_TASK)


def pods_of(cluster: Cluster, job: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"jobset.sigs.k8s.io/jobset-name={job}", "-o", "json")
    return json.loads(out.stdout)["items"]


def describe(cluster: Cluster, job: str) -> str:
    """What a failure message needs: the TrainJob's conditions, the JobSet's status, each pod's phase and log tail."""
    parts = []
    for kind in ("trainjob", "jobset"):
        done = cluster.kubectl("get", kind, job, "-n", NAMESPACE, "-o", "json", check=False)
        if done.returncode == 0:
            parts.append(f"{kind} {job} status: {json.dumps(json.loads(done.stdout).get('status'))[:1500]}")
    for pod in pods_of(cluster, job):
        name = pod["metadata"]["name"]
        parts.append(f"pod {name} {pod['status'].get('phase')}; log ends:\n{cluster.logs(name, NAMESPACE)[-3000:]}")
    return "\n".join(parts)


def wait_for(what: str, check, timeout_s: float, explain) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(2)
    raise TimeoutError(f"{what}: not after {timeout_s:.0f} s\n{explain()}")


@dataclass
class LogFollower:
    """``kubectl logs -f`` of one pod into memory (a deleted pod's log is gone once the pod is)."""

    cluster: Cluster
    pod: str
    namespace: str = NAMESPACE
    container: str | None = None
    lines: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    def start(self) -> LogFollower:
        argv = [str(CLUSTER), "kubectl", str(self.cluster.workdir), "logs", "-f", self.pod, "-n", self.namespace]
        argv += ["-c", self.container] if self.container else []
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def stop(self, timeout_s: float = 30) -> str:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._thread.join(timeout=10)
        return self.text()


def mirrored_iterations(deployment: Deployment, checkpoint_prefix: str) -> list[int]:
    """Complete checkpoints in the run's S3 mirror (their manifest written)."""
    client = deployment.client()
    found = client.list_objects_v2(Bucket=BUCKET, Prefix=checkpoint_prefix.rstrip("/") + "/")
    keys = [item["Key"] for item in found.get("Contents", [])]
    return sorted(
        int(key.split("/")[-2].removeprefix("iter-"))
        for key in keys
        if key.endswith("/manifest.json") and key.split("/")[-2].startswith("iter-")
    )


def export_weights(deployment: Deployment, export_uri: str) -> dict[str, str]:
    """The weight files of a published export and their sha256, from its manifest."""
    prefix = export_uri.split("/", 3)[3]
    body = deployment.client().get_object(Bucket=BUCKET, Key=f"{prefix}/manifest.json")["Body"].read()
    files = json.loads(body)["files"]
    entries = files.items() if isinstance(files, dict) else ((f["path"], f) for f in files)
    return {path: entry["sha256"] for path, entry in entries if Path(path).suffix in (".safetensors", ".bin", ".pt")}
