"""Multi-node training as a Kubeflow Trainer v2 ``TrainJob``, through the Kubeflow SDK.

One pod trains on up to one node (``torchrun`` inside the task). For more nodes the train step calls
:func:`launch_trainjob`, which hands the run to the cluster's Trainer controller:

- the job runs torchrun ``-m g2rpo train`` in the trainer image against the project's
  ``ClusterTrainingRuntime`` :data:`TRAINING_RUNTIME` (torch-distributed; the Helm chart ships it),
  with the resolved run config passed in the environment (:data:`CONFIG_ENV`). torchrun runs as
  :mod:`g2rpo.launch.torchrun`, which keeps the trainer's usage/configuration exit status (2) where
  torchrun exits 1; the runtime fails the job at once on it (a Job ``podFailurePolicy`` and the JobSet
  rule :data:`USAGE_FAILURE_RULE`) instead of using the restarts, and the task's error says so;
- its name is a function of the KFP run, the task and the attempt (:func:`job_name`): a retried task finds
  its job and follows it instead of starting a second one while that job runs (or has completed). A job that
  failed (its JobSet's restarts used up, its deadline passed, a usage or configuration error) stays ``Failed``;
  a retry then starts the next attempt, a new job of the next name, which resumes from the run's S3 checkpoint
  mirror (the same ``--checkpoint-uri``, a fresh ``output.dir``). A failed job is never deleted: it stays for
  its logs;
- the job lives as long as the task waits for it: SIGTERM to the task (a run terminated through KFP, whose Argo
  signals the task's container, or the task's pod deleted) deletes the job, so a cancelled run leaves no training
  pods. A retry of the task then creates it again under the same name, and it resumes from the S3 mirror. A task
  killed outright (SIGKILL, a lost node) leaves the job training, and its retry follows it. Get, create and delete
  on TrainJobs are all the task needs;
- ``output.dir``: on several nodes, a folder per job on the runtime's shared volume (:data:`RUNS_DIR_ENV`, the
  chart's ``trainingRuntime.sharedVolume``); without one, when the run mirrors its checkpoints to ``s3://``,
  a folder in an emptyDir of each pod (:data:`NODE_RUN_DIR`) with ``output.node_local=true``: each node keeps
  its part of every checkpoint there and S3 is the only store the nodes share (:mod:`g2rpo.training.mirror`).
  With neither, the launch is refused before any job is created;
- placement (node selector, tolerations, ``/dev/shm``, service account) rides in ``spec.runtimePatches``,
  GPUs per node in ``spec.trainer.resourcesPerNode``, the deadline in ``spec.activeDeadlineSeconds``;
- the S3 credentials reach the pods through the runtime (the chart's ``s3.existingSecret``), never as env
  in ``runtimePatches``: the Trainer's admission webhook (v2.3, and master) refuses a TrainJob whose
  patches set env on container ``node`` (HTTP 403, "must not have envs for the ... node containers").
  Before creating a job the launcher reads the runtime and refuses, naming the fix, when its ``node``
  container does not read every variable of :attr:`TrainJobLaunch.s3_secret_keys` from that Secret;
- the task waits with an explicit timeout sized for training (the SDK's default is 600 s), streams
  node-0's log into its own, and raises a :class:`~g2rpo.errors.G2RPOError` carrying the job's
  ``Failed`` condition message when the job fails.

Versions are pinned together: ``kubeflow`` 0.5.0 (with ``kubeflow-trainer-api`` 2.3.0) writes
``spec.runtimePatches``, the field of the ``trainer.kubeflow.org/v1alpha1`` TrainJob CRD of Trainer
v2.3 (it was ``podSpecOverrides``, then ``podTemplateOverrides``, earlier in 2026). A cluster whose
Trainer predates the rename drops the placement silently; the tests validate the generated job
against the CRD kept in ``tests/fixtures/crds/``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient
from kubeflow.trainer.options import (
    ActiveDeadlineSeconds,
    Annotations,
    ContainerPatch,
    JobSetSpecPatch,
    JobSetTemplatePatch,
    JobSpecPatch,
    JobTemplatePatch,
    Labels,
    Name,
    PodSpecPatch,
    PodTemplatePatch,
    ReplicatedJobPatch,
    RuntimePatch,
    TrainerCommand,
    TrainingRuntimeSpecPatch,
)
from kubeflow.trainer.types.types import CustomTrainerContainer
from kubernetes import client as k8s

from g2rpo.errors import USAGE_EXIT_STATUS, G2RPOError, problem

__all__ = [
    "run_labels",
    "train_pod_problems",
    "CONFIG_ENV",
    "MAX_GPUS_PER_NODE",
    "NODE_RUN_DIR",
    "RUNS_DIR_ENV",
    "S3_SECRET_KEYS",
    "TRAINING_RUNTIME",
    "Placement",
    "TrainJobLaunch",
    "TrainJobOutcome",
    "gpus_per_node_from",
    "job_name",
    "launch_trainjob",
    "train_command",
]

log = logging.getLogger(__name__)

# The ClusterTrainingRuntime the project's Helm chart installs (torch-distributed, replicated job
# "node" whose container "node" runs the trainer image). Named here only.
TRAINING_RUNTIME = "g2rpo-torch-distributed"
NODE_JOB = "node"  # the runtime's replicated job and container that train (the Trainer's convention)
CONFIG_ENV = "G2RPO_RUN_CONFIG"  # the resolved run config (YAML) the job's pods train from
CONFIG_PATH = "/tmp/g2rpo-run-config.yaml"
# The runtime's node container names the folder every node shares in this variable (the chart's
# trainingRuntime.sharedVolume); a multi-node job's output.dir is <that folder>/<job name>.
RUNS_DIR_ENV = "G2RPO_RUNS_DIR"
# Without a shared folder, a multi-node job that mirrors its checkpoints to S3 keeps each node's output.dir
# (output.node_local) in an emptyDir of its own pod, mounted here (g2rpo.training.mirror).
NODE_RUN_DIR = "/g2rpo-node-run"
NODE_RUN_VOLUME = "node-run"
# Keys of the Kubernetes Secret named by TrainJobLaunch.s3_secret, exported under the same names
# unless TrainJobLaunch.s3_secret_keys maps them (the pipeline passes its profile's mapping).
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
LABEL_RUN = "g2rpo.io/kfp-run"
ANNOTATION_RUN = "g2rpo.io/kfp-run-id"
ANNOTATION_TASK = "g2rpo.io/kfp-task"
# The chart's runtime fails a job at once on the trainer's usage/configuration status (USAGE_EXIT_STATUS): its
# Job's podFailurePolicy fails the Job, this JobSet failure rule fails the JobSet, and JobSet (v0.12) gives the
# JobSet's, and so the TrainJob's, Failed condition this reason.
USAGE_FAILURE_RULE = "TrainerUsageError"
FAIL_JOBSET_REASON = "FailJobSetFailurePolicyAction"

# A training run may take days on a pool of H200 nodes; the job's own deadline ends it first, so
# the task waits a little longer than the deadline and reports the job's DeadlineExceeded message.
DEFAULT_DEADLINE_S = 3 * 24 * 3600
DEADLINE_GRACE_S = 15 * 60
# The most TrainJobs one run's task starts (the pipeline retries its train task twice; a run retried by hand
# adds more): past it the task refuses to start another, naming the failed jobs' fix.
MAX_ATTEMPTS = 16
# The most GPUs one node holds (the placement profile's bound too).
MAX_GPUS_PER_NODE = 16


@dataclass(frozen=True)
class Placement:
    """Where the job's pods run: the same knobs as the single-node train task's placement."""

    gpus_per_node: int = 8
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    shm_size: str | None = "64Gi"  # /dev/shm as a memory emptyDir (NCCL and data loaders need more than 64 MiB)
    service_account: str | None = None


@dataclass(frozen=True)
class TrainJobLaunch:
    """How to launch one run's TrainJob: image, identity (KFP run and task), placement, limits."""

    image: str
    run_id: str  # the KFP run's id (dsl.PIPELINE_JOB_ID_PLACEHOLDER)
    task: str  # the pipeline task's name: stable across retries of the task
    namespace: str | None = None  # None: the SDK's default (the pod's own namespace, or the kubeconfig's)
    runtime: str = TRAINING_RUNTIME
    placement: Placement = field(default_factory=Placement)
    env: dict[str, str] = field(default_factory=dict)
    # The Secret the runtime's pods read S3_SECRET_KEYS from (its name only, never its values): checked
    # against the runtime before a job is created; None: no check.
    s3_secret: str | None = None
    # The Secret's data keys -> the environment variables the pods read them as (default: S3_SECRET_KEYS as named).
    s3_secret_keys: dict[str, str] = field(default_factory=lambda: {key: key for key in S3_SECRET_KEYS})
    active_deadline_s: int = DEFAULT_DEADLINE_S
    wait_timeout_s: int | None = None  # None: the deadline plus a grace period
    poll_interval_s: int = 30
    client_configuration: Any = None  # a kubernetes.client.Configuration; None: in-cluster or kubeconfig

    @property
    def wait_s(self) -> int:
        return self.wait_timeout_s if self.wait_timeout_s is not None else self.active_deadline_s + DEADLINE_GRACE_S


@dataclass(frozen=True)
class TrainJobOutcome:
    """A finished TrainJob: its name and namespace, whether this call followed an existing job, and which
    attempt of the run's task it is (1 unless an earlier attempt's job failed)."""

    name: str
    namespace: str
    followed: bool
    attempt: int = 1


def gpus_per_node_from(value: str | int) -> int:
    """The pipeline's ``gpus_per_node`` parameter as a number of GPUs (1 to :data:`MAX_GPUS_PER_NODE`).

    The parameter is a string ("8") because KFP's driver reads an accelerator count from a pipeline
    input only as a string (pipelines/alignment.py); anything but a whole number in range is refused
    here, before a pod or a TrainJob asks the scheduler for it."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdecimal() or not 1 <= int(text) <= MAX_GPUS_PER_NODE:
        raise G2RPOError(
            problem(
                "gpus_per_node",
                value,
                f"give the GPUs of one node as a whole number from 1 to {MAX_GPUS_PER_NODE}, e.g. gpus_per_node=8",
            )
        )
    return int(text)


def train_pod_problems(nodes: Any, gpus_per_node: Any, pod_gpus: Any) -> list[str]:
    """What is wrong with the train task's own pod having ``pod_gpus`` GPUs (the ``train_pod_gpus``
    parameter) for ``nodes`` and ``gpus_per_node``: with more than one node it only creates and watches
    the TrainJob, whose pods get the GPUs, so it must hold none; on one node it trains on ``gpus_per_node``."""
    pod_gpus, gpus = str(pod_gpus).strip(), str(gpus_per_node).strip()
    if isinstance(nodes, int) and nodes > 1 and pod_gpus != "0":
        return [
            problem(
                "train_pod_gpus",
                pod_gpus,
                f"with nodes={nodes} the train task only creates and watches the TrainJob (whose pods get the GPUs): "
                f"its own pod would hold {pod_gpus} idle GPUs; give 0 (`g2rpo pipeline submit` does)",
            )
        ]
    if isinstance(nodes, int) and nodes == 1 and pod_gpus != gpus:
        return [
            problem(
                "train_pod_gpus",
                pod_gpus,
                f"with nodes=1 the train task trains in its own pod on gpus_per_node={gpus} GPUs; give {gpus} "
                "(`g2rpo pipeline submit` does)",
            )
        ]
    return []


def job_name(run_id: str, task: str, attempt: int = 1) -> str:
    """The TrainJob's name for a run's task and its ``attempt``: the same for every retry of the task while
    that attempt's job has not failed, different for every other run, task or attempt; a DNS-1035 label short
    enough for the pods JobSet derives from it. Attempt 1 is ``g2rpo-<task>-<digest>``, attempt N ``…-aN``."""
    if not run_id or not task:
        raise G2RPOError(problem("run_id/task", (run_id, task), "both are needed to name the TrainJob"))
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_ATTEMPTS:
        raise G2RPOError(problem("attempt", attempt, f"give the attempt's number, 1 to {MAX_ATTEMPTS}"))
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")[:16].rstrip("-") or "train"
    digest = hashlib.sha256(f"{run_id}\n{task}".encode()).hexdigest()[:10]
    return f"g2rpo-{slug}-{digest}" + ("" if attempt == 1 else f"-a{attempt}")


def train_command(args: list[str], processes_per_node: int = 1) -> list[str]:
    """The trainer container's command: write the run config from :data:`CONFIG_ENV`, then
    torchrun ``-m g2rpo train`` on it, one process per GPU of the node (``processes_per_node``).

    torchrun takes nodes, rank and rendezvous from the ``PET_*`` variables the Trainer's torch plugin
    sets; the process count is given explicitly because the plugin's default, ``auto``, means one per
    CPU core on a node without a GPU visible to the container (seen on a real Trainer v2.3: 2 ranks
    per node on a 2-core node), not the one per node the job asked for. It runs as
    :mod:`g2rpo.launch.torchrun` (torch's launcher, in that process), which exits with the trainer's
    usage/configuration status when that is why a rank failed: torchrun itself would exit 1, and the
    runtime's ``podFailurePolicy`` fails the job at once only on that status."""
    if processes_per_node < 1:
        raise G2RPOError(problem("processes_per_node", processes_per_node, "give 1 or more (one per GPU)"))
    script = (
        f'printf "%s" "${CONFIG_ENV}" > {CONFIG_PATH} && '
        f"exec python -m g2rpo.launch.torchrun --nproc-per-node={processes_per_node} "
        f'-m g2rpo train --config {CONFIG_PATH} "$@"'
    )
    return ["bash", "-c", script, "g2rpo-train", *args]


def run_labels(launch: TrainJobLaunch) -> dict[str, str]:
    """The run's identity as labels: on the TrainJob, and through the runtime patch on its JobSet, Jobs and pods."""
    return {LABEL_RUN: _label_value(launch.run_id), "app.kubernetes.io/part-of": "g2rpo"}


def trainjob_options(launch: TrainJobLaunch, name: str, command: list[str], node_local: bool = False) -> list[Any]:
    """The SDK options that make the job: name, labels, deadline, command and the runtime patch
    (``node_local``: each pod's own folder for output.dir, an emptyDir at :data:`NODE_RUN_DIR`)."""
    placement = launch.placement
    volumes, mounts = [], []
    if placement.shm_size:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": placement.shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if node_local:  # on the node's disk, as big as a checkpoint's part needs; gone with the pod (S3 holds the whole)
        volumes.append({"name": NODE_RUN_VOLUME, "emptyDir": {}})
        mounts.append({"name": NODE_RUN_VOLUME, "mountPath": NODE_RUN_DIR})
    # No env here: the Trainer's webhook refuses env patches of container "node" (module docstring).
    container = ContainerPatch(name=NODE_JOB, volume_mounts=mounts or None)
    pod = PodSpecPatch(
        service_account_name=placement.service_account,
        volumes=volumes or None,
        containers=[container] if mounts else None,
        node_selector=dict(placement.node_selector) or None,
        tolerations=[dict(t) for t in placement.tolerations] or None,
    )
    # The TrainJob's own labels stay on the TrainJob (Trainer v2.3 copies none of them down): the run's
    # identity rides in the runtime patch's metadata, which the Trainer applies to the JobSet, its Jobs and
    # the pod template, so every training pod carries it (dashboards, cleanup by label).
    identity = {"labels": run_labels(launch)}
    pod_template = PodTemplatePatch(metadata=identity, spec=pod)
    patch = RuntimePatch(
        training_runtime_spec=TrainingRuntimeSpecPatch(
            template=JobSetTemplatePatch(
                metadata=identity,
                spec=JobSetSpecPatch(
                    replicated_jobs=[
                        ReplicatedJobPatch(
                            name=NODE_JOB,
                            template=JobTemplatePatch(metadata=identity, spec=JobSpecPatch(template=pod_template)),
                        )
                    ]
                ),
            )
        )
    )
    return [
        Name(name=name),
        Labels(labels=run_labels(launch)),
        Annotations(annotations={ANNOTATION_RUN: launch.run_id, ANNOTATION_TASK: launch.task}),
        ActiveDeadlineSeconds(seconds=launch.active_deadline_s),
        TrainerCommand(command=command),
        patch,
    ]


def launch_trainjob(
    launch: TrainJobLaunch,
    args: list[str],
    *,
    config_yaml: str,
    nodes: int,
    echo: Callable[[str], None] = print,
) -> TrainJobOutcome:
    """Start (or follow) the run's TrainJob of ``nodes`` nodes running ``g2rpo train ARGS`` on
    ``config_yaml``; stream node-0's log through ``echo``; return once it is Complete.

    The job is the task's current attempt (:func:`_current_attempt`): the first of its names whose job has
    not failed, followed when it exists and created when not. Raises :class:`G2RPOError` when the job fails
    (with its condition message and what a retry does), when it does not finish within the wait timeout, or
    when the runtime is missing.
    """
    _check(launch, nodes)
    trainer = TrainerClient(
        KubernetesBackendConfig(namespace=launch.namespace, client_configuration=launch.client_configuration)
    )
    namespace = trainer.backend.namespace
    api = k8s.CustomObjectsApi(k8s.ApiClient(launch.client_configuration))
    name, attempt, existing = _current_attempt(api, launch, namespace, echo)
    followed = existing is not None
    if existing is not None:
        echo(f"following TrainJob {namespace}/{name} (started by an earlier attempt of this task)")
    else:
        runtime = _read_runtime(api, launch, namespace)
        if launch.s3_secret and runtime is not None:
            _check_runtime_reads_the_secret(runtime, launch)
        node_local = False
        if nodes > 1 and runtime is not None:
            # Every rank writes its part of each checkpoint into output.dir: on several nodes the runtime's
            # shared volume, one folder per job (a restarted pod resumes from it); without one, each pod's
            # own folder, the run's S3 checkpoint mirror holding the whole (a restarted pod restores from it).
            runs_dir, node_local = _runs_dir(runtime, launch, args)
            args = [*args, f"output.dir={runs_dir}/{name}", *(["output.node_local=true"] if node_local else [])]
        container = CustomTrainerContainer(
            image=launch.image,
            num_nodes=nodes,
            resources_per_node={"gpu": launch.placement.gpus_per_node} if launch.placement.gpus_per_node else None,
            env={**launch.env, CONFIG_ENV: config_yaml},
        )
        try:
            trainer.train(
                runtime=launch.runtime,
                trainer=container,
                options=trainjob_options(
                    launch, name, train_command(args, max(launch.placement.gpus_per_node, 1)), node_local
                ),
            )
            resumes = " (resuming from the run's checkpoint mirror)" if attempt > 1 else ""
            echo(
                f"started TrainJob {namespace}/{name}: {nodes} node(s) × {launch.placement.gpus_per_node} GPU(s), "
                f"attempt {attempt}{resumes}"
            )
        except RuntimeError as exc:
            if _status_of(exc) == 409:  # another attempt created it between our read and our create
                followed = True
                echo(f"following TrainJob {namespace}/{name} (created concurrently)")
            else:
                raise _launch_error(exc, launch, namespace, name) from None
    _wait(trainer, api, launch, namespace, name, attempt, echo)
    return TrainJobOutcome(name=name, namespace=namespace, followed=followed, attempt=attempt)


# --------------------------------------------------------------------------- helpers


def _check(launch: TrainJobLaunch, nodes: int) -> None:
    problems = []
    if nodes < 1:
        problems.append(problem("nodes", nodes, "give the number of nodes (1 or more)"))
    if not launch.image:
        problems.append(problem("image", launch.image, "name the trainer image the job's pods run"))
    if launch.placement.gpus_per_node < 0:
        problems.append(problem("gpus_per_node", launch.placement.gpus_per_node, "give 0 (CPU) or more"))
    if launch.active_deadline_s < 1:
        problems.append(problem("active_deadline_s", launch.active_deadline_s, "give a positive number of seconds"))
    if not 0 < launch.poll_interval_s < launch.wait_s:
        problems.append(
            problem(
                "poll_interval_s", launch.poll_interval_s, f"must be positive and below the wait ({launch.wait_s} s)"
            )
        )
    if problems:
        raise G2RPOError("cannot launch the TrainJob:\n  - " + "\n  - ".join(problems))


def _read_runtime(api: k8s.CustomObjectsApi, launch: TrainJobLaunch, namespace: str) -> dict[str, Any] | None:
    """The runtime the job will use, looked up as the SDK does: a TrainingRuntime in the namespace, else the
    ClusterTrainingRuntime of that name; None when neither exists (the SDK's create then names the fix)."""
    group, version = "trainer.kubeflow.org", "v1alpha1"
    reads = (
        lambda: api.get_namespaced_custom_object(group, version, namespace, "trainingruntimes", launch.runtime),
        lambda: api.get_cluster_custom_object(group, version, "clustertrainingruntimes", launch.runtime),
    )
    for read in reads:
        try:
            return read()
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise G2RPOError(
                    f"cannot read runtime {launch.runtime}: HTTP {exc.status} {exc.reason}; the task's service "
                    "account needs get on trainingruntimes and clustertrainingruntimes (the Helm chart's roles)"
                ) from None
    return None


def _node_containers(runtime: dict[str, Any]) -> list[dict[str, Any]]:
    """The runtime's container ``node`` of its replicated job ``node`` (the one that trains)."""
    jobs = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    pods = [
        ((j.get("template") or {}).get("spec") or {}).get("template") or {} for j in jobs if j.get("name") == NODE_JOB
    ]
    return [c for pod in pods for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == NODE_JOB]


def _runs_dir(runtime: dict[str, Any], launch: TrainJobLaunch, args: list[str]) -> tuple[str, bool]:
    """Where a multi-node job's output.dir goes, and whether it is each node's own (``output.node_local``).

    The folder all nodes share (:data:`RUNS_DIR_ENV` on the runtime's ``node`` container, a volume mounted
    there) when the runtime has one; else, when the run mirrors its checkpoints to ``s3://``, each pod's
    own folder (:data:`NODE_RUN_DIR`). Refused, naming the setting and the fix, with neither, or with a
    mirror that is not S3 (a ``file://`` folder is no more shared than output.dir would be)."""
    containers = _node_containers(runtime)
    env = {e.get("name"): e.get("value") for c in containers for e in c.get("env") or []}
    mounts = {m.get("mountPath") for c in containers for m in c.get("volumeMounts") or []}
    runs_dir = env.get(RUNS_DIR_ENV)
    if runs_dir and runs_dir.rstrip("/") in mounts:
        return runs_dir.rstrip("/"), False
    why = f"{RUNS_DIR_ENV} names {runs_dir!r}, where no volume is mounted" if runs_dir else f"no {RUNS_DIR_ENV}"
    mirror = _checkpoint_uri(args)
    if mirror is not None and mirror.startswith("s3://"):
        return NODE_RUN_DIR, True
    shared = (
        "install the Helm chart with trainingRuntime.sharedVolume.claimName=<a ReadWriteMany "
        "PersistentVolumeClaim in this namespace>"
    )
    if mirror is not None:
        raise G2RPOError(
            problem(
                "checkpoint_uri",
                mirror,
                f"runtime {launch.runtime} has no folder its nodes share ({why}), so each node keeps its part of "
                "every checkpoint in a folder of its own and the checkpoint mirror must be the one store every "
                f"node sees: give an s3:// URI, or {shared}",
            )
        )
    raise G2RPOError(
        problem(
            "runtime",
            launch.runtime,
            f"has no folder its nodes share ({why}) and the run has no checkpoint mirror: every rank writes its "
            "part of each checkpoint, so a multi-node run needs one store all nodes see. Give the run an s3:// "
            f"checkpoint URI (--checkpoint-uri: each node then keeps its part in a folder of its own), or {shared}, "
            "or train on one node",
        )
    )


def _checkpoint_uri(args: list[str]) -> str | None:
    """The run's checkpoint mirror, as the job's ``g2rpo train`` arguments name it (``--checkpoint-uri``)."""
    for i, arg in enumerate(args):
        if arg == "--checkpoint-uri" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--checkpoint-uri="):
            return arg.partition("=")[2]
    return None


def _check_runtime_reads_the_secret(runtime: dict[str, Any], launch: TrainJobLaunch) -> None:
    """Refuse to start a job whose pods would not get the S3 credentials: every variable of
    ``launch.s3_secret_keys`` must be set on the runtime's ``node`` container, from ``launch.s3_secret``
    when it comes from a Secret (a plain value, e.g. the chart's ``s3.endpoint``, is fine)."""
    env = {e.get("name"): e for c in _node_containers(runtime) for e in c.get("env") or []}
    problems = []
    for key, variable in launch.s3_secret_keys.items():
        ref = ((env.get(variable) or {}).get("valueFrom") or {}).get("secretKeyRef")
        if variable not in env:
            problems.append(f"{variable}: not set on the runtime's container {NODE_JOB!r}")
        elif ref is not None and ref.get("name") != launch.s3_secret:
            problems.append(f"{variable}: read from Secret {ref.get('name')!r}, not {launch.s3_secret!r}")
        elif ref is not None and ref.get("key") != key:
            problems.append(f"{variable}: read from key {ref.get('key')!r} of the Secret, not {key!r}")
    if problems:
        raise G2RPOError(
            problem(
                "runtime",
                launch.runtime,
                "its pods would not get the S3 credentials of Secret "
                f"{launch.s3_secret!r} ({'; '.join(problems)}): install the Helm chart with "
                f"s3.existingSecret={launch.s3_secret} and the Secret's keys (s3.accessKeyIdKey, "
                "s3.secretAccessKeyKey, s3.endpointKey), or name that Secret in the placement profile",
            )
        )


def _label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._") or "none"


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status behind an SDK error (the SDK wraps the API's exception as the cause)."""
    while exc is not None:
        if isinstance(exc, k8s.ApiException):
            return exc.status
        exc = exc.__cause__
    return None


def _read_job(api: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return api.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise G2RPOError(
            f"cannot read TrainJob {namespace}/{name}: HTTP {exc.status} {exc.reason}; the task's service account "
            "needs get/create on trainjobs.trainer.kubeflow.org in this namespace (the Helm chart's Role)"
        ) from None


def _current_attempt(
    api: k8s.CustomObjectsApi, launch: TrainJobLaunch, namespace: str, echo: Callable[[str], None]
) -> tuple[str, int, dict[str, Any] | None]:
    """The attempt this call joins: the first of the task's names (:func:`job_name` for attempt 1, 2, …) whose
    job has not failed, with that job (None when it does not exist yet: the caller creates it). A failed job
    stays ``Failed`` and keeps its name, so a retry that followed it would fail at once: it starts the next."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        name = job_name(launch.run_id, launch.task, attempt)
        job = _read_job(api, namespace, name)
        if job is None:
            return name, attempt, None
        _check_same_run(job, launch, namespace, name)
        failed = _failed_condition(job)
        if failed is None:
            return name, attempt, job
        echo(
            f"TrainJob {namespace}/{name} (attempt {attempt}) failed ({_condition_text(failed)}): "
            f"starting attempt {attempt + 1}, which resumes from the run's checkpoint mirror"
        )
    raise G2RPOError(
        f"the TrainJobs of all {MAX_ATTEMPTS} attempts of task {launch.task!r} of run {launch.run_id} in {namespace} "
        f"failed (`kubectl get trainjobs -n {namespace} -l {LABEL_RUN}={_label_value(launch.run_id)}` lists them; "
        "their logs say why): fix the cause and start a new run, or delete those TrainJobs to retry this one"
    )


def _check_same_run(job: dict[str, Any], launch: TrainJobLaunch, namespace: str, name: str) -> None:
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    mine = {ANNOTATION_RUN: launch.run_id, ANNOTATION_TASK: launch.task}
    theirs = {key: annotations.get(key) for key in mine}
    if theirs != mine:
        raise G2RPOError(
            f"TrainJob {namespace}/{name} exists but belongs to {theirs}, not to this task {mine}: "
            f"delete it (`kubectl delete trainjob -n {namespace} {name}`) if it is a leftover, then retry"
        )


def _launch_error(exc: RuntimeError, launch: TrainJobLaunch, namespace: str, name: str) -> G2RPOError:
    status = _status_of(exc)
    if "Runtime" in str(exc) and "Failed to get" in str(exc):
        return G2RPOError(
            problem(
                "runtime",
                launch.runtime,
                f"no TrainingRuntime in {namespace} and no ClusterTrainingRuntime of that name: install the project's "
                "Helm chart (it ships the runtime), or name an installed runtime",
            )
        )
    return G2RPOError(f"could not create TrainJob {namespace}/{name} (HTTP {status}): {exc}")


def _failed_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's ``Failed`` condition when it is true (the Trainer copies its JobSet's), else None."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("status") == "True":
            return condition
    return None


def _condition_text(condition: dict[str, Any]) -> str:
    return f"{condition.get('reason') or 'Failed'}: {condition.get('message') or '(no message)'}"


def _failure_message(api: k8s.CustomObjectsApi, namespace: str, name: str) -> str:
    failed = _failed_condition(_read_job(api, namespace, name) or {})
    if failed is None:
        return "Failed (the job reports no condition message)"
    if failed.get("reason") == FAIL_JOBSET_REASON:
        return (
            f"{_condition_text(failed)}: the trainer exited with status {USAGE_EXIT_STATUS}, a usage or configuration "
            "error (a bad run config, a model or prompts path that is not there; node-0's log names it), so the "
            f"runtime's failure rule {USAGE_FAILURE_RULE} failed the job at once instead of restarting it: every "
            "restart would fail the same way. Fix what the log names"
        )
    return _condition_text(failed)


def _wait(
    trainer: TrainerClient,
    api: k8s.CustomObjectsApi,
    launch: TrainJobLaunch,
    namespace: str,
    name: str,
    attempt: int,
    echo: Callable[[str], None],
) -> None:
    done = threading.Event()
    logs = threading.Thread(target=_stream_logs, args=(trainer, name, done, launch.poll_interval_s, echo), daemon=True)
    logs.start()
    try:
        with _deleted_on_sigterm(api, namespace, name, echo):
            job = trainer.wait_for_job_status(
                name, status={"Complete", "Failed"}, timeout=launch.wait_s, polling_interval=launch.poll_interval_s
            )
    except TimeoutError:
        raise G2RPOError(
            f"TrainJob {namespace}/{name} did not finish within {launch.wait_s} s: it keeps running until it ends or "
            f"reaches its activeDeadlineSeconds ({launch.active_deadline_s} s). Running this task again follows the "
            f"same job; `kubectl get trainjob -n {namespace} {name}` shows it"
        ) from None
    except RuntimeError as exc:
        raise G2RPOError(f"lost track of TrainJob {namespace}/{name}: {exc}") from None
    finally:
        done.set()
        logs.join(timeout=launch.poll_interval_s)
    if job.status == "Failed":
        retry = (
            f"retrying this task starts attempt {attempt + 1} (TrainJob "
            f"{job_name(launch.run_id, launch.task, attempt + 1)}), which resumes from there"
            if attempt < MAX_ATTEMPTS
            else f"this was the last of {MAX_ATTEMPTS} attempts: start a new run"
        )
        raise G2RPOError(
            f"TrainJob {namespace}/{name} (attempt {attempt}) failed: {_failure_message(api, namespace, name)}. "
            f"Its checkpoints stay in the run's S3 mirror and {retry}; `kubectl logs -n {namespace} "
            f"-l jobset.sigs.k8s.io/jobset-name={name}` shows every node's log"
        )
    echo(f"TrainJob {namespace}/{name} is Complete")


class _Terminated(BaseException):
    """SIGTERM arrived while the task waited for its TrainJob (raised by the handler, caught around the wait)."""


@contextmanager
def _deleted_on_sigterm(
    api: k8s.CustomObjectsApi, namespace: str, name: str, echo: Callable[[str], None]
) -> Iterator[None]:
    """While the task waits for TrainJob ``name``: on SIGTERM delete the job (its JobSet and pods go with it,
    foreground), say so, and raise :class:`~g2rpo.errors.G2RPOError`. Only the main thread can take a signal;
    elsewhere the wait runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the deletion short
        echo(
            f"SIGTERM received while TrainJob {namespace}/{name} trains: deleting it, so no training pod outlives the run"
        )
        outcome = _delete_job(api, namespace, name)
        raise G2RPOError(
            f"stopped by SIGTERM (the run was terminated, or this task's pod is going away): TrainJob {namespace}/{name} "
            f"{outcome}. Its checkpoints stay in the run's S3 mirror: a retry of this task starts the job again and "
            "resumes from there"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _delete_job(api: k8s.CustomObjectsApi, namespace: str, name: str) -> str:
    """Delete TrainJob ``name`` with foreground propagation; what happened, as the end of a sentence."""
    try:
        api.delete_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name, propagation_policy="Foreground"
        )
    except k8s.ApiException as exc:
        if exc.status == 404:
            return "was already gone"
        return (
            f"could not be deleted (HTTP {exc.status} {exc.reason}: the task's service account needs delete on "
            f"trainjobs.trainer.kubeflow.org, as the Helm chart's Role grants); `kubectl delete trainjob -n {namespace} "
            f"{name}` stops it"
        )
    return "was deleted with its pods"


def _stream_logs(
    trainer: TrainerClient, name: str, done: threading.Event, poll_s: float, echo: Callable[[str], None]
) -> None:
    """Copy node-0's log into the task's log until the job ends, each node-0 pod once (a pod lost
    and replaced streams anew). Best effort: a failure to read logs is reported once and never fails
    the task; the job's status decides."""
    streamed: set[str] = set()
    while not done.is_set():
        try:
            pods = [
                s.pod_name for s in trainer.get_job(name).steps if s.name == f"{NODE_JOB}-0" and s.status != "Pending"
            ]
            if pods and pods[0] not in streamed:
                streamed.add(pods[0])
                for line in trainer.get_job_logs(name, step=f"{NODE_JOB}-0", follow=True):
                    echo(f"[{NODE_JOB}-0] {line.rstrip()}")
        except Exception as exc:  # noqa: BLE001 - the log is a convenience; the job's status is the truth
            log.warning("cannot stream node-0's log of TrainJob %s: %s", name, exc)
            return
        done.wait(poll_s)
