"""How good a shapes model is, read off its samples by the task's exact rewards.

:func:`shapes_quality` samples every held-out prompt at a few seeds with the deterministic ODE
sampler (the evaluation's own :func:`~g2rpo.evaluation.sampling.sample_and_score`) and reports what
issue-level questions need: the fraction drawn in the asked colour per colour (can RL find a signal
for every colour?), the shape score per shape, every metric's mean, and the fraction of prompts
whose samples all agree on the colour — all right or all wrong. Such a group carries no colour
signal: GRPO's advantages are group-normalised, so a group that scores alike gives none.

The held-out prompts are the pipeline's: the prepare step's split of the task's 360 prompts
(:func:`g2rpo.data.split_prompts`, split seed 0), the 64 that ``make demo`` evaluates on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from g2rpo import core
from g2rpo.data import split_prompts
from g2rpo.models.flux import FluxVelocity
from g2rpo.models.loading import load_text_encoder, load_transformer, load_vae
from g2rpo.models.shapes import GUIDANCE
from g2rpo.rewards.shapes import MEASURES, ShapesReward
from g2rpo.tasks.shapes import COLOURS, IMAGE_SIZE, SHAPES, all_scenes, parse_prompt

from .sampling import sample_and_score

__all__ = ["HELD_OUT", "ShapesQuality", "held_out_prompts", "shapes_quality"]

HELD_OUT = 64  # the prepare step's test split of the task's prompts (split seed 0): the demo's held-out set


def held_out_prompts(count: int = HELD_OUT, seed: int = 0) -> list[str]:
    """The prompts the pipeline's prepare step holds out of the task's 360 (``test_size=count``)."""
    return split_prompts([s.prompt for s in all_scenes()], count, seed=seed)[1]


@dataclass(frozen=True)
class ShapesQuality:
    """A shapes model's samples, scored exactly (means over prompts × seeds)."""

    prompts: int
    seeds: list[int]
    num_steps: int
    means: dict[str, float]  # every shapes metric
    colour_match_by_colour: dict[str, float]  # fraction drawn in the asked colour, per asked colour
    shape_by_shape: dict[str, float]  # shapes_shape's mean per asked shape
    colour_match_by_shape: dict[str, float]
    flat_colour_groups: float  # fraction of prompts whose samples are all right or all wrong in colour

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """The report as aligned text lines."""
        lines = [f"{self.prompts} held-out prompts × seeds {self.seeds}, T = {self.num_steps}"]
        lines.append("  " + "  ".join(f"{_short(k)} {v:.3f}" for k, v in self.means.items()))
        lines.append(
            "  asked colour drawn: " + "  ".join(f"{c} {v:.0%}" for c, v in self.colour_match_by_colour.items())
        )
        lines.append("  shape score:        " + "  ".join(f"{s} {v:.3f}" for s, v in self.shape_by_shape.items()))
        lines.append(f"  prompts whose samples all agree in colour (no colour signal): {self.flat_colour_groups:.0%}")
        return "\n".join(lines)


def _short(metric: str) -> str:
    return metric.removeprefix("shapes_")


@torch.no_grad()
def shapes_quality(
    model: str | Path,
    prompts: list[str] | None = None,
    seeds: list[int] | None = None,
    num_steps: int = 6,
) -> ShapesQuality:
    """Sample ``prompts`` (default: :func:`held_out_prompts`) × ``seeds`` (default 0–3) from the
    shapes model at ``model`` in ``num_steps`` Euler steps on Flux's grid, and score them."""
    prompts = prompts if prompts is not None else held_out_prompts()
    seeds = seeds if seeds is not None else [0, 1, 2, 3]
    scenes = [parse_prompt(p) for p in prompts]
    transformer = load_transformer(str(model), dtype="float32")
    vae = load_vae(str(model), dtype="float32")
    encoder = load_text_encoder(str(model), dtype="float32")
    velocity = FluxVelocity(transformer, height=IMAGE_SIZE, width=IMAGE_SIZE, guidance=GUIDANCE).eval()
    sigmas = core.flux_sigmas(num_steps, velocity.latent_shape[0])
    rewards = {name: ShapesReward(name) for name in MEASURES}
    result = sample_and_score(
        velocity,
        vae,
        encoder.encode(prompts),
        prompts,
        seeds,
        rewards,
        sigmas,
        micro_batch=256,
        decode_micro_batch=64,
        reward_batch=512,
    )
    match, shape = result.scores["shapes_colour_match"], result.scores["shapes_shape"]  # [P, S]

    def mean_where(scores: torch.Tensor, keep: list[bool]) -> float:
        rows = scores[torch.tensor(keep)]
        return float(rows.double().mean()) if rows.numel() else float("nan")

    agree = (match.sum(1) == 0) | (match.sum(1) == match.shape[1])  # [P]
    return ShapesQuality(
        prompts=len(prompts),
        seeds=list(seeds),
        num_steps=num_steps,
        means={name: result.mean(name) for name in MEASURES},
        colour_match_by_colour={c: mean_where(match, [s.colour == c for s in scenes]) for c in COLOURS},
        shape_by_shape={k: mean_where(shape, [s.shape == k for s in scenes]) for k in SHAPES},
        colour_match_by_shape={k: mean_where(match, [s.shape == k for s in scenes]) for k in SHAPES},
        flat_colour_groups=float(agree.double().mean()),
    )
