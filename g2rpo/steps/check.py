"""Every value of a pipeline run, checked before anything is sent, downloaded or trained.

``g2rpo pipeline submit``, ``schedule`` and ``run-local`` call :func:`check_arguments` (the placement
profile's defaults added, then :func:`check_run`) after the parameter names and types and before their
first request or expensive step. It resolves the run's values into what the tasks
themselves will build, with the tasks' own functions:

- train: the :class:`~g2rpo.training.run_config.RunConfig` of :func:`~g2rpo.steps.train_task.train_config`
  (the base config file, the training choices, ``overrides``), every field and cross-field check, and the
  rank checks of :func:`g2rpo.training.preflight.run_problems` over ``nodes × gpus_per_node`` ranks;
- evaluate: the :class:`~g2rpo.evaluation.config.EvaluationConfig` of :func:`evaluation_for`
  (``eval_seeds``, ``eval_num_prompts``);
- decide: the gates of :func:`g2rpo.steps.gate.gates_from` (a local file, or the packaged default),
  and that every gated metric is one the evaluation scores;
- prepare, placement, registry: ``test_size``, ``split_seed``, ``nodes``, ``gpus_per_node``, the node
  selector's and tolerations' shapes (:func:`g2rpo.steps.train_task.trainjob_for`), ``model_name``.

What needs the cluster (an ``s3://`` gates file, the model and prompt files on S3) is read by the tasks;
everything else fails here, in one :class:`~g2rpo.errors.G2RPOError` listing every problem, each naming
the pipeline parameter it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from g2rpo.artifacts.registry import validate_model_name
from g2rpo.config import COUNT_MAX, SEED_MAX, format_validation_error, parse_overrides, problem_field
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.launch.quantity import quantity_problem
from g2rpo.rewards.specs import get_spec
from g2rpo.steps.gate import gates_from
from g2rpo.steps.parameters import pipeline_defaults, source_of, train_choices
from g2rpo.steps.placement import PlacementProfile, load_profile
from g2rpo.steps.train import matching_evaluation
from g2rpo.steps.train_task import train_config, trainjob_for
from g2rpo.training.preflight import run_problems
from g2rpo.training.run_config import RunConfig

__all__ = ["check_arguments", "check_run", "evaluation_for", "parameter_problems", "run_values"]

# Where the checked config pretends the task's files are: only their names are checked here.
_PLACEHOLDER_DIR = "/pipeline-check"
# The evaluation config's fields that a pipeline parameter sets (evaluation_for).
_EVALUATION_PARAMETERS = {"seeds": "eval_seeds", "num_prompts": "eval_num_prompts"}


def run_values(arguments: Mapping[str, Any], placement: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter of the run as the pipeline will see it: the defaults, the placement profile's
    (``placement``: gpus_per_node, node_selector, tolerations), then the arguments."""
    return {**pipeline_defaults(), **placement, **arguments}


def check_run(values: dict[str, Any]) -> dict[str, Any]:
    """Raise one G2RPOError listing every problem of the run's values (:func:`run_values`); return them when
    there is none."""
    problems = parameter_problems(values)
    if problems:
        raise G2RPOError(
            f"{len(problems)} problem(s) in the pipeline's parameters (nothing was sent or started):\n  - "
            + "\n  - ".join(problems)
        )
    return values


def evaluation_for(values: Mapping[str, Any], config: RunConfig, prompts: str) -> EvaluationConfig:
    """The evaluate task's evaluation for a run's values: sampled as ``config`` trains
    (:func:`~g2rpo.steps.train.matching_evaluation`), on ``prompts`` (the first ``eval_num_prompts``; 0 for
    all) × ``eval_seeds``."""
    return matching_evaluation(
        config, prompts, num_prompts=values["eval_num_prompts"] or None, seeds=values["eval_seeds"]
    )


def parameter_problems(values: dict[str, Any]) -> list[str]:
    """The problems of a run's complete values (:func:`run_values`), each naming its parameter."""
    placement = _placement_problems(values)
    problems = placement + _prepare_problems(values)
    try:
        validate_model_name(values["model_name"])
    except G2RPOError as exc:
        problems.append(f"model_name: {exc}")
    config, config_problems = _run_config(values)
    problems += config_problems
    if config is not None:
        world = values["nodes"] * _whole(values["gpus_per_node"]) if not placement else 1
        # The rank split and "more than one rank needs DeepSpeed": the trainer's own set-up checks.
        sections = SimpleNamespace(train=config.train, deepspeed=config.deepspeed)
        problems += [f"train task: {p}" for p in run_problems(sections, world)]
    # These run on a config that did not build too (with the evaluation's own defaults, and without
    # the gated metrics' check), so that every problem is listed at once.
    problems += _evaluation_problems(values, config)
    problems += _gate_problems(values, config)
    return problems


def _whole(value: Any) -> Any:
    """An integer parameter's value; a string of digits counts too (a KFP string parameter can carry a
    count a Kubernetes field needs as a string, e.g. the accelerator limit)."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _int_problem(name: str, value: Any, low: int, high: int) -> str | None:
    number = _whole(value)
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        return problem(name, value, f"give an integer in {low}…{high}")
    return None


def _placement_problems(values: dict[str, Any]) -> list[str]:
    problems = [
        p
        for p in (
            _int_problem("nodes", values["nodes"], 1, COUNT_MAX),
            _int_problem("gpus_per_node", values["gpus_per_node"], 1, 16),
        )
        if p
    ]
    problems += [
        p
        for p in (
            quantity_problem("train_pod_cpu", values["train_pod_cpu"], "cpu") if "train_pod_cpu" in values else None,
            quantity_problem("train_pod_memory", values["train_pod_memory"], "memory")
            if "train_pod_memory" in values
            else None,
        )
        if p
    ]
    try:
        trainjob_for(
            image="check",
            run_id="check",
            task="train",
            gpus_per_node=1,
            node_selector=values["node_selector"],
            tolerations=values["tolerations"],
        )
    except G2RPOError as exc:
        problems += [line.strip().removeprefix("- ") for line in str(exc).splitlines()[1:]]
    return problems


def _prepare_problems(values: dict[str, Any]) -> list[str]:
    checks = (
        _int_problem("test_size", values["test_size"], 1, COUNT_MAX),
        _int_problem("split_seed", values["split_seed"], 0, SEED_MAX),
        _int_problem("eval_num_prompts", values["eval_num_prompts"], 0, COUNT_MAX),
    )
    return [p for p in checks if p]


def _run_config(values: dict[str, Any]) -> tuple[RunConfig | None, list[str]]:
    """The train task's run config, or the problems that keep it from being built, each naming the
    parameter that set its field (:func:`~g2rpo.steps.parameters.source_of`)."""
    overrides = values["overrides"]
    if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
        return None, [problem("overrides", overrides, "give a list of 'key=value' strings, e.g. ['train.seed=3']")]
    try:
        config = train_config(values, prompts=f"{_PLACEHOLDER_DIR}/train.jsonl", output_dir=_PLACEHOLDER_DIR)
    except ConfigError as exc:
        choices, tree = train_choices(values), _override_tree(overrides)
        return None, [
            f"train task: {_with_parameter(p, source_of(problem_field(p), choices, tree))}" for p in exc.problems
        ]
    except G2RPOError as exc:
        return None, [str(exc)]
    return config, []


def _override_tree(overrides: list[str]) -> dict[str, Any]:
    try:
        return parse_overrides(overrides)
    except ConfigError:
        return {}  # a malformed override is the problem reported


def _with_parameter(line: str, name: str | None) -> str:
    """``algorithm.group_size=1: …`` → ``algorithm.group_size=1 (parameter group_size): …``."""
    if name is None:
        return line
    head, sep, rest = line.partition(": ")
    return f"{head} (parameter {name}){sep}{rest}" if sep else f"{line} (parameter {name})"


def _evaluation_problems(values: dict[str, Any], config: RunConfig | None) -> list[str]:
    prompts = f"{_PLACEHOLDER_DIR}/test.jsonl"
    seeds = values["eval_seeds"] if isinstance(values["eval_seeds"], list) else [values["eval_seeds"]]
    try:
        if config is not None:
            evaluation_for({**values, "eval_seeds": seeds}, config, prompts)
        else:
            EvaluationConfig(prompts=prompts, num_prompts=values["eval_num_prompts"] or None, seeds=seeds)
    except ValidationError as err:
        lines = format_validation_error(EvaluationConfig, err)
        out = []
        for line in lines:
            name = _EVALUATION_PARAMETERS.get(problem_field(line).split(".")[0])
            out.append(f"evaluate task: {line}" + (f" (parameter {name})" if name else ""))
        return out
    return []


def _gate_problems(values: dict[str, Any], config: RunConfig | None) -> list[str]:
    gates_uri = values["gates_uri"]
    if str(gates_uri).startswith("s3://"):
        return []  # read by the decide task, with the cluster's credentials
    try:
        gates, _ = gates_from(gates_uri)
    except ConfigError as exc:
        return [f"gates_uri={gates_uri!r} ({exc.source or 'the packaged default'}): {p}" for p in exc.problems]
    except G2RPOError as exc:
        return [f"gates_uri: {exc}"]
    if config is None:
        return []
    scored = sorted(get_spec(model.name).name for model in config.rewards.models)  # the evaluation's metric names
    unknown = sorted(set(gates.metrics) - set(scored))
    if unknown:
        return [
            problem(
                "gates_uri",
                gates_uri or "the packaged default",
                f"gates metrics {unknown} that the evaluation does not score (it scores {scored}): "
                "gate only the run's rewards, or add them to `rewards` (weight 0 scores without training on it)",
            )
        ]
    return []


def check_arguments(arguments: Mapping[str, Any], profile: PlacementProfile | None = None) -> dict[str, Any]:
    """The run's arguments with the placement profile's defaults added (default profile: :func:`load_profile`),
    checked by :func:`check_run`: one G2RPOError listing every problem, or the values when there is none."""
    profile = profile or load_profile()
    placement = {
        "gpus_per_node": profile.gpus_per_node,
        "node_selector": dict(profile.node_selector),
        "tolerations": list(profile.tolerations),
    }
    return check_run(run_values(arguments, placement))
