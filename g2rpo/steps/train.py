"""Step **train**: a validated run config in, the trained export (optionally published as an artifact) out.

:func:`train_and_publish` runs the whole job (:func:`g2rpo.training.trainer.train_from_config`: resume, iterations,
checkpoints, export; rank 0 serves Prometheus ``/metrics`` when ``observability.metrics_port``
is set, :func:`training_exporter`) and, with ``publish_uri``, publishes the export folder under a fresh prefix of
that URI (:func:`publish_export`). Under torchrun every rank calls :func:`train_and_publish`; rank 0 publishes.

With ``checkpoint_uri`` (one per run identity) every complete checkpoint is mirrored there, and a
start in a fresh working directory first restores the newest complete mirrored checkpoint, so a
lost pod costs at most one checkpoint interval (:mod:`g2rpo.training.mirror`, a trainer callback).
Start-up — the output checks, the process group, the writer claim on ``output.dir``, the restore —
is the trainer's setup alone; this step only chooses the callbacks.

With ``nodes > 1`` the step trains nothing itself: it launches (or, on a retry, follows) the run's
Kubeflow Trainer ``TrainJob`` (:mod:`g2rpo.launch.trainjob`), which runs ``g2rpo train`` under
torchrun on ``nodes`` nodes, waits for it and returns where it published the export.

:func:`matching_evaluation` is the evaluation config that samples as a run does (for before/after
comparisons on the run's own sampler).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from g2rpo.artifacts.manifest import MANIFEST_NAME, Manifest, read_manifest
from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.storage import S3Settings, open_store
from g2rpo.config import to_yaml
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.launch.trainjob import TrainJobLaunch, job_name, launch_trainjob
from g2rpo.observability import TrainingExporter
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.checkpoint import manifest_metadata
from g2rpo.training.mirror import CheckpointMirror
from g2rpo.training.preflight import run_problems
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.run_dir import RunDir
from g2rpo.training.trainer import RunSummary, train_from_config

__all__ = [
    "PublishedExport",
    "TrainResult",
    "matching_evaluation",
    "publish_export",
    "train_and_publish",
    "training_exporter",
]


@dataclass(frozen=True)
class PublishedExport:
    """An export folder published as an immutable artifact."""

    uri: str
    manifest: Manifest


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train_and_publish` produced. ``summary`` is the trainer's (iterations, first/last reward, backend, ...);
    None when a TrainJob trained (its summary stays in the job's pods)."""

    summary: RunSummary | None
    output_dir: Path
    metrics_path: Path
    checkpoints_dir: Path
    export_dir: Path | None  # None when output.export is false
    config_hash: str  # the resume hash (model, algorithm, data sections)
    published: PublishedExport | None  # with publish_uri, on rank 0
    trainjob: str | None = None  # with nodes > 1: the TrainJob that trained (paths above are in its pods)

    @property
    def export_uri(self) -> str | None:
        return None if self.published is None else self.published.uri


def train_and_publish(
    config: RunConfig,
    *,
    publish_uri: str | None = None,
    settings: S3Settings | None = None,
    producer: str = "g2rpo train",
    checkpoint_uri: str | None = None,
    nodes: int = 1,
    trainjob: TrainJobLaunch | None = None,
) -> TrainResult:
    """Train from ``config``; with ``publish_uri`` (a folder, ``file://`` or ``s3://`` base) publish the export
    under a fresh prefix of it and return its URI and manifest.

    ``checkpoint_uri``: mirror every complete checkpoint there and resume from the newest one there.
    ``nodes > 1``: run as the TrainJob ``trainjob`` describes (image, KFP run and task, placement).
    """
    if publish_uri is not None and not config.output.export:
        raise G2RPOError(problem("output.export", False, "publishing needs the export: set output.export=true"))
    if checkpoint_uri is not None and config.train.resume != "auto":
        raise G2RPOError(
            problem(
                "train.resume",
                config.train.resume,
                "a run with a checkpoint URI resumes from what is mirrored there: use auto, or leave the URI out",
            )
        )
    if config.output.node_local and checkpoint_uri is None:
        raise G2RPOError(
            problem(
                "output.node_local",
                True,
                "each node keeps only its part of a checkpoint in its own output.dir, so the whole exists only in the "
                "checkpoint mirror: give one (--checkpoint-uri s3://bucket/runs/RUN/checkpoints), or put output.dir "
                "on a volume every node shares and set output.node_local=false",
            )
        )
    if nodes > 1:
        return _train_as_trainjob(config, nodes, trainjob, publish_uri, checkpoint_uri, settings)
    if nodes < 1:
        raise G2RPOError(problem("nodes", nodes, "give the number of nodes to train on (1: in this process)"))
    # The trainer's setup owns the start-up: the output checks, the process group, the writer claim on
    # output.dir and (through the mirror's before_resume) the restore from checkpoint_uri. output.dir is
    # resolved here, once, and handed on.
    run_dir = RunDir.of(config)
    callbacks: list[TrainerCallback] = []
    if checkpoint_uri is not None:
        mirror = CheckpointMirror(
            checkpoint_uri,
            keep_last=config.train.keep_last,
            keep_iterations=config.train.keep_iterations,
            settings=settings,
        )
        callbacks.append(mirror)
    exporter = training_exporter(config, run_dir) if int(os.environ.get("RANK", "0")) == 0 else None
    if exporter is not None:
        callbacks.append(exporter)
    try:
        summary = train_from_config(config, callbacks, run_dir)
    finally:
        if exporter is not None:
            exporter.close()
    config_hash = resume_hash(config)
    export_dir = None if summary.export is None else Path(summary.export)
    published = None
    if publish_uri is not None and export_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        published = publish_export(export_dir, publish_uri, config_hash, producer=producer, settings=settings)
    return TrainResult(
        summary=summary,
        output_dir=run_dir.root,
        metrics_path=run_dir.metrics,
        checkpoints_dir=run_dir.checkpoints,
        export_dir=export_dir,
        config_hash=config_hash,
        published=published,
    )


# The Helm chart's ClusterTrainingRuntime declares the training pods' metrics port (the one its
# PodMonitor scrapes) in this variable; a config that sets observability.metrics_port wins.
METRICS_PORT_ENV = "G2RPO_METRICS_PORT"


def training_exporter(config: RunConfig, run_dir: RunDir | None = None) -> TrainingExporter | None:
    """The /metrics exporter of ``config.observability``, on ``metrics_port`` or else the port the
    training runtime names in ``$G2RPO_METRICS_PORT``; None when neither is set. Its run id defaults
    to the name of the run's folder (``run_dir``, else ``output.dir``)."""
    obs = config.observability
    port = obs.metrics_port
    if port is None and os.environ.get(METRICS_PORT_ENV):
        text = os.environ[METRICS_PORT_ENV]
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise G2RPOError(problem(METRICS_PORT_ENV, text, "a port number 1-65535 (set by the chart's runtime)"))
        port = int(text)
    if port is None:
        return None
    return TrainingExporter(
        port,
        address=obs.metrics_address,
        run_id=obs.run_id or (run_dir.root if run_dir is not None else Path(config.output.dir)).name,
        pipeline=obs.pipeline,
        strategy=config.algorithm.strategy,
        model=config.model.base_model_name,
        target_iterations=config.train.iterations,
        # G²RPO's reward columns are its strides Λ; other strategies have one column (labelled 1)
        strides=config.algorithm.g2rpo.granularities if config.algorithm.strategy == "g2rpo" else None,
        linger_seconds=obs.linger_seconds,
    )


def _train_as_trainjob(
    config: RunConfig,
    nodes: int,
    trainjob: TrainJobLaunch | None,
    publish_uri: str | None,
    checkpoint_uri: str | None,
    settings: S3Settings | None,
) -> TrainResult:
    """Launch (or follow) the run's TrainJob; the job publishes the export under ``publish_uri/<the task's first job name>`` (every attempt alike)."""
    if trainjob is None:
        raise G2RPOError(
            problem(
                "nodes",
                nodes,
                "more than one node trains as a Kubeflow TrainJob: pass trainjob=TrainJobLaunch(image=..., run_id=..., "
                "task=...), or train on one node",
            )
        )
    if checkpoint_uri is None:
        raise G2RPOError(
            problem(
                "checkpoint_uri",
                None,
                "a multi-node run mirrors its checkpoints to S3 so that a lost pod resumes: give an s3:// URI for this run",
            )
        )
    # What the job's world size asks of the config (the rank split, DeepSpeed), checked here: found in the
    # job's pods, it would fail every restart the JobSet makes. Files are the pods' to check (their image).
    ranks = nodes * max(trainjob.placement.gpus_per_node, 1)
    problems = run_problems(SimpleNamespace(train=config.train, deepspeed=config.deepspeed), ranks)
    if problems:
        raise ConfigError(problems, source=f"run config for {nodes} nodes ({ranks} ranks)")
    # Every attempt of the task (a new TrainJob after one that failed) resumes from the same mirror and
    # publishes under the same base, named after the task's first job.
    name = job_name(trainjob.run_id, trainjob.task)
    args = ["--checkpoint-uri", checkpoint_uri]
    export_base = None if publish_uri is None else f"{publish_uri.rstrip('/')}/{name}"
    if export_base is not None:
        args += ["--publish", export_base]
    outcome = launch_trainjob(trainjob, args, config_yaml=to_yaml(config), nodes=nodes)
    run_dir = RunDir.of(config)  # the paths in the TrainJob's pods
    return TrainResult(
        summary=None,
        output_dir=run_dir.root,
        metrics_path=run_dir.metrics,
        checkpoints_dir=run_dir.checkpoints,
        export_dir=None,
        config_hash=resume_hash(config),
        published=None if export_base is None else _published_under(export_base, settings),
        trainjob=outcome.name,
    )


def _published_under(base: str, settings: S3Settings | None) -> PublishedExport:
    """The export a TrainJob published under ``base`` (one ``model-*`` prefix with a manifest)."""
    store = open_store(base, settings)
    prefixes = sorted({i.key.split("/")[0] for i in store.list() if i.key.endswith("/" + MANIFEST_NAME)})
    if not prefixes:
        raise G2RPOError(
            f"the TrainJob completed but published no export under {base}: check its node-0 log for the publish step"
        )
    uri = f"{base}/{prefixes[-1]}"
    return PublishedExport(uri=uri, manifest=read_manifest(open_store(uri, settings)))


def publish_export(
    export_dir: str | Path,
    uri_base: str,
    config_hash: str,
    *,
    producer: str = "g2rpo train",
    settings: S3Settings | None = None,
) -> PublishedExport:
    """Publish a trainer's export folder under a fresh prefix ``uri_base/model-<...>``.

    The export carries the trainer's local manifest (same format); :func:`publish_dir` writes the
    artifact's own, last, so the local one is left out of the upload and its metadata carried over.
    """
    uri = f"{uri_base.rstrip('/')}/{unique_prefix('model')}"
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "export"
        shutil.copytree(export_dir, staging, ignore=shutil.ignore_patterns("manifest.json"))
        manifest = publish_dir(
            staging,
            uri,
            producer=producer,
            config_hash=config_hash,
            metadata=manifest_metadata(export_dir),
            settings=settings,
        )
    return PublishedExport(uri=uri, manifest=manifest)


def matching_evaluation(
    config: RunConfig, prompts: str, *, num_prompts: int | None = None, seeds: list[int] | tuple[int, ...] = (0, 1, 2)
) -> EvaluationConfig:
    """The evaluation that samples as the run ``config`` does: its σ grid (``algorithm``: T, grid,
    shift, timestep truncation), image size and guidance (``model``), T5 length (``data``), rewards,
    device, and the dtype of its precision; on ``prompts`` (first ``num_prompts``) × ``seeds``."""
    algo = config.algorithm
    return EvaluationConfig(
        prompts=prompts,
        num_prompts=num_prompts,
        seeds=list(seeds),
        num_steps=algo.num_steps,
        grid=algo.grid,
        shift=algo.shift,
        truncate_timestep=algo.truncate_timestep,
        height=config.model.height,
        width=config.model.width,
        guidance=config.model.guidance,
        max_sequence_length=config.data.max_sequence_length,
        rewards=config.rewards,
        trained_metrics=[spec.name for spec in config.rewards.models if spec.weight != 0],
        dtype="bfloat16" if config.train.precision == "bf16" else "float32",
        device=config.train.device,
    )
