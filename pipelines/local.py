"""The whole alignment pipeline on this machine through ``kfp.local`` (what ``make demo`` runs).

:func:`run_local` runs the compiled DAG's tasks as subprocesses of this interpreter
(``SubprocessRunner(use_venv=False)``: kfp.local ignores the images and drops the cluster placement)
with the tiny settings of :func:`local_arguments`: the tiny random-weight Flux (made on first use),
``configs/tiny-cpu.yaml`` and ``configs/tiny-gates.yaml``. The run folder holds the KFP pipeline root
(every task's outputs) and the tasks' temp files; the store (exports, evaluations), the registry and
the tiny model are shared by every local run, so a second run evaluates its challenger against the
first run's champion.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp import local

from g2rpo.errors import G2RPOError, problem
from pipelines.alignment import build_pipeline
from pipelines.placement import load_profile

__all__ = ["LocalRun", "local_arguments", "run_local"]

CHECKOUT = Path(__file__).resolve().parents[1]
COMPLETE_MARKER = ".complete"  # written into the pipeline root when the run has finished


@dataclass(frozen=True)
class LocalRun:
    """Where a local run left its outputs, and what the registry says now."""

    run_dir: Path
    pipeline_root: Path
    state: str  # the final status the exit task recorded
    outputs: dict[str, Path]  # name -> file or folder under the pipeline root
    decision: dict[str, Any]  # the decide task's record
    champion: int | None


def local_arguments(shared: Path, iterations: int) -> dict[str, Any]:
    """The pipeline's parameters for the tiny CPU run; ``shared`` holds the model, store and registry."""
    return {
        "config_uri": str(CHECKOUT / "configs" / "tiny-cpu.yaml"),
        "base_model_uri": str(shared / "tiny-flux"),
        "prompts_uri": str(CHECKOUT / "configs" / "tiny-prompts.txt"),
        "store_uri": (shared / "store").as_uri(),
        "registry_uri": (shared / "registry").as_uri(),
        "model_name": "g2rpo-tiny",
        "rewards": [{"name": "jpeg_compressibility", "weight": 1.0}],
        "num_steps": 4,
        "group_size": 4,
        "granularities": [1, 2],
        "iterations": iterations,
        "learning_rate": 1e-2,
        "overrides": ["train.prompts_per_iteration=4", "train.checkpoint_every=10", "train.progress=false"],
        "test_size": 4,
        "eval_seeds": [0, 1, 2],
        "gates_uri": str(CHECKOUT / "configs" / "tiny-gates.yaml"),
        "gpus_per_node": 1,
    }


def run_local(
    run_dir: Path,
    shared: Path,
    *,
    iterations: int = 30,
    parameters: dict[str, Any] | None = None,
) -> LocalRun:
    """Run the pipeline into ``run_dir`` (its pipeline root must not exist yet) with :func:`local_arguments`
    updated by ``parameters``."""
    run_dir, shared = run_dir.resolve(), shared.resolve()
    root = run_dir / "pipeline-root"
    if root.exists():
        finished = (root / COMPLETE_MARKER).is_file()
        raise G2RPOError(
            problem(
                "run folder",
                str(run_dir),
                "holds a finished run; choose another --name"
                if finished
                else "holds a partial pipeline root left by an interrupted run (nothing registered was lost); "
                f"delete {root} or choose another --name",
            )
        )
    tmp = run_dir / "tmp"
    tmp.mkdir(parents=True)
    shared.mkdir(parents=True, exist_ok=True)
    arguments = {**local_arguments(shared, iterations), **(parameters or {})}
    # Each task leaves a temp file behind, and the train task its checkpoints: keep them in the run folder.
    previous_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp)
    try:
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root), raise_on_error=False)
        pipeline = build_pipeline(load_profile())
        pipeline(**arguments)
    finally:
        if previous_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous_tmp
    (root / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return _collect(run_dir, root, arguments)


def _collect(run_dir: Path, root: Path, arguments: dict[str, Any]) -> LocalRun:
    """Find each task's outputs under the pipeline root (``<root>/<run>/<task>/<output>``)."""
    outputs: dict[str, Path] = {}
    for path in sorted(root.glob("*/*/*")):
        if path.name != "executor_output.json":
            outputs[f"{path.parent.name}/{path.name}"] = path
    status = outputs.get("report-status/record")
    state = json.loads(status.read_text())["state"] if status is not None and status.is_file() else "UNKNOWN"
    decision_file = root.glob("*/decide/decision/record.json")
    decision = next((json.loads(p.read_text()) for p in decision_file), {})
    state_file = (
        Path(arguments["registry_uri"].removeprefix("file://")) / "models" / arguments["model_name"] / "state.json"
    )
    champion = json.loads(state_file.read_text())["aliases"].get("champion") if state_file.is_file() else None
    return LocalRun(
        run_dir=run_dir, pipeline_root=root, state=state, outputs=outputs, decision=decision, champion=champion
    )
