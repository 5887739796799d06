"""Step **train**, as the pipeline's train task runs it: pipeline choices in, a published export and its record out.

:func:`run_config_for` turns the pipeline's parameters into a validated :class:`RunConfig`: the base
config file, then the choices a retraining run changes, then any further ``key=value`` overrides, then
where this task reads and writes, each merged over the last as values. The choices are one table,
:data:`g2rpo.steps.parameters.TRAIN_PARAMETERS` (name, type, pipeline default, the run-config field it
sets, what its "unset" value means), applied by :func:`g2rpo.steps.parameters.choice_tree`.
:func:`train_task` trains on one node — in this process for one device, under ``torchrun
--nproc_per_node`` for several — publishes the export under the run's store and writes a
:class:`~g2rpo.steps.records.TrainRecord` with the resolved config beside it.

With ``checkpoint_uri`` (:func:`checkpoint_uri_for`: the run's store, the KFP run id and the task name)
every complete checkpoint is mirrored to S3, and a task started again with the same run identity (a
retry after a lost pod, a re-run of the same run) resumes from the newest complete one there.

With ``nodes > 1`` the task trains nothing itself: :func:`g2rpo.steps.train.train_and_publish` launches (or, on a
retry, follows) the run's Kubeflow Trainer ``TrainJob`` (:func:`trainjob_for`: the trainer image, the run
and task, the placement), which trains, mirrors and publishes; the record is read from what it published.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

import g2rpo
from g2rpo.artifacts.storage import ObjectNotFound, open_store
from g2rpo.config import deep_merge, load_config, parse_overrides, to_yaml
from g2rpo.errors import G2RPOError, problem
from g2rpo.launch.quantity import quantity_problem
from g2rpo.launch.trainjob import DEFAULT_DEADLINE_S, Placement, TrainJobLaunch
from g2rpo.steps.parameters import choice_tree, train_choices
from g2rpo.steps.records import TrainRecord, write_record
from g2rpo.steps.train import publish_export, train_and_publish
from g2rpo.textfile import JSON_MAX_BYTES, decode_record
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.run_dir import RunDir
from g2rpo.training.trainer import RunSummary
from g2rpo.training.validation import ValidationSummary

__all__ = [
    "RUN_CONFIG_FILE",
    "checkpoint_uri_for",
    "resolve_config_path",
    "run_config_for",
    "train_config",
    "train_task",
    "trainjob_for",
]


RUN_CONFIG_FILE = "run-config.yaml"
METRICS_FILE = "metrics.jsonl"  # the trainer's iteration records, copied beside the record
PRODUCER = f"g2rpo pipeline train {g2rpo.__version__}"


def resolve_config_path(config_uri: str) -> Path:
    """A base config file: a path as given, else relative to the g2rpo checkout (``configs/...`` in the image)."""
    path = Path(config_uri.removeprefix("file://"))
    if path.is_file():
        return path
    checkout = Path(g2rpo.__file__).resolve().parents[1] / path
    if not path.is_absolute() and checkout.is_file():
        return checkout
    raise G2RPOError(problem("config_uri", config_uri, "no such config file; e.g. configs/flux-dev-h200.yaml"))


def run_config_for(
    config_uri: str,
    choices: dict[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    base_model_uri: str,
    prompts: str,
    output_dir: str | Path,
) -> RunConfig:
    """The run config: ``config_uri``, then ``choices`` (training choices by name, :func:`choice_tree`), then
    ``overrides`` (``key=value`` text), then the model, prompts and output folder of this task, each merged
    over the last as values. Every problem is reported at once."""
    where = {"model": {"path": base_model_uri}, "data": {"prompts": str(prompts)}, "output": {"dir": str(output_dir)}}
    tree = deep_merge(deep_merge(choice_tree(choices), parse_overrides(overrides)), where)
    return load_config(RunConfig, resolve_config_path(config_uri), tree)


def train_config(values: Mapping[str, Any], *, prompts: str, output_dir: str | Path) -> RunConfig:
    """The run config the train task builds from a run's ``values`` (the pipeline's parameters by name:
    ``config_uri``, the training choices, ``overrides``, ``base_model_uri``), with ``prompts`` and
    ``output_dir`` for this task's files (:func:`run_config_for`)."""
    return run_config_for(
        values["config_uri"],
        train_choices(values),
        values["overrides"],
        base_model_uri=values["base_model_uri"],
        prompts=prompts,
        output_dir=output_dir,
    )


def checkpoint_uri_for(store_uri: str, run_id: str, task: str, checkpoint_store_uri: str = "") -> str:
    """Where one run's train task mirrors its checkpoints: ``<base>/<run id>/<task>``, the base being
    ``checkpoint_store_uri`` or, when that is empty, ``<store_uri>/checkpoints``. Every retry of the task,
    and every re-run with the same run id, finds the same checkpoints there."""
    if not run_id or "/" in run_id:
        raise G2RPOError(problem("run_id", run_id, "give the KFP run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER)"))
    if not task or "/" in task:
        raise G2RPOError(problem("task", task, "give the pipeline task's name (one path segment)"))
    base = (checkpoint_store_uri or f"{store_uri.rstrip('/')}/checkpoints").rstrip("/")
    return f"{base}/{run_id}/{task}"


def trainjob_for(
    *,
    image: str,
    run_id: str,
    task: str,
    gpus_per_node: int,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    shm_size: str | None = None,
    s3_secret: str | None = None,
    s3_secret_keys: dict[str, str] | None = None,
    service_account: str | None = None,
    deadline_s: int = DEFAULT_DEADLINE_S,
) -> TrainJobLaunch:
    """The TrainJob of the pipeline's train task: the trainer image, named after the KFP run and task, on
    the task's own placement (the Secret by name only). Shapes KFP passes through are checked here."""
    problems = []
    if not isinstance(node_selector or {}, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in (node_selector or {}).items()
    ):
        problems.append(problem("node_selector", node_selector, "give a mapping of label to value"))
    if not isinstance(tolerations or [], list) or not all(isinstance(t, dict) for t in tolerations or []):
        problems.append(problem("tolerations", tolerations, "give a list of Kubernetes tolerations (mappings)"))
    if shm_size and (shm_problem := quantity_problem("shm_size", shm_size, "memory")):
        problems.append(shm_problem)
    if problems:
        raise G2RPOError("cannot build the TrainJob:\n  - " + "\n  - ".join(problems))
    placement = Placement(
        gpus_per_node=gpus_per_node,
        node_selector=dict(node_selector or {}),
        tolerations=list(tolerations or []),
        shm_size=shm_size or None,
        service_account=service_account or None,
    )
    launch = TrainJobLaunch(
        image=image,
        run_id=run_id,
        task=task,
        placement=placement,
        s3_secret=s3_secret or None,
        active_deadline_s=deadline_s,
    )
    return launch if s3_secret_keys is None else replace(launch, s3_secret_keys=dict(s3_secret_keys))


def train_task(
    config_uri: str,
    choices: dict[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    prompts: str,
    base_model_uri: str,
    publish_uri: str,
    record_dir: str | Path,
    nodes: int = 1,
    gpus_per_node: int = 1,
    work_dir: str | Path | None = None,
    checkpoint_uri: str | None = None,
    trainjob: TrainJobLaunch | None = None,
    prompts_uri: str | None = None,
) -> TrainRecord:
    """Train on ``prompts`` from ``base_model_uri``; publish the export under ``publish_uri``; write the
    record (and the resolved run config) into ``record_dir``. ``work_dir`` (default a fresh folder under the temp
    dir: the pod's scratch disk) holds checkpoints and metrics, too large for the task's output artifact.

    ``checkpoint_uri``: mirror checkpoints there and resume from it (:func:`checkpoint_uri_for`).
    ``trainjob``: how to launch when ``nodes > 1`` (:func:`trainjob_for`); it needs ``checkpoint_uri``.
    ``prompts_uri``: where the TrainJob's pods read the prompts when ``nodes > 1`` (the data artifact's ``s3://``
    URI: ``prompts`` is this pod's local copy, which no other pod has).
    """
    work_dir = Path(tempfile.mkdtemp(prefix="g2rpo-train-")) if work_dir is None else Path(work_dir)
    if nodes < 1 or gpus_per_node < 1:
        raise G2RPOError(problem("nodes/gpus_per_node", (nodes, gpus_per_node), "both must be at least 1"))
    if nodes > 1 and not str(prompts_uri or "").startswith("s3://"):
        raise G2RPOError(
            problem(
                "prompts_uri",
                prompts_uri,
                f"with nodes={nodes} the TrainJob's pods read the prompts, not this pod: give the prompts' s3:// URI "
                "(the pipeline passes its data artifact's)",
            )
        )
    config = run_config_for(
        config_uri,
        choices,
        overrides,
        base_model_uri=base_model_uri,
        prompts=prompts if nodes == 1 else str(prompts_uri),
        output_dir=work_dir,
    )
    if not config.output.export:
        raise G2RPOError(problem("output.export", False, "the pipeline publishes the export: leave it true"))
    record_dir = Path(record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    (record_dir / RUN_CONFIG_FILE).write_text(to_yaml(config), encoding="utf-8")
    config_hash = resume_hash(config)
    # The first line of the task's log, before the seconds of loading (the trainer's records follow).
    print(
        f"training {config.algorithm.strategy} for {config.train.iterations} iteration(s) from {base_model_uri}: "
        f"loading the model, {len(config.rewards.models)} reward model(s) and the prompts"
        + (", then validating iteration 0" if config.train.validation.enabled else ""),
        flush=True,
    )
    if nodes > 1:
        if trainjob is not None and trainjob.placement.gpus_per_node != gpus_per_node:
            trainjob = replace(trainjob, placement=replace(trainjob.placement, gpus_per_node=gpus_per_node))
        result = train_and_publish(
            config,
            publish_uri=publish_uri,
            producer=PRODUCER,
            checkpoint_uri=checkpoint_uri,
            nodes=nodes,
            trainjob=trainjob,
        )
        export_uri = result.export_uri
        published = result.published.manifest.metadata if result.published is not None else {}
        summary = None  # the TrainJob's stays in its pods: the export's metadata says how far it trained
        iterations = int(published.get("iterations", 0))
        base_model = _published_base_model(export_uri)
    else:
        if gpus_per_node > 1:
            summary = _torchrun(record_dir / RUN_CONFIG_FILE, Path(work_dir), gpus_per_node, checkpoint_uri)
            export_uri = publish_export(summary.export, publish_uri, config_hash, producer=PRODUCER).uri
        else:
            result = train_and_publish(
                config, publish_uri=publish_uri, producer=PRODUCER, checkpoint_uri=checkpoint_uri
            )
            summary, export_uri = result.summary, result.export_uri
        iterations = summary.iterations
        # Read as is: this task's trainer (in this process, or the torchrun it just ran) wrote it.
        base_model = json.loads((Path(summary.export) / "base_model.json").read_text(encoding="utf-8"))
    record = TrainRecord(
        export_uri=export_uri,
        base_model_uri=base_model_uri,
        base_model_name=config.model.base_model_name,
        licence=str(base_model["license"]["name"]),
        config_hash=config_hash,
        run_config=RUN_CONFIG_FILE,
        iterations=iterations,
        first_reward=None if summary is None else summary.first_reward,
        last_reward=None if summary is None else summary.last_reward,
        **_validation_fields(None if summary is None else summary.validation, base_model),
    )
    write_record(record, record_dir)
    # The iteration records, for the decision report's reward curves (a multi-node run keeps its own).
    metrics = RunDir.of(config).metrics
    if metrics.is_file():
        shutil.copyfile(metrics, record_dir / METRICS_FILE)
    return record


class _Licence(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    name: str | None


class ExportInfo(BaseModel):
    """An export's ``base_model.json`` (g2rpo.training.checkpoint.export_model), the keys the record takes
    from it; the others pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    license: _Licence
    selected_iteration: int | None = None
    selection_reason: str | None = None


def _published_base_model(export_uri: str) -> dict[str, Any]:
    """``base_model.json`` of the export a TrainJob published at ``export_uri`` (its pods wrote it, not
    this task): an object naming the base model's licence, else a G2RPOError naming it and the fix."""
    store = open_store(export_uri)
    where = store.uri_for("base_model.json")
    fix = "the TrainJob published the export without a sound one: run the pipeline again to train and publish anew"
    try:
        data = store.get_bytes("base_model.json", max_bytes=JSON_MAX_BYTES)[0]
    except ObjectNotFound:
        raise G2RPOError(f"{where} does not exist: {fix}") from None
    return decode_record(ExportInfo, data, where, fix=fix).model_dump()


def _validation_fields(validation: ValidationSummary | None, base_model: dict[str, Any]) -> dict[str, Any]:
    """The record's validation fields: from the run's summary, or (a TrainJob's run, whose summary
    stays in its pods) the chosen iteration the export's base_model.json names."""
    if validation is None:
        selected = base_model.get("selected_iteration")
        if selected is None or base_model.get("selection_reason") in (None, "the last iteration"):
            return {}
        return {"selected_iteration": selected, "selection_reason": base_model["selection_reason"]}
    return {
        "selected_iteration": validation.selected_iteration if validation.exported_best else None,
        "selection_reason": validation.selection_reason if validation.exported_best else None,
        "early_stop": validation.early_stop,
        "validation_curve": [asdict(point) for point in validation.curve],
    }


def _torchrun(config_file: Path, work_dir: Path, gpus: int, checkpoint_uri: str | None) -> RunSummary:
    """``torchrun --standalone --nproc_per_node gpus -m g2rpo train [--checkpoint-uri URI]``; the run's summary."""
    work_dir.mkdir(parents=True, exist_ok=True)
    summary_file = work_dir / "summary.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    command += ["-m", "g2rpo", "train", "--config", str(config_file), "--summary-json", str(summary_file)]
    if checkpoint_uri is not None:
        command += ["--checkpoint-uri", checkpoint_uri]
    done = subprocess.run(command, env=os.environ.copy(), check=False)
    if done.returncode != 0:
        raise G2RPOError(f"torchrun with {gpus} processes exited with status {done.returncode}; see the task log")
    # As is: the run that just ended (exit status 0) wrote it with RunSummary.to_json.
    return RunSummary.from_json(json.loads(summary_file.read_text(encoding="utf-8")))
