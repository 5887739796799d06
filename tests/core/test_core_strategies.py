"""Strategies on the real toy velocity model: rollout structure, forward counts, the shared-velocity
loss, ratio = 1 at the first update, seeding, dropped groups, and the config's bad-input errors."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from g2rpo import core, strides
from g2rpo.cli import main as cli_main
from g2rpo.config import config_hash, load_config, to_yaml
from g2rpo.errors import ConfigError
from g2rpo.seeding import Draws, derive_seed
from g2rpo.strategies.base import Conditioning, G2RPOStates, Strategy, TrajectoryStates, VelocityModel, summarize_step
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.dancegrpo import DanceGRPO
from g2rpo.strategies.g2rpo import G2RPO, pack_calls, sampling_forwards
from g2rpo.strategies.mixgrpo import MixGRPO, window_steps
from g2rpo.strategies.registry import STRATEGIES, build_strategy
from g2rpo.strategies.settings import PRESETS, SETTINGS, DanceGRPOSettings, G2RPOSettings, MixGRPOSettings
from g2rpo.toy import make_toy_problem
from g2rpo.training.run_config import RunConfig

LATENT = (4, 4)
TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


class CountingModel(torch.nn.Module):
    """The real toy model, counting the rows and calls it is asked for (independent of the strategy's counters)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.rows = 0
        self.calls = 0
        self.grad_rows = 0
        self.largest_call = 0
        self.call_sizes = []

    def forward(self, x, sigma, cond):
        self.rows += x.shape[0]
        self.calls += 1
        self.largest_call = max(self.largest_call, x.shape[0])
        self.call_sizes.append(x.shape[0])
        if torch.is_grad_enabled():
            self.grad_rows += x.shape[0]
        return self.inner(x, sigma, cond)


def config(**overrides) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, overrides=overrides)


def toy(num_prompts=2, seed=0):
    model, cond, reward = make_toy_problem(num_prompts=num_prompts, seed=seed)
    return CountingModel(model), cond, reward


def rewards_of(rollout, reward):
    return reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))


def test_protocols_are_met_by_the_toy_and_the_strategies():
    model, cond, _ = toy()
    assert isinstance(model, VelocityModel) and isinstance(cond, Conditioning)
    for name in ("g2rpo", "g2rpo_no_mgai", "dancegrpo", "mixgrpo"):
        assert isinstance(build_strategy(config(strategy=name)), Strategy)


# --------------------------------------------------------------------------- forward counts


def test_g2rpo_forward_counts_follow_the_documented_formula():
    # G = 12, T = 16, M = {0..7} (noisiest half), Λ = {1, 2, 3}.
    # Anchor: the ODE up to the last branch step, forwards at σ[0..7] = 8.
    # Per branch at k, with n_λ = ceil((15 − k)/λ) steps per stride and the first forward shared:
    #   1 + (n_1 − 1) + (n_2 − 1) + (n_3 − 1)
    #   k=0: 15,8,5 → 26   k=1: 14,7,5 → 24   k=2: 13,7,5 → 23   k=3: 12,6,4 → 20
    #   k=4: 11,6,4 → 19   k=5: 10,5,4 → 17   k=6:  9,5,3 → 15   k=7:  8,4,3 → 13   Σ = 157
    # Per prompt: 8 + 12·157 = 1892 sampling forwards; training: one forward per k = 8.
    cfg = config(num_steps=16, group_size=12, g2rpo={"granularities": [1, 2, 3]}, micro_batch=64)
    model, cond, reward = toy(num_prompts=2)
    strategy = build_strategy(cfg)
    assert sampling_forwards(16, 12, strategy.trained_steps, strategy.strides) == 1892
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    assert rollout.nfe.sampling_forwards == 2 * 1892 == model.rows
    assert rollout.nfe.model_calls == model.calls
    # The anchor runs first, one call of P = 2 rows per step (8 calls: the rows it always had, so its
    # numbers do not change); then every finishing forward is packed across stages (a branch's first
    # forward next to other rows' later steps), every call full but the last:
    # 8 + ceil((3784 − 16)/64) = 8 + 59 = 67 calls (stage by stage it was 73: 3 calls for the 192
    # first forwards, then ceil(rows/64) for each finishing round, 62 calls for the finish).
    assert model.call_sizes[:8] == [2] * 8 and set(model.call_sizes[8:-1]) == {64} and model.calls == 67
    assert rollout.reward_shape == (2, 8, 3, 12) and rollout.final_latents.shape == (2 * 8 * 3 * 12, *LATENT)
    model.rows = 0
    advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
    terms = []
    for term in strategy.loss_terms(model, rollout, advantages):
        term.loss.backward()
        terms.append(term.detached())
    stats = summarize_step(rollout, rewards_of(rollout, reward), advantages, terms)
    assert stats.training_forwards == stats.training_backwards == 2 * 8 == model.grad_rows
    assert stats.sampling_forwards == 2 * 1892


@pytest.mark.parametrize(
    ("settings", "per_prompt"),
    [
        # finish_steps 4: n_λ(k) = min(ceil((15 − k)/λ), 4); k = 0…5: (4, 4, 4) → 1 + 3·3 = 10 each;
        # k = 6: (9, 5, 3) → (4, 4, 3) → 1 + 3 + 3 + 2 = 9; k = 7: (8, 4, 3) → 9. 8 + 12·(60 + 18) = 944
        ({"finish_steps": 4}, 944),
        # the solver does not change the count: DPM-Solver++(2M) reuses the previous step's x̂₀
        ({"finish_solver": "dpmpp_2m"}, 1892),
        ({"finish_solver": "dpmpp_2m", "finish_steps": 4}, 944),
        # coarser strides only, Λ = {2, 3}: 1 + (ceil((15−k)/2) − 1) + (ceil((15−k)/3) − 1) per branch,
        # k = 0…7: 12, 11, 11, 9, 9, 8, 7, 6 = 73 → 8 + 12·73 = 884
        ({"granularities": [2, 3]}, 884),
    ],
)
def test_compute_efficient_options_forward_counts_at_paper_settings(settings, per_prompt):
    cfg = config(num_steps=16, group_size=12, micro_batch=64, g2rpo=settings)
    model, cond, _ = toy(num_prompts=1)
    strategy = build_strategy(cfg)
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    s = cfg.g2rpo
    formula = sampling_forwards(16, 12, strategy.trained_steps, strategy.strides, max_steps=s.finish_steps)
    assert formula == per_prompt == rollout.nfe.sampling_forwards == model.rows
    assert rollout.nfe.model_calls == model.calls and torch.isfinite(rollout.final_latents).all()


def test_branch_step_subsets_cost_only_the_drawn_steps():
    # Each prompt draws 2 of M = {0, 1, 2, 3} (T = 8); its anchor stops at its own last drawn step
    # and only the drawn steps are finished and trained: per prompt exactly the formula for its
    # drawn steps. With all of M: per branch 1 + (n_1 − 1) + (n_2 − 1), n_1 = 7 − k, n_2 = ceil((7 − k)/2):
    # k = 0…3: 1 + 6 + 3 = 10, 1 + 5 + 2 = 8, 1 + 4 + 2 = 7, 1 + 3 + 1 = 5 → 4 + 3·30 = 94.
    cfg = config(num_steps=8, group_size=3, g2rpo={"granularities": [1, 2], "branch_steps_per_iteration": 2})
    model, cond, reward = toy(num_prompts=3)
    strategy = build_strategy(cfg)
    assert sampling_forwards(8, 3, [0, 1, 2, 3], [1, 2]) == 4 + 3 * (10 + 8 + 7 + 5) == 94
    rollout = strategy.rollout(model, cond, Draws(0, 2, (0, 1, 2)), LATENT)
    drawn = rollout.states.steps.tolist()
    assert len({tuple(row) for row in drawn}) > 1  # the prompts drew different subsets
    expected = sum(sampling_forwards(8, 3, row, [1, 2]) for row in drawn)
    assert rollout.nfe.sampling_forwards == expected == model.rows < 3 * 94
    advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
    terms = [t.detached() for t in strategy.loss_terms(model, rollout, advantages)]
    assert sum(t.stats.forwards for t in terms) == 3 * 2  # |M| per iteration → 2 training forwards per prompt


def test_pack_calls_hand_example_and_bounds():
    # 0 → {1, 2}, 1 → {3, 4}, 3 → 5. Levels (longest chain from a node down): 0: 4, 1: 3, 3: 2,
    # 2, 4, 5: 1. Two per call, highest level first: [0], then 1 and 2 are ready → [1, 2], then
    # 3 (level 2) and 4 → [3, 4], then 5.
    assert pack_calls([-1, 0, 0, 1, 1, 3], 2) == [[0], [1, 2], [3, 4], [5]]
    assert pack_calls([-1, 0, 0, 1, 1, 3], 1) == [[0], [1], [3], [2], [4], [5]]  # the long chain first
    # two independent chains of 3 and 1: the long one starts at once, the short one fills its call
    assert pack_calls([-1, 0, 1, -1], 2) == [[0, 3], [1], [2]]
    with pytest.raises(ValueError, match="parents must come before"):
        pack_calls([1, -1], 2)
    with pytest.raises(ValueError, match="micro_batch must be ≥ 1"):
        pack_calls([-1], 0)


@pytest.mark.parametrize(
    "settings",
    [
        {"granularities": [1, 2, 3]},
        {"granularities": [1, 3], "finish_solver": "dpmpp_2m", "finish_steps": 3},
        {"granularities": [2, 3], "branch_steps_per_iteration": 2, "stride_schedule": "reference"},
    ],
)
def test_packing_rows_into_calls_changes_no_row(settings):
    # The toy model gives a row the same bits whatever else is in its call (checked first), so any
    # difference between micro-batches would come from the rollout itself: packing must only change
    # which rows share a call. micro_batch 1 is one row per call, nothing shared.
    model, cond, _ = toy(num_prompts=2)
    x = torch.randn(9, *LATENT, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sigma, prompt = torch.linspace(0.1, 0.9, 9), torch.tensor([0, 1] * 4 + [0])
        whole = model(x, sigma, cond[prompt])
        assert torch.equal(whole[3:4], model(x[3:4], sigma[3:4], cond[prompt[3:4]]))
        assert torch.equal(whole[2:7], model(x[2:7], sigma[2:7], cond[prompt[2:7]]))
    outs = []
    for micro in (1, 5, 16, 1000):
        strategy = build_strategy(config(num_steps=7, group_size=3, micro_batch=micro, g2rpo=settings))
        outs.append(strategy.rollout(model, cond, Draws(1, 0, (0, 1)), LATENT))
    for other in outs[1:]:
        assert torch.equal(other.final_latents, outs[0].final_latents)
        assert torch.equal(other.states.log_prob_old, outs[0].states.log_prob_old)
        assert torch.equal(other.states.x_k, outs[0].states.x_k)
        assert torch.equal(other.states.branches, outs[0].states.branches)
        assert other.nfe.sampling_forwards == outs[0].nfe.sampling_forwards
    assert outs[1].nfe.model_calls < outs[0].nfe.model_calls


def test_baseline_forward_counts():
    # Without MGAI (Λ = {1}): 8 + 12·Σ_{k=0..7}(15 − k) = 8 + 12·92 = 1112 per prompt.
    assert sampling_forwards(16, 12, list(range(8)), [1]) == 1112
    model, cond, reward = toy(num_prompts=1)
    nfe = {}
    for name in ("g2rpo_no_mgai", "dancegrpo", "mixgrpo"):
        strategy = build_strategy(config(strategy=name, num_steps=16, group_size=12, micro_batch=200))
        rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
        advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
        terms = [t.detached() for t in strategy.loss_terms(model, rollout, advantages)]
        nfe[name] = (rollout.nfe.sampling_forwards, sum(t.stats.forwards for t in terms))
    # DanceGRPO: SDE at all 16 steps for 12 trajectories = 192; trains int(0.6·15) = 9 of the first 15 steps = 108.
    # MixGRPO at iteration 0: window [0, 1, 2, 3] so no shared ODE prefix: 12·16 = 192; trains 12·4 = 48.
    assert nfe == {"g2rpo_no_mgai": (1112, 8), "dancegrpo": (192, 108), "mixgrpo": (192, 48)}


# --------------------------------------------------------------------------- the loss


def _perturb(model, seed=5, scale=0.02):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def test_shared_velocity_loss_and_gradients_equal_separate_forwards():
    cfg = config(num_steps=6, group_size=4, g2rpo={"granularities": [1, 2]}, ratio_clip=2e-3)
    model, cond, reward = toy(num_prompts=2)
    strategy = build_strategy(cfg)
    rollout = strategy.rollout(model, cond, Draws(1, 0, (0, 1)), LATENT)
    advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
    _perturb(model)  # ratios ≠ 1 so that clipping takes part in the comparison

    model.zero_grad()
    shared_loss = torch.zeros(())
    clip_seen = 0.0
    for term in strategy.loss_terms(model, rollout, advantages):
        term.loss.backward()
        shared_loss += term.loss.detach()
        clip_seen += term.stats.clip_fraction
    shared_grads = [p.grad.clone() for p in model.parameters()]
    num_terms = rollout.states.steps.shape[1]
    assert 0 < clip_seen < num_terms  # some ratios clipped, some not
    assert sum(float(g.abs().sum()) for g in shared_grads) > 0

    # Reference: G separate forwards per group, the surrogate of each branch on its own.
    model.zero_grad()
    st = rollout.states
    sig = rollout.sigmas
    num_prompts, num_slots, group = st.log_prob_old.shape
    separate_loss = torch.zeros(())
    for p in range(num_prompts):
        for s in range(num_slots):
            k = int(st.steps[p, s])
            for g in range(group):
                x = st.x_k[p, s][None]
                v = model(x, sig[k].reshape(1), cond[torch.tensor([p])])
                mean, std = core.sde_mean_std(x, v, sig[k].reshape(1), sig[k + 1].reshape(1), cfg.eta, sig[1])
                lp = core.gaussian_log_prob(st.branches[p, s, g][None], mean, std)
                loss, _ = core.clipped_surrogate(
                    lp, st.log_prob_old[p, s, g][None], advantages.values[p, s, g][None], cfg.ratio_clip
                )
                loss = loss / (group * num_prompts * num_slots)
                loss.backward()
                separate_loss += loss.detach()
    torch.testing.assert_close(shared_loss, separate_loss, atol=1e-6, rtol=1e-5)
    for a, b in zip(shared_grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    ("name", "noise", "reduce"),
    [
        ("g2rpo", "flow_grpo", "mean"),
        ("g2rpo", "flow_grpo", "sum"),
        ("dancegrpo", "flow_grpo", "mean"),
        ("mixgrpo", "flow_grpo", "mean"),
        ("dancegrpo", "dancegrpo", "mean"),
    ],
)
def test_first_update_after_sampling_sees_ratio_one(name, noise, reduce):
    cfg = config(
        strategy=name,
        num_steps=6,
        group_size=4,
        g2rpo={"granularities": [1, 3]},
        sde_noise=noise,
        log_prob_reduce=reduce,
    )  # ε = 1e-4 (reference)
    model, cond, reward = toy(num_prompts=3)
    strategy = build_strategy(cfg)
    rollout = strategy.rollout(model, cond, Draws(2, 4, (5, 6, 7)), LATENT)
    advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
    terms = [t.detached() for t in strategy.loss_terms(model, rollout, advantages)]
    assert terms
    for term in terms:
        assert term.stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
        assert term.stats.ratio_max == pytest.approx(1.0, abs=1e-5)
        assert term.stats.clip_fraction == 0.0


def test_micro_batched_terms_sum_to_the_full_batch_loss_and_gradients():
    results = []
    for micro in (None, 1):
        model, cond, reward = toy(num_prompts=3)
        strategy = build_strategy(
            config(num_steps=5, group_size=3, g2rpo={"granularities": [1, 2]}, train_micro_batch=micro)
        )
        rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1, 2)), LATENT)
        advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
        _perturb(model)
        total = 0.0
        n_terms = 0
        for term in strategy.loss_terms(model, rollout, advantages):
            term.loss.backward()
            total += float(term.loss.detach())
            n_terms += 1
        results.append((total, [p.grad.clone() for p in model.parameters()], n_terms))
    (full, grads_full, n_full), (micro, grads_micro, n_micro) = results
    assert (n_full, n_micro) == (3, 9)  # |M| = 3 terms; split per prompt: 3 × 3
    assert micro == pytest.approx(full, abs=1e-7)
    for a, b in zip(grads_full, grads_micro, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize(("mode", "expected_steps"), [("per_iteration", 1), ("per_step", 4)])
def test_optimizer_step_flags(mode, expected_steps):
    model, cond, reward = toy(num_prompts=2)
    strategy = build_strategy(config(num_steps=8, group_size=3, g2rpo={"granularities": [2]}, optimizer_step=mode))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    advantages = strategy.advantages(rollout, rewards_of(rollout, reward))
    flags = [t.step_optimizer for t in strategy.loss_terms(model, rollout, advantages)]
    assert len(flags) == 4 and sum(flags) == expected_steps and flags[-1]


def test_nan_and_inf_rewards_drop_their_groups_and_are_counted():
    model, cond, reward = toy(num_prompts=3)
    strategy = build_strategy(config(num_steps=6, group_size=4, g2rpo={"granularities": [1, 2]}))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1, 2)), LATENT)
    clean = rewards_of(rollout, reward)
    rewards = torch.cat([clean, clean * 2])  # R = 2 reward models: [2, P=3, K=3, J=2, G=4]
    rewards[0, 0, 1, 0, 2] = float("nan")  # one bad score drops group (prompt 0, k 1)
    rewards[1, 2, :, 1, 0] = float("inf")  # prompt 2: every k dropped
    advantages = strategy.advantages(rollout, rewards, reward_weights=[1.0, 0.5])
    assert advantages.dropped_groups == 4 and advantages.total_groups == 9
    assert advantages.valid.tolist() == [[True, False, True], [True, True, True], [False, False, False]]
    assert torch.isfinite(advantages.values).all()
    terms = []
    for term in strategy.loss_terms(model, rollout, advantages):
        assert torch.isfinite(term.loss)
        term.loss.backward()
        terms.append(term.detached())
    assert sum(t.stats.forwards for t in terms) == 5  # one forward per kept group
    stats = summarize_step(rollout, rewards, advantages, terms)
    assert (stats.dropped_groups, stats.total_groups) == (4, 9)
    assert all(map(lambda row: all(torch.isfinite(torch.tensor(row))), stats.reward_mean))
    with pytest.raises(ValueError, match="one weight per reward model"):
        strategy.advantages(rollout, rewards, reward_weights=[1.0])
    with pytest.raises(ValueError, match="reward_weights must be finite"):
        strategy.advantages(rollout, rewards, reward_weights=[1.0, float("nan")])
    with pytest.raises(ValueError, match="rewards must be"):
        strategy.advantages(rollout, rewards[:, :2])


@pytest.mark.parametrize("name", ["dancegrpo", "mixgrpo"])
def test_baselines_drop_a_prompt_with_a_nan_or_inf_reward(name):
    model, cond, reward = toy(num_prompts=3)
    strategy = build_strategy(config(strategy=name, num_steps=6, group_size=4, mixgrpo={"window_size": 2}))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1, 2)), LATENT)
    rewards = rewards_of(rollout, reward)  # [1, P=3, G=4]
    rewards[0, 1, 3] = float("inf")
    advantages = strategy.advantages(rollout, rewards)
    assert advantages.valid.tolist() == [True, False, True] and advantages.dropped_groups == 1
    assert torch.equal(advantages.values[1], torch.zeros(4)) and torch.isfinite(advantages.values).all()
    terms = [t.detached() for t in strategy.loss_terms(model, rollout, advantages)]
    trained = rollout.states.trained_steps.shape[-1]  # DanceGRPO int(0.6·5) = 3 steps; MixGRPO window of 2
    assert trained == {"dancegrpo": 3, "mixgrpo": 2}[name]
    assert sum(t.stats.forwards for t in terms) == 2 * 4 * trained  # the 2 kept prompts × G × trained steps
    assert all(math.isfinite(t.stats.loss) for t in terms)


def test_every_group_dropped_yields_no_terms():
    model, cond, reward = toy(num_prompts=2)
    strategy = build_strategy(config(num_steps=4, group_size=3, g2rpo={"granularities": [1]}))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    rewards = torch.full(rollout.reward_layout(1), float("nan"))
    advantages = strategy.advantages(rollout, rewards)
    assert list(strategy.loss_terms(model, rollout, advantages)) == []
    stats = summarize_step(rollout, rewards, advantages, [])
    assert (stats.dropped_groups, stats.total_groups, stats.optimizer_steps, stats.loss) == (4, 4, 0, 0.0)
    assert math.isnan(stats.ratio_mean) and math.isnan(stats.clip_fraction)


# --------------------------------------------------------------------------- rollout structure and seeding


class SigmaRecorder(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.seen = []

    def forward(self, x, sigma, cond):
        self.seen.append(sigma.clone())
        return self.inner(x, sigma, cond)


def test_grid_choice_and_timestep_truncation():
    inner, cond, _ = make_toy_problem(num_prompts=1)
    static = build_strategy(
        config(num_steps=4, group_size=2, g2rpo={"granularities": [1]}, grid="static_shift", shift=3.0)
    )
    model = SigmaRecorder(inner)
    rollout = static.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    assert rollout.sigmas.tolist() == pytest.approx([1.0, 0.9, 0.75, 0.5, 0.0])  # 3t/(1+2t), t = 1, .75, .5, .25, 0
    seen = torch.cat(model.seen)
    assert seen.unique().tolist() == pytest.approx([0.5, 0.75, 0.9, 1.0])
    # flux grid at L = 4 tokens: μ = 0.5 + (4 − 256)·0.65/3840 = 0.45734, e^μ = 1.57986,
    # σ[1] = e^μ/(e^μ + 1/0.75 − 1) = 1.57986/1.91319 = 0.82577; fed to the model as 0.825
    truncating = build_strategy(config(num_steps=4, group_size=2, g2rpo={"granularities": [1]}, truncate_timestep=True))
    model = SigmaRecorder(inner)
    rollout = truncating.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    e = math.exp(core.flux_mu(4))
    assert rollout.sigmas[1].item() == pytest.approx(e / (e + 1 / 0.75 - 1), abs=1e-6)
    seen = torch.cat(model.seen)
    assert torch.equal(seen, torch.floor(seen * 1000) / 1000)
    assert 0.825 in [round(v, 6) for v in seen.tolist()]


def test_rollout_is_independent_of_micro_batch():
    finals = []
    for micro in (1, 7, 1000):
        model, cond, _ = toy(num_prompts=2)
        strategy = build_strategy(
            config(num_steps=6, group_size=3, g2rpo={"granularities": [1, 2, 4]}, micro_batch=micro)
        )
        finals.append(strategy.rollout(model, cond, Draws(3, 1, (0, 1)), LATENT).final_latents)
    torch.testing.assert_close(finals[0], finals[1], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(finals[0], finals[2], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("mode", "solver", "cap"),
    [
        ("to_zero", "euler", None),
        ("reference", "euler", None),
        ("to_zero", "dpmpp_2m", None),
        ("to_zero", "dpmpp_2m", 2),
    ],
)
def test_finishes_match_a_sequential_solve_per_stride(mode, solver, cap):
    # The packed finish (rows at mixed σ, shared first forward) equals running each stride's
    # (thinned) schedule with the chosen solver one branch at a time.
    model, cond, _ = toy(num_prompts=1)
    settings = {"granularities": [1, 3], "stride_schedule": mode, "finish_solver": solver, "finish_steps": cap}
    cfg = config(num_steps=7, group_size=2, g2rpo=settings)
    strategy = build_strategy(cfg)
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    assert strategy.trained_steps == [0, 1, 2, 3] and strategy.strides == [1, 3]  # M = noisiest half of T = 7
    formula = sampling_forwards(7, 2, [0, 1, 2, 3], [1, 3], mode, cap)
    assert rollout.nfe.sampling_forwards == formula == model.rows
    finals = rollout.final_latents.reshape(*rollout.reward_shape, *LATENT)  # [P, K, J, G, L, C]
    sig = rollout.sigmas
    with torch.no_grad():
        for s, k in enumerate(rollout.states.steps[0].tolist()):
            for j, lam in enumerate(strategy.strides):
                for g in range(cfg.group_size):
                    x = rollout.states.branches[0, s, g][None]
                    idx = strides.stride_indices(cfg.num_steps, k, lam, mode, cap)
                    assert cap is None or len(idx) - 1 <= cap
                    previous = (None, None)
                    for a, b in zip(idx[:-1], idx[1:]):
                        v = model(x, sig[a].reshape(1), cond[torch.tensor([0])])
                        if solver == "euler":
                            x = core.ode_step(x, v, sig[a], sig[b])
                        else:
                            x, x0 = core.dpmpp_2m_step(x, v, sig[a], sig[b], *previous)
                            previous = (x0, sig[a])
                    torch.testing.assert_close(finals[0, s, j, g], x[0], atol=1e-6, rtol=1e-5)


def test_branches_share_the_anchor_state_and_differ_only_by_noise():
    model, cond, _ = toy(num_prompts=2)
    cfg = config(num_steps=8, group_size=5, g2rpo={"granularities": [1]})
    rollout = build_strategy(cfg).rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    st = rollout.states
    # the typed record: x[k], branches and old log-probs per (prompt, k), final latents per stride
    assert isinstance(st, G2RPOStates)
    assert (st.x_k.shape, st.branches.shape, st.log_prob_old.shape) == ((2, 4, *LATENT), (2, 4, 5, *LATENT), (2, 4, 5))
    assert rollout.reward_dims == ("prompt", "step", "stride", "branch") and rollout.reward_shape == (2, 4, 1, 5)
    assert rollout.final_latents.shape == (2 * 4 * 1 * 5, *LATENT) and rollout.nfe.sampling_forwards == model.rows
    assert st.steps.tolist() == [[0, 1, 2, 3]] * 2
    # x[0] is the initial noise of each prompt, drawn under its global prompt index
    torch.testing.assert_close(st.x_k[1, 0], Draws(0, 0, (0, 1)).normal(LATENT, "initial-noise", 1))
    # x[k] is the anchor ODE's state at σ[k]: replay the ODE one prompt at a time
    sig = rollout.sigmas
    with torch.no_grad():
        for p in range(2):
            x = Draws(0, 0, (0, 1)).normal(LATENT, "initial-noise", p)[None]
            for k in range(4):
                torch.testing.assert_close(st.x_k[p, k], x[0], atol=1e-6, rtol=1e-5)
                x = core.ode_step(x, model(x, sig[k].reshape(1), cond[torch.tensor([p])]), sig[k], sig[k + 1])
    # the G branches of one group are distinct samples around one mean
    branches = st.branches[0, 2]  # [G, L, C]
    assert torch.cdist(branches.flatten(1), branches.flatten(1)).triu(1).gt(0).sum() == 5 * 4 / 2


def test_draws_do_not_depend_on_the_batch_layout_or_on_earlier_draws():
    model, cond, _ = toy(num_prompts=4)
    strategy = build_strategy(
        config(num_steps=6, group_size=3, g2rpo={"granularities": [1, 2], "branch_steps_per_iteration": 2})
    )
    whole = strategy.rollout(model, cond, Draws(7, 3, (10, 11, 12, 13)), LATENT)
    # the same prompts split over two "ranks", in reverse order of execution
    second = strategy.rollout(model, cond[torch.tensor([2, 3])], Draws(7, 3, (12, 13)), LATENT)
    first = strategy.rollout(model, cond[torch.tensor([0, 1])], Draws(7, 3, (10, 11)), LATENT)
    shape = (*whole.reward_shape, *LATENT)
    joined = torch.cat([first.final_latents.reshape(2, *shape[1:]), second.final_latents.reshape(2, *shape[1:])])
    torch.testing.assert_close(whole.final_latents.reshape(shape), joined, atol=1e-6, rtol=1e-5)
    assert torch.equal(whole.states.steps, torch.cat([first.states.steps, second.states.steps]))
    # random subsets of M: 2 of {0, 1, 2} per prompt, and another iteration draws other noise
    assert all(len(set(row)) == 2 and set(row) <= {0, 1, 2} for row in whole.states.steps.tolist())
    other = strategy.rollout(model, cond, Draws(7, 4, (10, 11, 12, 13)), LATENT)
    assert not torch.equal(other.states.branches, whole.states.branches)


@pytest.mark.parametrize("name", ["g2rpo", "dancegrpo", "mixgrpo"])
def test_rollout_refuses_draws_for_another_number_of_prompts(name):
    model, cond, _ = toy(num_prompts=2)
    strategy = build_strategy(config(strategy=name, num_steps=4, group_size=2))
    for prompt_indices in ((0,), (0, 1, 2)):
        with pytest.raises(ValueError, match=f"draws cover {len(prompt_indices)} prompts, cond has 2"):
            strategy.rollout(model, cond, Draws(0, 0, prompt_indices), LATENT)
    assert model.rows == 0  # refused before any model call


def test_derive_seed_is_stable_across_processes():
    code = "from g2rpo.seeding import derive_seed; print(derive_seed(7, 'branch-noise', 3, 12, 0, 5))"
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
            ).stdout.strip()
        )
    assert outs == {str(derive_seed(7, "branch-noise", 3, 12, 0, 5))}
    assert derive_seed(7, 1) != derive_seed(7, "1") != derive_seed(8, 1)


# --------------------------------------------------------------------------- baselines


def test_dancegrpo_sde_every_step_shared_noise_and_trained_fraction():
    model, cond, _ = toy(num_prompts=2)
    strategy = build_strategy(config(strategy="dancegrpo", num_steps=10, group_size=4))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    assert isinstance(rollout.states, TrajectoryStates)
    states = rollout.states.latents  # [P, G, T+1, L, C]
    assert torch.equal(states[:, :1, 0].expand(-1, 4, -1, -1), states[:, :, 0])  # one initial noise per group
    assert not torch.equal(states[:, 0, 1], states[:, 1, 1])  # SDE from the first step on
    assert torch.isfinite(rollout.states.log_prob_old).all()
    trained = rollout.states.trained_steps  # [P, G, S], S = int(0.6·(10 − 1)) = 5 of the first 9 steps
    assert trained.shape == (2, 4, 5)
    assert all(len(set(row)) == 5 for row in trained.reshape(-1, 5).tolist())
    assert int(trained.max()) <= 8  # the last step (index 9) is never trained
    independent = build_strategy(
        config(strategy="dancegrpo", num_steps=10, group_size=4, dancegrpo={"shared_noise": False})
    )
    states = independent.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT).states.latents
    assert not torch.equal(states[:, 0, 0], states[:, 1, 0])


def test_mixgrpo_window_hand_values():
    # T = 16, W = 4, s = 1, τ = 25: windows stay below index T − 2 = 14, starts 0..13 (14 positions)
    assert window_steps(0, 16) == [0, 1, 2, 3]
    assert window_steps(24, 16) == [0, 1, 2, 3]
    assert window_steps(25, 16) == [1, 2, 3, 4]
    assert window_steps(25 * 11, 16) == [11, 12, 13]  # cut at 14
    assert window_steps(25 * 13, 16) == [13]
    assert window_steps(25 * 14, 16) == [0, 1, 2, 3]  # rolled back
    assert window_steps(10, 16, window_size=2, shift=2, iters_per_shift=5) == [4, 5]


def test_mixgrpo_ode_outside_the_window():
    model, cond, _ = toy(num_prompts=2)
    strategy = build_strategy(config(strategy="mixgrpo", num_steps=8, group_size=3, mixgrpo={"window_size": 2}))
    rollout = strategy.rollout(model, cond, Draws(0, 50, (0, 1)), LATENT)  # iteration 50: window [2, 3]
    assert rollout.states.window == [2, 3]
    states, lp = rollout.states.latents, rollout.states.log_prob_old
    assert torch.equal(states[:, :1, :3].expand(-1, 3, -1, -1, -1), states[:, :, :3])  # identical up to σ[2]
    assert not torch.equal(states[:, 0, 3], states[:, 1, 3])
    assert torch.isfinite(lp[:, :, 2:4]).all() and torch.isnan(lp[:, :, [0, 1, 4, 5, 6, 7]]).all()
    assert rollout.nfe.sampling_forwards == 2 * (2 + 3 * 6)  # ODE prefix once per prompt


# --------------------------------------------------------------------------- config


def test_config_reports_every_bad_value_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(
            AlgorithmConfig,
            overrides=[
                "group_size=1",
                "g2rpo.granularities=[]",
                "eta=-0.5",
                "num_steps=1",
                "ratio_clip=0",
                "learning_rate=1",
            ],
        )
    text = str(err.value)
    for field in ("group_size=1", "g2rpo.granularities=[]", "eta=-0.5", "num_steps=1", "ratio_clip=0", "learning_rate"):
        assert field in text
    assert len(err.value.problems) == 6
    with pytest.raises(
        ConfigError,
        match=r"g2rpo.granularities: \[1, 0, -2\] has strides \[0, -2\] below 1: each stride is an integer ≥ 1",
    ):
        load_config(AlgorithmConfig, overrides=["g2rpo.granularities=[1, 0, -2]"])
    with pytest.raises(ConfigError, match=r"g2rpo.branch_steps: \[-1, 3\] has steps \[-1\] outside the grid"):
        load_config(AlgorithmConfig, overrides=["g2rpo.branch_steps=[-1, 3]"])
    with pytest.raises(ConfigError, match="g2rpo.granularities: \\[2, 2\\] repeats a stride"):
        load_config(AlgorithmConfig, overrides=["g2rpo.granularities=[2, 2]"])
    with pytest.raises(
        ConfigError, match=r"g2rpo.branch_steps=\[0, 16\]: steps \[16\] are outside the grid: each k must be in 0..15"
    ):
        load_config(AlgorithmConfig, overrides=["g2rpo.branch_steps=[0, 16]"])
    with pytest.raises(
        ConfigError, match=r"g2rpo.stride_weights=\[1.0, 2.0\]: give one weight per granularity \(3 for"
    ):
        load_config(AlgorithmConfig, overrides=["g2rpo.stride_weights=[1, 2]"])


def test_config_refuses_bad_finish_options():
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["g2rpo.finish_steps=0", "g2rpo.finish_solver=rk4"])
    text = str(err.value)
    assert "g2rpo.finish_steps=0: Input should be greater than or equal to 1" in text
    assert "g2rpo.finish_solver='rk4': Input should be 'euler' or 'dpmpp_2m'" in text
    # One finishing step from σ[k+1] to 0 is the same for every stride: the rewards would repeat.
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["g2rpo.finish_steps=1", "g2rpo.granularities=[1, 3]"])
    assert err.value.problems == [
        "g2rpo.finish_steps=1: strides 1 and 3 then visit the same σ at every branch step, so their rewards are "
        "duplicates: raise finish_steps, drop a stride from granularities, or set finish_steps: null"
    ]
    # With M = {7} (T = 16) a cap of 4 thins λ = 1's [8, 9, …, 16] (8 steps) at positions 0, 2, 4, 6, 8
    # to [8, 10, 12, 14, 16], which is λ = 2's own schedule; λ = 3's [8, 11, 14, 16] stays apart.
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["g2rpo.finish_steps=4", "g2rpo.branch_steps=[7]"])
    assert err.value.problems[0].startswith("g2rpo.finish_steps=4: strides 1 and 2 then visit the same σ")
    ok = load_config(AlgorithmConfig, overrides=["g2rpo.finish_steps=4", "g2rpo.finish_solver=dpmpp_2m"]).g2rpo
    assert (ok.finish_steps, ok.finish_solver) == (4, "dpmpp_2m")
    default = load_config(AlgorithmConfig).g2rpo
    assert (default.finish_steps, default.finish_solver, default.branch_steps_per_iteration) == (None, "euler", None)


def test_config_rejects_zero_eta_and_non_finite_numbers():
    # η = 0 is the ODE: the G branches coincide and the Gaussian log-prob has std 0 (NaN ratios that
    # would silently turn the weights into NaN); inf/NaN settings would silently drop or zero every
    # group. Each is one named problem, all reported together.
    with pytest.raises(
        ConfigError, match="eta=0: Input should be greater than 0 .*η = 0 makes the G branches identical"
    ):
        load_config(AlgorithmConfig, overrides=["eta=0"])
    bad = [
        "eta=.inf",
        "shift=.nan",
        "advantage_eps=.inf",
        "ratio_clip=.inf",
        "advantage_clip=.inf",
        "g2rpo.stride_weights=[.nan, 1, -1]",
    ]
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=bad)
    text = str(err.value)
    for field in ("eta=inf", "shift=nan", "advantage_eps=inf", "ratio_clip=inf", "advantage_clip=inf"):
        assert f"{field}: Input should be a finite number" in text
    assert "g2rpo.stride_weights: [nan, 1.0, -1.0] has weights [nan, -1.0] that are not finite numbers ≥ 0" in text
    assert len(err.value.problems) == 6  # one per setting
    with pytest.raises(ConfigError, match=r"g2rpo.stride_weights=\[0\.0, 0\.0, 0\.0\]: all weights are 0"):
        load_config(AlgorithmConfig, overrides=["g2rpo.stride_weights=[0, 0, 0]"])
    assert load_config(AlgorithmConfig, overrides=["g2rpo.stride_weights=[0, 1, 2]"]).g2rpo.weights == [0.0, 1.0, 2.0]
    with pytest.raises(ConfigError, match=r"dancegrpo.train_fraction=nan: Input should be a finite number"):
        load_config(AlgorithmConfig, overrides=["strategy=dancegrpo", "dancegrpo.train_fraction=.nan"])


def test_config_defaults_and_derived_values():
    cfg = load_config(AlgorithmConfig)
    assert (cfg.num_steps, cfg.group_size, cfg.eta, cfg.ratio_clip, cfg.advantage_clip) == (16, 12, 0.7, 1e-4, 5.0)
    assert cfg.strategy == "g2rpo" and cfg.settings is cfg.g2rpo
    g2rpo = build_strategy(cfg)
    assert g2rpo.trained_steps == list(range(8)) and g2rpo.strides == [1, 2, 3] and cfg.g2rpo.weights == [1.0] * 3
    assert build_strategy(config(num_steps=7)).trained_steps == [0, 1, 2, 3]  # ceil(7/2) = 4
    assert build_strategy(config(g2rpo={"branch_steps": [5, 2]})).trained_steps == [2, 5]
    dance, mix = config(strategy="dancegrpo"), config(strategy="mixgrpo")
    assert (dance.settings.train_fraction, dance.settings.shared_noise) == (0.6, True)
    assert (mix.settings.window_size, mix.settings.window_shift, mix.settings.iters_per_shift) == (4, 1, 25)


def test_the_no_mgai_preset_is_g2rpo_with_one_stride():
    no_mgai = config(strategy="g2rpo_no_mgai")
    assert no_mgai == config(g2rpo={"granularities": [1]})  # the preset reads as its strategy, nothing else
    assert no_mgai.strategy == "g2rpo" and no_mgai.g2rpo.granularities == [1] and no_mgai.g2rpo.weights == [1.0]
    assert config_hash(no_mgai) == config_hash(load_config(AlgorithmConfig, overrides=["g2rpo.granularities=[1]"]))
    strategy = build_strategy(no_mgai)
    assert isinstance(strategy, G2RPO) and strategy.strides == [1]
    # other settings of the section stay the user's; setting the fixed one to the same value is consistent
    same = config(strategy="g2rpo_no_mgai", g2rpo={"granularities": [1], "branch_steps": [0, 3]})
    assert same.g2rpo.granularities == [1] and same.g2rpo.branch_steps == [0, 3]
    python_built = AlgorithmConfig(strategy="g2rpo_no_mgai", g2rpo=G2RPOSettings(stride_schedule="reference"))
    assert python_built.g2rpo.granularities == [1] and python_built.g2rpo.stride_schedule == "reference"
    # another Λ would contradict the preset: refused, naming the field, the value and the fix
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["strategy=g2rpo_no_mgai", "g2rpo.granularities=[1, 2]"])
    assert err.value.problems == [
        "g2rpo.granularities=[1, 2]: strategy g2rpo_no_mgai sets g2rpo.granularities to [1]: "
        "drop g2rpo.granularities, or use strategy g2rpo"
    ]
    with pytest.raises(
        ValueError, match=r"g2rpo.granularities=\[2\]: strategy g2rpo_no_mgai sets g2rpo.granularities to"
    ):
        AlgorithmConfig.model_validate({"strategy": "g2rpo_no_mgai", "g2rpo": G2RPOSettings(granularities=[2])})
    # stride weights follow the one stride: one weight, or a clear error
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["strategy=g2rpo_no_mgai", "g2rpo.stride_weights=[1, 1]"])
    assert err.value.problems == [
        "g2rpo.stride_weights=[1.0, 1.0]: give one weight per granularity (1 for [1]), or null"
    ]
    assert config(strategy="g2rpo_no_mgai", g2rpo={"stride_weights": [2]}).g2rpo.weights == [2.0]


def test_registry_lists_each_strategy_with_its_section():
    # adding a strategy: its module, its section (and SETTINGS entry), a registry line and its section
    # field; this keeps the four in step, in the same order (help text lists the names in SETTINGS' order)
    sections = {name for name, info in AlgorithmConfig.model_fields.items() if name in STRATEGIES}
    assert set(STRATEGIES) == sections == {"g2rpo", "dancegrpo", "mixgrpo", "flowgrpo", "diffusionnft", "branchgrpo"}
    assert list(SETTINGS) == list(STRATEGIES)
    for name, cls in STRATEGIES.items():
        assert cls.name == name and cls.Settings.strategy == name and SETTINGS[name] is cls.Settings
        assert AlgorithmConfig.model_fields[name].annotation is cls.Settings
    assert set(PRESETS) == {"g2rpo_no_mgai"} and all(base in STRATEGIES for base, _ in PRESETS.values())
    for name, cls in {"g2rpo": G2RPO, "dancegrpo": DanceGRPO, "mixgrpo": MixGRPO}.items():
        strategy = build_strategy(config(strategy=name))
        assert type(strategy) is cls and strategy.name == name and strategy.settings is strategy.config.settings
    with pytest.raises(ConfigError) as err:
        load_config(AlgorithmConfig, overrides=["strategy=grpo"])
    assert err.value.problems == [
        "strategy: 'grpo' is not a strategy (did you mean g2rpo?): use one of g2rpo, dancegrpo, mixgrpo, flowgrpo, "
        "diffusionnft, branchgrpo, or a preset (g2rpo_no_mgai)"
    ]


@pytest.mark.parametrize(
    ("settings", "valid", "misplaced", "owner"),
    [
        (
            G2RPOSettings,
            "branch_steps, branch_steps_per_iteration, finish_solver, finish_steps, granularities, learning_rate, "
            "stride_schedule, stride_weights",
            "window_size",
            "mixgrpo",
        ),
        (
            DanceGRPOSettings,
            "learning_rate, shared_noise, train_fraction, trajectories_per_step",
            "granularities",
            "g2rpo",
        ),
        (
            MixGRPOSettings,
            "iters_per_shift, learning_rate, trajectories_per_step, window_shift, window_size",
            "train_fraction",
            "dancegrpo",
        ),
    ],
)
def test_each_strategy_section_validates_alone(settings, valid, misplaced, owner):
    assert load_config(settings) == settings()
    with pytest.raises(ConfigError) as err:
        load_config(settings, overrides=["strides=[1]"])
    (found,) = err.value.problems  # then the closest key, where one is close (g2rpo: stride_weights)
    assert found.startswith(f"strides: unknown key; remove it or fix the spelling (valid keys here: {valid})")
    with pytest.raises(ConfigError) as err:
        load_config(settings, overrides=[f"{misplaced}=1"])
    assert err.value.problems == [
        f"{misplaced}: unknown key; remove it or fix the spelling (valid keys here: {valid}); "
        f"{misplaced} is a setting of strategy {owner}: write it as {owner}.{misplaced} and choose strategy: {owner}"
    ]


def test_a_knob_in_the_wrong_place_names_where_it_belongs():
    # in another strategy's section, inside a run config: the full dotted path of the right place
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, TINY_CONFIG, ["algorithm.strategy=mixgrpo", "algorithm.g2rpo.window_size=2"])
    (line,) = err.value.problems
    assert line.startswith("algorithm.g2rpo.window_size: unknown key")
    assert line.endswith(
        "window_size is a setting of strategy mixgrpo: write it as algorithm.mixgrpo.window_size "
        "and choose algorithm.strategy: mixgrpo"
    )
    # at the top of the algorithm section, by the former flat or prefixed names
    for old, new in [
        ("granularities=[1]", "algorithm.g2rpo.granularities"),
        ("dancegrpo_train_fraction=0.5", "algorithm.dancegrpo.train_fraction"),
        ("mixgrpo_iters_per_shift=5", "algorithm.mixgrpo.iters_per_shift"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(RunConfig, TINY_CONFIG, [f"algorithm.{old}"])
        (line,) = err.value.problems
        key = old.partition("=")[0]
        assert line.startswith(f"algorithm.{key}: unknown key") and line.endswith(
            f"{key} is a setting of strategy {new.split('.')[1]}: write it as {new}"
        )
    # a cross-check of the chosen strategy is named from the run config's top
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, TINY_CONFIG, ["algorithm.strategy=mixgrpo", "algorithm.num_steps=2"])
    assert err.value.problems == ["algorithm.num_steps=2: MixGRPO keeps its window below step T − 2: use num_steps ≥ 3"]


def test_only_the_chosen_strategy_section_is_recorded_and_hashed():
    # A file may carry every strategy's section; the ones not chosen are checked but change nothing.
    chosen = config(strategy="mixgrpo", mixgrpo={"window_size": 2})
    carrying = config(
        strategy="mixgrpo",
        mixgrpo={"window_size": 2},
        g2rpo={"granularities": [1, 2]},
        dancegrpo={"train_fraction": 0.3},
    )
    assert config_hash(chosen) == config_hash(carrying)
    assert "g2rpo" not in chosen.model_dump() and "dancegrpo" not in to_yaml(carrying)
    assert config_hash(chosen) != config_hash(config(strategy="mixgrpo", mixgrpo={"window_size": 3}))
    with pytest.raises(ConfigError, match=r"dancegrpo.train_fraction=2: Input should be less than or equal to 1"):
        config(strategy="mixgrpo", dancegrpo={"train_fraction": 2})


@pytest.mark.parametrize("strategy", ["g2rpo", "g2rpo_no_mgai", "dancegrpo", "mixgrpo"])
def test_config_show_round_trips_for_each_strategy(strategy, tmp_path, capsys):
    knobs = {
        "g2rpo": ["algorithm.g2rpo.granularities=[1, 3]", "algorithm.g2rpo.stride_weights=[1, 0.5]"],
        "g2rpo_no_mgai": ["algorithm.g2rpo.granularities=[1]", "algorithm.g2rpo.branch_steps=[0, 2]"],
        "dancegrpo": ["algorithm.dancegrpo.train_fraction=0.25", "algorithm.dancegrpo.shared_noise=false"],
        "mixgrpo": ["algorithm.mixgrpo.window_size=2", "algorithm.mixgrpo.iters_per_shift=3"],
    }[strategy]
    overrides = [f"algorithm.strategy={strategy}", *knobs]
    loaded = load_config(RunConfig, TINY_CONFIG, overrides)
    assert cli_main(["config", "show", "--config", str(TINY_CONFIG), *overrides]) == 0
    shown = capsys.readouterr().out
    assert shown == to_yaml(loaded)
    written = tmp_path / "shown.yaml"
    written.write_text(shown)
    again = load_config(RunConfig, written)
    assert again.algorithm == loaded.algorithm and config_hash(again) == config_hash(loaded)
    assert to_yaml(again) == shown
    name = loaded.algorithm.strategy
    recorded = yaml.safe_load(shown)["algorithm"]
    assert recorded["strategy"] == name == ("g2rpo" if strategy == "g2rpo_no_mgai" else strategy)
    assert set(recorded) & set(STRATEGIES) == {name}  # only the chosen strategy's section is written
    assert type(build_strategy(again.algorithm)) is STRATEGIES[name]


def test_step_stats_reward_std_by_hand():
    model, cond, _ = toy(num_prompts=2)
    strategy = build_strategy(config(num_steps=4, group_size=3, g2rpo={"granularities": [1]}))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    # 1 reward × P=2 × K=2 × J=1 × G=3 = 12 rewards: 0, 1, …, 10 and one NaN (left out).
    rewards = torch.arange(12, dtype=torch.float32).reshape(rollout.reward_layout(1))
    rewards.view(-1)[11] = float("nan")
    stats = summarize_step(rollout, rewards, strategy.advantages(rollout, rewards), [])
    # 11 consecutive integers 0…10: mean 5, population variance (11² − 1)/12 = 10, std √10.
    assert stats.reward_mean == [[pytest.approx(5.0)]]
    assert stats.reward_std == [[pytest.approx(math.sqrt(10.0))]]


def test_reward_mean_all_averages_the_rewards_that_train():
    # two reward models on one prompt, T = 4, G = 2, DanceGRPO (layout [R, P, G]): the trained one
    # scores 0.2 and 0.4, the watched one (weight 0, another scale) −3 and −5
    model, cond, _ = toy(num_prompts=1)
    strategy = build_strategy(config(strategy="dancegrpo", num_steps=4, group_size=2))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    rewards = torch.tensor([[[0.2, 0.4]], [[-3.0, -5.0]]])  # [R, P, G]
    advantages = strategy.advantages(rollout, rewards, reward_weights=[1.0, 0.0])
    assert summarize_step(rollout, rewards, advantages, [], reward_weights=[1.0, 0.0]).reward_mean_all == (
        pytest.approx(0.3)
    )
    # without weights (or all zero) every reward counts: (0.2 + 0.4 − 3 − 5)/4
    assert summarize_step(rollout, rewards, advantages, []).reward_mean_all == pytest.approx(-1.85)
    with pytest.raises(ValueError, match="2 reward models"):
        summarize_step(rollout, rewards, advantages, [], reward_weights=[1.0])


def test_the_pages_that_list_the_strategy_files_name_every_registered_one():
    """docs/architecture.md named 4 of the 6 strategy files; the lists are held to the registry."""
    root = Path(__file__).resolve().parents[2]
    files = {cls.__module__.rsplit(".", 1)[-1] + ".py" for cls in STRATEGIES.values()}
    architecture = next(
        line for line in (root / "docs" / "architecture.md").read_text().splitlines() if "`g2rpo/strategies/`" in line
    )
    assert [f for f in sorted(files) if f"`{f}`" not in architecture] == []
    readme = next(line for line in (root / "README.md").read_text().splitlines() if line.startswith("  strategies/"))
    assert [f for f in sorted(files) if f.removesuffix(".py") not in readme] == []
    # docs/core.md's example config lists the names algorithm.strategy takes: the registry's, in its order.
    example = next(
        line for line in (root / "docs" / "core.md").read_text().splitlines() if "  strategy: g2rpo " in line
    )
    assert example.split("# ", 1)[1].split(",")[0].split(" | ") == list(STRATEGIES)


def test_learning_rate_is_one_field_whose_default_each_strategy_sets():
    """One declaration (StrategySettings.learning_rate); each section sets its default and its source."""
    expected = {"g2rpo": 2e-6, "dancegrpo": 1e-5, "mixgrpo": 1e-5, "flowgrpo": 3e-4, "diffusionnft": 3e-4,
                "branchgrpo": 1e-5}  # fmt: skip
    for name, strategy in STRATEGIES.items():
        settings = strategy.Settings
        assert "learning_rate" not in vars(settings).get("__annotations__", {}), name  # not declared again
        assert settings().learning_rate == expected[name] == settings.default_learning_rate, name
        field = settings.model_fields["learning_rate"]
        assert field.description.endswith(f"({settings.learning_rate_source})"), name
        with pytest.raises(Exception, match="greater than 0"):
            settings(learning_rate=0.0)


def _rate(value: float) -> str:
    """A learning rate as the docs and the sources write it: 2e-6, 1e-5, 3e-4."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def test_the_lists_of_learning_rates_come_from_the_sections():
    """train.learning_rate's help named 3 of the 6 strategies' own rates: it is generated from the sections,
    each source states its section's default, and docs/core.md's one list is held to them."""
    assert [_rate(r) for r in (2e-6, 1e-5, 3e-4)] == ["2e-6", "1e-5", "3e-4"]
    help_text = RunConfig.model_fields["train"].annotation.model_fields["learning_rate"].description
    for name, section in SETTINGS.items():
        assert _rate(section.default_learning_rate) in section.learning_rate_source, name
        assert section.learning_rate_source in help_text, name
    line = next(
        line
        for line in (Path(__file__).resolve().parents[2] / "docs" / "core.md").read_text().split("\n\n")
        if line.startswith("Every strategy section: `learning_rate` [")
    )
    listed = dict(re.findall(r"(\w+) (\d+e-\d+)", line.split("]")[0]))
    assert listed == {name: _rate(section.default_learning_rate) for name, section in SETTINGS.items()}
