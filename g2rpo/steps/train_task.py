"""Step **train**, as the pipeline's train task runs it: pipeline choices in, a published export and its record out.

:func:`run_config_for` turns the pipeline's parameters into a validated :class:`RunConfig`: the base
config file, then the choices a retraining run changes (:data:`PARAMETER_KEYS`, one table), then any
further ``key=value`` overrides, then where this task reads and writes. :func:`train_task` trains on
one node — in this process for one device, under ``torchrun --nproc_per_node`` for several — publishes
the export under the run's store and writes a :class:`~g2rpo.steps.records.TrainRecord` with the
resolved config beside it.

More than one node is the Kubeflow Trainer ``TrainJob`` launcher's (:func:`launch_multi_node`, the seam
where it plugs in).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import g2rpo
from g2rpo.config import load_config, parse_overrides, to_yaml
from g2rpo.errors import G2RPOError, problem
from g2rpo.steps.records import TrainRecord, write_record
from g2rpo.steps.train import publish_export, train
from g2rpo.training.run_config import RunConfig, resume_hash

__all__ = [
    "PARAMETER_KEYS",
    "RUN_CONFIG_FILE",
    "launch_multi_node",
    "resolve_config_path",
    "run_config_for",
    "train_task",
]

# The pipeline parameters that set a run-config key: what a retraining run changes.
PARAMETER_KEYS = {
    "strategy": "algorithm.strategy",
    "num_steps": "algorithm.num_steps",  # T
    "group_size": "algorithm.group_size",  # G
    "granularities": "algorithm.g2rpo.granularities",  # Λ (a G²RPO setting)
    "rewards": "rewards.models",  # [{name, weight, ...}, ...]
    "iterations": "train.iterations",
    "learning_rate": "train.learning_rate",
}
RUN_CONFIG_FILE = "run-config.yaml"
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
    """The run config: ``config_uri``, then ``choices`` (keys of :data:`PARAMETER_KEYS`), then ``overrides``,
    then the model, prompts and output folder of this task. Every problem is reported at once."""
    unknown = sorted(set(choices) - set(PARAMETER_KEYS))
    if unknown:
        raise G2RPOError(problem("choices", unknown, f"unknown; valid: {', '.join(PARAMETER_KEYS)}"))
    items = [f"{PARAMETER_KEYS[name]}={json.dumps(value)}" for name, value in choices.items()]
    items += list(overrides)
    items += [
        f"model.path={json.dumps(base_model_uri)}",
        f"data.prompts={json.dumps(str(prompts))}",
        f"output.dir={json.dumps(str(output_dir))}",
    ]
    return load_config(RunConfig, resolve_config_path(config_uri), parse_overrides(items))


def launch_multi_node(config: RunConfig, nodes: int, gpus_per_node: int) -> dict[str, Any]:
    """Train across ``nodes`` nodes: the Kubeflow Trainer ``TrainJob`` launcher's place (not built yet)."""
    raise G2RPOError(
        problem(
            "nodes",
            nodes,
            "multi-node needs the TrainJob launcher (Kubeflow Trainer), which is not part of this build; "
            f"train on one node: nodes=1 with up to {gpus_per_node} GPUs",
        )
    )


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
) -> TrainRecord:
    """Train on ``prompts`` from ``base_model_uri``; publish the export under ``publish_uri``; write the
    record (and the resolved run config) into ``record_dir``. ``work_dir`` (default a fresh folder under the temp
    dir: the pod's scratch disk) holds checkpoints and metrics, too large for the task's output artifact."""
    work_dir = Path(tempfile.mkdtemp(prefix="g2rpo-train-")) if work_dir is None else Path(work_dir)
    if nodes < 1 or gpus_per_node < 1:
        raise G2RPOError(problem("nodes/gpus_per_node", (nodes, gpus_per_node), "both must be at least 1"))
    config = run_config_for(
        config_uri, choices, overrides, base_model_uri=base_model_uri, prompts=prompts, output_dir=work_dir
    )
    if not config.output.export:
        raise G2RPOError(problem("output.export", False, "the pipeline publishes the export: leave it true"))
    record_dir = Path(record_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    (record_dir / RUN_CONFIG_FILE).write_text(to_yaml(config), encoding="utf-8")
    config_hash = resume_hash(config)
    if nodes > 1:
        summary = launch_multi_node(config, nodes, gpus_per_node)
        export_uri = publish_export(summary["export"], publish_uri, config_hash, producer=PRODUCER).uri
    elif gpus_per_node > 1:
        summary = _torchrun(record_dir / RUN_CONFIG_FILE, Path(work_dir), gpus_per_node)
        export_uri = publish_export(summary["export"], publish_uri, config_hash, producer=PRODUCER).uri
    else:
        result = train(config, publish_uri=publish_uri, producer=PRODUCER)
        summary, export_uri = result.summary, result.export_uri
    base_model = json.loads((Path(summary["export"]) / "base_model.json").read_text(encoding="utf-8"))
    record = TrainRecord(
        export_uri=export_uri,
        base_model_uri=base_model_uri,
        base_model_name=config.model.base_model_name,
        licence=str(base_model["license"]["name"]),
        config_hash=config_hash,
        run_config=RUN_CONFIG_FILE,
        iterations=int(summary["iterations"]),
        first_reward=summary.get("first_reward"),
        last_reward=summary.get("last_reward"),
    )
    write_record(record, record_dir)
    return record


def _torchrun(config_file: Path, work_dir: Path, gpus: int) -> dict[str, Any]:
    """``torchrun --standalone --nproc_per_node gpus -m g2rpo train``; the run's summary."""
    work_dir.mkdir(parents=True, exist_ok=True)
    summary_file = work_dir / "summary.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    command += ["-m", "g2rpo", "train", "--config", str(config_file), "--summary-json", str(summary_file)]
    done = subprocess.run(command, env=os.environ.copy(), check=False)
    if done.returncode != 0:
        raise G2RPOError(f"torchrun with {gpus} processes exited with status {done.returncode}; see the task log")
    return json.loads(summary_file.read_text(encoding="utf-8"))
