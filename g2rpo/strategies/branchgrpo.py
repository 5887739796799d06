"""BranchGRPO: SDE rollouts that branch into a tree at chosen steps, depth-wise tree advantages.

After the paper (Li et al., 2025, "BranchGRPO: Stable and Efficient GRPO with Structured Branching in
Diffusion Models", arXiv 2509.06040) and its published code (``Fredreic1849/BranchGRPO`` at ffc3c90:
``fastvideo/train_branchgrpo_flux.py``, ``scripts/finetune/finetune_flux_branchgrpo_8gpus.sh``);
docs/core.md lists where this differs.

Rollout for P prompts: one tree per prompt, rooted at the prompt's initial noise. Every step is the
shared SDE step (docs/algorithm.md §1); at a branch step k ∈ M every node gets b children (b =
``branchgrpo.branch_factor``, 2 as published) from b independent noises around the one mean, elsewhere
one child. So the depth-i nodes number n_i = b^{|{k ∈ M : k < i}|} (:func:`g2rpo.core.tree_widths`),
the N = b^{|M|} leaves share their prefixes, and each node's forward serves all its children. M is
``branchgrpo.branch_steps``, or (null) the published uniform split k_r = r·⌊T/rounds⌋, r = 0 …
rounds − 1 (``split_rounds`` 4: T = 16 → {0, 4, 8, 12}). The leaves are scored on the last step's
x₀-prediction x̂₀ = x[T−1] − σ[T−1]·v (siblings of a last-step branch share it), as published.
``split_noise_scale`` c multiplies the noise of the branch steps; the log-probability keeps the
step's own std (published: ``tree_split_noise_scale``, which the script sets to 4). All nodes of a
depth, over every prompt, are one batch of ``micro_batch`` rows per call. Sampling forwards per
prompt: Σ_{i<T} n_i (T = 16, M = {0, 4, 8, 12}, b = 2: 1 + 4·2 + 4·4 + 4·8 + 3·16 = 105).

Advantages (:func:`g2rpo.core.tree_advantages`): a node's value is the mean reward of the leaves
under it; at each depth 1 … T the values of the prompt's n_i nodes are normalised, (V − mean)/(std +
δ), Bessel std, 0 for a depth of one node or a std below 1e-6. Several reward models: per model,
weighted sum, clipped ±``advantage_clip`` once. Rewards ``[R, P, N]`` → ``[P, Σ_{d=1}^{T} n_d]``,
the depths one after another.

Loss: every edge (node at depth i → child at depth i + 1) is one clipped-surrogate ratio with its
child's advantage, for each trained step i: every step except those whose child depth is listed in
``pruned_depths`` (the published depth pruning, fixed). One forward per parent node serves its b
children (the same mean). One loss term per trained step (split by ``train_micro_batch``), scaled so
that the terms sum to the mean surrogate over all the iteration's edges; the optimiser steps once per
iteration, or after each trained step with ``optimizer_step: per_step``. Training forwards (=
backwards) per prompt: Σ_{trained i} n_i. Learning rate 1e-5 (the script's) unless
``train.learning_rate`` is set.

Published stepping (``edges_per_step`` k, the script's ``gradient_accumulation_steps`` 12): the
iteration's trained edges, over all kept prompts, are shuffled (:class:`~g2rpo.seeding.Draws` key
``edge-order``) and every k of them form one optimiser step, the last one whatever is left. Each edge
is its own forward row (a window's rows are one call), so from the second step on the ratios move
off 1 and the clip acts. Each edge's surrogate is divided by k·E, E = Σ_{trained i} n_{i+1} the edges
of one tree (the script's loss / (gradient_accumulation_steps · transitions per tree)). Training
forwards per prompt: E; optimiser steps ⌈P·E / k⌉.

Not built: width pruning, the depth-pruning sliding window, the mixed ODE/SDE tree and the
probability-weighted node values (all off in the published script).

Rollout ``states`` (:class:`~g2rpo.strategies.base.TreeStates`): ``widths`` ``[T+1]``, ``latents``
T+1 tensors ``[P, n_i, L, C]``, ``log_prob_old`` T tensors ``[P, n_{i+1}]``, ``trained_steps``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from g2rpo import core
from g2rpo.seeding import Draws
from g2rpo.strategies._shared import (
    check_draws,
    check_rewards,
    make_grid,
    model_sigma,
    reward_weight_tensor,
    sample_velocity,
    surrogate_term,
)
from g2rpo.strategies.base import (
    Advantages,
    Conditioning,
    LossTerm,
    NFECounters,
    Rollout,
    TreeStates,
    VelocityModel,
)
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.settings import BranchGRPOSettings

__all__ = ["BranchGRPO"]

STD_FLOOR = 1e-6  # published: a depth whose values' std is below this gets zero advantages


class BranchGRPO:
    """A tree of SDE rollouts per prompt, branching at M; depth-wise tree advantages train every edge."""

    name = "branchgrpo"
    Settings = BranchGRPOSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: BranchGRPOSettings = config.branchgrpo
        self.branch_steps = self.settings.all_branch_steps(config.num_steps)  # M
        self.widths = core.tree_widths(config.num_steps, self.branch_steps, self.settings.branch_factor)

    @property
    def leaves(self) -> int:
        return self.widths[-1]

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
        length, channels = latent_shape
        num_prompts, widths = len(cond), self.widths
        check_draws(draws, cond)
        sigmas = make_grid(cfg, length).to(device)
        nfe = NFECounters()
        x = torch.stack([draws.normal(latent_shape, "initial-noise", p, device=device) for p in range(num_prompts)])
        states, log_probs = [x[:, None]], []  # depth 0: [P, 1, L, C]
        scored = x
        for i in range(cfg.num_steps):
            n, children = widths[i], widths[i + 1] // widths[i]
            rows = states[-1].reshape(num_prompts * n, length, channels)  # rows (p, j)
            row_cond = cond[torch.arange(num_prompts).repeat_interleave(n)]
            v = sample_velocity(model, cfg, rows, sigmas[i].expand(rows.shape[0]), row_cond, nfe)
            mean, std = core.sde_mean_std(rows, v, sigmas[i], sigmas[i + 1], cfg.eta, sigmas[1], cfg.sde_noise)
            noise = torch.stack(
                [
                    draws.normal(latent_shape, "sde-noise", p, i, j, device=device)
                    for p in range(num_prompts)
                    for j in range(widths[i + 1])
                ]
            )  # [P·n_{i+1}, L, C], child j of the depth
            scale = self.settings.split_noise_scale if children > 1 else 1.0
            mean = mean.repeat_interleave(children, dim=0)  # [P·n_{i+1}, L, C], one mean for b siblings
            child = mean + std * scale * noise
            log_probs.append(core.gaussian_log_prob(child, mean, std, cfg.log_prob_reduce).reshape(num_prompts, -1))
            if i == cfg.num_steps - 1:  # the leaves are scored on the last step's x₀-prediction
                scored = core.data_prediction(rows, v, sigmas[i]).repeat_interleave(children, dim=0)
            states.append(child.reshape(num_prompts, widths[i + 1], length, channels))
        leaves = widths[-1]
        return Rollout(
            strategy=self.name,
            sigmas=sigmas,
            cond=cond,
            draws=draws,
            final_latents=scored,  # [P·N, L, C]
            reward_shape=(num_prompts, leaves),
            reward_dims=("prompt", "branch"),
            final_prompt=torch.arange(num_prompts).repeat_interleave(leaves),
            nfe=nfe,
            states=TreeStates(
                widths=list(widths),
                latents=states,
                log_prob_old=log_probs,
                trained_steps=self.settings.trained_steps(cfg.num_steps),
            ),
        )

    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        """Rewards ``[R, P, N]`` → ``[P, Σ_{d=1}^{T} n_d]``; a prompt with a NaN/inf reward is dropped."""
        cfg = self.config
        num_rewards = check_rewards(rollout, rewards)
        rewards = rewards.float().cpu()
        w = reward_weight_tensor(reward_weights, num_rewards)
        valid = torch.isfinite(rewards).all(dim=-1).all(dim=0)  # [P]
        safe = torch.where(valid[None, :, None], rewards, torch.zeros_like(rewards))  # [R, P, N]
        adv = core.tree_advantages(
            safe, rollout.states.widths[1:], cfg.advantage_eps, STD_FLOOR, cfg.unbiased_std
        )  # [R, P, E]
        mixed = core.mix_advantages(adv[:, None], [1.0], w, cfg.advantage_clip)  # [P, E]
        mixed = torch.where(valid[:, None], mixed, torch.zeros_like(mixed))
        return Advantages(mixed, valid, dropped_groups=int((~valid).sum()), total_groups=int(valid.numel()))

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        cfg = self.config
        st = rollout.states
        widths, sigmas = st.widths, rollout.sigmas
        valid_p = advantages.valid.nonzero().flatten()  # prompts kept
        if valid_p.numel() == 0 or not st.trained_steps:
            return
        offsets = [0]  # where depth d's nodes start in the advantage's last axis (depths 1..T)
        for n in widths[1:]:
            offsets.append(offsets[-1] + n)
        if self.settings.edges_per_step is not None:
            yield from self._shuffled_edge_terms(model, rollout, advantages, valid_p, offsets)
            return
        total = valid_p.numel() * sum(widths[i + 1] for i in st.trained_steps)  # edges trained this iteration
        work = []  # (step i, parent rows (p, j) of this forward)
        for i in st.trained_steps:
            n = widths[i]
            p = valid_p.repeat_interleave(n)
            j = torch.arange(n).repeat(valid_p.numel())
            chunk = cfg.train_micro_batch or p.numel()
            work += [(i, p[s : s + chunk], j[s : s + chunk]) for s in range(0, p.numel(), chunk)]
        for n_work, (i, p, j) in enumerate(work):
            children = widths[i + 1] // widths[i]
            device = st.latents[i].device
            pd, jd = p.to(device), j.to(device)
            x = st.latents[i][pd, jd]  # [n, L, C]
            sig = sigmas[i].expand(x.shape[0])
            v = model(x, model_sigma(cfg, sig), rollout.cond[p]).float()  # one forward per parent node
            mean, std = core.sde_mean_std(x, v, sigmas[i], sigmas[i + 1], cfg.eta, sigmas[1], cfg.sde_noise)
            num_prompts = st.latents[i + 1].shape[0]
            kids = st.latents[i + 1].reshape(num_prompts, widths[i], children, *x.shape[1:])[pd, jd]  # [n, b, L, C]
            lp_new = core.gaussian_log_prob(kids, mean[:, None], std, cfg.log_prob_reduce, batch_dims=2)  # [n, b]
            lp_old = st.log_prob_old[i].reshape(num_prompts, widths[i], children)[pd, jd]  # [n, b]
            depth = advantages.values[:, offsets[i] : offsets[i + 1]]  # [P, n_{i+1}], advantages of depth i + 1
            adv = depth.reshape(-1, widths[i], children)[p, j]  # [n, b]
            last = n_work + 1 == len(work)
            step = last or (cfg.optimizer_step == "per_step" and work[n_work + 1][0] != i)
            yield surrogate_term(
                cfg,
                lp_new,
                lp_old,
                adv,
                scale=lp_new.numel() / total,
                forwards=x.shape[0],
                step_optimizer=step,
                step_index=i,
            )

    def _shuffled_edge_terms(
        self,
        model: VelocityModel,
        rollout: Rollout,
        advantages: Advantages,
        valid_p: torch.Tensor,
        offsets: list[int],
    ) -> Iterator[LossTerm]:
        """The published stepping: every ``edges_per_step`` shuffled edges one optimiser step, one row per edge."""
        cfg, st = self.config, rollout.states
        widths, sigmas = st.widths, rollout.sigmas
        per_step = self.settings.edges_per_step
        per_tree = sum(widths[i + 1] for i in st.trained_steps)  # E, the trained edges of one tree
        edges = [(p, i, c) for p in valid_p.tolist() for i in st.trained_steps for c in range(widths[i + 1])]
        order = rollout.draws.permutation(len(edges), "edge-order", 0).tolist()
        chunk = cfg.train_micro_batch or per_step
        for first in range(0, len(edges), per_step):
            window = [edges[e] for e in order[first : first + per_step]]  # (prompt p, step i, child c at depth i+1)
            for start in range(0, len(window), chunk):
                rows = window[start : start + chunk]
                p = torch.tensor([q for q, _, _ in rows])
                i = torch.tensor([k for _, k, _ in rows])
                parent = [c // (widths[k + 1] // widths[k]) for _, k, c in rows]  # its node j at depth i
                x = torch.stack([st.latents[k][q, j] for (q, k, _), j in zip(rows, parent)])  # [w, L, C]
                child = torch.stack([st.latents[k + 1][q, c] for q, k, c in rows])  # [w, L, C]
                lp_old = torch.stack([st.log_prob_old[k][q, c] for q, k, c in rows])  # [w]
                adv = torch.stack([advantages.values[q, offsets[k] + c] for q, k, c in rows])  # [w]
                sig, sig_next = sigmas[i.to(sigmas.device)], sigmas[(i + 1).to(sigmas.device)]  # [w]
                v = model(x, model_sigma(cfg, sig), rollout.cond[p]).float()
                mean, std = core.sde_mean_std(x, v, sig, sig_next, cfg.eta, sigmas[1], cfg.sde_noise)
                lp_new = core.gaussian_log_prob(child, mean, std, cfg.log_prob_reduce)  # [w]
                yield surrogate_term(
                    cfg,
                    lp_new,
                    lp_old,
                    adv,
                    scale=len(rows) / (per_step * per_tree),
                    forwards=len(rows),
                    step_optimizer=start + chunk >= len(window),
                    step_index=None,
                )
