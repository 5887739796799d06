"""The checks a run config still has to pass on this machine, after it validated as data.

:mod:`g2rpo.training.run_config` checks the config on its own (field by field, then across
sections) and imports no torch. What depends on the machine and the files it sees is checked here,
by ``g2rpo validate`` (:func:`validate_run`), before a pipeline run is sent, and by the trainer's
set-up (:func:`run_problems`): the rollout's memory against what this machine shows, the rank split,
the generated DeepSpeed config, the model folder (and LoRA's target modules in it), the prompt file
and the embedding cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from g2rpo.data import read_prompt_location
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.models.loading import TEXT_COMPONENTS, TRAINING_COMPONENTS, check_model_dir, transformer_skeleton
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.textfile import JSON_MAX_BYTES, read_json_file
from g2rpo.training.deepspeed_config import build_deepspeed_config, validate_deepspeed_config
from g2rpo.training.lora import lora_target_problem
from g2rpo.training.memory import available_memory, memory_problem, rollout_memory
from g2rpo.training.run_config import (
    ModelSection,
    TrainSection,
    deepspeed_rank_problem,
    load_run_config,
    resume_hash,
    valid_sections,
)

__all__ = ["run_problems", "rollout_memory_problem", "validate_run", "FLUX_PACKED_CHANNELS"]


def run_problems(config: Any, world_size: int = 1) -> list[str]:
    """Problems a config can still have on this machine: files, the rank split, DeepSpeed.

    ``config`` is a :class:`~g2rpo.training.run_config.RunConfig` or any object with the sections as attributes, some of
    them None (``g2rpo validate`` passes the sections that validated on their own, so these
    checks run even when another section has errors, and every problem is listed together).
    """
    train, ds, model, data = (getattr(config, n, None) for n in ("train", "deepspeed", "model", "data"))
    algorithm = getattr(config, "algorithm", None)
    problems: list[str] = []
    if train is not None and model is not None and algorithm is not None:
        fits = rollout_memory_problem(algorithm, model, train, world_size)
        if fits:
            problems.append(fits)
    if train is not None and train.prompts_per_iteration % world_size:
        problems.append(
            problem(
                "train.prompts_per_iteration",
                train.prompts_per_iteration,
                f"must be a multiple of the world size {world_size}: one whole group per prompt stays on one rank",
            )
        )
    if ds is not None and (ranks := deepspeed_rank_problem(ds.enabled, world_size)):
        problems.append(ranks)
    if ds is not None and train is not None and ds.enabled:
        generated = build_deepspeed_config(
            ds,
            precision=train.precision,
            max_grad_norm=train.max_grad_norm,
            world_size=world_size,
            accumulation_steps=1,
        )
        try:
            validate_deepspeed_config(generated, world_size)
        except ConfigError as exc:
            problems += [p for p in exc.problems if not p.startswith("deepspeed.train_batch_size")]
    if model is not None and model.path and "://" not in model.path:
        if not (model.create_tiny and not Path(model.path).exists()):
            needed = (
                TRAINING_COMPONENTS if data is not None and data.embeddings else TRAINING_COMPONENTS + TEXT_COMPONENTS
            )
            try:
                check_model_dir(Path(model.path), needed)
            except G2RPOError as exc:
                problems.append(f"model.path: {exc}")
            else:
                if train is not None and train.lora.enabled:
                    problems += _lora_problems(model.path, train.lora.target_modules)
    if data is not None and data.prompts and not data.prompts.startswith("s3://"):
        try:
            read_prompt_location(data.prompts)
        except G2RPOError as exc:
            problems.append(f"data.prompts: {exc}")
    if data is not None and data.embeddings and not (Path(data.embeddings) / "manifest.json").is_file():
        problems.append(
            problem(
                "data.embeddings",
                data.embeddings,
                "no finished embedding cache there (no manifest.json): run `g2rpo data prep`",
            )
        )
    return problems


def _lora_problems(model_path: str, target_modules: list[str]) -> list[str]:
    """``train.lora.target_modules`` checked against the model's transformer, built on the meta device
    (no weights read): a name it lacks failed only at set-up, on a cluster after the pods started."""
    try:
        wrong = lora_target_problem(transformer_skeleton(model_path), target_modules)
    except G2RPOError as exc:
        return [f"model.path: {exc}"]
    return [wrong] if wrong else []


FLUX_PACKED_CHANNELS = 64  # Flux: 16 latent channels × a 2×2 patch


def _packed_latent_channels(model: ModelSection) -> int:
    """The transformer's ``in_channels`` when a local model folder states it, else Flux's. A folder
    whose config cannot be read falls back to Flux's too: check_model_dir reports that folder."""
    if not model.path or "://" in model.path:
        return FLUX_PACKED_CHANNELS
    transformer_config = Path(model.path) / "transformer" / "config.json"
    try:
        config = read_json_file(transformer_config, what="transformer config", fix="", max_bytes=JSON_MAX_BYTES)
        return int(config.get("in_channels", FLUX_PACKED_CHANNELS))
    except (G2RPOError, ValueError, TypeError):
        return FLUX_PACKED_CHANNELS


def rollout_memory_problem(
    algorithm: AlgorithmConfig, model: ModelSection, train: TrainSection, world_size: int
) -> str | None:
    """The rollout of one iteration cannot fit in the memory this machine shows (:mod:`g2rpo.training.memory`)."""
    tokens = (model.height // 16) * (model.width // 16)  # packed 2×2 patches of the 8× VAE latent
    channels = _packed_latent_channels(model)
    trajectory = algorithm.strategy != "g2rpo"
    settings = algorithm.g2rpo
    trained = settings.branch_steps_per_iteration or len(settings.all_branch_steps(algorithm.num_steps))
    estimate = rollout_memory(
        trajectory=trajectory,
        prompts=max(1, train.prompts_per_iteration // world_size),
        trained_steps=trained,
        strides=len(settings.granularities),
        group_size=algorithm.group_size,
        num_steps=algorithm.num_steps,
        latent_tokens=tokens,
        latent_channels=channels,
        height=model.height,
        width=model.width,
    )
    shown = f"strategy={algorithm.strategy}, G={algorithm.group_size}, T={algorithm.num_steps}"
    if not trajectory:
        shown += f", |M|={trained}, Λ={list(settings.granularities)}"
    shown += f", prompts per rank={max(1, train.prompts_per_iteration // world_size)}, {model.height}×{model.width}"
    return memory_problem(estimate, available_memory(train.device), shown)


def validate_run(path: str | Path | None, overrides: Any = (), world_size: int = 1) -> tuple[str, list[str]]:
    """Validate a run config completely; raise ConfigError listing every problem, else return its hash
    and the settings the strategy will clamp (:meth:`~g2rpo.strategies.base.StrategySettings.clamped`)."""
    try:
        config = load_run_config(path, overrides)
    except ConfigError as exc:
        # Also run the machine-level checks on the sections that are valid by themselves.
        extra = run_problems(valid_sections(path, overrides), world_size)
        raise ConfigError(exc.problems + extra, source=str(path) if path else None) from None
    problems = run_problems(config, world_size)
    if problems:
        raise ConfigError(problems, source=str(path) if path else None)
    return resume_hash(config), config.algorithm.settings.clamped(config.algorithm)
