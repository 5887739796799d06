"""Deterministic evaluation of a Flux policy: ODE samples from fixed seeds, decoded and scored.

For each prompt ``p`` (conditioning ``c_p``) and seed ``s`` the initial noise ``x_0`` is the noise
``FluxPipeline`` draws for ``torch.Generator().manual_seed(s)`` (:func:`g2rpo.models.flux.initial_noise`),
and the sample is the Euler ODE over the grid ``σ_0 = 1 > σ_1 > … > σ_T = 0``::

    x_{i+1} = x_i + (σ_{i+1} − σ_i) · v_θ(x_i, σ_i, c_p)            (g2rpo.core.ode_step)

No noise is drawn along the way, so the same (prompt, seed) gives the same image for the same
weights, and a change of score between two policies is caused by the weights alone: "the reward
rose" is measured on the same inputs (a paired comparison). The images are decoded with the VAE
(:func:`g2rpo.models.flux.decode_latents`) and scored by every reward model given.

This is the evaluation the G²RPO reference code approximates with its anchor's "eval reward"
(which it logs from the training rollout); here it is a separate, seeded pass on a fixed set.
The scores convert to the registry's per-prompt format (:meth:`EvalResult.eval_scores`), and
:func:`save_before_after_grid` / :func:`save_reward_curve` draw them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from g2rpo import core
from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.errors import G2RPOError, problem
from g2rpo.models.flux import decode_latents, initial_noise, vae_scale_factor_of
from g2rpo.rewards.scoring import score_rewards

__all__ = ["EvalResult", "ode_sample", "sample_rows", "sample_and_score", "save_before_after_grid", "save_reward_curve"]


@dataclass
class EvalResult:
    """Images and scores of one evaluation, indexed ``[prompt, seed]``."""

    prompts: list[str]
    seeds: list[int]
    images: torch.Tensor  # [P, S, 3, H, W] float32 in [0, 1]
    scores: dict[str, torch.Tensor]  # reward name -> [P, S]

    def mean(self, name: str | None = None) -> float:
        """Mean score over every (prompt, seed) of reward ``name`` (the only one when None)."""
        if name is None:
            if len(self.scores) != 1:
                raise G2RPOError(problem("name", None, f"name one of the rewards: {', '.join(self.scores)}"))
            (name,) = self.scores
        return float(self.scores[name].double().mean())

    def eval_scores(self, prompt_set: str, prompt_set_sha256: str | None = None) -> Any:
        """The registry's per-prompt record (:class:`g2rpo.artifacts.scores.EvalScores`); prompt ids are
        ``p<i>``, the prompt's position in :attr:`prompts`."""
        items = [
            ScoreItem(
                prompt_id=f"p{p}",
                seed=seed,
                scores={name: float(values[p, s]) for name, values in self.scores.items()},
            )
            for p in range(len(self.prompts))
            for s, seed in enumerate(self.seeds)
        ]
        return EvalScores(
            prompt_set=prompt_set, prompt_set_sha256=prompt_set_sha256, seeds=list(self.seeds), items=items
        )


@torch.no_grad()
def ode_sample(
    velocity: Any,
    cond: Any,
    seeds: Sequence[int],
    sigmas: torch.Tensor,
    *,
    vae_scale_factor: int = 8,
    micro_batch: int = 32,
) -> torch.Tensor:
    """Deterministic ODE samples ``[P·S, L, C]`` (prompt-major: row ``p·S + s``).

    ``velocity`` is a :class:`~g2rpo.models.flux.FluxVelocity` (it knows the image size),
    ``cond`` its conditioning for P prompts, ``sigmas`` ``[T+1]`` from 1 down to 0. Each row's
    initial noise is FluxPipeline's for ``manual_seed(seed)``, the same for every prompt.
    """
    if not seeds:
        raise G2RPOError(problem("seeds", list(seeds), "give at least one sampling seed, e.g. [0, 1]"))
    if sigmas.ndim != 1 or float(sigmas[0]) != 1.0 or float(sigmas[-1]) != 0.0:
        raise G2RPOError(problem("sigmas", sigmas.tolist(), "pass a grid [T+1] from 1 down to 0 (core.flux_sigmas)"))
    num_prompts, num_seeds = len(cond), len(seeds)
    latent_channels = velocity.latent_shape[1] // 4
    noise = initial_noise(
        [torch.Generator().manual_seed(int(s)) for s in seeds],
        velocity.height,
        velocity.width,
        latent_channels=latent_channels,
        vae_scale_factor=vae_scale_factor,
    )  # [S, L, C]
    device = next(velocity.parameters()).device
    x = noise.repeat(num_prompts, 1, 1).to(device)  # [P·S, L, C]
    rows = cond[torch.arange(num_prompts).repeat_interleave(num_seeds)].to(device)  # batch P·S
    out = []
    for start in range(0, x.shape[0], micro_batch):
        xb, cb = x[start : start + micro_batch], rows[start : start + micro_batch]
        for i in range(sigmas.numel() - 1):
            sigma = sigmas[i].to(device).expand(xb.shape[0])  # [b]
            xb = core.ode_step(xb, velocity(xb, sigma, cb), sigmas[i], sigmas[i + 1])
        out.append(xb)
    return torch.cat(out)


@torch.no_grad()
def sample_rows(
    velocity: Any,
    vae: Any,
    cond: Any,
    seeds: Sequence[int],
    sigmas: torch.Tensor,
    *,
    micro_batch: int = 32,
    decode_micro_batch: int = 16,
) -> torch.Tensor:
    """Decoded ODE samples ``[N, 3, H, W]`` (CPU, in [0, 1]) of N arbitrary (conditioning, seed) rows.

    Row ``i`` starts from FluxPipeline's noise for ``manual_seed(seeds[i])`` and is conditioned on
    ``cond[i]``: the resumable evaluation samples one chunk of its (prompt, seed) items at a time.
    A row's image depends only on its own inputs and on how the rows are batched, so the same chunk
    gives the same images on every run.
    """
    if len(cond) != len(seeds) or not len(seeds):
        raise G2RPOError(problem("seeds", list(seeds), f"give one seed per conditioning row ({len(cond)})"))
    if sigmas.ndim != 1 or float(sigmas[0]) != 1.0 or float(sigmas[-1]) != 0.0:
        raise G2RPOError(problem("sigmas", sigmas.tolist(), "pass a grid [T+1] from 1 down to 0 (core.flux_sigmas)"))
    scale = vae_scale_factor_of(vae)
    noise = initial_noise(
        [torch.Generator().manual_seed(int(s)) for s in seeds],
        velocity.height,
        velocity.width,
        latent_channels=velocity.latent_shape[1] // 4,
        vae_scale_factor=scale,
    )  # [N, L, C]
    device = next(velocity.parameters()).device
    out = []
    for start in range(0, noise.shape[0], micro_batch):
        xb = noise[start : start + micro_batch].to(device)
        cb = cond[torch.arange(start, start + xb.shape[0])].to(device)
        for i in range(sigmas.numel() - 1):
            sigma = sigmas[i].to(device).expand(xb.shape[0])  # [b]
            xb = core.ode_step(xb, velocity(xb, sigma, cb), sigmas[i], sigmas[i + 1])
        out.append(xb)
    return decode_latents(vae, torch.cat(out), velocity.height, velocity.width, micro_batch=decode_micro_batch).cpu()


@torch.no_grad()
def sample_and_score(
    velocity: Any,
    vae: Any,
    cond: Any,
    prompts: Sequence[str],
    seeds: Sequence[int],
    rewards: Mapping[str, Any],
    sigmas: torch.Tensor,
    *,
    micro_batch: int = 32,
    decode_micro_batch: int = 16,
    reward_batch: int = 64,
) -> EvalResult:
    """ODE-sample every (prompt, seed), decode, and score with each reward model.

    ``cond`` holds the conditioning of ``prompts`` (same order); ``rewards`` maps a name to a
    :class:`g2rpo.rewards.base.RewardModel`. Returns images ``[P, S, 3, H, W]`` and, per reward,
    scores ``[P, S]``.
    """
    if len(prompts) != len(cond):
        raise G2RPOError(problem("prompts", len(prompts), f"give one prompt per conditioning row ({len(cond)})"))
    if not rewards:
        raise G2RPOError(problem("rewards", {}, "give at least one reward model to score with"))
    num_prompts, num_seeds = len(prompts), len(seeds)
    latents = ode_sample(
        velocity, cond, seeds, sigmas, vae_scale_factor=vae_scale_factor_of(vae), micro_batch=micro_batch
    )  # [P·S, L, C]
    images = decode_latents(vae, latents, velocity.height, velocity.width, micro_batch=decode_micro_batch).cpu()
    texts = [prompts[p] for p in range(num_prompts) for _ in range(num_seeds)]
    rows = score_rewards(list(rewards.values()), images, texts, reward_batch)  # [R, P·S]
    scores = dict(zip(rewards, rows.reshape(len(rewards), num_prompts, num_seeds)))  # name -> [P, S]
    return EvalResult(
        prompts=list(prompts),
        seeds=[int(s) for s in seeds],
        images=images.reshape(num_prompts, num_seeds, *images.shape[1:]),
        scores=scores,
    )


def save_before_after_grid(before: EvalResult, after: EvalResult, path: str | Path, reward: str | None = None) -> Path:
    """A PNG grid: one row per prompt, the seeds as columns, before | after, each image titled
    with its score. Both results must cover the same prompts and seeds."""
    if before.prompts != after.prompts or before.seeds != after.seeds:
        raise G2RPOError(problem("after", "prompts/seeds", "evaluate before and after on the same prompts and seeds"))
    name = reward or next(iter(before.scores))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, seeds = len(before.prompts), len(before.seeds)
    fig, axes = plt.subplots(rows, 2 * seeds, figsize=(1.6 * 2 * seeds, 1.75 * rows + 0.6), dpi=100, squeeze=False)
    for p in range(rows):
        for side, result in enumerate((before, after)):
            for s in range(seeds):
                ax = axes[p, side * seeds + s]
                ax.imshow(result.images[p, s].permute(1, 2, 0).numpy(), interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                label = f"{'before' if side == 0 else 'after'} s{result.seeds[s]}" if p == 0 else ""
                ax.set_title(f"{label}\n{float(result.scores[name][p, s]):.3f}".strip(), fontsize=7)
        axes[p, 0].set_ylabel(_short(before.prompts[p]), fontsize=6, rotation=0, ha="right", va="center")
    fig.suptitle(
        f"{name}: before {before.mean(name):.4f} | after {after.mean(name):.4f} (rows: prompts, columns: seeds)",
        fontsize=8,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_reward_curve(
    rollout_rewards: Sequence[float],
    path: str | Path,
    before: float | None = None,
    after: float | None = None,
    title: str = "",
) -> Path:
    """A PNG of the mean rollout reward per iteration (sampled before that iteration's update), with
    the fixed-set evaluation before training (at 0) and after the last update (at N) as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=100)
    ax.plot(
        range(len(rollout_rewards)),
        list(rollout_rewards),
        marker="o",
        markersize=3,
        label="rollout mean (training prompts)",
    )
    if before is not None and after is not None:
        ax.plot(
            [0, len(rollout_rewards)], [before, after], "s--", color="tab:red", label="ODE eval (fixed prompts, seeds)"
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _short(text: str, width: int = 22) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
