"""The configuration of one training run: every section, validated together.

``RunConfig`` composes ``algorithm`` (:class:`~g2rpo.strategies.config.AlgorithmConfig`),
``model``, ``data``, ``rewards`` (:class:`~g2rpo.rewards.config.RewardsConfig`), ``train``, ``deepspeed``
(:class:`~g2rpo.training.deepspeed_config.DeepSpeedSection`), ``output`` and ``observability``
(Prometheus metrics, off by default). Load it with
:func:`load_run_config` (YAML + ``key=value`` overrides; every problem reported at once), print
it with ``g2rpo config show``, list every field with ``g2rpo config describe``.

The **config hash** that guards resume (:func:`resume_hash`) covers ``model``, ``algorithm`` and
``data``: what the weights and the trajectory of draws depend on. Run length, learning-rate,
checkpoint cadence and output paths are free to change between a run and its resume.

The config is data: this module checks it field by field and across sections, and imports no
torch. What depends on the machine and the files it sees (memory, ranks, the model folder, the
prompt file) is checked by :mod:`g2rpo.training.preflight`.

Defaults are the paper's / reference code's (docs/algorithm.md §6) at Flux.1-dev scale. Test and demo configs
(``configs/tiny-cpu.yaml``) change them — larger learning rate and ratio clip, few steps — and
say so.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from g2rpo.config import (
    COUNT_MAX,
    GUIDANCE_MAX,
    MAX_SIDE,
    PROBLEM_SEPARATOR,
    SEED_MAX,
    Section,
    config_hash,
    load_config,
    read_config_file,
)
from g2rpo.errors import ConfigError, G2RPOError, problem
from g2rpo.rewards.config import RewardsConfig
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.settings import SETTINGS
from g2rpo.training.deepspeed_config import DeepSpeedSection

__all__ = [
    "ModelSection",
    "DataSection",
    "LoraSection",
    "EmaSection",
    "ValidationSection",
    "TrainSection",
    "OutputSection",
    "ObservabilitySection",
    "RunConfig",
    "load_run_config",
    "resume_hash",
    "HASHED_SECTIONS",
    "cross_field_problems",
    "valid_sections",
    "deepspeed_rank_problem",
]

HASHED_SECTIONS = ("model", "algorithm", "data")
# Each strategy's own learning rate and its source, from its section: a list written here went stale.
_STRATEGY_RATES = "; ".join(section.learning_rate_source for section in SETTINGS.values())
# An AdamW beta: torch.optim.AdamW raises "Invalid beta parameter" outside [0, 1) — at the first step.
Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class ModelSection(Section):
    """The policy: a diffusers Flux pipeline directory (only transformer and VAE are loaded to train)."""

    path: str = Field(
        "",
        description="local directory of a diffusers FluxPipeline (model_index.json, transformer/, vae/, text encoders)",
    )
    create_tiny: bool = Field(
        False,
        description="tests/demo only: build the tiny random-weight Flux pipeline at `path` if it does not exist yet",
    )
    height: int = Field(
        720, ge=16, le=MAX_SIDE, description="image height in pixels (multiple of 16; reference code 720)"
    )
    width: int = Field(
        720, ge=16, le=MAX_SIDE, description="image width in pixels (multiple of 16; reference code 720)"
    )
    guidance: float | None = Field(
        3.5, ge=0, le=GUIDANCE_MAX, description="embedded guidance scale (FLUX.1-dev 3.5; null for models without)"
    )
    base_model_name: str = Field(
        "black-forest-labs/FLUX.1-dev",
        description="what the exported model points to as its base (name or URI); its licence is recorded from the model dir",
    )

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        problems = []
        for name in ("height", "width"):
            value = getattr(self, name)
            if value % 16:
                problems.append(
                    problem(f"model.{name}", value, "must be a multiple of 16 (VAE factor 8 × 2×2 packing)")
                )
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


class DataSection(Section):
    """The training prompts and their text embeddings."""

    prompts: str = Field(
        "",
        description="prompt file (local path or s3:// URI): UTF-8 text, one prompt per line, or .jsonl with a 'prompt' "
        "field (g2rpo data prep's train.jsonl); encoded once at start-up with the pipeline's text encoders, then freed",
    )
    embeddings: str | None = Field(
        None,
        description="directory of a precomputed text-embedding cache (g2rpo data prep); its prompts are the training "
        "set (then `prompts` may be empty). Null = encode `prompts` at start-up",
    )
    max_sequence_length: int | None = Field(
        None,
        ge=1,
        le=512,
        description="T5 tokens per prompt when encoding at start-up (null = the tokenizer's, FLUX.1-dev 512)",
    )

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        if not self.prompts and not self.embeddings:
            raise ValueError(problem("data.prompts", "", "set a prompt file (one prompt per line) or data.embeddings"))
        return self


class LoraSection(Section):
    """Optional LoRA adapters (peft) instead of a full fine-tune."""

    enabled: bool = Field(False, description="train LoRA adapters only; the base transformer stays frozen")
    rank: int = Field(64, ge=1, le=COUNT_MAX, description="LoRA rank r")
    alpha: float = Field(128.0, gt=0, description="LoRA alpha (scale alpha / r)")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the LoRA path; must stay 0 (the policy runs in eval mode)"
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"],
        min_length=1,
        description="module names (suffixes) that get adapters; must exist in the transformer",
    )

    @model_validator(mode="after")
    def _check(self) -> LoraSection:
        # The transformer runs in eval mode (as diffusers loads it) so that sampling and training
        # compute the same log-probabilities; a LoRA dropout would never be applied.
        if self.dropout != 0.0:
            raise ValueError(
                problem(
                    "train.lora.dropout",
                    self.dropout,
                    "must be 0: the policy runs in eval mode so that the rollout's and the update's "
                    "log-probabilities agree (ratio 1 at the first update), so a dropout would silently do nothing",
                )
            )
        return self


class EmaSection(Section):
    """Optional exponential moving average of the trained weights."""

    enabled: bool = Field(False, description="keep an EMA copy of the trainable weights (float32)")
    decay: float = Field(
        0.999, gt=0.0, lt=1.0, description="θ_ema ← decay·θ_ema + (1 − decay)·θ after each optimiser step"
    )
    warmup: bool = Field(
        False,
        description=(
            "the s-th update uses min((1 + s)/(10 + s), decay) instead of decay, so the average follows the first "
            "steps (DiffusionNFT's published EMA: decay 0.9 with this warm-up)"
        ),
    )


class ValidationSection(Section):
    """Validation during training (off by default): a fixed held-out pass, best-checkpoint export, early stop."""

    enabled: bool = Field(False, description="validate every `every` iterations, at iteration 0 and at the end")
    every: int = Field(
        10, ge=1, le=COUNT_MAX, description="validate after every this many iterations (each gets a checkpoint)"
    )
    num_prompts: int = Field(
        8,
        ge=1,
        le=COUNT_MAX,
        description="prompts of the training split to validate on, evenly spaced over it (the prepare step's "
        "train.jsonl; the test split is for the evaluate task and never read here)",
    )
    seeds: list[Annotated[int, Field(ge=0, le=SEED_MAX)]] = Field(
        default_factory=lambda: [0, 1],
        min_length=1,
        description="sampling seeds; each (prompt, seed) is one deterministic ODE sample, as in g2rpo eval",
    )
    metrics: list[str] = Field(
        default_factory=list,
        description="reward names to score (each one of rewards.models); empty = every reward, trained and weight-0",
    )
    max_regression: dict[str, float] = Field(
        default_factory=dict,
        description="out-of-domain tolerance: metric -> largest drop of its mean allowed below the first "
        "validation's (score units, the promotion gates' max_regression); a validation beyond it cannot be exported",
    )
    select_best: bool = Field(
        True, description="export the best validated checkpoint (see docs/training.md) instead of the last"
    )
    stop_after_breaches: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description="early stop after this many validations in a row breach max_regression; null = never",
    )
    patience: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description="early stop when the objective has not improved for this many validations; null = never",
    )
    micro_batch: int = Field(
        8,
        ge=1,
        le=COUNT_MAX,
        description="(prompt, seed) rows per sampling chunk; chunks are shared round-robin by the ranks, so the "
        "result does not depend on the world size",
    )
    max_forwards: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description="bound on one validation's transformer forwards (prompts × seeds × algorithm.num_steps); a "
        "config above it is refused; null = no bound",
    )

    @model_validator(mode="after")
    def _check(self) -> ValidationSection:
        problems = []
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(problem("train.validation.seeds", self.seeds, "list each seed once"))
        if len(set(self.metrics)) != len(self.metrics):
            problems.append(problem("train.validation.metrics", self.metrics, "list each reward once"))
        negative = {k: v for k, v in self.max_regression.items() if not (v >= 0 and math.isfinite(v))}
        if negative:
            problems.append(
                problem(
                    "train.validation.max_regression",
                    negative,
                    "give each metric a finite drop ≥ 0 in score units (0: no drop allowed)",
                )
            )
        if self.stop_after_breaches is not None and not self.max_regression:
            problems.append(
                problem(
                    "train.validation.stop_after_breaches",
                    self.stop_after_breaches,
                    "counts breaches of max_regression, which is empty: set max_regression for the out-of-domain "
                    "metrics, or leave stop_after_breaches null",
                )
            )
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    def forwards(self, num_steps: int) -> int:
        """Transformer forwards of one validation pass (every rank together)."""
        return self.num_prompts * len(self.seeds) * num_steps


class TrainSection(Section):
    """The optimisation loop."""

    iterations: int = Field(300, ge=1, le=COUNT_MAX, description="training iterations (reference code 300)")
    prompts_per_iteration: int = Field(
        16,
        ge=1,
        le=COUNT_MAX,
        description="groups per iteration over all ranks (paper: 16 GPUs × 1); a multiple of the world size",
    )
    seed: int = Field(
        0,
        ge=0,
        le=SEED_MAX,
        description=f"run seed, 0…{SEED_MAX} (torch.Generator's range): every draw derives from (seed, iteration, "
        "prompt, k, branch)",
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        le=1.0,
        description=(
            "AdamW learning rate, constant, for every strategy; null = the chosen strategy's own "
            f"(algorithm.<strategy>.learning_rate: {_STRATEGY_RATES})"
        ),
    )
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay (paper 1e-4)")
    adam_betas: tuple[Beta, Beta] = Field(
        (0.9, 0.999), description="AdamW betas (β1, β2), each in [0, 1): torch.optim.AdamW refuses others"
    )
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    max_grad_norm: float = Field(1.0, gt=0, description="clip the global gradient norm to this (reference 1.0)")
    precision: Literal["bf16", "fp32"] = Field(
        "bf16", description="bf16 (DeepSpeed keeps fp32 master weights) or fp32; plain torch mode supports fp32 only"
    )
    gradient_checkpointing: bool = Field(True, description="recompute block activations in backward (less memory)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = CUDA when available")
    decode_micro_batch: int = Field(
        16,
        ge=1,
        le=COUNT_MAX,
        description="images per VAE decode call; the default comes from benchmarks/decode.py (fewer, larger calls are faster; at FLUX.1-dev 720² each image in a call adds its decode activations — benchmarks/README.md gives both)",
    )
    lora: LoraSection = Field(default_factory=LoraSection, description="LoRA adapters (peft)")
    ema: EmaSection = Field(default_factory=EmaSection, description="EMA of the trained weights")
    checkpoint_every: int = Field(
        50, ge=1, le=COUNT_MAX, description="save a resumable checkpoint every this many iterations"
    )
    keep_last: int = Field(2, ge=1, le=COUNT_MAX, description="keep the newest this many checkpoints")
    keep_iterations: list[Annotated[int, Field(ge=1, le=COUNT_MAX)]] = Field(
        default_factory=list, description="checkpoints at these iterations are kept for good"
    )
    resume: str = Field(
        "auto",
        description="auto (latest complete checkpoint in output.dir, if any), never (refuse a used output.dir), or a "
        "checkpoint directory",
    )
    stop_grace_s: float = Field(
        25.0,
        ge=0,
        le=86_400,
        description="after SIGTERM/SIGINT: seconds the run may still use to finish (or abandon) its iteration and "
        "write a checkpoint before it exits with status 128+signal (143 for SIGTERM); keep it below the pod's "
        "terminationGracePeriodSeconds and torchrun's 30 s kill delay (docs/training.md)",
    )
    deterministic: bool = Field(False, description="torch.use_deterministic_algorithms (bit-exact resume on CPU)")
    progress: bool = Field(True, description="show a progress bar (reward and loss in its postfix)")
    validation: ValidationSection = Field(
        default_factory=ValidationSection,
        description="validation during training: held-out curves, best-checkpoint export, early stop (off by default)",
    )


class OutputSection(Section):
    """Where the run writes."""

    dir: str = Field("runs/g2rpo", description="run directory: config, metrics.jsonl, checkpoints/, export/")
    export: bool = Field(True, description="export the trained transformer (or LoRA adapters) at the end")
    export_ema: bool = Field(False, description="export the EMA weights instead of the raw ones (needs train.ema)")
    node_local: bool = Field(
        False,
        description="output.dir is a folder of each node alone, not one every node shares: each node keeps its ranks' "
        "part of every checkpoint there, the S3 checkpoint mirror (--checkpoint-uri, required) holds the whole, and "
        "a resume restores it from S3 into every node's folder (docs/training.md, multi-node without a shared volume)",
    )


class ObservabilitySection(Section):
    """Prometheus metrics of the run (docs/observability.md); off unless ``metrics_port`` is set."""

    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="rank 0 serves Prometheus /metrics on this port while training; null = off"
    )
    metrics_address: str = Field("0.0.0.0", description="interface /metrics listens on (127.0.0.1: this machine only)")
    linger_seconds: float = Field(
        15.0, ge=0, description="keep /metrics up this long after training, so a last scrape sees the final values"
    )
    pipeline: str = Field("local", description="the `pipeline` label of every series (the pipeline's name)")
    run_id: str = Field("", description="the `run_id` label of every series; empty = the name of output.dir")


class RunConfig(Section):
    """A complete training run."""

    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="credit-assignment strategy")
    model: ModelSection = Field(default_factory=ModelSection, description="the policy model")
    data: DataSection = Field(default_factory=DataSection, description="prompts and text embeddings")
    rewards: RewardsConfig = Field(default_factory=RewardsConfig, description="reward models (g2rpo.rewards)")
    train: TrainSection = Field(default_factory=TrainSection, description="optimisation loop")
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection, description="DeepSpeed ZeRO")
    output: OutputSection = Field(default_factory=OutputSection, description="outputs")
    observability: ObservabilitySection = Field(
        default_factory=ObservabilitySection, description="Prometheus metrics (/metrics on rank 0)"
    )

    @property
    def learning_rate(self) -> float:
        """The learning rate the run trains at: ``train.learning_rate``, else the strategy's own."""
        if self.train.learning_rate is not None:
            return self.train.learning_rate
        return self.algorithm.settings.learning_rate

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        problems = cross_field_problems(self)
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


def validation_problems(
    validation: ValidationSection, reward_names: list[str], weights: list[float], num_steps: int
) -> list[str]:
    """The checks that need the rewards and the algorithm (called from the run config's cross-field checks)."""
    if not validation.enabled:
        return []
    problems = []
    known = set(reward_names)
    unknown = [m for m in validation.metrics if m not in known]
    if unknown:
        problems.append(
            problem("train.validation.metrics", unknown, f"name rewards of rewards.models: {', '.join(reward_names)}")
        )
    scored = set(validation.metrics or reward_names)
    trained = [n for n, w in zip(reward_names, weights) if w != 0]
    missing = [n for n in trained if n not in scored]
    if missing:
        problems.append(
            problem(
                "train.validation.metrics",
                validation.metrics,
                f"must include the trained rewards {missing}: the objective is their weighted sum",
            )
        )
    outside = [m for m in validation.max_regression if m not in scored]
    if outside:
        problems.append(
            problem(
                "train.validation.max_regression",
                outside,
                f"names metrics validation does not score; use some of {sorted(scored)}",
            )
        )
    in_domain = [m for m in validation.max_regression if m in trained]
    if in_domain:
        problems.append(
            problem(
                "train.validation.max_regression",
                in_domain,
                "names trained rewards: the tolerance guards the out-of-domain (weight-0) metrics; the trained "
                "ones form the objective",
            )
        )
    cost = validation.forwards(num_steps)
    if validation.max_forwards is not None and cost > validation.max_forwards:
        problems.append(
            problem(
                "train.validation.max_forwards",
                validation.max_forwards,
                f"one validation costs {validation.num_prompts} prompts × {len(validation.seeds)} seeds × "
                f"{num_steps} steps = {cost} forwards: lower num_prompts or seeds, or raise the bound",
            )
        )
    return problems


def cross_field_problems(config: Any) -> list[str]:
    """The checks that span sections. ``config`` is a :class:`RunConfig` or any object with the
    sections as attributes, some None (those that did not validate on their own): a check runs
    when every section it reads is there, so field problems do not hide these."""
    model, train, ds, output = (getattr(config, n, None) for n in ("model", "train", "deepspeed", "output"))
    rewards, algorithm = getattr(config, "rewards", None), getattr(config, "algorithm", None)
    problems = []
    if train is not None and rewards is not None and algorithm is not None:
        problems += validation_problems(
            train.validation,
            [spec.name for spec in rewards.models],
            [spec.weight for spec in rewards.models],
            algorithm.num_steps,
        )
    if model is not None and not model.path:
        problems.append(problem("model.path", "", "set the directory of a diffusers Flux pipeline"))
    if train is not None and ds is not None:
        if train.precision == "bf16" and not ds.enabled:
            problems.append(
                problem(
                    "train.precision",
                    "bf16",
                    "plain torch mode trains in fp32 only: set deepspeed.enabled=true (fp32 master weights) or "
                    "train.precision=fp32",
                )
            )
        if train.ema.enabled and ds.enabled and ds.zero_stage == 3:
            problems.append(
                problem("train.ema.enabled", True, "EMA is kept on full weights: use zero_stage ≤ 2, or turn EMA off")
            )
        if train.lora.enabled and ds.enabled and ds.zero_stage == 3:
            problems.append(
                problem(
                    "deepspeed.zero_stage",
                    3,
                    "LoRA trains a few adapters on a frozen base: use zero_stage ≤ 2 (the adapters are exported "
                    "from whole weights; ZeRO-3 would shard them)",
                )
            )
    if algorithm is not None and train is not None and algorithm.strategy == "flowgrpo":
        beta = algorithm.flowgrpo.kl_beta
        if beta > 0 and not train.lora.enabled:
            problems.append(
                problem(
                    "algorithm.flowgrpo.kl_beta",
                    beta,
                    "the KL penalty's reference policy is the base model with LoRA adapters disabled: set "
                    "train.lora.enabled=true, or algorithm.flowgrpo.kl_beta=0",
                )
            )
    if algorithm is not None and train is not None and algorithm.strategy == "diffusionnft":
        beta = algorithm.diffusionnft.kl_beta
        if beta > 0 and not train.lora.enabled:
            problems.append(
                problem(
                    "algorithm.diffusionnft.kl_beta",
                    beta,
                    "the KL term's reference policy is the base model with LoRA adapters disabled: set "
                    "train.lora.enabled=true, or algorithm.diffusionnft.kl_beta=0",
                )
            )
        if ds is not None and ds.enabled and ds.zero_stage == 3:
            problems.append(
                problem(
                    "deepspeed.zero_stage",
                    3,
                    "DiffusionNFT keeps a whole copy of the trainable tensors as its old policy (ZeRO-3 shards "
                    "them): use zero_stage ≤ 2",
                )
            )
    if output is not None and train is not None and output.export_ema and not train.ema.enabled:
        problems.append(problem("output.export_ema", True, "needs train.ema.enabled=true"))
    if output is not None and train is not None and output.export_ema and train.validation.enabled:
        if train.validation.select_best:
            problems.append(
                problem(
                    "train.validation.select_best",
                    True,
                    "validation scores the raw weights, so it cannot choose among EMA exports: set "
                    "output.export_ema=false, or train.validation.select_best=false to export the last EMA weights",
                )
            )
    if output is not None and train is not None and output.node_local and train.validation.enabled:
        if train.validation.select_best:
            problems.append(
                problem(
                    "train.validation.select_best",
                    True,
                    "with output.node_local=true each node holds only its part of a checkpoint, so the export cannot "
                    "load the best validated one: set train.validation.select_best=false (the export takes the last "
                    "iteration), or put output.dir on a volume every node shares and set output.node_local=false",
                )
            )
    if train is not None and train.resume not in ("auto", "never") and not Path(train.resume).exists():
        problems.append(problem("train.resume", train.resume, "use auto, never, or an existing checkpoint directory"))
    return problems


def load_run_config(path: str | Path | None = None, overrides: Any = ()) -> RunConfig:
    """Read a run config (YAML + ``key=value`` overrides); raises ConfigError with every problem:
    field problems and, on the sections that are valid by themselves, the cross-field ones."""
    try:
        return load_config(RunConfig, path, overrides)
    except ConfigError as exc:
        hidden = [p for p in cross_field_problems(valid_sections(path, overrides)) if p not in exc.problems]
        if not hidden:
            raise
        raise ConfigError(exc.problems + hidden, source=exc.source) from None


def resume_hash(config: RunConfig) -> str:
    """The hash a checkpoint must match to be resumed (model, algorithm, data)."""
    return config_hash(config, HASHED_SECTIONS)


def deepspeed_rank_problem(enabled: bool, world_size: int) -> str | None:
    """The one rule for data parallelism: more than one rank needs DeepSpeed (plain torch mode trains on
    one process). Checked by ``g2rpo validate``, before a pipeline run is sent, and by the trainer."""
    if world_size > 1 and not enabled:
        return problem(
            "deepspeed.enabled", False, f"{world_size} ranks need DeepSpeed for data parallelism: set it to true"
        )
    return None


def valid_sections(path: str | Path | None, overrides: Any) -> SimpleNamespace:
    """The sections of a (possibly invalid) config that validate on their own (None for the others)."""
    try:
        raw = read_config_file(path, overrides)
    except G2RPOError:  # an unreadable file or a malformed override: already the reported problem
        return SimpleNamespace()
    out = {}
    for name, info in RunConfig.model_fields.items():
        cls = info.annotation
        value = raw.get(name, {})
        try:
            out[name] = cls.model_validate(value) if isinstance(cls, type) and issubclass(cls, BaseModel) else None
        except ValidationError:
            out[name] = None
    return SimpleNamespace(**out)
