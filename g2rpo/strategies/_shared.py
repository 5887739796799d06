"""Small pieces the strategy modules share: the grid, batched model calls, terminal advantages, and
for whole-trajectory strategies (DanceGRPO, Flow-GRPO, MixGRPO) the initial noise, the SDE step of
every row, the all-SDE trajectory, the rollout record and the per-step loss loop."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import torch

from g2rpo import core
from g2rpo.seeding import Draws
from g2rpo.strategies.base import (
    Advantages,
    Conditioning,
    LossTerm,
    NFECounters,
    ReferenceVelocityModel,
    Rollout,
    TermStats,
    TrajectoryStates,
    VelocityModel,
)
from g2rpo.strategies.config import AlgorithmConfig


def check_draws(draws: Draws, cond: Conditioning) -> None:
    """A rollout's draws must be keyed by the prompts it samples, one for each row of ``cond``."""
    if len(draws.prompt_indices) != len(cond):
        raise ValueError(f"draws cover {len(draws.prompt_indices)} prompts, cond has {len(cond)}")


def make_grid(config: AlgorithmConfig, image_seq_len: int) -> torch.Tensor:
    """The σ grid ``[T+1]`` the config asks for, for images of ``image_seq_len`` packed tokens."""
    if config.grid == "flux":
        return core.flux_sigmas(config.num_steps, image_seq_len)
    return core.static_shift_sigmas(config.num_steps, config.shift)


def model_sigma(config: AlgorithmConfig, sigma: torch.Tensor) -> torch.Tensor:
    """The σ fed to the model: as is, or ``int(σ·1000)/1000`` (reference code) when truncating."""
    if config.truncate_timestep:
        return torch.floor(sigma * 1000) / 1000
    return sigma


def sample_velocity(
    model: VelocityModel,
    config: AlgorithmConfig,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: Conditioning,
    nfe: NFECounters,
) -> torch.Tensor:
    """v for rows ``x`` ``[B, L, C]`` at ``sigma`` ``[B]`` with ``cond`` (batch B), ``micro_batch`` rows
    per call; counts sampling forwards and calls. No grad."""
    out = []
    for start in range(0, x.shape[0], config.micro_batch):
        stop = min(start + config.micro_batch, x.shape[0])
        rows = slice(start, stop)
        out.append(model(x[rows], model_sigma(config, sigma[rows]), cond[rows]).float())
        nfe.sampling_forwards += stop - start
        nfe.model_calls += 1
    return torch.cat(out) if out else x.new_zeros(x.shape)


def initial_noise(
    draws: Draws,
    num_prompts: int,
    group: int,
    latent_shape: tuple[int, int],
    device: torch.device | str,
    shared: bool,
) -> torch.Tensor:
    """x[0] of every trajectory row ``[P·G, L, C]``, rows (p, g): one noise per prompt (``shared``, keyed
    ``("initial-noise", p)``) or one per trajectory (keyed ``("initial-noise", p, g)``)."""
    if shared:
        x0 = [
            draws.normal(latent_shape, "initial-noise", p, device=device).expand(group, -1, -1)
            for p in range(num_prompts)
        ]
    else:
        x0 = [
            torch.stack([draws.normal(latent_shape, "initial-noise", p, g, device=device) for g in range(group)])
            for p in range(num_prompts)
        ]
    return torch.stack(x0).reshape(num_prompts * group, *latent_shape)  # [P·G, L, C]


def sde_trajectories(
    model: VelocityModel,
    config: AlgorithmConfig,
    draws: Draws,
    x: torch.Tensor,
    cond: Conditioning,
    sigmas: torch.Tensor,
    nfe: NFECounters,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """All T steps of every trajectory row as SDE steps, from x[0] ``[P·G, L, C]`` (rows (p, g), ``cond``
    per prompt). Returns the states x[0..T] (T+1 tensors ``[P·G, L, C]``), the log-probs (T tensors
    ``[P·G]``) and the last step's x₀-prediction x̂₀ = x[T−1] − σ[T−1]·v ``[P·G, L, C]``."""
    group = config.group_size
    row_cond = cond[torch.arange(len(cond)).repeat_interleave(group)]
    states, log_probs = [x], []
    for i in range(config.num_steps):
        v = sample_velocity(model, config, x, sigmas[i].expand(x.shape[0]), row_cond, nfe)
        predicted_x0 = x - sigmas[i] * v
        x, log_prob = trajectory_sde_step(config, draws, x, v, sigmas, i, group)
        log_probs.append(log_prob)  # [P·G]
        states.append(x)
    return states, log_probs, predicted_x0


def trajectory_sde_step(
    config: AlgorithmConfig,
    draws: Draws,
    x: torch.Tensor,
    v: torch.Tensor,
    sigmas: torch.Tensor,
    step: int,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SDE step of every trajectory row at grid step ``step``: ``(x', log π(x' | x))``.

    Rows are ordered (prompt p, branch g), ``x`` ``[P·G, L, C]``; the noise of row (p, g) is keyed
    ``("sde-noise", p, step, g)`` so that a resume or another rank layout draws the same numbers.
    """
    num_prompts = x.shape[0] // group
    latent_shape = tuple(x.shape[1:])
    noise = torch.stack(
        [draws.normal(latent_shape, "sde-noise", p, step, g) for p in range(num_prompts) for g in range(group)]
    ).to(x.device)  # [P·G, L, C]
    x_next, mean, std = core.sde_step(
        x, v, sigmas[step], sigmas[step + 1], config.eta, noise, sigmas[1], config.sde_noise
    )
    return x_next, core.gaussian_log_prob(x_next, mean, std, config.log_prob_reduce)  # [P·G]


def trajectory_rollout(
    name: str,
    sigmas: torch.Tensor,
    cond: Conditioning,
    draws: Draws,
    nfe: NFECounters,
    states: list[torch.Tensor],
    log_probs: list[torch.Tensor],
    trained_steps: torch.Tensor,
    group: int,
    window: list[int] | None = None,
    scored: torch.Tensor | None = None,
) -> Rollout:
    """The rollout record of a whole-trajectory strategy from its per-step states and log-probs.

    ``states``: T+1 tensors ``[P·G, L, C]``; ``log_probs``: T tensors ``[P·G]`` (NaN where a step was
    an ODE step); ``trained_steps`` ``[P, G, S]``. ``scored`` ``[P·G, L, C]``: the latents the rewards
    score (default the last state). Rewards come back as ``[R, P, G]``.
    """
    num_prompts = len(cond)
    t_steps = len(log_probs)
    length, channels = states[-1].shape[1:]
    return Rollout(
        strategy=name,
        sigmas=sigmas,
        cond=cond,
        draws=draws,
        final_latents=states[-1] if scored is None else scored,
        reward_shape=(num_prompts, group),
        reward_dims=("prompt", "branch"),
        final_prompt=torch.arange(num_prompts).repeat_interleave(group),
        nfe=nfe,
        states=TrajectoryStates(
            latents=torch.stack(states, dim=1).reshape(num_prompts, group, t_steps + 1, length, channels),
            log_prob_old=torch.stack(log_probs, dim=1).reshape(num_prompts, group, t_steps),
            trained_steps=trained_steps,
            window=window,
        ),
    )


def check_rewards(rollout: Rollout, rewards: torch.Tensor) -> int:
    """The number of reward models R, after checking ``rewards`` is ``[R, *reward_shape]``."""
    if rewards.ndim != len(rollout.reward_shape) + 1 or tuple(rewards.shape[1:]) != rollout.reward_shape:
        raise ValueError(
            f"rewards must be [R, {', '.join(rollout.reward_dims)}] = [R, *{rollout.reward_shape}], "
            f"got {tuple(rewards.shape)}"
        )
    return rewards.shape[0]


def reward_weight_tensor(reward_weights: Sequence[float] | None, num_rewards: int) -> torch.Tensor:
    if reward_weights is None:
        return torch.ones(num_rewards)
    w = torch.as_tensor(list(reward_weights), dtype=torch.float32)
    if w.shape != (num_rewards,):
        raise ValueError(
            f"reward_weights must have one weight per reward model ({num_rewards}), got {list(reward_weights)}"
        )
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"reward_weights must be finite numbers, got {list(reward_weights)}")
    return w


def terminal_advantages(
    config: AlgorithmConfig,
    rollout: Rollout,
    rewards: torch.Tensor,
    reward_weights: Sequence[float] | None,
) -> Advantages:
    """Whole-trajectory advantages for rewards ``[R, P, G]``: per reward model group-normalised,
    weighted sum, clipped once; a group with a NaN/inf reward is dropped. Returns ``[P, G]``."""
    num_rewards = check_rewards(rollout, rewards)
    rewards = rewards.float().cpu()
    w = reward_weight_tensor(reward_weights, num_rewards)
    valid = torch.isfinite(rewards).all(dim=-1).all(dim=0)  # [P]
    safe = torch.where(valid[None, :, None], rewards, torch.zeros_like(rewards))  # [R, P, G]
    adv = core.group_advantages(safe, config.advantage_eps, config.unbiased_std)  # [R, P, G]
    mixed = core.mix_advantages(adv[:, None], [1.0], w, config.advantage_clip)  # [P, G]
    mixed = torch.where(valid[:, None], mixed, torch.zeros_like(mixed))
    return Advantages(mixed, valid, dropped_groups=int((~valid).sum()), total_groups=int(valid.numel()))


FLOW_GRPO_ADVANTAGE_EPS = 1e-4  # flow_grpo/stat_tracking.py: std + 1e-4 (DiffusionNFT's script uses it too)


def flow_grpo_terminal_advantages(
    config: AlgorithmConfig,
    rollout: Rollout,
    rewards: torch.Tensor,
    reward_weights: Sequence[float] | None,
    global_std: bool,
) -> Advantages:
    """Flow-GRPO's whole-trajectory advantages (Flow-GRPO, DiffusionNFT): rewards ``[R, P, G]`` → ``[P, G]``
    by :func:`g2rpo.core.flow_grpo_advantages` (the batch std when ``global_std``); a prompt with a NaN/inf
    reward is dropped and left out of the batch std."""
    num_rewards = check_rewards(rollout, rewards)
    rewards = rewards.float().cpu()
    w = reward_weight_tensor(reward_weights, num_rewards)
    valid = torch.isfinite(rewards).all(dim=-1).all(dim=0)  # [P]
    adv = torch.zeros_like(rewards)  # [R, P, G]
    if bool(valid.any()):
        adv[:, valid] = core.flow_grpo_advantages(rewards[:, valid], FLOW_GRPO_ADVANTAGE_EPS, global_std)
    mixed = core.mix_advantages(adv[:, None], [1.0], w, config.advantage_clip)  # [P, G]
    mixed = torch.where(valid[:, None], mixed, torch.zeros_like(mixed))
    return Advantages(mixed, valid, dropped_groups=int((~valid).sum()), total_groups=int(valid.numel()))


def surrogate_term(
    config: AlgorithmConfig,
    log_prob_new: torch.Tensor,
    log_prob_old: torch.Tensor,
    advantages: torch.Tensor,
    scale: float,
    forwards: int,
    step_optimizer: bool,
    step_index: int | None,
) -> LossTerm:
    """The clipped surrogate over the given elements (mean), times ``scale``, as a LossTerm."""
    loss, stats = core.clipped_surrogate(
        log_prob_new, log_prob_old.to(log_prob_new.device), advantages.to(log_prob_new.device), config.ratio_clip
    )
    loss = loss * scale
    return LossTerm(
        loss=loss,
        stats=TermStats(
            loss=float(loss.detach()),
            clip_fraction=float(stats["clip_fraction"]),
            ratio_mean=float(stats["ratio_mean"]),
            ratio_max=float(stats["ratio_max"]),
            num_ratios=log_prob_new.numel(),
            forwards=forwards,
            step_index=step_index,
        ),
        step_optimizer=step_optimizer,
    )


def trajectory_loss_terms(
    config: AlgorithmConfig,
    model: VelocityModel,
    rollout: Rollout,
    advantages: Advantages,
    trajectories_per_step: int | None = None,
    kl_beta: float = 0.0,
) -> Iterator[LossTerm]:
    """Loss terms of whole-trajectory strategies: for each trained slot s, one forward per
    trajectory at its trained step ``trained[p, g, s]`` (rows at different σ are batched), the
    trajectory's advantage broadcast to that step.

    ``trajectories_per_step`` None: one accumulation over the whole iteration, each term scaled so
    that their sum is the mean surrogate over valid trajectories and trained slots (the optimiser
    steps after the last term, or after each slot with ``optimizer_step: per_step``).
    ``trajectories_per_step`` a: the published scripts' gradient accumulation — branches
    ``[c·a, (c+1)·a)`` of every valid prompt form accumulation c (the last one may be smaller), its
    terms scaled so that they sum to the mean surrogate over that accumulation's trajectories and
    slots, and the optimiser steps after each: ``ceil(G / a)`` steps per iteration.

    ``kl_beta`` β > 0 (Flow-GRPO): each term adds β·mean KL(π_θ ‖ π_ref) of its rows' SDE steps
    (:func:`g2rpo.core.gaussian_mean_kl`), π_ref from ``model.reference_velocity`` (no grad; one
    more forward per row, not back-propagated). A model without it is refused.
    """
    reference = None
    if kl_beta > 0:
        if not isinstance(model, ReferenceVelocityModel):
            raise ValueError(
                f"a KL penalty (β = {kl_beta}) needs the reference policy: the velocity model "
                f"{type(model).__name__} has no reference_velocity (train with LoRA, whose base is the reference, "
                "or set the strategy's kl_beta: 0)"
            )
        reference = model.reference_velocity
    st = rollout.states
    states, lp_old, trained = st.latents, st.log_prob_old, st.trained_steps  # [P,G,T+1,L,C] [P,G,T] [P,G,S]
    sigmas = rollout.sigmas
    num_prompts, group, num_slots = trained.shape
    valid_p = advantages.valid.nonzero().flatten()  # prompts kept
    if valid_p.numel() == 0:
        return
    per_step = trajectories_per_step or group
    accumulations = []  # (rows p [n], rows g [n]) of each optimiser step
    for first in range(0, group, per_step):
        branches = torch.arange(first, min(first + per_step, group))
        accumulations.append((valid_p.repeat_interleave(branches.numel()), branches.repeat(valid_p.numel())))
    chunk = config.train_micro_batch or valid_p.numel() * group
    per_slot = trajectories_per_step is None and config.optimizer_step == "per_step"
    for acc_p, acc_g in accumulations:
        total = acc_p.numel() * num_slots
        work = [(s, start) for s in range(num_slots) for start in range(0, acc_p.numel(), chunk)]
        for n, (s, start) in enumerate(work):
            device = states.device
            p, g = acc_p[start : start + chunk].to(device), acc_g[start : start + chunk].to(device)
            i = trained[p, g, s]  # [n] grid index per row
            x = states[p, g, i]  # [n, L, C]
            sig, sig_next = sigmas[i], sigmas[i + 1]  # [n]
            v = model(x, model_sigma(config, sig), rollout.cond[p.cpu()]).float()
            mean, std = core.sde_mean_std(x, v, sig, sig_next, config.eta, sigmas[1], config.sde_noise)
            lp_new = core.gaussian_log_prob(states[p, g, i + 1].to(device), mean, std, config.log_prob_reduce)  # [n]
            last = n + 1 == len(work)
            step = last or (per_slot and work[n + 1][0] != s)
            term = surrogate_term(
                config,
                lp_new,
                lp_old[p, g, i],
                advantages.values[p.cpu(), g.cpu()],
                scale=p.numel() / total,
                forwards=p.numel(),
                step_optimizer=step,
                step_index=None,
            )
            if reference is not None:
                with torch.no_grad():
                    v_ref = reference(x, model_sigma(config, sig), rollout.cond[p.cpu()]).float()
                    mean_ref, _ = core.sde_mean_std(x, v_ref, sig, sig_next, config.eta, sigmas[1], config.sde_noise)
                kl = core.gaussian_mean_kl(mean, mean_ref, std).mean()  # scalar, over the term's rows
                scaled = kl_beta * kl * (p.numel() / total)
                term = LossTerm(
                    term.loss + scaled,
                    dataclasses.replace(
                        term.stats,
                        loss=term.stats.loss + float(scaled.detach()),
                        kl=float(kl.detach()),
                        reference_forwards=p.numel(),
                    ),
                    term.step_optimizer,
                )
            yield term
