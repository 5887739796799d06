"""Step **train**: a validated run config in, the trained export (optionally published as an artifact) out.

:func:`train` runs the whole job (:func:`g2rpo.training.trainer.train_from_config`: resume, iterations,
checkpoints, export; rank 0 serves Prometheus ``/metrics`` when ``observability.metrics_port``
is set, :func:`training_exporter`) and, with ``publish_uri``, publishes the export folder under a fresh prefix of
that URI (:func:`publish_export`). Under torchrun every rank calls :func:`train`; rank 0 publishes.

:func:`~g2rpo.training.metrics.read_iteration_records` (re-exported here) reads ``metrics.jsonl`` back.
:func:`matching_evaluation` is the evaluation config that samples as a run does (for before/after
comparisons on the run's own sampler).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g2rpo.artifacts.manifest import Manifest, publish_dir, unique_prefix
from g2rpo.artifacts.storage import S3Settings
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.observability import TrainingExporter
from g2rpo.training.checkpoint import manifest_metadata
from g2rpo.training.metrics import read_iteration_records
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.trainer import train_from_config

__all__ = [
    "PublishedExport",
    "TrainResult",
    "matching_evaluation",
    "publish_export",
    "read_iteration_records",
    "train",
    "training_exporter",
]


@dataclass(frozen=True)
class PublishedExport:
    """An export folder published as an immutable artifact."""

    uri: str
    manifest: Manifest


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` produced. ``summary`` is the trainer's (iterations, first/last reward, backend, ...)."""

    summary: dict[str, Any]
    output_dir: Path
    metrics_path: Path
    checkpoints_dir: Path
    export_dir: Path | None  # None when output.export is false
    config_hash: str  # the resume hash (model, algorithm, data sections)
    published: PublishedExport | None  # with publish_uri, on rank 0

    @property
    def export_uri(self) -> str | None:
        return None if self.published is None else self.published.uri


def train(
    config: RunConfig,
    *,
    publish_uri: str | None = None,
    settings: S3Settings | None = None,
    producer: str = "g2rpo train",
) -> TrainResult:
    """Train from ``config``; with ``publish_uri`` (a folder, ``file://`` or ``s3://`` base) publish the export
    under a fresh prefix of it and return its URI and manifest."""
    if publish_uri is not None and not config.output.export:
        raise G2RPOError(problem("output.export", False, "publishing needs the export: set output.export=true"))
    exporter = training_exporter(config) if int(os.environ.get("RANK", "0")) == 0 else None
    try:
        summary = train_from_config(config, [exporter] if exporter is not None else [])
    finally:
        if exporter is not None:
            exporter.close()
    config_hash = resume_hash(config)
    export_dir = None if summary["export"] is None else Path(summary["export"])
    published = None
    if publish_uri is not None and export_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        published = publish_export(export_dir, publish_uri, config_hash, producer=producer, settings=settings)
    out = Path(summary["output_dir"])
    return TrainResult(
        summary=summary,
        output_dir=out,
        metrics_path=out / "metrics.jsonl",
        checkpoints_dir=out / "checkpoints",
        export_dir=export_dir,
        config_hash=config_hash,
        published=published,
    )


def training_exporter(config: RunConfig) -> TrainingExporter | None:
    """The /metrics exporter of ``config.observability`` (None when ``metrics_port`` is null)."""
    obs = config.observability
    if obs.metrics_port is None:
        return None
    return TrainingExporter(
        obs.metrics_port,
        address=obs.metrics_address,
        run_id=obs.run_id or Path(config.output.dir).name,
        pipeline=obs.pipeline,
        strategy=config.algorithm.strategy,
        model=config.model.base_model_name,
        target_iterations=config.train.iterations,
        # G²RPO's reward columns are its strides Λ; other strategies have one column (labelled 1)
        strides=config.algorithm.g2rpo.granularities if config.algorithm.strategy == "g2rpo" else None,
        linger_seconds=obs.linger_seconds,
    )


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
        dtype="bfloat16" if config.train.precision == "bf16" else "float32",
        device=config.train.device,
    )
