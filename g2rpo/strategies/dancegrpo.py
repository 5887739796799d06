"""DanceGRPO baseline: SDE at every step, terminal advantage broadcast (docs/algorithm.md §9), after the published
code (``XueZeyue/DanceGRPO``, ``fastvideo/train_grpo_flux.py``; docs/core.md lists where this differs).

Rollout for P prompts: G trajectories per prompt, from one shared initial noise per prompt
(DanceGRPO's ``init_same_noise``; ``dancegrpo.shared_noise: false`` draws one per trajectory,
Flow-GRPO style). Every step is an SDE step (the same step as G²RPO's, docs/algorithm.md §1, so a comparison
isolates credit assignment; ``sde_noise: dancegrpo`` gives DanceGRPO's own noise form, s_σ = η). All
P·G trajectories advance together, ``micro_batch`` rows per model call. Sampling forwards per
prompt: G·T.

Scored latent: the x₀-prediction of the last step, x̂₀ = x[T−1] − σ[T−1]·v (DanceGRPO decodes
``pred_original``, not the last noisy sample x[T]).

Advantages: rewards ``[R, P, G]`` → per reward model group-normalised over G → weighted sum →
clip ±``advantage_clip`` → ``[P, G]``, broadcast to every step of the trajectory.

Loss: the last step is never trained (DanceGRPO slices it off); each trajectory trains a random
subset of S = max(1, int(f·(T−1))) of the first T−1 steps (f = ``dancegrpo.train_fraction`` = 0.6,
``timestep_fraction``; T = 16: 9 steps; drawn per trajectory, seeded). Slot s ∈ 0..S−1 is one loss
term with one forward per trajectory at its s-th trained step (rows at different σ are batched):
training forwards per prompt = G·S (G = 12, T = 16: 108).

Optimiser steps: ``dancegrpo.trajectories_per_step`` = a (the script's gradient accumulation, 4)
trajectories per step — branches ``[c·a, (c+1)·a)`` of every prompt form step c, so G = 12 steps the
optimiser 3 times per iteration, each on the mean surrogate over its trajectories and trained
steps; null steps once per iteration on the mean over all. Learning rate 1e-5 (the script's)
unless ``train.learning_rate`` is set.

Rollout ``states`` (:class:`~g2rpo.strategies.base.TrajectoryStates`): ``latents``
``[P, G, T+1, L, C]``, ``log_prob_old`` ``[P, G, T]``, ``trained_steps`` ``[P, G, S]`` long.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from g2rpo.seeding import Draws
from g2rpo.strategies._shared import (
    check_draws,
    initial_noise,
    make_grid,
    sde_trajectories,
    terminal_advantages,
    trajectory_loss_terms,
    trajectory_rollout,
)
from g2rpo.strategies.base import (
    Advantages,
    Conditioning,
    LossTerm,
    NFECounters,
    Rollout,
    VelocityModel,
)
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.settings import DanceGRPOSettings

__all__ = ["DanceGRPO"]


class DanceGRPO:
    """SDE on every step; the x₀-prediction is scored; the terminal advantage trains a random 60 % of
    the first T−1 steps."""

    name = "dancegrpo"
    Settings = DanceGRPOSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: DanceGRPOSettings = config.dancegrpo

    @property
    def trainable_steps(self) -> int:
        """The steps a trajectory may train: all but the last (T−1)."""
        return self.config.num_steps - 1

    @property
    def trained_per_trajectory(self) -> int:
        return max(1, int(self.settings.train_fraction * self.trainable_steps))

    @torch.no_grad()
    def rollout(
        self,
        model: VelocityModel,
        cond: Conditioning,
        draws: Draws,
        latent_shape: tuple[int, int],
        *,
        device: torch.device | str = "cpu",
    ) -> Rollout:
        cfg = self.config
        num_prompts, group = len(cond), cfg.group_size
        check_draws(draws, cond)
        sigmas = make_grid(cfg, latent_shape[0]).to(device)
        nfe = NFECounters()
        x = initial_noise(draws, num_prompts, group, latent_shape, device, self.settings.shared_noise)  # [P·G, L, C]
        # x̂₀ of the last step is scored, not x[T]
        states, log_probs, predicted_x0 = sde_trajectories(model, cfg, draws, x, cond, sigmas, nfe)
        trained = torch.stack(
            [
                torch.stack(
                    [
                        draws.permutation(self.trainable_steps, "trained-steps", p, g)[: self.trained_per_trajectory]
                        for g in range(group)
                    ]
                )
                for p in range(num_prompts)
            ]
        )  # [P, G, S]
        return trajectory_rollout(
            self.name, sigmas, cond, draws, nfe, states, log_probs, trained.to(device), group, scored=predicted_x0
        )

    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        return terminal_advantages(self.config, rollout, rewards, reward_weights)

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        return trajectory_loss_terms(self.config, model, rollout, advantages, self.settings.trajectories_per_step)
