"""Flow-GRPO baseline: an SDE at every step, a KL penalty to the reference policy, the first steps trained.

After the paper (Liu et al., 2025, "Flow-GRPO: Training Flow Matching Models via Online RL") and its
published code (``yifan123/flow_grpo`` at ac4c86e: ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``,
``scripts/train_sd3.py``, ``config/base.py``, ``config/grpo.py``, ``flow_grpo/stat_tracking.py``);
docs/core.md lists where this differs.

Rollout for P prompts: G trajectories per prompt, each from its own initial noise (the script draws
every image's noise independently). Every step is the SDE step of docs/algorithm.md §1, which is Flow-GRPO's:
noise scale s_σ = η·sqrt(σ/(1 − σ)) (σ = 1 replaced by σ[1] in the denominator), η the shared
``eta`` (the script's ``noise_level`` 0.7). The last sample x[T] is scored. Sampling forwards per
prompt: G·T.

Advantages: rewards ``[R, P, G]`` → per reward model (R − mean over the prompt's G) / (std + 1e-4),
std over the whole batch (``flowgrpo.global_std``, the published configs' ``global_std = True``) or
the group's; population std as numpy's → weighted sum → clip ±``advantage_clip`` (the script's
``adv_clip_max`` 5) → ``[P, G]``, broadcast to every trained step.

Loss: the first S = int(f·T) steps of every trajectory (f = ``flowgrpo.train_fraction``, the
script's ``timestep_fraction`` 0.99: T = 16 → 15, the last step is left out). Per step the clipped
surrogate (ε = ``ratio_clip``) plus β·KL(π_θ ‖ π_ref) of that step's Gaussians,
mean((μ_θ − μ_ref)²)/(2·std²) (β = ``flowgrpo.kl_beta``, 0.04 as the GenEval and OCR configs). π_ref
is the reference policy, the frozen base: with LoRA the model with its adapters disabled (the
script's ``disable_adapter()``), from the model's ``reference_velocity``. Training forwards per
prompt: G·S, plus G·S reference forwards when β > 0 (no grad, not back-propagated; counted as
``StepStats.reference_forwards``). Optimiser steps: ``flowgrpo.trajectories_per_step`` = 6
trajectories per prompt (the script steps twice per epoch: at G = 12 twice per iteration). Learning rate 3e-4 (the base config's, a LoRA rate) unless
``train.learning_rate`` is set.

Flow-GRPO-Fast (SDE at one or two steps only) is not built here.

Rollout ``states`` (:class:`~g2rpo.strategies.base.TrajectoryStates`): ``latents``
``[P, G, T+1, L, C]``, ``log_prob_old`` ``[P, G, T]``, ``trained_steps`` ``[P, G, S]`` long (the
same first S steps in every row).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from g2rpo.seeding import Draws
from g2rpo.strategies._shared import (
    check_draws,
    flow_grpo_terminal_advantages,
    initial_noise,
    make_grid,
    sde_trajectories,
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
from g2rpo.strategies.settings import FlowGRPOSettings

__all__ = ["FlowGRPO", "trained_steps_per_trajectory"]


def trained_steps_per_trajectory(num_steps: int, train_fraction: float) -> int:
    """S = int(f·T), at least 1 and at most T (the script's ``num_train_timesteps``)."""
    return min(num_steps, max(1, int(train_fraction * num_steps)))


class FlowGRPO:
    """SDE on every step; the last sample is scored; the first int(f·T) steps train, with a KL to the reference."""

    name = "flowgrpo"
    Settings = FlowGRPOSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: FlowGRPOSettings = config.flowgrpo

    @property
    def trained_per_trajectory(self) -> int:
        return trained_steps_per_trajectory(self.config.num_steps, self.settings.train_fraction)

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
        x = initial_noise(draws, num_prompts, group, latent_shape, device, shared=False)  # [P·G, L, C]
        states, log_probs, _ = sde_trajectories(model, cfg, draws, x, cond, sigmas, nfe)  # x[T] is scored
        first = torch.arange(self.trained_per_trajectory, device=device)  # [S]
        trained = first.expand(num_prompts, group, -1).contiguous()  # [P, G, S]
        return trajectory_rollout(self.name, sigmas, cond, draws, nfe, states, log_probs, trained, group)

    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        """Rewards ``[R, P, G]`` → ``[P, G]`` (:func:`~g2rpo.strategies._shared.flow_grpo_terminal_advantages`)."""
        return flow_grpo_terminal_advantages(self.config, rollout, rewards, reward_weights, self.settings.global_std)

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        return trajectory_loss_terms(
            self.config,
            model,
            rollout,
            advantages,
            self.settings.trajectories_per_step,
            kl_beta=self.settings.kl_beta,
        )
