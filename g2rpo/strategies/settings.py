"""Each strategy's own settings section (``algorithm.<strategy>``), and the names a run can choose.

One class per strategy, a :class:`StrategySettings` each: its knobs with their help and checks, its
learning rate and where that comes from. The sections are configuration, so they live here and
import no torch: ``g2rpo config``, ``g2rpo validate`` and the pipeline's parameter checks load them
without the sampler. Each strategy's module (``g2rpo.py``, ``dancegrpo.py``, …) holds the algorithm
and reads its section as ``config.<strategy>``; the docstring there says what each knob does to the
rollout and the loss.

:data:`SETTINGS` names every strategy (name → section), in the order help text lists them;
:data:`PRESETS` names the presets, each a strategy with some of its settings fixed.
:data:`g2rpo.strategies.registry.STRATEGIES` holds the classes under the same names (a test checks
the two agree).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from g2rpo.config import COUNT_MAX, PROBLEM_SEPARATOR, STEPS_MAX, Section
from g2rpo.errors import problem
from g2rpo.strides import stride_indices

if TYPE_CHECKING:  # the algorithm section holds these sections and passes itself to their checks
    from g2rpo.strategies.config import AlgorithmConfig

__all__ = [
    "StrategySettings",
    "G2RPOSettings",
    "DanceGRPOSettings",
    "MixGRPOSettings",
    "FlowGRPOSettings",
    "DiffusionNFTSettings",
    "BranchGRPOSettings",
    "TrajectorySteppingSettings",
    "SETTINGS",
    "PRESETS",
]


class StrategySettings(Section):
    """Base of a strategy's own settings section (``algorithm.<strategy>``).

    Every strategy has its own learning rate (its paper's or published script's), used unless
    ``train.learning_rate`` sets one for all. The section checks itself; checks that need the shared
    settings (e.g. a step index against ``num_steps``) go in :meth:`cross_checks`, which the
    ``algorithm`` section runs for the chosen strategy.
    """

    strategy: ClassVar[str]  # the strategy's registry name, which is also the section's key
    # The strategy's own learning rate and where it comes from: each section sets these two, and the one
    # ``learning_rate`` field below takes them as its default and help (__pydantic_init_subclass__).
    default_learning_rate: ClassVar[float] = 2e-6
    learning_rate_source: ClassVar[str] = "G²RPO paper 2e-6"

    learning_rate: float = Field(
        2e-6,
        gt=0.0,
        allow_inf_nan=False,
        description="AdamW learning rate, constant, when train.learning_rate is null (G²RPO paper 2e-6)",
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = copy.copy(cls.__pydantic_fields__["learning_rate"])
        field.default = cls.default_learning_rate
        field.description = (
            f"AdamW learning rate, constant, when train.learning_rate is null ({cls.learning_rate_source})"
        )
        cls.__pydantic_fields__["learning_rate"] = field
        cls.model_rebuild(force=True)

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        """Problems (``field=value: fix``, fields named from the ``algorithm`` section) with the shared settings."""
        return []

    def clamped(self, config: AlgorithmConfig) -> list[str]:
        """Settings the step grid cannot honour as given, which the strategy clamps as its reference code
        does: one line each, ``field=value: what is used instead`` (fields named from the ``algorithm``
        section). ``validate`` and the trainer's set-up say them once; a setting is never clamped silently."""
        return []

    def multi_step_setting(self, config: AlgorithmConfig) -> tuple[str, object] | None:
        """The setting (key under ``algorithm``, value) that makes the strategy step the optimiser more
        than once per iteration, or None when it steps once."""
        if config.optimizer_step != "per_iteration":
            return ("optimizer_step", config.optimizer_step)
        return None

    @classmethod
    def unknown_key_fix(cls, key: str, path: str) -> str | None:
        """A knob of another strategy: name the section it belongs in."""
        parent = path.rpartition(".")[0]
        prefix = f"{parent}." if parent else ""
        for other in SETTINGS.values():
            if other is not cls and key in other.model_fields:
                return (
                    f"{key} is a setting of strategy {other.strategy}: "
                    f"write it as {prefix}{other.strategy}.{key} and choose {prefix}strategy: {other.strategy}"
                )
        return None


def trajectories_per_step_field(default: int | None, source: str) -> Any:
    """The ``trajectories_per_step`` field of a :class:`TrajectorySteppingSettings`: its default and
    where that comes from differ per strategy, its bounds and meaning do not."""
    return Field(
        default,
        ge=1,
        le=COUNT_MAX,
        description=(
            f"trajectories per prompt accumulated into each optimiser step ({source}); null = one step per iteration"
        ),
    )


class TrajectorySteppingSettings(StrategySettings):
    """Settings of a strategy that steps the optimiser every ``trajectories_per_step`` trajectories of
    each prompt (the published scripts' gradient accumulation): DanceGRPO, MixGRPO, Flow-GRPO,
    DiffusionNFT. Each declares the field with :func:`trajectories_per_step_field`, where it stands among
    its own (a field declared here would come first in every section's listing)."""

    if TYPE_CHECKING:
        trajectories_per_step: int | None

    def multi_step_setting(self, config: AlgorithmConfig) -> tuple[str, object] | None:
        per_step = self.trajectories_per_step
        if per_step is not None and per_step < config.group_size:
            return (f"{self.strategy}.trajectories_per_step", per_step)
        return super().multi_step_setting(config)

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        """Steps per ``trajectories_per_step`` trajectories or per trained step, not both."""
        per_step, strategy = self.trajectories_per_step, self.strategy
        if per_step is not None and config.optimizer_step == "per_step":
            return [
                problem(
                    "optimizer_step",
                    config.optimizer_step,
                    f"{strategy} steps the optimiser every {strategy}.trajectories_per_step = {per_step} "
                    f"trajectories: use per_iteration, or set {strategy}.trajectories_per_step: null",
                )
            ]
        return []


class G2RPOSettings(StrategySettings):
    """G²RPO's own settings: where it branches, the strides it finishes with and their weights."""

    strategy: ClassVar[str] = "g2rpo"

    branch_steps: list[Annotated[int, Field(le=STEPS_MAX)]] | None = Field(
        None,
        description=(
            "M, the grid indices k where G²RPO branches (0 = noisiest, each < num_steps); "
            "null = the noisiest half, k = 0 … ceil(T/2)−1"
        ),
    )
    branch_steps_per_iteration: Annotated[int, Field(ge=1, le=STEPS_MAX)] | None = Field(
        None,
        description="draw this many steps of M at random each iteration (per prompt, seeded); null = all of M",
    )
    granularities: list[Annotated[int, Field(le=STEPS_MAX)]] = Field(
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
    # Non-finite and negative weights are refused together by _weights_finite_non_negative (one problem
    # naming them all), not item by item as the section's allow_inf_nan=False would.
    stride_weights: list[Annotated[float, Field(allow_inf_nan=True)]] | None = Field(
        None, description="α_j ≥ 0, one weight per granularity for the advantage sum (not all 0); null = all 1"
    )
    finish_solver: Literal["euler", "dpmpp_2m"] = Field(
        "euler",
        description=(
            "ODE solver of the branch finish: euler (paper, reference) or dpmpp_2m (DPM-Solver++(2M), second order, "
            "same forwards per step; pair it with finish_steps to spend fewer forwards)"
        ),
    )
    finish_steps: Annotated[int, Field(ge=1, le=STEPS_MAX)] | None = Field(
        None,
        description=(
            "at most this many finishing steps per stride (its schedule thinned evenly, first and last σ kept); "
            "null = every point of the stride schedule (paper)"
        ),
    )

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
    def _steps_on_a_grid(cls, value: list[int] | None) -> list[int] | None:
        # k ≥ num_steps is checked with num_steps (cross_checks); a negative k is outside any grid.
        negative = [k for k in value or [] if k < 0]
        if negative:
            raise ValueError(
                f"{value!r} has steps {negative} outside the grid: each k is a grid index 0..num_steps−1 (0 = noisiest)"
            )
        return value

    @model_validator(mode="after")
    def _checks(self) -> G2RPOSettings:
        problems = []
        if self.branch_steps is not None:
            if not self.branch_steps:
                problems.append(problem("branch_steps", [], "give at least one step k, or null for the noisiest half"))
            if len(set(self.branch_steps)) != len(self.branch_steps):
                problems.append(problem("branch_steps", self.branch_steps, "list each step once"))
        if self.stride_weights is not None and len(self.stride_weights) != len(self.granularities):
            problems.append(
                problem(
                    "stride_weights",
                    self.stride_weights,
                    f"give one weight per granularity ({len(self.granularities)} for {self.granularities}), or null",
                )
            )
        if self.stride_weights and not any(self.stride_weights):
            problems.append(
                problem(
                    "stride_weights",
                    self.stride_weights,
                    "all weights are 0, so every advantage would be 0: give at least one weight > 0",
                )
            )
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        problems = []
        t = config.num_steps
        outside = [k for k in self.branch_steps or [] if k >= t]
        if outside:
            problems.append(
                problem(
                    "g2rpo.branch_steps",
                    self.branch_steps,
                    f"steps {outside} are outside the grid: each k must be in 0..{t - 1} (num_steps is {t})",
                )
            )
        problems += self._duplicate_finish_problems(t)
        m = len(self.all_branch_steps(t))
        if self.branch_steps_per_iteration is not None and self.branch_steps_per_iteration > m:
            problems.append(
                problem(
                    "g2rpo.branch_steps_per_iteration",
                    self.branch_steps_per_iteration,
                    f"must be ≤ |M| = {m}, or null for all of M",
                )
            )
        return problems

    def _duplicate_finish_problems(self, num_steps: int) -> list[str]:
        """A ``finish_steps`` cap that gives two strides the same σ points at every k makes their rewards
        duplicates (the advantage would count one granularity twice): refuse it."""
        if self.finish_steps is None or any(k >= num_steps for k in self.branch_steps or []):
            return []
        steps = self.all_branch_steps(num_steps)
        schedules = {
            lam: [stride_indices(num_steps, k, lam, self.stride_schedule, self.finish_steps) for k in steps]
            for lam in self.granularities
        }
        same = [
            (a, b)
            for i, a in enumerate(self.granularities)
            for b in self.granularities[i + 1 :]
            if schedules[a] == schedules[b]
        ]
        if not same:
            return []
        pairs = ", ".join(f"{a} and {b}" for a, b in same)
        return [
            problem(
                "g2rpo.finish_steps",
                self.finish_steps,
                f"strides {pairs} then visit the same σ at every branch step, so their rewards are duplicates: "
                "raise finish_steps, drop a stride from granularities, or set finish_steps: null",
            )
        ]

    def all_branch_steps(self, num_steps: int) -> list[int]:
        """M on a grid of ``num_steps``: the configured branch steps, or the noisiest half ``0 … ceil(T/2) − 1``."""
        if self.branch_steps is not None:
            return sorted(self.branch_steps)
        return list(range(math.ceil(num_steps / 2)))

    @property
    def weights(self) -> list[float]:
        """α_j, one per granularity (all 1 unless configured)."""
        return list(self.stride_weights) if self.stride_weights is not None else [1.0] * len(self.granularities)


class DanceGRPOSettings(TrajectorySteppingSettings):
    """DanceGRPO's own settings: which steps train, the noise of the group, optimiser stepping, learning rate."""

    strategy: ClassVar[str] = "dancegrpo"
    default_learning_rate: ClassVar[float] = 1e-5
    learning_rate_source: ClassVar[str] = "DanceGRPO script: 1e-5"

    train_fraction: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="f, each trajectory trains int(f·(T−1)) of the first T−1 steps, drawn at random (DanceGRPO: 0.6)",
    )
    shared_noise: bool = Field(
        True, description="one initial noise for the whole group (false = independent, Flow-GRPO style)"
    )
    trajectories_per_step: int | None = trajectories_per_step_field(
        4, "DanceGRPO script: 4, i.e. 3 steps per iteration at G = 12"
    )

    def clamped(self, config: AlgorithmConfig) -> list[str]:
        trainable = config.num_steps - 1
        if int(self.train_fraction * trainable) >= 1:
            return []
        return [
            f"dancegrpo.train_fraction={self.train_fraction:g}: int({self.train_fraction:g} × (T − 1 = {trainable})) "
            "= 0 steps; each trajectory trains 1 step, as DanceGRPO's code does "
            f"(use train_fraction ≥ {1 / trainable:.3g} to say what runs)"
        ]


class MixGRPOSettings(TrajectorySteppingSettings):
    """MixGRPO's own settings: the sliding SDE window (MixGRPO code's defaults)."""

    strategy: ClassVar[str] = "mixgrpo"
    default_learning_rate: ClassVar[float] = 1e-5
    learning_rate_source: ClassVar[str] = "MixGRPO script: 1e-5"

    window_size: int = Field(4, ge=1, le=STEPS_MAX, description="W, SDE steps in the sliding window (MixGRPO code: 4)")
    window_shift: int = Field(1, ge=1, le=STEPS_MAX, description="steps the window advances each time (code: 1)")
    iters_per_shift: int = Field(25, ge=1, le=COUNT_MAX, description="iterations between advances (code: 25)")
    trajectories_per_step: int | None = trajectories_per_step_field(
        3, "MixGRPO script: 3, i.e. 4 steps per iteration at G = 12"
    )

    def clamped(self, config: AlgorithmConfig) -> list[str]:
        room = config.num_steps - 2  # window indices stay < T − 2
        if self.window_size <= room:
            return []
        return [
            f"mixgrpo.window_size={self.window_size}: the grid of num_steps={config.num_steps} holds at most "
            f"T − 2 = {room} window step(s); every window is cut to at most {room} step(s), as MixGRPO's code cuts it "
            f"(use window_size ≤ {room}, or more num_steps, to say what runs)"
        ]

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        problems = super().cross_checks(config)
        if config.num_steps < 3:
            problems.append(
                problem("num_steps", config.num_steps, "MixGRPO keeps its window below step T − 2: use num_steps ≥ 3")
            )
        return problems


class FlowGRPOSettings(TrajectorySteppingSettings):
    """Flow-GRPO's own settings: which steps train, the KL penalty, the advantage's std, optimiser stepping."""

    strategy: ClassVar[str] = "flowgrpo"
    default_learning_rate: ClassVar[float] = 3e-4
    learning_rate_source: ClassVar[str] = "Flow-GRPO base config, LoRA: 3e-4"

    train_fraction: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="f, every trajectory trains its first int(f·T) steps (Flow-GRPO timestep_fraction 0.99)",
    )
    kl_beta: float = Field(
        0.04,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "β of the KL penalty to the reference policy (Flow-GRPO GenEval/OCR 0.04, PickScore 0.01); "
            "> 0 needs the reference (train.lora.enabled: the base with adapters disabled); 0 = no KL"
        ),
    )
    global_std: bool = Field(
        True, description="normalise advantages by the std of the whole batch (Flow-GRPO) rather than the group's"
    )
    trajectories_per_step: int | None = trajectories_per_step_field(6, "Flow-GRPO steps twice per epoch: 6 at G = 12")

    def clamped(self, config: AlgorithmConfig) -> list[str]:
        if int(self.train_fraction * config.num_steps) >= 1:
            return []
        return [
            f"flowgrpo.train_fraction={self.train_fraction:g}: int({self.train_fraction:g} × (T = {config.num_steps})) "
            "= 0 steps; each trajectory trains 1 step, as Flow-GRPO's script does "
            f"(use train_fraction ≥ {1 / config.num_steps:.3g} to say what runs)"
        ]


class DiffusionNFTSettings(TrajectorySteppingSettings):
    """DiffusionNFT's own settings: β, the old policy's update schedule, timesteps, the KL to the reference."""

    strategy: ClassVar[str] = "diffusionnft"
    default_learning_rate: ClassVar[float] = 3e-4
    learning_rate_source: ClassVar[str] = "DiffusionNFT, LoRA: 3e-4"

    beta: float = Field(
        1.0,
        gt=0.0,
        allow_inf_nan=False,
        description=(
            "β of the implicit policies v± = v_old ± β·(v_θ − v_old), > 0 (DiffusionNFT config.beta 1.0; "
            "its OCR and multi-reward configs 0.1)"
        ),
    )
    sampler: Literal["euler", "dpmpp_2m"] = Field(
        "euler",
        description=(
            "deterministic ODE sampler of the rollouts: euler (the evaluation's sampler) or dpmpp_2m "
            "(DPM-Solver++(2M), the published dpm2)"
        ),
    )
    train_fraction: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="f, every sample trains int(f·T) distinct random grid timesteps (DiffusionNFT timestep_fraction 0.99)",
    )
    kl_beta: float = Field(
        1e-4,
        ge=0.0,
        allow_inf_nan=False,
        description=(
            "weight of mean (v_θ − v_ref)² to the reference policy (DiffusionNFT train.beta 1e-4); > 0 needs the "
            "reference (train.lora.enabled: the base with adapters disabled); 0 = none"
        ),
    )
    global_std: bool = Field(
        True, description="normalise advantages by the std of the whole batch (DiffusionNFT) rather than the group's"
    )
    old_decay_flat: int = Field(
        0,
        ge=0,
        le=COUNT_MAX,
        description="optimiser steps during which the old policy copies θ outright (decay 0; published 0, OCR 75)",
    )
    old_decay_rate: float = Field(
        1e-3,
        ge=0.0,
        allow_inf_nan=False,
        description="the old policy's decay grows by this per optimiser step after the flat ones (published 0.001)",
    )
    old_decay_max: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="the old policy's decay stops growing here (published 0.5, OCR 0.999; 1 = never updated)",
    )
    trajectories_per_step: int | None = trajectories_per_step_field(
        None, "DiffusionNFT: null, its gradient_step_per_epoch 1; its OCR config steps twice"
    )

    def clamped(self, config: AlgorithmConfig) -> list[str]:
        if int(self.train_fraction * config.num_steps) >= 1:
            return []
        return [
            f"diffusionnft.train_fraction={self.train_fraction:g}: int({self.train_fraction:g} × "
            f"(T = {config.num_steps})) = 0 timesteps; each sample trains 1, as DiffusionNFT's script does "
            f"(use train_fraction ≥ {1 / config.num_steps:.3g} to say what runs)"
        ]

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        # Not the trajectory strategies' rule: DiffusionNFT has no step k to step after.
        if config.optimizer_step == "per_step":
            return [
                problem(
                    "optimizer_step",
                    config.optimizer_step,
                    "diffusionnft trains on random timesteps of every sample, not on a step k: use per_iteration, "
                    "and diffusionnft.trajectories_per_step to step more often",
                )
            ]
        return []

    def steps_per_iteration(self, group_size: int) -> int:
        """Optimiser steps one iteration takes: ceil(G / trajectories_per_step), or 1."""
        per_step = self.trajectories_per_step or group_size
        return math.ceil(group_size / per_step)


LEAVES_MAX = 4096  # b^|M| leaves per prompt; more is a typo, not a tree


class BranchGRPOSettings(StrategySettings):
    """BranchGRPO's own settings: where the tree branches and how wide, which depths train, learning rate."""

    strategy: ClassVar[str] = "branchgrpo"
    default_learning_rate: ClassVar[float] = 1e-5
    learning_rate_source: ClassVar[str] = "BranchGRPO script: 1e-5"

    branch_steps: list[Annotated[int, Field(le=STEPS_MAX)]] | None = Field(
        None,
        description=(
            "M, the grid steps k where every node branches (0 = noisiest, each < num_steps; the published script "
            "0,3,6,9 at T = 20); null = the published uniform split k = r·⌊T/split_rounds⌋"
        ),
    )
    split_rounds: int = Field(
        4, ge=1, le=STEPS_MAX, description="branch steps of the uniform split when branch_steps is null (published 4)"
    )
    branch_factor: int = Field(2, ge=2, le=COUNT_MAX, description="b, children per node at a branch step (published 2)")
    split_noise_scale: float = Field(
        1.0,
        gt=0.0,
        allow_inf_nan=False,
        description=(
            "c, the branch steps' noise is c·std·ξ while the log-prob keeps std (published tree_split_noise_scale, "
            "script 4.0); 1 = the log-prob is the sampling density"
        ),
    )
    pruned_depths: list[Annotated[int, Field(ge=0, le=STEPS_MAX)]] = Field(
        [],
        description="depth pruning: the edges into these depths (1..num_steps) are sampled and scored but not trained",
    )
    edges_per_step: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description=(
            "shuffle the iteration's trained edges and step the optimiser every this many, one forward per edge "
            "(the published gradient_accumulation_steps, 12); null = one step per iteration, or per trained step "
            "with optimizer_step: per_step"
        ),
    )

    @field_validator("branch_steps")
    @classmethod
    def _distinct_steps_on_a_grid(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("[] has no branch step: give at least one step k, or null for the uniform split")
        negative = [k for k in value if k < 0]
        if negative:
            raise ValueError(
                f"{value!r} has steps {negative} outside the grid: each k is a grid index 0..num_steps−1 (0 = noisiest)"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r} repeats a step: list each branch step once, e.g. [0, 3, 6, 9]")
        return value

    def all_branch_steps(self, num_steps: int) -> list[int]:
        """M on a grid of ``num_steps``: the configured steps, sorted, or r·⌊T/rounds⌋ for r < rounds."""
        if self.branch_steps is not None:
            return sorted(self.branch_steps)
        interval = num_steps // self.split_rounds
        return [r * interval for r in range(self.split_rounds)]

    def trained_steps(self, num_steps: int) -> list[int]:
        """The grid steps i whose edges train: all but those into a pruned depth i + 1."""
        return [i for i in range(num_steps) if i + 1 not in self.pruned_depths]

    def multi_step_setting(self, config: AlgorithmConfig) -> tuple[str, object] | None:
        if self.edges_per_step is not None:
            return ("branchgrpo.edges_per_step", self.edges_per_step)
        return super().multi_step_setting(config)

    def cross_checks(self, config: AlgorithmConfig) -> list[str]:
        problems = []
        t = config.num_steps
        if self.edges_per_step is not None and config.optimizer_step == "per_step":
            problems.append(
                problem(
                    "optimizer_step",
                    config.optimizer_step,
                    f"branchgrpo steps the optimiser every branchgrpo.edges_per_step = {self.edges_per_step} "
                    "edges: use per_iteration, or set branchgrpo.edges_per_step: null",
                )
            )
        outside = [k for k in self.branch_steps or [] if k >= t]
        if outside:
            problems.append(
                problem(
                    "branchgrpo.branch_steps",
                    self.branch_steps,
                    f"steps {outside} are outside the grid: each k must be in 0..{t - 1} (num_steps is {t})",
                )
            )
        if self.branch_steps is None and self.split_rounds > t:
            problems.append(
                problem(
                    "branchgrpo.split_rounds",
                    self.split_rounds,
                    f"the uniform split needs split_rounds ≤ num_steps = {t} distinct steps: lower it, "
                    "or list branchgrpo.branch_steps",
                )
            )
        bad_depths = [d for d in self.pruned_depths if not 1 <= d <= t]
        if bad_depths:
            problems.append(
                problem(
                    "branchgrpo.pruned_depths",
                    self.pruned_depths,
                    f"depths {bad_depths} have no incoming edge: each pruned depth must be in 1..{t}",
                )
            )
        elif set(range(1, t + 1)) <= set(self.pruned_depths):
            problems.append(
                problem("branchgrpo.pruned_depths", self.pruned_depths, "every depth is pruned: leave one to train")
            )
        if not problems and self.branch_factor ** len(self.all_branch_steps(t)) > LEAVES_MAX:
            problems.append(
                problem(
                    "branchgrpo.branch_factor",
                    self.branch_factor,
                    f"b^|M| = {self.branch_factor}^{len(self.all_branch_steps(t))} leaves per prompt is over "
                    f"{LEAVES_MAX}: lower branch_factor or use fewer branch steps",
                )
            )
        return problems


SETTINGS: dict[str, type[StrategySettings]] = {
    section.strategy: section
    for section in (
        G2RPOSettings,
        DanceGRPOSettings,
        MixGRPOSettings,
        FlowGRPOSettings,
        DiffusionNFTSettings,
        BranchGRPOSettings,
    )
}

# preset name -> (strategy, the settings of its section it fixes)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "g2rpo_no_mgai": ("g2rpo", {"granularities": [1]}),  # G²RPO without MGAI: one stride (docs/algorithm.md §9)
}
