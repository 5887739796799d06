"""The pipeline's training choices, one table: what a retraining run may change, and how each becomes a run-config key.

:data:`TRAIN_PARAMETERS` (name, KFP type, pipeline default, run-config key, help, what its "unset" value
means) is the one home of these rules: the pipeline's signature and defaults (``pipelines/alignment.py``),
the train task's run config (:func:`g2rpo.steps.train_task.run_config_for`) and the checks before a run
is sent (``pipelines/check.py``) read it, and a test holds the train component's signature (KFP ships
it as source, so it is written out) to it. This module imports no torch, so that compiling or checking
the pipeline does not load the trainer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["BY_NAME", "PARAMETER_KEYS", "TRAIN_PARAMETERS", "TrainParameter", "train_parameter_defaults"]


@dataclass(frozen=True)
class TrainParameter:
    """One training choice of the pipeline: a run parameter that the train task turns into a run-config key.

    A KFP parameter has no null, so ``unset`` says what its 0 (or ``{}``) means: ``"file"`` the base
    config file's setting, ``"strategy"`` the strategy section's own value; None: 0 is a value like any.
    """

    name: str  # the pipeline's and the train component's parameter
    type: type  # its KFP type: str, int, float, list or dict (STRING, NUMBER_INTEGER, NUMBER_DOUBLE, LIST, STRUCT)
    default: Any  # the pipeline's default (FLUX.1-dev with the paper's settings, configs/flux-dev-h200.yaml)
    key: str  # the run-config key it sets
    help: str
    unset: Literal["file", "strategy"] | None = None
    when_set: tuple[str, ...] = ()  # further key=value overrides when it is set (not unset)

    def is_unset(self, value: Any) -> bool:
        if self.unset == "strategy":
            return value == 0
        return self.unset == "file" and value in (0, {})


# What a retraining run changes, in the pipeline's parameter order. A new knob is a row here and the
# parameter in components/train.py's signature (tests/pipeline/test_pipeline_parameters.py holds them
# together), then the recompiled pipeline YAML. The help names no strategy or value that a registry holds:
# a list written here would fall behind the registry.
TRAIN_PARAMETERS: tuple[TrainParameter, ...] = (
    TrainParameter(
        "strategy",
        str,
        "g2rpo",
        "algorithm.strategy",
        "a credit-assignment strategy or preset of g2rpo.strategies (`g2rpo config describe`: algorithm.strategy)",
    ),
    TrainParameter("num_steps", int, 16, "algorithm.num_steps", "T, the sampler's steps"),
    TrainParameter("group_size", int, 12, "algorithm.group_size", "G, images per prompt"),
    TrainParameter("granularities", list, [1, 2, 3], "algorithm.g2rpo.granularities", "Λ, a G²RPO setting"),
    TrainParameter(
        "rewards",
        list,
        [
            {"name": "hps_v21", "weight": 1.0, "weights": "s3://g2rpo/models/rewards/HPS_v2.1_compressed.pt"},
            {"name": "clip", "weight": 1.0, "weights": "s3://g2rpo/models/rewards/DFN5B-CLIP-ViT-H-14"},
        ],
        "rewards.models",
        "[{name, weight, weights, ...}, ...]",
    ),
    TrainParameter("iterations", int, 300, "train.iterations", "training iterations"),
    TrainParameter(
        "learning_rate",
        float,
        0.0,
        "train.learning_rate",
        "0: the strategy's own, algorithm.<strategy>.learning_rate (`g2rpo config describe`)",
        unset="strategy",
    ),
    # Validation during training (g2rpo.training.validation); 0 / {} keeps the config file's setting.
    TrainParameter(
        "validation_every",
        int,
        0,
        "train.validation.every",
        "> 0: validate every N iterations (turns validation on) and export the best validated checkpoint",
        unset="file",
        when_set=("train.validation.enabled=true",),
    ),
    TrainParameter("validation_num_prompts", int, 0, "train.validation.num_prompts", "prompts validated", unset="file"),
    TrainParameter(
        "validation_max_regression",
        dict,
        {},
        "train.validation.max_regression",
        "out-of-domain metric -> allowed drop (as the gates' max_regression)",
        unset="file",
    ),
    TrainParameter(
        "validation_stop_after_breaches",
        int,
        0,
        "train.validation.stop_after_breaches",
        "early stop after this many breaching validations in a row",
        unset="file",
    ),
    TrainParameter(
        "validation_patience",
        int,
        0,
        "train.validation.patience",
        "early stop when the objective has not improved for this many validations",
        unset="file",
    ),
)
# The pipeline parameters that set a run-config key, read off the table.
PARAMETER_KEYS = {p.name: p.key for p in TRAIN_PARAMETERS}
BY_NAME = {p.name: p for p in TRAIN_PARAMETERS}


def train_parameter_defaults() -> dict[str, Any]:
    """The pipeline's default of each training choice (fresh copies: a caller may change them)."""
    return {p.name: copy.deepcopy(p.default) for p in TRAIN_PARAMETERS}
