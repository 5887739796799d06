"""The evaluation's config: which prompts and seeds, how to sample, what scores the images.

YAML (every key optional except ``prompts``; ``g2rpo eval --config FILE key=value ...``)::

    prompts: s3://data/eval-prompts.txt   # .txt (one per line) or .jsonl ('prompt' field); builtin:tiny
    num_prompts: 64                        # the first N (after removing duplicates); null = all
    seeds: [0, 1, 2]                       # every prompt is sampled once per seed
    num_steps: 16                          # T of the ODE sampler (scores.json, what the gates read)
    extra_steps: [10, 20]                  # reported beside it (step-count robustness)
    grid: flux                             # or static_shift (+ shift), as algorithm.grid
    rewards:                               # the rewards section of a run config
      models: [{name: hps_v21}, {name: clip}]

Fields that mean the same as a run config's carry the same name and help: ``grid``, ``shift``,
``truncate_timestep`` and ``num_steps`` as in ``algorithm``; ``guidance``, ``height`` and ``width``
as in ``model`` (here ``null`` size = the model's own); ``max_sequence_length`` as in ``data``;
``rewards`` is the run config's rewards section itself.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from g2rpo.config import COUNT_MAX, GUIDANCE_MAX, MAX_SIDE, PROBLEM_SEPARATOR, SEED_MAX, STEPS_MAX, Section
from g2rpo.errors import problem
from g2rpo.rewards.config import RewardsConfig

__all__ = ["EvaluationConfig", "IMAGES_MAX", "SEEDS_MAX"]

# An evaluation's seeds: the paper's use a handful; more than this is a typo or a generated list.
SEEDS_MAX = 1024
# Images one evaluation samples (prompts × seeds × step counts), checked once the prompts are read and
# before any model loads: every image and its scores are held until the artifact is assembled.
IMAGES_MAX = 100_000


class EvaluationConfig(Section):
    """A deterministic evaluation: fixed prompts × fixed seeds, ODE-sampled, decoded, scored."""

    prompts: str = Field(
        description="prompt file (local path, file:// or s3:// URI): UTF-8 text, one prompt per line, or .jsonl "
        "with a 'prompt' field (g2rpo data prep's test.jsonl); duplicates are dropped, first occurrence kept; "
        "builtin:tiny is the packaged set for the tiny model",
    )
    num_prompts: int | None = Field(
        None, ge=1, le=COUNT_MAX, description="evaluate the first N prompts of the file (null = every prompt)"
    )
    seeds: list[Annotated[int, Field(ge=0, le=SEED_MAX)]] = Field(
        default_factory=lambda: [0, 1, 2],
        min_length=1,
        max_length=SEEDS_MAX,
        description=f"sampling seeds, 0…{SEED_MAX} (2**64 − 1, torch.Generator's range); each prompt's initial noise is "
        "FluxPipeline's for manual_seed(seed)",
    )
    num_steps: int = Field(
        16,
        ge=1,
        le=STEPS_MAX,
        description="T, steps of the ODE sampler's σ grid (paper 16); scores.json, what the registry and the "
        "promotion gates read, holds this step count",
    )
    extra_steps: list[Annotated[int, Field(ge=1, le=STEPS_MAX)]] = Field(
        default_factory=list,
        description="further step counts evaluated on the same prompts and seeds and reported beside num_steps "
        "(the paper's 10/16/20 table); reported, not gated",
    )
    grid: Literal["flux", "static_shift"] = Field(
        "flux", description="σ grid: flux (FluxPipeline's resolution-dependent shift) or static_shift (reference code)"
    )
    shift: float = Field(
        3.0, gt=0.0, allow_inf_nan=False, description="s of the static_shift grid σ = s·t/(1+(s−1)·t) (reference 3)"
    )
    truncate_timestep: bool = Field(
        False, description="feed the model int(σ·1000)/1000 as the reference code does (the step math keeps σ)"
    )
    height: int | None = Field(
        None,
        ge=16,
        le=MAX_SIDE,
        description="image height in pixels, a multiple of 16 (null = the model's VAE sample size)",
    )
    width: int | None = Field(
        None,
        ge=16,
        le=MAX_SIDE,
        description="image width in pixels, a multiple of 16 (null = the model's VAE sample size)",
    )
    guidance: float | None = Field(
        3.5, ge=0, le=GUIDANCE_MAX, description="embedded guidance scale (FLUX.1-dev 3.5; null for models without)"
    )
    max_sequence_length: int | None = Field(
        None, ge=1, le=512, description="T5 tokens per prompt (null = the tokenizer's, FLUX.1-dev 512)"
    )
    rewards: RewardsConfig = Field(
        default_factory=RewardsConfig,
        description="reward models that score every image (the run config's rewards section; weights are not used)",
    )
    trained_metrics: list[str] | None = Field(
        None,
        description="the metrics the model was trained on (a run's rewards of non-zero weight: the pipeline sets "
        "them); the report labels these 'trained' and the others 'held-out'; null: not labelled",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the transformer, VAE and text encoders"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = CUDA when available")
    micro_batch: int = Field(
        32, ge=1, le=COUNT_MAX, description="(prompt, seed) rows per transformer call while sampling"
    )
    decode_micro_batch: int = Field(
        16,
        ge=1,
        le=COUNT_MAX,
        description="images per VAE decode call; the default comes from benchmarks/decode.py (fewer, larger calls are faster; at FLUX.1-dev 720² each image in a call adds its decode activations — benchmarks/README.md gives both)",
    )
    chunk_size: int = Field(
        32,
        ge=1,
        le=COUNT_MAX,
        description="(prompt, seed) images per resumable chunk: each chunk's images and scores are saved under "
        "the output before the next starts, so an interrupted evaluation redoes at most one chunk per process",
    )
    cache_dir: str | None = Field(
        None, description="where s3:// models are cached (default $G2RPO_CACHE_DIR or ~/.cache/g2rpo)"
    )

    @model_validator(mode="after")
    def _check(self) -> EvaluationConfig:
        problems = []
        if not self.prompts.strip():
            problems.append(problem("prompts", self.prompts, "name a prompt file (local path or s3:// URI)"))
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(problem("seeds", self.seeds, "list each seed once"))
        if len(set(self.step_counts)) != len(self.step_counts):
            problems.append(
                problem(
                    "extra_steps",
                    self.extra_steps,
                    f"list each step count once, num_steps {self.num_steps} not again",
                )
            )
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is not None and value % 16:
                problems.append(problem(name, value, "must be a multiple of 16 (VAE factor 8 × 2×2 packing)"))
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    @property
    def step_counts(self) -> list[int]:
        """Every step count evaluated: ``num_steps`` (the gated one) first, then ``extra_steps``."""
        return [self.num_steps, *self.extra_steps]
