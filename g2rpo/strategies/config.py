"""The ``algorithm`` section of a run's config: which strategy and its hyper-parameters.

Defaults are the paper's (spec §6) except where noted: ratio clip ε = 1e-4 comes from the
reference code (the paper gives none); the grid defaults to Flux's own (diffusers ``FluxPipeline``)
rather than the reference code's static shift 3. The baselines' knobs carry their own prefix
(``dancegrpo_*``, ``mixgrpo_*``) and are ignored by the other strategies.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from g2rpo.config import Section
from g2rpo.errors import problem

__all__ = ["AlgorithmConfig"]

PositiveInt = Annotated[int, Field(ge=1)]


class AlgorithmConfig(Section):
    """Credit-assignment strategy and its hyper-parameters."""

    strategy: Literal["g2rpo", "g2rpo_no_mgai", "dancegrpo", "mixgrpo"] = Field(
        "g2rpo",
        description="g2rpo | g2rpo_no_mgai (G²RPO with granularities [1]) | dancegrpo | mixgrpo",
    )
    num_steps: int = Field(16, ge=2, description="T, denoising steps of the sampler grid (≥ 2; paper 16)")
    group_size: int = Field(12, ge=2, description="G, samples per group (≥ 2; paper 12)")
    eta: float = Field(
        0.7,
        gt=0.0,
        allow_inf_nan=False,
        description=(
            "η, SDE noise scale s_σ = η·sqrt(σ/(1−σ)) (> 0; paper 0.7): η = 0 makes the G branches identical "
            "and their log-probability undefined"
        ),
    )
    sde_noise: Literal["flow_grpo", "dancegrpo"] = Field(
        "flow_grpo",
        description=(
            "SDE noise scale for every strategy: flow_grpo s_σ = η·sqrt(σ/(1−σ)) (spec §1, reference code) "
            "or dancegrpo s_σ = η (DanceGRPO's original step)"
        ),
    )
    branch_steps: list[int] | None = Field(
        None,
        description=(
            "M, the grid indices k where G²RPO branches (0 = noisiest, each < num_steps); "
            "null = the noisiest half, k = 0 … ceil(T/2)−1"
        ),
    )
    branch_steps_per_iteration: PositiveInt | None = Field(
        None,
        description="draw this many steps of M at random each iteration (per prompt, seeded); null = all of M",
    )
    granularities: list[int] = Field(
        [1, 2, 3],
        min_length=1,
        description="Λ, the strides each branch is finished with (integers ≥ 1; paper [1, 2, 3], reference [1, 2])",
    )
    stride_schedule: Literal["to_zero", "reference"] = Field(
        "to_zero",
        description=(
            "to_zero: σ[k+1], σ[k+1+λ], …, 0 (spec default); reference: the reference code's "
            "σ[:k+2] + σ[k+2::λ] (one stride-1 step first), finished with an Euler step to 0"
        ),
    )
    stride_weights: list[float] | None = Field(
        None, description="α_j ≥ 0, one weight per granularity for the advantage sum (not all 0); null = all 1"
    )
    advantage_clip: float = Field(
        5.0, gt=0.0, allow_inf_nan=False, description="clip the mixed advantage to ±this after the sum (paper 5)"
    )
    advantage_eps: float = Field(1e-8, gt=0.0, allow_inf_nan=False, description="δ in (R − mean)/(std + δ)")
    unbiased_std: bool = Field(True, description="group std with Bessel's correction (torch.std default)")
    ratio_clip: float = Field(
        1e-4, gt=0.0, allow_inf_nan=False, description="ε of the clipped surrogate (reference code 1e-4)"
    )
    log_prob_reduce: Literal["mean", "sum"] = Field(
        "mean", description="reduce the Gaussian log-prob over latent dims by mean (reference) or sum"
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
    optimizer_step: Literal["per_iteration", "per_step"] = Field(
        "per_iteration",
        description="per_iteration: accumulate over all trained steps, one optimiser step (reference); per_step: one per k",
    )
    micro_batch: PositiveInt = Field(16, description="rows per model call while sampling (branches × strides batched)")
    train_micro_batch: PositiveInt | None = Field(
        None,
        description="rows per training forward; a trained step with more rows is split into several terms; null = no split",
    )
    dancegrpo_train_fraction: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="DanceGRPO: fraction of the T steps trained, drawn at random per prompt (0.6)",
    )
    dancegrpo_shared_noise: bool = Field(
        True, description="DanceGRPO: one initial noise for the whole group (false = independent, Flow-GRPO style)"
    )
    mixgrpo_window_size: PositiveInt = Field(
        4, description="MixGRPO: W, SDE steps in the sliding window (MixGRPO code: 4)"
    )
    mixgrpo_window_shift: PositiveInt = Field(1, description="MixGRPO: steps the window advances each time (code: 1)")
    mixgrpo_iters_per_shift: PositiveInt = Field(25, description="MixGRPO: iterations between advances (code: 25)")

    @field_validator("granularities")
    @classmethod
    def _distinct_strides(cls, value: list[int]) -> list[int]:
        below = [lam for lam in value if lam < 1]
        if below:
            raise ValueError(f"{value!r} has strides {below} below 1: each stride is an integer ≥ 1, e.g. [1, 2, 3]")
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r} repeats a stride: list each stride once, e.g. [1, 2, 3]")
        return value

    @field_validator("stride_weights")
    @classmethod
    def _weights_finite_non_negative(cls, value: list[float] | None) -> list[float] | None:
        bad = [w for w in value or [] if not math.isfinite(w) or w < 0]
        if bad:
            raise ValueError(
                f"{value!r} has weights {bad} that are not finite numbers ≥ 0: give each α_j ≥ 0, e.g. [1, 1, 1]"
            )
        return value

    @field_validator("branch_steps")
    @classmethod
    def _steps_on_the_grid(cls, value: list[int] | None) -> list[int] | None:
        # k ≥ num_steps is checked with num_steps below; a negative k is outside any grid.
        negative = [k for k in value or [] if k < 0]
        if negative:
            raise ValueError(
                f"{value!r} has steps {negative} outside the grid: each k is a grid index 0..num_steps−1 (0 = noisiest)"
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> AlgorithmConfig:
        problems = []
        t = self.num_steps
        if self.branch_steps is not None:
            if not self.branch_steps:
                problems.append(problem("branch_steps", [], "give at least one step k, or null for the noisiest half"))
            outside = [k for k in self.branch_steps if k >= t]
            if outside:
                problems.append(
                    problem(
                        "branch_steps",
                        self.branch_steps,
                        f"steps {outside} are outside the grid: each k must be in 0..{t - 1}",
                    )
                )
            if len(set(self.branch_steps)) != len(self.branch_steps):
                problems.append(problem("branch_steps", self.branch_steps, "list each step once"))
        m = len(self.branch_steps) if self.branch_steps is not None else math.ceil(t / 2)
        if self.branch_steps_per_iteration is not None and self.branch_steps_per_iteration > m:
            problems.append(
                problem(
                    "branch_steps_per_iteration",
                    self.branch_steps_per_iteration,
                    f"must be ≤ |M| = {m}, or null for all of M",
                )
            )
        if (
            self.stride_weights is not None
            and len(self.stride_weights) != len(self.granularities)
            and self.strategy != "g2rpo_no_mgai"
        ):
            problems.append(
                problem(
                    "stride_weights",
                    self.stride_weights,
                    f"give one weight per granularity ({len(self.granularities)} for {self.granularities}), or null",
                )
            )
        if self.stride_weights is not None and self.stride_weights and not any(self.stride_weights):
            problems.append(
                problem(
                    "stride_weights",
                    self.stride_weights,
                    "all weights are 0, so every advantage would be 0: give at least one weight > 0",
                )
            )
        if self.strategy == "g2rpo_no_mgai":
            # The ablation is defined as Λ = {1}; an explicit other Λ would be silently ignored.
            if "granularities" in self.model_fields_set and self.granularities != [1]:
                problems.append(
                    problem(
                        "granularities",
                        self.granularities,
                        "strategy g2rpo_no_mgai always finishes with stride [1]: drop granularities, or use strategy g2rpo",
                    )
                )
            if self.stride_weights is not None:
                problems.append(
                    problem(
                        "stride_weights",
                        self.stride_weights,
                        "strategy g2rpo_no_mgai has one stride and weight 1: drop stride_weights",
                    )
                )
        if self.strategy == "mixgrpo" and t < 3:
            problems.append(problem("num_steps", t, "MixGRPO keeps its window below step T − 2: use num_steps ≥ 3"))
        if problems:
            # One ValueError per section: join so every problem is listed (ConfigError prints them).
            raise ValueError("\n  - ".join(problems))
        return self

    # ------------------------------------------------------------------ derived values

    @property
    def trained_steps(self) -> list[int]:
        """M: the configured branch steps, or the noisiest half ``0 … ceil(T/2) − 1``."""
        if self.branch_steps is not None:
            return sorted(self.branch_steps)
        return list(range(math.ceil(self.num_steps / 2)))

    @property
    def strides(self) -> list[int]:
        """Λ actually used (``[1]`` for g2rpo_no_mgai)."""
        return [1] if self.strategy == "g2rpo_no_mgai" else list(self.granularities)

    @property
    def stride_weight_values(self) -> list[float]:
        """α_j for :attr:`strides` (all 1 unless configured; ``[1.0]`` without MGAI)."""
        if self.strategy == "g2rpo_no_mgai":
            return [1.0]
        return list(self.stride_weights) if self.stride_weights is not None else [1.0] * len(self.granularities)
