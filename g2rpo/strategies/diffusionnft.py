"""DiffusionNFT baseline: reward-weighted, negative-aware flow matching on the forward process.

After the paper (Zheng et al., 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward
Process") and its published code (``NVlabs/DiffusionNFT`` at 24af555: ``scripts/train_nft_sd3.py``,
``config/nft.py``, ``config/base.py``, ``flow_grpo/stat_tracking.py``); docs/core.md lists where
this differs.

Old policy θ_old: a float32 copy of the policy's trainable tensors, equal to θ at the first
rollout. Before the rollout of iteration n > 0 it moves toward the weights the last iteration left,
θ_old ← d·θ_old + (1 − d)·θ, d = :func:`old_policy_decay` of the optimiser steps taken so far
(n × the steps one iteration takes): 0 for the first ``old_decay_flat`` steps, then
min((steps − flat)·``old_decay_rate``, ``old_decay_max``) (the published ``decay_type`` 1: 0,
0.001, 0.5). θ_old both samples the rollouts and gives v_old in the loss. Its tensors are the
strategy's state (:meth:`DiffusionNFT.state_dict`), checkpointed by the trainer.

Rollout for P prompts: G trajectories per prompt from independent initial noises, sampled by θ_old
with the deterministic ODE (``sampler``: Euler, or DPM-Solver++(2M) as the published ``dpm2``), no
likelihoods. The clean sample x₀ = x[T] is scored. Then per trajectory S = int(f·T) distinct grid
timesteps are drawn (a random permutation of the T grid σ's, its first S; f = ``train_fraction``,
the published ``timestep_fraction`` 0.99), and for each a fresh ε: x_t = (1 − σ)·x₀ + σ·ε. θ_old's
velocity there (v_old) and, with ``kl_beta`` > 0, the reference policy's (v_ref, the LoRA base)
are computed in the rollout, without grad. Sampling forwards per prompt: G·T + G·S (+ G·S).

Advantages: rewards ``[R, P, G]`` → per reward model (R − mean over the prompt's G) / (std + 1e-4),
std of the whole batch (``global_std``, published) or the group's, population std → weighted sum →
clip ±``advantage_clip`` (the published ``adv_clip_max`` 5) → ``[P, G]``. The loss turns them into
optimality probabilities r = A/(2·5) + ½ (:func:`g2rpo.core.nft_optimality`).

Loss per (sample, timestep): ``advantage_clip`` × :func:`g2rpo.core.diffusion_nft_loss` (the
positive/negative policies v^± = v_old ± β·(v_θ − v_old) around θ_old, β = ``beta``, each error
divided by its own detached mean absolute error, the sum over β) + ``kl_beta``·mean (v_θ − v_ref)²;
its mean over every sample and trained timestep of an accumulation. Training forwards per prompt:
G·S. One optimiser step per iteration unless ``trajectories_per_step`` splits the G samples of
every prompt into several (the published ``gradient_step_per_epoch``). Learning rate 3e-4 (the
published LoRA rate) unless ``train.learning_rate`` is set.

Rollout ``states`` (:class:`~g2rpo.strategies.base.NFTStates`): ``clean`` ``[P, G, L, C]``,
``steps`` ``[P, G, S]``, ``noisy``/``v_old``/``v_ref`` ``[P, G, S, L, C]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from g2rpo import core
from g2rpo.seeding import Draws
from g2rpo.strategies._shared import (
    check_draws,
    flow_grpo_terminal_advantages,
    initial_noise,
    make_grid,
    model_sigma,
    sample_velocity,
)
from g2rpo.strategies.base import (
    Advantages,
    Conditioning,
    LossTerm,
    NFECounters,
    NFTStates,
    ReferenceVelocityModel,
    Rollout,
    TermStats,
    VelocityModel,
)
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.settings import DiffusionNFTSettings

__all__ = ["DiffusionNFT", "OldPolicy", "old_policy_decay", "trained_timesteps_per_sample"]

WEIGHT_FLOOR = 1e-5  # train_nft_sd3.py: the adaptive weight's .clip(min=0.00001)


def trained_timesteps_per_sample(num_steps: int, train_fraction: float) -> int:
    """S = int(f·T), at least 1 and at most T (the script's ``num_train_timesteps``)."""
    return min(num_steps, max(1, int(train_fraction * num_steps)))


def old_policy_decay(optimizer_steps: int, flat: int, rate: float, maximum: float) -> float:
    """The old policy's decay d after ``optimizer_steps`` steps: 0 while steps < ``flat``, then
    min((steps − flat)·rate, maximum) (the script's ``return_decay``)."""
    if optimizer_steps < flat:
        return 0.0
    return min((optimizer_steps - flat) * rate, maximum)


class OldPolicy:
    """θ_old, a float32 copy of a model's trainable tensors, soft-updated toward θ once per iteration.

    The model needs ``named_parameters()`` (an ``nn.Module``; the DeepSpeed engine at ZeRO ≤ 2); its
    trainable tensors are those with ``requires_grad`` (the LoRA adapters alone with LoRA).
    """

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] | None = None
        self.iteration: int | None = None  # the iteration whose rollout θ_old was last brought up to

    @staticmethod
    def trainable(model: VelocityModel) -> dict[str, torch.nn.Parameter]:
        named = getattr(model, "named_parameters", None)
        if named is None:
            raise ValueError(
                f"DiffusionNFT keeps an old copy of the policy's trainable tensors: the velocity model "
                f"{type(model).__name__} has no named_parameters() (pass the nn.Module)"
            )
        return {name: p for name, p in named() if p.requires_grad}

    @torch.no_grad()
    def advance(self, model: VelocityModel, iteration: int, decay: float) -> None:
        """Bring θ_old up to ``iteration``: a copy of θ the first time, else one soft update
        θ_old ← d·θ_old + (1 − d)·θ when the last iteration it saw is an earlier one."""
        trainable = self.trainable(model)
        if self.tensors is None or self.iteration is None:
            self.tensors = {name: p.detach().float().clone() for name, p in trainable.items()}
        elif iteration < self.iteration:
            raise ValueError(
                f"the old policy is at iteration {self.iteration}, the rollout asks for {iteration}: iterations "
                "only go forward (resume from a checkpoint to go back)"
            )
        elif iteration > self.iteration:
            self._check_names(trainable)
            for name, p in trainable.items():
                self.tensors[name].mul_(decay).add_(p.detach().float(), alpha=1.0 - decay)
        self.iteration = iteration

    @contextmanager
    def swapped_in(self, model: VelocityModel) -> Iterator[None]:
        """The model computes with θ_old inside the block; θ is put back bit for bit after it."""
        if self.tensors is None:
            raise ValueError("the old policy has no tensors yet: advance it first")
        trainable = self.trainable(model)
        self._check_names(trainable)
        with torch.no_grad():
            current = {name: p.detach().clone() for name, p in trainable.items()}
            for name, p in trainable.items():
                p.copy_(self.tensors[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in trainable.items():
                    p.copy_(current[name])

    def _check_names(self, trainable: dict[str, torch.nn.Parameter]) -> None:
        if self.tensors is not None and set(trainable) != set(self.tensors):
            raise ValueError(
                f"the old policy holds {len(self.tensors)} tensors, the model has {len(trainable)} other trainable "
                "ones: resume with the config the checkpoint was made with"
            )


class DiffusionNFT:
    """θ_old samples with the ODE; the clean samples train θ on the forward process, pulled toward
    the well-rewarded ones and pushed from the others around θ_old."""

    name = "diffusionnft"
    Settings = DiffusionNFTSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: DiffusionNFTSettings = config.diffusionnft
        self.old = OldPolicy()

    @property
    def trained_per_sample(self) -> int:
        return trained_timesteps_per_sample(self.config.num_steps, self.settings.train_fraction)

    # ------------------------------------------------------------------ state across iterations

    def state_dict(self) -> dict[str, Any]:
        if self.old.tensors is None:
            return {}
        return {"iteration": self.old.iteration, "old_policy": dict(self.old.tensors)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            self.old = OldPolicy()
            return
        self.old.tensors = {name: t.float().clone() for name, t in state["old_policy"].items()}
        self.old.iteration = int(state["iteration"])

    # ------------------------------------------------------------------ rollout

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
        cfg, s = self.config, self.settings
        length, channels = latent_shape
        num_prompts, group, t_steps, slots = len(cond), cfg.group_size, cfg.num_steps, self.trained_per_sample
        check_draws(draws, cond)
        reference = None
        if s.kl_beta > 0:
            if not isinstance(model, ReferenceVelocityModel):
                raise ValueError(
                    f"a KL weight (kl_beta = {s.kl_beta}) needs the reference policy: the velocity model "
                    f"{type(model).__name__} has no reference_velocity (train with LoRA, whose base is the "
                    "reference, or set diffusionnft.kl_beta: 0)"
                )
            reference = model.reference_velocity
        steps_so_far = draws.iteration * s.steps_per_iteration(group)
        decay = old_policy_decay(steps_so_far, s.old_decay_flat, s.old_decay_rate, s.old_decay_max)
        self.old.advance(model, draws.iteration, decay)

        sigmas = make_grid(cfg, length).to(device)
        nfe = NFECounters()
        rows = [(p, g) for p in range(num_prompts) for g in range(group)]
        x = initial_noise(draws, num_prompts, group, latent_shape, device, shared=False)  # [P·G, L, C]
        row_cond = cond[torch.arange(num_prompts).repeat_interleave(group)]
        steps = torch.stack([draws.permutation(t_steps, "nft-timesteps", p, g)[:slots] for p, g in rows])  # [P·G, S]
        noise = torch.stack(
            [draws.normal((slots, length, channels), "nft-noise", p, g, device=device) for p, g in rows]
        )
        steps = steps.to(device)
        with self.old.swapped_in(model):
            x0_prev, sigma_prev = None, None
            for i in range(t_steps):
                v = sample_velocity(model, cfg, x, sigmas[i].expand(x.shape[0]), row_cond, nfe)
                if s.sampler == "dpmpp_2m":
                    x, x0_prev = core.dpmpp_2m_step(x, v, sigmas[i], sigmas[i + 1], x0_prev, sigma_prev)
                    sigma_prev = sigmas[i]
                else:
                    x = core.ode_step(x, v, sigmas[i], sigmas[i + 1])
            clean = x  # [P·G, L, C]
            sigma = sigmas[steps]  # [P·G, S]
            noisy = (1 - sigma)[..., None, None] * clean[:, None] + sigma[..., None, None] * noise  # [P·G, S, L, C]
            flat_x, flat_sigma = noisy.reshape(-1, length, channels), sigma.reshape(-1)  # [P·G·S, L, C] [P·G·S]
            flat_cond = cond[torch.arange(num_prompts).repeat_interleave(group * slots)]
            v_old = sample_velocity(model, cfg, flat_x, flat_sigma, flat_cond, nfe)  # [P·G·S, L, C]
        v_ref = None
        if reference is not None:
            v_ref = sample_velocity(reference, cfg, flat_x, flat_sigma, flat_cond, nfe)
        shape = (num_prompts, group, slots, length, channels)
        return Rollout(
            strategy=self.name,
            sigmas=sigmas,
            cond=cond,
            draws=draws,
            final_latents=clean,
            reward_shape=(num_prompts, group),
            reward_dims=("prompt", "branch"),
            final_prompt=torch.arange(num_prompts).repeat_interleave(group),
            nfe=nfe,
            states=NFTStates(
                clean=clean.reshape(num_prompts, group, length, channels),
                steps=steps.reshape(num_prompts, group, slots),
                noisy=noisy.reshape(shape),
                v_old=v_old.reshape(shape),
                v_ref=None if v_ref is None else v_ref.reshape(shape),
            ),
        )

    # ------------------------------------------------------------------ advantages and loss

    # Copied from g2rpo.strategies.flowgrpo.FlowGRPO.advantages
    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        """Rewards ``[R, P, G]`` → ``[P, G]`` (:func:`~g2rpo.strategies._shared.flow_grpo_terminal_advantages`)."""
        return flow_grpo_terminal_advantages(self.config, rollout, rewards, reward_weights, self.settings.global_std)

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        """For each trained slot s, one forward of θ per sample at its s-th timestep (rows at different σ
        batched; ``train_micro_batch`` rows at most), each term scaled so that an accumulation's terms
        sum to the mean loss over its samples and slots; the optimiser steps after each accumulation."""
        cfg, s = self.config, self.settings
        st = rollout.states
        if not isinstance(st, NFTStates):
            raise ValueError(f"a DiffusionNFT loss needs a DiffusionNFT rollout, got one of {rollout.strategy}")
        num_prompts, group, num_slots = st.steps.shape
        valid_p = advantages.valid.nonzero().flatten()  # prompts kept
        if valid_p.numel() == 0:
            return
        r = core.nft_optimality(advantages.values, cfg.advantage_clip)  # [P, G]
        per_step = s.trajectories_per_step or group
        accumulations = []  # (rows p [n], rows g [n]) of each optimiser step
        for first in range(0, group, per_step):
            branches = torch.arange(first, min(first + per_step, group))
            accumulations.append((valid_p.repeat_interleave(branches.numel()), branches.repeat(valid_p.numel())))
        chunk = cfg.train_micro_batch or valid_p.numel() * group
        device = st.clean.device
        for acc_p, acc_g in accumulations:
            total = acc_p.numel() * num_slots
            work = [(slot, start) for slot in range(num_slots) for start in range(0, acc_p.numel(), chunk)]
            for n, (slot, start) in enumerate(work):
                p, g = acc_p[start : start + chunk].to(device), acc_g[start : start + chunk].to(device)
                sigma = rollout.sigmas[st.steps[p, g, slot]]  # [n]
                x_t = st.noisy[p, g, slot]  # [n, L, C]
                v = model(x_t, model_sigma(cfg, sigma), rollout.cond[p.cpu()]).float()  # [n, L, C], with grad
                per_sample = cfg.advantage_clip * core.diffusion_nft_loss(
                    v, st.v_old[p, g, slot], x_t, st.clean[p, g], sigma, r[p.cpu(), g.cpu()].to(device), s.beta
                )  # [n]
                kl = None
                if st.v_ref is not None:
                    kl = ((v - st.v_ref[p, g, slot]) ** 2).mean(dim=tuple(range(1, v.ndim)))  # [n]
                    per_sample = per_sample + s.kl_beta * kl
                loss = per_sample.mean() * (p.numel() / total)
                yield LossTerm(
                    loss=loss,
                    stats=TermStats(
                        loss=float(loss.detach()),
                        clip_fraction=math.nan,  # no importance ratio in DiffusionNFT
                        ratio_mean=math.nan,
                        ratio_max=math.nan,
                        num_ratios=p.numel(),
                        forwards=p.numel(),
                        kl=None if kl is None else float(kl.detach().mean()),
                    ),
                    step_optimizer=n + 1 == len(work),
                )
