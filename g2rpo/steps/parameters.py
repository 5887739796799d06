"""A pipeline run's parameters, one typed home: what each one is, its default, and the run-config field it sets.

:data:`TRAIN_PARAMETERS` holds the training choices a retraining run may change (name, KFP type, pipeline
default, the run-config field it sets, help, what its "unset" value means); :data:`RUN_PARAMETERS` the run's
other parameters (where it reads and writes, the split, the evaluation, the gates, the node count). The
profile's placement parameters (GPUs per node, node selector, tolerations, the train pod's size) take their
defaults from the placement profile, :mod:`g2rpo.steps.placement`.

Everything that reads a parameter reads it here, at call time: the pipeline's signature, defaults and
input descriptions (``pipelines/alignment.py``), the train component's choices (:func:`train_choices`), the
train task's run config (:func:`choice_tree`, applied as values to the config's sections, no text in
between), and the checks before a run is sent (:mod:`g2rpo.steps.check`, which names the parameter behind
each run-config problem with :func:`source_of`). A new training choice is a row here and its parameter in
``components/train.py``'s signature (KFP ships that function as source, so it is written out);
``tests/pipeline/test_pipeline_parameters.py`` adds one and follows it end to end. This module imports no
torch, so that compiling or checking the pipeline does not load the trainer.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from g2rpo.errors import G2RPOError, did_you_mean, problem

__all__ = [
    "RUN_PARAMETERS",
    "TRAIN_PARAMETERS",
    "RunParameter",
    "TrainParameter",
    "choice_tree",
    "describe_parameters",
    "parameter_help",
    "pipeline_defaults",
    "source_of",
    "train_choices",
    "train_parameter_defaults",
]


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
    when_set: tuple[tuple[str, Any], ...] = ()  # further (run-config field, value) pairs when it is set

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    def is_unset(self, value: Any) -> bool:
        if self.unset == "strategy":
            return value == 0
        return self.unset == "file" and value in (0, {})


# What a retraining run changes, in the pipeline's parameter order. A new knob is a row here and the
# parameter in components/train.py's signature (tests/pipeline/test_pipeline_parameters.py adds one and
# follows it end to end), then the recompiled pipeline YAML (`g2rpo pipeline compile`). The help (the
# pipeline's input description in the KFP UI) names no strategy or value that a registry holds: a list
# written here would fall behind the registry.
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
    TrainParameter("granularities", list, [1, 2, 3], "algorithm.g2rpo.granularities", "Lambda, the G2RPO strides"),
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
        when_set=(("train.validation.enabled", True),),
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


@dataclass(frozen=True)
class RunParameter:
    """One of the run's other parameters: read by a task (or the pipeline's wiring), not a run-config field."""

    name: str
    type: type  # its KFP type, as TrainParameter.type
    default: Any  # the pipeline's default
    help: str


# The run's other parameters with a pipeline default, in the pipeline's order around the training choices
# (which come after model_name). The defaults: FLUX.1-dev with the paper's settings, on S3.
RUN_PARAMETERS: tuple[RunParameter, ...] = (
    RunParameter(
        "config_uri",
        str,
        "configs/flux-dev-h200.yaml",
        "the base run config (a path in the image); the training choices, then overrides, go over it",
    ),
    RunParameter("base_model_uri", str, "s3://g2rpo/models/FLUX.1-dev", "the base model: a diffusers folder"),
    RunParameter("prompts_uri", str, "s3://g2rpo/prompts/hpdv2-train.txt", "the prompt file (txt or JSONL)"),
    RunParameter("store_uri", str, "s3://g2rpo/artifacts", "where exports and evaluations are stored"),
    RunParameter("registry_uri", str, "s3://g2rpo/registry", "the model registry"),
    RunParameter("model_name", str, "flux-g2rpo", "the registered model's name"),
    RunParameter("overrides", list, [], "any other run-config key=value, e.g. ['train.seed=3']; over the choices"),
    RunParameter("test_size", int, 400, "prompts the prepare task holds out for the evaluation"),
    RunParameter("split_seed", int, 0, "seed of the train/test split"),
    RunParameter("eval_num_prompts", int, 0, "held-out prompts evaluated; 0: all of them"),
    RunParameter("eval_seeds", list, [0, 1, 2], "the seeds each held-out prompt is sampled with"),
    RunParameter("gates_uri", str, "", "the promotion gates (YAML); empty: the packaged g2rpo/gates/default.yaml"),
    RunParameter("nodes", int, 1, "> 1: train in a Kubeflow Trainer TrainJob across this many nodes"),
    RunParameter(
        "checkpoint_store_uri",
        str,
        "",
        "where checkpoints are mirrored, under <run id>/<task name>; empty: <store_uri>/checkpoints",
    ),
    RunParameter("pushgateway_url", str, "", "a Prometheus Pushgateway for the run's status and decision; empty: none"),
)


def pipeline_defaults() -> dict[str, Any]:
    """Every parameter's pipeline default, but the placement profile's (fresh copies: a caller may change them)."""
    return {p.name: copy.deepcopy(p.default) for p in (*RUN_PARAMETERS, *TRAIN_PARAMETERS)}


def train_parameter_defaults() -> dict[str, Any]:
    """The pipeline's default of each training choice (fresh copies: a caller may change them)."""
    return {p.name: copy.deepcopy(p.default) for p in TRAIN_PARAMETERS}


def parameter_help() -> dict[str, str]:
    """Each parameter's help, by name (the pipeline's input descriptions)."""
    return {p.name: p.help for p in (*RUN_PARAMETERS, *TRAIN_PARAMETERS)}


def describe_parameters() -> str:
    """Every parameter with its pipeline default and help, as ``g2rpo pipeline submit --help`` lists them."""

    def line(row: RunParameter | TrainParameter) -> str:
        default = repr(row.default)
        return f"  {row.name} = {default if len(default) <= 40 else default[:37] + '...'}: {row.help}"

    return "\n".join(
        [
            "pipeline parameters (NAME=VALUE), with their defaults (g2rpo/steps/parameters.py):",
            *(line(row) for row in RUN_PARAMETERS),
            "training choices, over config_uri's file (then overrides over them):",
            *(line(row) for row in TRAIN_PARAMETERS),
            "and the placement profile's: gpus_per_node, node_selector, tolerations, train_pod_gpus/_cpu/_memory",
        ]
    )


def train_choices(values: Mapping[str, Any]) -> dict[str, Any]:
    """The training choices among a run's ``values``: those of the table's rows that it holds."""
    return {p.name: values[p.name] for p in TRAIN_PARAMETERS if p.name in values}


def choice_tree(choices: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config fields that ``choices`` (training choices by name) set, as a nested mapping of values
    (``{"algorithm": {"group_size": 8}}``) to merge over the config file: an unset choice sets nothing, a set
    one also its ``when_set`` fields. An unknown name is refused with the valid ones."""
    rows = {p.name: p for p in TRAIN_PARAMETERS}
    unknown = sorted(set(choices) - set(rows))
    if unknown:
        guesses = "".join(did_you_mean(name, rows) for name in unknown)
        raise G2RPOError(problem("choices", unknown, f"unknown{guesses}; valid: {', '.join(rows)}"))
    tree: dict[str, Any] = {}
    for name, value in choices.items():
        row = rows[name]
        if row.is_unset(value):
            continue  # a KFP parameter has no null: the file's (or the strategy's) value stays
        _put(tree, row.path, copy.deepcopy(value))
        for key, extra in row.when_set:
            _put(tree, tuple(key.split(".")), extra)
    return tree


def source_of(field: str, choices: Mapping[str, Any], overrides: Mapping[str, Any]) -> str | None:
    """The training choice that set the run-config ``field`` (dotted, as a problem names it:
    ``algorithm.group_size``, ``rewards.models.0.name``), or None when another source did: ``overrides``
    (the parsed override tree, applied after the choices) or the config file."""
    parts = field.split(".")
    if _sets(overrides, parts):
        return None
    for name, value in choices.items():
        row = next((p for p in TRAIN_PARAMETERS if p.name == name), None)
        if row is None or row.is_unset(value):
            continue
        if any(
            parts[: len(path)] == list(path) for path in (row.path, *(tuple(k.split(".")) for k, _ in row.when_set))
        ):
            return name
    return None


def _sets(tree: Mapping[str, Any], parts: list[str]) -> bool:
    """Whether ``tree`` sets the field at ``parts``: the field itself, or a value above it."""
    node: Any = tree
    for part in parts:
        if not isinstance(node, Mapping):
            return True  # a value above the field
        if part not in node:
            return False
        node = node[part]
    return True


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
