"""The ``rewards`` config section: which reward models score the images, where their weights
are, and each one's weight in the advantage sum.

YAML::

    rewards:
      batch_size: 16                      # images per reward-model call (default for every model)
      models:
        - name: hps_v21                   # g2rpo rewards list
          weight: 1.0                     # w_r in Σ_r w_r A_r
          weights: /models/hps/HPS_v2.1_compressed.pt     # or s3://bucket/prefix (a published artifact)
        - name: clip
          weight: 1.0
          weights: /models/DFN5B-CLIP-ViT-H-14-384        # open_clip local-dir folder

Per-model optional keys: ``arch`` (open_clip architecture), ``arch_config`` (open_clip config
or BLIP ``med_config.json``), ``vision_config``, ``tokenizer`` (a folder), ``backbone`` (the
aesthetic head's CLIP folder), ``max_new_tokens`` (the UnifiedReward judge),
``batch_size``, ``dtype``. A key a head does not use is an error
(nothing is silently ignored); whether the files exist is checked when the head is built
(:func:`g2rpo.rewards.registry.build_reward`), so a config can be validated on a machine
without the weights. The default is the paper's setting, HPS-v2.1 + CLIP with equal weights;
configs for machines without weights use ``jpeg_compressibility``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from g2rpo.config import COUNT_MAX, PROBLEM_SEPARATOR, Section
from g2rpo.errors import did_you_mean, problem
from g2rpo.rewards.specs import REWARDS

__all__ = ["RewardModelConfig", "RewardsConfig", "OPTIONAL_KEYS"]

# Optional per-model keys; each head's spec (g2rpo.rewards.specs) says which ones it uses.
OPTIONAL_KEYS = (
    "weights",
    "arch",
    "arch_config",
    "vision_config",
    "tokenizer",
    "backbone",
    "max_new_tokens",
)


class RewardModelConfig(Section):
    """One reward model in the advantage sum."""

    name: str = Field(
        description="registered reward name (`g2rpo rewards list`), e.g. hps_v21, clip, jpeg_compressibility"
    )
    weight: float = Field(
        1.0, description="w_r, this reward's weight in the advantage sum Σ_r w_r A_r (docs/algorithm.md §4)"
    )
    weights: str | None = Field(
        None, description="weights location: a local file/folder or s3://bucket/prefix of a published artifact"
    )
    arch: str | None = Field(
        None, description="open_clip architecture name (hps_v21 default ViT-H-14; clip with a bare state dict)"
    )
    arch_config: str | None = Field(
        None,
        description="architecture config file: open_clip_config.json (hps_v21, clip) or BLIP med_config.json (image_reward)",
    )
    vision_config: str | None = Field(
        None, description="image_reward only: BLIP ViT config JSON (default ViT-L/16 at 224)"
    )
    tokenizer: str | None = Field(
        None,
        description="image_reward: folder with bert-base-uncased vocab.txt; pickscore, unified_reward_*: processor folder",
    )
    backbone: str | None = Field(None, description="aesthetic only: open_clip ViT-L/14 (OpenAI) local-dir folder")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=COUNT_MAX,
        description="unified_reward_* only: most tokens the judge may write (default the official script's: "
        "512 for unified_reward_score, 4096 for the semantic task)",
    )
    batch_size: int | None = Field(
        None, ge=1, le=COUNT_MAX, description="images per call for this model (default: rewards.batch_size)"
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] | None = Field(
        None,
        description="dtype the reward model runs in (default: its official one: float32, or for unified_reward_* "
        "auto = the checkpoint's stored dtype, as the official loader's torch_dtype='auto')",
    )

    @property
    def fetches(self) -> bool:
        """Whether building this head downloads an ``s3://`` artifact into the cache (rewards.cache_dir)."""
        return any(str(getattr(self, key) or "").startswith("s3://") for key in OPTIONAL_KEYS)

    @model_validator(mode="after")
    def _check(self) -> RewardModelConfig:
        problems = []
        if self.name not in REWARDS:
            problems.append(
                problem(
                    "name",
                    self.name,
                    f"unknown reward{did_you_mean(self.name, REWARDS)}; valid names: {', '.join(sorted(REWARDS))}",
                )
            )
        else:
            spec = REWARDS[self.name]
            for key in OPTIONAL_KEYS:
                if getattr(self, key) is not None and key not in spec.keys:
                    used = ", ".join(spec.keys) or "none"
                    problems.append(
                        problem(key, getattr(self, key), f"'{self.name}' does not use it (its keys: {used}); remove it")
                    )
            if self.dtype == "auto" and spec.dtype != "auto":
                problems.append(
                    problem(
                        "dtype",
                        self.dtype,
                        f"'{self.name}' has no stored dtype to keep: use float32, bfloat16 or float16",
                    )
                )
        if not math.isfinite(self.weight):
            problems.append(problem("weight", self.weight, "must be a finite number"))
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


class RewardsConfig(Section):
    """Reward models scored on every decoded image (paper: HPS-v2.1 + CLIP)."""

    models: list[RewardModelConfig] = Field(
        default_factory=lambda: [RewardModelConfig(name="hps_v21"), RewardModelConfig(name="clip")],
        min_length=1,
        description="reward models and their weights in the advantage sum",
    )
    batch_size: int = Field(
        16, ge=1, le=COUNT_MAX, description="images per reward-model call (a model's own batch_size overrides it)"
    )
    cache_dir: str | None = Field(
        None, description="where s3:// weights are cached (default $G2RPO_CACHE_DIR or ~/.cache/g2rpo)"
    )

    @model_validator(mode="after")
    def _check(self) -> RewardsConfig:
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        problems = []
        if duplicates:
            problems.append(problem("models", duplicates, "each reward may appear once; merge the entries"))
        if all(m.weight == 0 for m in self.models):
            problems.append(problem("models[*].weight", 0, "at least one reward needs a non-zero weight"))
        if problems:
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    def batch_size_of(self, model: RewardModelConfig) -> int:
        return model.batch_size or self.batch_size
