"""G²RPO: singular stochastic sampling + multi-granularity advantage integration (docs/algorithm.md §3–§5).

Rollout for P prompts (all model calls batched, ``micro_batch`` rows per call):

1. **Anchor.** One shared initial noise per prompt; the ODE runs from σ[0] to σ[max M], keeping the
   state x[k] and the velocity v[k] at every branch step k ∈ M. (The anchor stops at the last
   branch step: what comes after it is never used. The reference code runs it to σ = 0.)
2. **Branch.** At each k ∈ M, G SDE steps from the shared x[k] to σ[k+1], using the anchor's v[k]
   (no extra forward). Each branch's log-probability under the sampling policy is kept.
3. **Finish.** Every branch is finished with the ODE at every stride λ ∈ Λ
   (:func:`g2rpo.core.stride_schedule`: σ[k+1], σ[k+1+λ], …, 0; ``stride_schedule: reference``
   gives the reference code's σ[k+1], σ[k+2], σ[k+2+λ], …). All strides start from the same
   state at σ[k+1], so their first forward is computed once per branch. Rows of different
   branches, steps and strides sit at different σ and are batched together.

Sampling forwards per prompt (:func:`sampling_forwards`; tested for G=12, T=16, |M|=8, Λ={1,2,3}):

    (max M + 1) + G · Σ_{k∈M} [k+1 < T] · (1 + Σ_λ (n_λ(k) − 1)),   n_λ(k) = min(ceil((T−k−1)/λ), n_max)

with M the steps drawn this iteration and n_max = ``finish_steps`` (∞ by default).

Compute-efficient options (beyond the paper; each off by default): ``branch_steps_per_iteration``
trains a random subset of M per prompt and iteration (its finishes and, when the subset stops
earlier, the anchor's tail are not computed); ``finish_steps`` caps each stride's finish at n_max
steps (:func:`g2rpo.strides.thin_schedule`); ``finish_solver: dpmpp_2m`` finishes with
DPM-Solver++(2M) (:func:`g2rpo.core.dpmpp_2m_step`; same forwards per step, second order, so a
capped finish stays closer to the ODE solution); coarser strides only are ``granularities`` without 1.

Loss. For each k, **one** forward at x[k] for the whole group: μ_θ is the same for all G branches
(they share x[k]), so the G log-probs come from one mean. Training forwards per prompt = |M|
(``training_backwards`` the same). The surrogate is averaged over the G branches and over the
(prompt, k) groups kept; each k's term is scaled by 1/(number of kept groups) so that the sum of the
backward passes is the objective of docs/algorithm.md §5.

Advantages. Rewards ``[R, P, |M|, J, G]`` → per (reward model, stride) group-normalised over G →
``clip(Σ_r w_r Σ_j α_j A, ±clip)`` → ``[P, |M|, G]``. A (prompt, k) group with any NaN/inf reward
is dropped (advantage 0, no loss term rows) and counted.

Settings (:class:`~g2rpo.strategies.settings.G2RPOSettings`, the ``algorithm.g2rpo`` section): M (``branch_steps``,
``branch_steps_per_iteration``), Λ (``granularities``), the finishing schedule, solver and cap
(``stride_schedule``, ``finish_solver``, ``finish_steps``) and α (``stride_weights``). "G²RPO without MGAI" is this strategy with Λ = {1}: the preset
``strategy: g2rpo_no_mgai`` (:data:`g2rpo.strategies.settings.PRESETS`) sets ``granularities: [1]``.

Rollout ``states`` (:class:`~g2rpo.strategies.base.G2RPOStates`): ``steps`` ``[P, K]`` long (the k
of each slot; with ``branch_steps_per_iteration`` each prompt draws its own subset), ``x_k``
``[P, K, L, C]``, ``branches`` ``[P, K, G, L, C]`` (the y_i at σ[k+1]), ``log_prob_old`` ``[P, K, G]``.
"""

from __future__ import annotations

import heapq
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
    G2RPOStates,
    LossTerm,
    NFECounters,
    Rollout,
    VelocityModel,
)
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.settings import G2RPOSettings
from g2rpo.strides import finish_forwards, stride_indices

__all__ = ["G2RPO", "pack_calls", "sampling_forwards"]


def sampling_forwards(
    num_steps: int,
    group_size: int,
    steps: Sequence[int],
    strides: Sequence[int],
    mode: str = "to_zero",
    max_steps: int | None = None,
) -> int:
    """Sampling forwards for one prompt whose branch steps this iteration are ``steps`` (the formula
    in the module docstring; ``max_steps`` is ``finish_steps``)."""
    anchor = max(steps) + 1
    return anchor + group_size * sum(finish_forwards(num_steps, k, list(strides), mode, max_steps) for k in steps)


def pack_calls(parent: Sequence[int], micro_batch: int) -> list[list[int]]:
    """Model calls for a forest of forwards: node i needs the result of ``parent[i]`` (−1: none) and
    parents come before their children (``parent[i] < i``). Each call holds at most ``micro_batch``
    nodes whose parents ran in earlier calls. Greedy, highest level first (Hu's rule): a call takes
    the ready nodes with the longest chain of forwards still hanging below them (ties: lower id),
    so the long chains start early and later calls stay full.

    E.g. parent = [−1, 0, 0, 1, 1, 3] (0 → {1, 2}, 1 → {3, 4}, 3 → 5), micro_batch 2: levels
    4, 3, 1, 2, 1, 1 → calls [0], [1, 2], [3, 4], [5].
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be ≥ 1, got {micro_batch}")
    children: list[list[int]] = [[] for _ in parent]
    level = [1] * len(parent)
    for node in range(len(parent) - 1, -1, -1):
        up = parent[node]
        if up >= node:
            raise ValueError(f"node {node} has parent {up}: parents must come before their children")
        if up >= 0:
            children[up].append(node)
            level[up] = max(level[up], level[node] + 1)
    ready = [(-level[node], node) for node, up in enumerate(parent) if up < 0]
    heapq.heapify(ready)
    calls = []
    while ready:
        call = [heapq.heappop(ready)[1] for _ in range(min(micro_batch, len(ready)))]
        for node in call:
            for child in children[node]:
                heapq.heappush(ready, (-level[child], child))
        calls.append(call)
    return calls


class _RolloutPlan:
    """The index tables of one rollout: which forwards exist, what each needs, where its row lives.

    Nodes (one forward each): the anchor's forward at grid index i of prompt p (stage 0, row p,
    index i); the first finishing forward of branch (p, s, g) at σ[k+1] (stage 1, row (p·K + s)·G + g;
    absent when k + 1 = T); finishing step r ≥ 1 of row (p, s, j, g) (stage 2, row
    ((p·K + s)·J + j)·G + g, index r).
    """

    def __init__(
        self,
        steps: torch.Tensor,
        group: int,
        strides: list[int],
        num_steps: int,
        settings: G2RPOSettings,
        device: torch.device | str,
    ):
        num_prompts, num_slots = steps.shape
        num_strides = len(strides)
        self.group, self.num_strides = group, num_strides
        schedules = [
            stride_indices(num_steps, int(steps[p, s]), lam, settings.stride_schedule, settings.finish_steps)
            for p in range(num_prompts)
            for s in range(num_slots)
            for lam in strides
            for _ in range(group)
        ]
        longest = max(len(idx) for idx in schedules)
        # [N, S] grid indices of each finishing row, padded with T
        self.schedule = torch.tensor([idx + [num_steps] * (longest - len(idx)) for idx in schedules], device=device)
        moves = [len(idx) - 1 for idx in schedules]  # [N] finishing steps per row
        self.finish_prompt = torch.arange(num_prompts, device=device).repeat_interleave(num_slots * num_strides * group)
        self.branch_prompt = torch.arange(num_prompts, device=device).repeat_interleave(num_slots * group)
        self.branch_grid = (steps + 1).repeat_interleave(group, dim=1).reshape(-1).to(device)  # [P*K*G] k + 1
        slot_of = torch.full((num_prompts, int(steps.max()) + 1), -1, dtype=torch.long)
        for p in range(num_prompts):
            slot_of[p, steps[p]] = torch.arange(num_slots)
        self.slot_of = slot_of.to(device)  # [P, max M + 1] slot of a branch step, −1 elsewhere

        parent, stage, row, index = [], [], [], []

        def node(up: int, st: int, r: int, i: int) -> int:
            parent.append(up), stage.append(st), row.append(r), index.append(i)
            return len(parent) - 1

        anchor_node = {}
        for p in range(num_prompts):
            for i in range(int(steps[p].max()) + 1):
                anchor_node[p, i] = node(anchor_node.get((p, i - 1), -1), 0, p, i)
        self.num_anchor_nodes = len(parent)
        branch_node = {}
        for p in range(num_prompts):
            for s in range(num_slots):
                k = int(steps[p, s])
                for g in range(group):
                    if k + 1 < num_steps:
                        b = (p * num_slots + s) * group + g
                        branch_node[b] = node(anchor_node[p, k], 1, b, 0)
        for n, count in enumerate(moves):
            b = (n // (num_strides * group)) * group + n % group
            up = branch_node.get(b, -1)
            for r in range(1, count):
                up = node(up, 2, n, r)
        self.parent = parent
        self.stage = torch.tensor(stage, device=device)
        self.row = torch.tensor(row, device=device)
        self.index = torch.tensor(index, device=device)

    def calls(self, micro_batch: int) -> list[list[int]]:
        """The model calls: the anchor's steps first, each one call of the prompts still running
        (as many rows as before packing, so the anchor's numbers do not change), then every finishing
        forward packed by :func:`pack_calls`."""
        anchors = self.num_anchor_nodes
        by_index: dict[int, list[int]] = {}
        for node in range(anchors):
            by_index.setdefault(int(self.index[node]), []).append(node)
        calls = [
            nodes[start : start + micro_batch]
            for _, nodes in sorted(by_index.items())
            for start in range(0, len(nodes), micro_batch)
        ]
        finishing = [-1 if up < anchors else up - anchors for up in self.parent[anchors:]]
        return calls + [[anchors + node for node in call] for call in pack_calls(finishing, micro_batch)]

    def split(self, call: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The node ids of one call, by stage (anchor, branch, finishing step)."""
        ids = torch.tensor(call, device=self.stage.device)
        stage = self.stage[ids]
        return ids[stage == 0], ids[stage == 1], ids[stage == 2]

    def finish_rows_of_branch(self, branch_rows: torch.Tensor) -> torch.Tensor:
        """Finishing rows ``[nb·J]`` of branch rows ``[nb]``: for each branch, its J strides in order."""
        group, num_strides = self.group, self.num_strides
        j = torch.arange(num_strides, device=branch_rows.device)
        first = (branch_rows // group) * num_strides * group + branch_rows % group  # [nb] row of stride 0
        return (first[:, None] + j[None, :] * group).reshape(-1)


class G2RPO:
    """Granular-GRPO (with ``granularities: [1]``, its "without MGAI" ablation)."""

    name = "g2rpo"
    Settings = G2RPOSettings

    def __init__(self, config: AlgorithmConfig):
        self.config = config
        self.settings: G2RPOSettings = config.g2rpo
        self.strides = list(self.settings.granularities)  # Λ
        self.trained_steps = self.settings.all_branch_steps(config.num_steps)  # M

    # ------------------------------------------------------------------ rollout

    def branch_steps(self, draws: Draws, prompt: int) -> list[int]:
        """M for the prompt at batch position ``prompt`` this iteration (sorted)."""
        steps = self.trained_steps
        n = self.settings.branch_steps_per_iteration
        if n is None:
            return steps
        order = draws.permutation(len(steps), "branch-steps", prompt)
        return sorted(steps[int(i)] for i in order[:n])

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
        num_prompts, group, num_strides = len(cond), cfg.group_size, len(self.strides)
        check_draws(draws, cond)
        sigmas = make_grid(cfg, length).to(device)  # [T+1]
        nfe = NFECounters()
        steps = torch.tensor([self.branch_steps(draws, p) for p in range(num_prompts)], dtype=torch.long)  # [P, K]
        num_slots = steps.shape[1]
        steps_dev = steps.to(device)
        keys = [(p, int(steps[p, s]), g) for p in range(num_prompts) for s in range(num_slots) for g in range(group)]
        noise = torch.stack([draws.normal(latent_shape, "branch-noise", p, k, g) for p, k, g in keys])
        noise = noise.reshape(num_prompts, num_slots, group, length, channels).to(device)  # [P, K, G, L, C]
        plan = _RolloutPlan(steps, group, self.strides, cfg.num_steps, self.settings, device)

        # States. Anchor: x [P, L, C], kept at the branch steps as x[k], v[k]. Branches y [P, K, G, L, C]
        # with their SDE mean/std. Finishing rows, ordered [P, K, J, G]: x [N, L, C] (and x̂₀ of the
        # previous step for DPM-Solver++(2M)).
        anchor = torch.stack(
            [draws.normal(latent_shape, "initial-noise", p, device=device) for p in range(num_prompts)]
        )
        x_k = anchor.new_empty(num_prompts, num_slots, length, channels)  # [P, K, L, C]
        v_k = torch.empty_like(x_k)
        mean = anchor.new_empty(num_prompts, num_slots, 1, length, channels)  # [P, K, 1, L, C]
        std = anchor.new_empty(num_prompts, num_slots, 1, 1, 1)  # [P, K, 1, 1, 1]
        branches = anchor.new_empty(num_prompts, num_slots, group, length, channels)  # [P, K, G, L, C]
        finish = anchor.new_empty(num_prompts, num_slots, num_strides, group, length, channels)  # [P, K, J, G, L, C]
        second_order = self.settings.finish_solver == "dpmpp_2m"
        x0_prev = torch.empty_like(finish).flatten(0, 3) if second_order else None  # [N, L, C]
        x = finish.view(-1, length, channels)  # [N, L, C]
        branch_flat = branches.view(-1, length, channels)  # [P*K*G, L, C]

        # Every forward is one node of a forest (anchor step i → branch's first finishing forward →
        # each stride's later forwards); the calls pack ready nodes of every stage together
        # (:func:`pack_calls`). A row's computation does not depend on which rows share its call.
        for call in plan.calls(cfg.micro_batch):
            a, b, f = plan.split(call)  # node ids per stage
            a_p, a_i = plan.row[a], plan.index[a]  # anchor: prompt, grid index
            b_row = plan.row[b]  # branch rows (p, s, g)
            f_row, f_r = plan.row[f], plan.index[f]  # finishing rows (p, s, j, g), their step r ≥ 1
            v = sample_velocity(
                model,
                cfg,
                torch.cat([anchor[a_p], branch_flat[b_row], x[f_row]]),
                torch.cat([sigmas[a_i], sigmas[plan.branch_grid[b_row]], sigmas[plan.schedule[f_row, f_r]]]),
                cond[torch.cat([a_p, plan.branch_prompt[b_row], plan.finish_prompt[f_row]])],
                nfe,
            )
            v_a, v_b, v_f = v.split([a.numel(), b.numel(), f.numel()])

            # 1. Anchor: keep x[k], v[k]; branch there (G SDE steps from the anchor's v[k], no extra
            #    forward); then the ODE step.
            slot = plan.slot_of[a_p, a_i]  # [n] the slot of a branch step, −1 elsewhere
            hit = (slot >= 0).nonzero().flatten()
            if hit.numel():
                p, s = a_p[hit], slot[hit]
                x_k[p, s], v_k[p, s] = anchor[p], v_a[hit]
                mean[p, s], std[p, s] = self._transition(x_k[p, s], v_k[p, s], steps_dev[p, s], sigmas)
                branches[p, s] = mean[p, s] + std[p, s] * noise[p, s]
                finish[p, s] = branches[p, s].unsqueeze(1)  # every stride starts at the branch
            anchor[a_p] = core.ode_step(anchor[a_p], v_a, sigmas[a_i], sigmas[a_i + 1])

            # 2. A branch's first finishing forward, shared by its strides: step 0 of each.
            rows = plan.finish_rows_of_branch(b_row)  # [nb·J]
            self._finish_step(x, x0_prev, v_b.repeat_interleave(num_strides, dim=0), rows, 0, plan, sigmas)
            # 3. The later finishing steps.
            self._finish_step(x, x0_prev, v_f, f_row, f_r, plan, sigmas)

        log_prob_old = core.gaussian_log_prob(branches, mean, std, cfg.log_prob_reduce, batch_dims=3)  # [P, K, G]
        reward_shape = (num_prompts, num_slots, num_strides, group)
        return Rollout(
            strategy=self.name,
            sigmas=sigmas,
            cond=cond,
            draws=draws,
            final_latents=x,
            reward_shape=reward_shape,
            reward_dims=("prompt", "step", "stride", "branch"),
            final_prompt=torch.arange(num_prompts).repeat_interleave(num_slots * num_strides * group),
            nfe=nfe,
            states=G2RPOStates(steps=steps, x_k=x_k, branches=branches, log_prob_old=log_prob_old),
        )

    def _finish_step(
        self,
        x: torch.Tensor,
        x0_prev: torch.Tensor | None,
        v: torch.Tensor,
        rows: torch.Tensor,
        r: torch.Tensor | int,
        plan: _RolloutPlan,
        sigmas: torch.Tensor,
    ) -> None:
        """Step r of finishing rows ``rows`` ``[n]`` with their velocities ``v`` ``[n, L, C]``, in place:
        Euler, or DPM-Solver++(2M) (whose first step is Euler and records x̂₀ for the next)."""
        if rows.numel() == 0:
            return
        here, nxt = plan.schedule[rows, r], plan.schedule[rows, r + 1]
        sig, sig_next = sigmas[here], sigmas[nxt]  # [n]
        if x0_prev is None:
            x[rows] = core.ode_step(x[rows], v, sig, sig_next)
        elif isinstance(r, int) and r == 0:
            x0_prev[rows] = core.data_prediction(x[rows], v, sig)
            x[rows] = core.ode_step(x[rows], v, sig, sig_next)
        else:
            sig_prev = sigmas[plan.schedule[rows, r - 1]]
            x[rows], x0_prev[rows] = core.dpmpp_2m_step(x[rows], v, sig, sig_next, x0_prev[rows], sig_prev)

    def _transition(
        self, x_k: torch.Tensor, v_k: torch.Tensor, steps: torch.Tensor, sigmas: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """SDE mean/std at ``x_k`` ``[..., L, C]`` with velocity ``v_k``, step index ``steps`` ``[...]``;
        returned with a group axis inserted before ``L`` (``[..., 1, L, C]``). Sampling and training
        both go through here, so their log-probabilities are computed identically."""
        lead = steps.shape
        flat_x = x_k.reshape(-1, *x_k.shape[-2:])
        flat_v = v_k.reshape(-1, *v_k.shape[-2:])
        flat_steps = steps.reshape(-1)
        mean, std = core.sde_mean_std(
            flat_x,
            flat_v,
            sigmas[flat_steps],
            sigmas[flat_steps + 1],
            self.config.eta,
            sigmas[1],
            self.config.sde_noise,
        )  # [N, L, C], [N, 1, 1]
        return mean.reshape(*lead, 1, *x_k.shape[-2:]), std.reshape(*lead, 1, 1, 1)

    # ------------------------------------------------------------------ advantages and loss

    def advantages(
        self, rollout: Rollout, rewards: torch.Tensor, reward_weights: Sequence[float] | None = None
    ) -> Advantages:
        cfg = self.config
        num_rewards = check_rewards(rollout, rewards)
        rewards = rewards.float().cpu()  # [R, P, K, J, G]
        w = reward_weight_tensor(reward_weights, num_rewards)
        valid = torch.isfinite(rewards).all(dim=-1).all(dim=-1).all(dim=0)  # [P, K]
        safe = torch.where(valid[None, :, :, None, None], rewards, torch.zeros_like(rewards))
        adv = core.group_advantages(safe, cfg.advantage_eps, cfg.unbiased_std)  # [R, P, K, J, G]
        mixed = core.mix_advantages(adv.movedim(3, 1), self.settings.weights, w, cfg.advantage_clip)  # [P, K, G]
        mixed = torch.where(valid[..., None], mixed, torch.zeros_like(mixed))
        return Advantages(mixed, valid, dropped_groups=int((~valid).sum()), total_groups=int(valid.numel()))

    def loss_terms(self, model: VelocityModel, rollout: Rollout, advantages: Advantages) -> Iterator[LossTerm]:
        cfg = self.config
        st = rollout.states
        steps, x_k, branches, log_prob_old = st.steps, st.x_k, st.branches, st.log_prob_old
        sigmas = rollout.sigmas
        device = x_k.device
        kept = int(advantages.valid.sum())
        if kept == 0:
            return
        work = []  # (slot, prompts of this forward)
        for s in range(steps.shape[1]):
            prompts = advantages.valid[:, s].nonzero().flatten()
            chunk = cfg.train_micro_batch or max(prompts.numel(), 1)
            work += [(s, prompts[i : i + chunk]) for i in range(0, prompts.numel(), chunk)]
        for n, (s, prompts) in enumerate(work):
            p = prompts.to(device)
            k = steps[prompts, s].to(device)  # [n]
            x = x_k[p, s]  # [n, L, C]
            v = model(x, model_sigma(cfg, sigmas[k]), rollout.cond[prompts]).float()  # one forward per group
            mean, std = self._transition(x, v, k, sigmas)  # [n, 1, L, C], [n, 1, 1, 1]
            lp_new = core.gaussian_log_prob(branches[p, s], mean, std, cfg.log_prob_reduce, batch_dims=2)  # [n, G]
            last = n + 1 == len(work)
            step = last if cfg.optimizer_step == "per_iteration" else (last or work[n + 1][0] != s)
            yield surrogate_term(
                cfg,
                lp_new,
                log_prob_old[p, s],
                advantages.values[prompts, s],
                scale=prompts.numel() / kept,
                forwards=prompts.numel(),
                step_optimizer=step,
                step_index=int(k[0]) if bool((k == k[0]).all()) else None,
            )
