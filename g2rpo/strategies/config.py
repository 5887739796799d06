"""The ``algorithm`` section of a run's config: which strategy, the settings every strategy shares,
and one section per strategy with its own knobs.

::

    algorithm:
      strategy: g2rpo          # a name of SETTINGS (`g2rpo config describe` lists them), or a preset such as g2rpo_no_mgai
      num_steps: 16            # shared: grid, group, SDE noise, advantages, ratio clip, batching
      g2rpo:                   # the chosen strategy's own section (G2RPOSettings in strategies/settings.py)
        granularities: [1, 2, 3]

Each strategy's section (:mod:`g2rpo.strategies.settings`) is validated on its own; a knob written in
the wrong place is refused with the section it belongs in. Sections of strategies that are not
chosen are validated too but do not affect the run, so one file can carry settings for each
strategy and a run switches with ``algorithm.strategy=...``: the loaded config keeps their
defaults and leaves them out of the recorded config (``g2rpo config show``, ``to_yaml``) and of
the config hash.

A preset (:data:`g2rpo.strategies.settings.PRESETS`) is read as its strategy with some settings fixed:
``strategy: g2rpo_no_mgai`` loads as ``strategy: g2rpo`` with ``g2rpo.granularities: [1]``. Setting
one of those knobs to another value is an error.

Defaults are the paper's (docs/algorithm.md §6) except where noted: ratio clip ε = 1e-4 comes from the
reference code (the paper gives none); the grid defaults to Flux's own (diffusers ``FluxPipeline``)
rather than the reference code's static shift 3.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from g2rpo.config import COUNT_MAX, PROBLEM_SEPARATOR, STEPS_MAX, Section
from g2rpo.errors import did_you_mean, problem
from g2rpo.strategies.settings import (
    PRESETS,
    SETTINGS,
    BranchGRPOSettings,
    DanceGRPOSettings,
    DiffusionNFTSettings,
    FlowGRPOSettings,
    G2RPOSettings,
    MixGRPOSettings,
    StrategySettings,
)

__all__ = ["AlgorithmConfig"]

PositiveInt = Annotated[int, Field(ge=1, le=COUNT_MAX)]

_NAMES = " | ".join(SETTINGS)
_PRESET_NAMES = ", ".join(
    f"{p} (= {base} with {', '.join(f'{key} {value}' for key, value in fixed.items())})"
    for p, (base, fixed) in PRESETS.items()
)


class AlgorithmConfig(Section):
    """Credit-assignment strategy, the settings all strategies share, and each strategy's own section."""

    strategy: str = Field(
        "g2rpo", description=f"{_NAMES}; or a preset, read as its strategy with settings fixed: {_PRESET_NAMES}"
    )
    num_steps: int = Field(
        16, ge=2, le=STEPS_MAX, description=f"T, denoising steps of the sampler grid (2…{STEPS_MAX}; paper 16)"
    )
    group_size: int = Field(12, ge=2, le=COUNT_MAX, description="G, samples per group (≥ 2; paper 12)")
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
            "SDE noise scale for every strategy: flow_grpo s_σ = η·sqrt(σ/(1−σ)) (docs/algorithm.md §1, reference code) "
            "or dancegrpo s_σ = η (DanceGRPO's original step)"
        ),
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
    g2rpo: G2RPOSettings = Field(
        default_factory=G2RPOSettings, description="G²RPO's own settings (used when strategy is g2rpo)"
    )
    dancegrpo: DanceGRPOSettings = Field(
        default_factory=DanceGRPOSettings, description="DanceGRPO's own settings (used when strategy is dancegrpo)"
    )
    mixgrpo: MixGRPOSettings = Field(
        default_factory=MixGRPOSettings, description="MixGRPO's own settings (used when strategy is mixgrpo)"
    )
    flowgrpo: FlowGRPOSettings = Field(
        default_factory=FlowGRPOSettings, description="Flow-GRPO's own settings (used when strategy is flowgrpo)"
    )
    diffusionnft: DiffusionNFTSettings = Field(
        default_factory=DiffusionNFTSettings,
        description="DiffusionNFT's own settings (used when strategy is diffusionnft)",
    )
    branchgrpo: BranchGRPOSettings = Field(
        default_factory=BranchGRPOSettings, description="BranchGRPO's own settings (used when strategy is branchgrpo)"
    )

    @model_validator(mode="before")
    @classmethod
    def _read_preset(cls, data: Any) -> Any:
        """``strategy: <preset>`` → its strategy, with the preset's settings in that strategy's section."""
        if not isinstance(data, dict) or not isinstance(data.get("strategy"), str) or data["strategy"] not in PRESETS:
            return data
        preset = data["strategy"]
        name, fixed = PRESETS[preset]
        section = data.get(name)
        if isinstance(section, BaseModel):
            given = {key: getattr(section, key) for key in section.model_fields_set}
        elif section is None:
            given = {}
        elif isinstance(section, dict):
            given = dict(section)
        else:  # not a section at all: let the field's own check report it
            return {**data, "strategy": name}
        conflicts = [
            problem(
                f"{name}.{key}",
                given[key],
                f"strategy {preset} sets {name}.{key} to {value!r}: drop {name}.{key}, or use strategy {name}",
            )
            for key, value in fixed.items()
            if key in given and given[key] != value
        ]
        if conflicts:
            raise ValueError(PROBLEM_SEPARATOR.join(conflicts))
        return {**data, "strategy": name, name: {**given, **fixed}}

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        if value not in SETTINGS:
            raise ValueError(
                f"{value!r} is not a strategy{did_you_mean(value, [*SETTINGS, *PRESETS])}: use one of "
                f"{', '.join(SETTINGS)}, or a preset ({', '.join(PRESETS)})"
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> AlgorithmConfig:
        problems = self.settings.cross_checks(self)
        if problems:
            # One ValueError per section: join so every problem is listed (ConfigError prints them).
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _reset_unused_sections(cls, data: Any, handler: ModelWrapValidatorHandler[AlgorithmConfig]) -> AlgorithmConfig:
        # The other strategies' sections were checked; they do not affect the run, so the config keeps
        # their defaults: what `config show` prints is what the object holds.
        config = handler(data)
        unused = {
            name: section()
            for name, section in SETTINGS.items()
            if name != config.strategy and getattr(config, name) != section()
        }
        return config.model_copy(update=unused) if unused else config

    @model_serializer(mode="wrap")
    def _only_the_chosen_section(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The other strategies' sections do not affect the run: keep them out of the record and the hash.
        data = handler(self)
        for name in SETTINGS:
            if name != self.strategy:
                data.pop(name, None)
        return data

    @classmethod
    def unknown_key_fix(cls, key: str, path: str) -> str | None:
        """A strategy's own knob written at the top of the section (or under its old prefixed name)."""
        prefix = f"{path}." if path else ""
        for name, section in SETTINGS.items():
            field = key.removeprefix(f"{name}_")
            if field in section.model_fields:
                return f"{key} is a setting of strategy {name}: write it as {prefix}{name}.{field}"
        return None

    @property
    def settings(self) -> StrategySettings:
        """The chosen strategy's own section."""
        return getattr(self, self.strategy)
