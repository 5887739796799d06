"""MixGRPO baseline: SDE only inside a sliding window of steps, ODE elsewhere (docs/algorithm.md §9).

MixGRPO (Li et al., 2025, "MixGRPO: Unlocking Flow-based GRPO Efficiency with Mixed ODE-SDE";
code ``Tencent-Hunyuan/MixGRPO``, ``fastvideo/utils/grpo_states.py`` and
``scripts/finetune/finetune_flux_grpo_MixGRPO.sh``) samples G trajectories per prompt from a
shared initial noise, uses SDE steps only for the grid indices inside a window and trains only
those steps. Its defaults, which this module takes over: window size W = 4 (``group_size=4``),
the window advances by s = 1 step (``prog_overlap_step=1``, "progressive" strategy) every
τ = 25 iterations (``iters_per_group=25``), window indices stay below T − 2 (``max_timesteps =
sampling_steps − 2``), and it rolls back to the start after the last position (``--roll_back``).
Their grid has 25 steps; here T is ``num_steps`` (16 by default) like every strategy.

The window is a pure function of the iteration (:func:`window_steps`), so a resumed run uses the
window an uninterrupted one would: with n = iteration // τ and positions 0, s, 2s, … ≤ T − 3,
the window starts at l = (n mod #positions)·s and is ``range(l, min(l + W, T − 2))``.

The SDE step is G²RPO's (docs/algorithm.md §1), which is also the MixGRPO script's (``--flow_grpo_sampling``);
the script runs no DPM-Solver (``dpm_algorithm_type="null"``; MixGRPO-Flash does). The ODE prefix
before the window is deterministic from the shared noise, so it is computed once per prompt, not G
times (same values). Sampling forwards per prompt: l + G·(T − l); training
forwards: G·|window|. Advantages and loss as DanceGRPO (terminal advantage broadcast to the
window steps; one term per window step), but the last sample x[T] is scored (the script's
``--drop_last_sample`` is off; the steps after the window are ODE steps, so x[T] carries no
sampling noise). Optimiser steps: ``mixgrpo.trajectories_per_step`` = 3 trajectories per prompt
(the script's gradient accumulation; G = 12 → 4 steps per iteration), learning rate 1e-5 unless
``train.learning_rate`` is set. docs/core.md lists every remaining difference.

Rollout ``states`` (:class:`~g2rpo.strategies.base.TrajectoryStates`): ``latents``
``[P, G, T+1, L, C]``, ``log_prob_old`` ``[P, G, T]`` (NaN outside the window), ``trained_steps``
``[P, G, |window|]``, ``window``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from g2rpo import core
from g2rpo.seeding import Draws
from g2rpo.strategies._shared import (
    check_draws,
    make_grid,
    sample_velocity,
    terminal_advantages,
    trajectory_loss_terms,
    trajectory_rollout,
    trajectory_sde_step,
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
from g2rpo.strategies.settings import MixGRPOSettings

__all__ = ["MixGRPO", "window_steps"]


def window_steps(
    iteration: int, num_steps: int, window_size: int = 4, shift: int = 1, iters_per_shift: int = 25
) -> list[int]:
    """The SDE window at ``iteration`` (grid indices; see the module docstring)."""
    last_start = num_steps - 3  # window indices stay < T − 2
    if last_start < 0:
        raise ValueError(f"MixGRPO needs num_steps ≥ 3, got {num_steps}")
    positions = last_start // shift + 1
    start = ((iteration // iters_per_shift) % positions) * shift
    return list(range(start, min(start + window_size, num_steps - 2)))


class MixGRPO:
    """SDE inside a sliding window (trained), ODE before and after it."""

    name = "mixgrpo"
    Settings = MixGRPOSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: MixGRPOSettings = config.mixgrpo

    def window(self, iteration: int) -> list[int]:
        s = self.settings
        return window_steps(iteration, self.config.num_steps, s.window_size, s.window_shift, s.iters_per_shift)

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
        length = latent_shape[0]
        num_prompts, group, t_steps = len(cond), cfg.group_size, cfg.num_steps
        check_draws(draws, cond)
        sigmas = make_grid(cfg, length).to(device)
        nfe = NFECounters()
        window = self.window(draws.iteration)
        start = window[0]

        # ODE prefix once per prompt (deterministic from the shared noise), then G rows per prompt.
        x = torch.stack([draws.normal(latent_shape, "initial-noise", p, device=device) for p in range(num_prompts)])
        prefix = [x]
        for i in range(start):
            v = sample_velocity(model, cfg, x, sigmas[i].expand(num_prompts), cond, nfe)
            x = core.ode_step(x, v, sigmas[i], sigmas[i + 1])
            prefix.append(x)
        states = [s.repeat_interleave(group, dim=0) for s in prefix]  # rows (p, g)
        x = states[-1]
        row_cond = cond[torch.arange(num_prompts).repeat_interleave(group)]
        log_probs = [torch.full((num_prompts * group,), float("nan"), device=device)] * start
        for i in range(start, t_steps):
            v = sample_velocity(model, cfg, x, sigmas[i].expand(x.shape[0]), row_cond, nfe)
            if i in window:
                x, log_prob = trajectory_sde_step(cfg, draws, x, v, sigmas, i, group)
                log_probs.append(log_prob)
            else:
                x = core.ode_step(x, v, sigmas[i], sigmas[i + 1])
                log_probs.append(torch.full((x.shape[0],), float("nan"), device=device))
            states.append(x)
        trained = torch.tensor(window, device=device).expand(num_prompts, group, len(window))
        return trajectory_rollout(self.name, sigmas, cond, draws, nfe, states, log_probs, trained, group, window=window)

    # Copied from g2rpo.strategies.dancegrpo.DanceGRPO.advantages
    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        return terminal_advantages(self.config, rollout, rewards, reward_weights)

    # Copied from g2rpo.strategies.dancegrpo.DanceGRPO.loss_terms
    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        return trajectory_loss_terms(self.config, model, rollout, advantages, self.settings.trajectories_per_step)
