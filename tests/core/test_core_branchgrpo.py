"""BranchGRPO: the tree widths and depth-wise advantages against hand-worked values and the published
functions' outputs (fixture), the tree rollout and its loss on the real toy model, and its config errors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from g2rpo import core
from g2rpo.config import load_config
from g2rpo.errors import ConfigError
from g2rpo.seeding import Draws
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.registry import build_strategy
from g2rpo.toy import make_toy_problem

LATENT = (4, 4)
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "oracle" / "branch_grpo_tree_advantages.json"


def config(**overrides) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, overrides=overrides)


def test_tree_widths_hand_values():
    # T = 6, branch at 0 and 2, b = 2: depth 0 the root; step 0 doubles (2), step 1 keeps (2),
    # step 2 doubles (4), steps 3–5 keep (4)
    assert core.tree_widths(6, [0, 2], 2) == [1, 2, 2, 4, 4, 4, 4]
    # b = 3 at the last step: the leaves are 3 siblings of one chain
    assert core.tree_widths(3, [2], 3) == [1, 1, 1, 3]
    with pytest.raises(ValueError, match="outside the grid 0..3"):
        core.tree_widths(4, [4], 2)


def test_tree_advantages_hand_values():
    rewards = torch.tensor([[1.0, 3.0, 2.0, 6.0]])  # [P=1, N=4]
    adv = core.tree_advantages(rewards, [1, 2, 4])  # depths of 1, 2 and 4 nodes: [1, 7]
    # depth of 1 node (the root's chain): 0
    # 2 nodes, values mean(1, 3) = 2 and mean(2, 6) = 4: mean 3, Bessel std sqrt((1 + 1)/1) = √2 → ∓1/√2
    # 4 nodes = the leaves: mean 3, deviations −2, 0, −1, 3, std sqrt(14/3) = 2.16025 → −0.92582, 0, −0.46291, 1.38873
    expected = [0.0, -1 / math.sqrt(2), 1 / math.sqrt(2), -0.92582, 0.0, -0.46291, 1.38873]
    torch.testing.assert_close(adv, torch.tensor([expected]), rtol=1e-5, atol=1e-5)
    # population std (unbiased=False) for the leaves: sqrt(14/4) = 1.87083 → (R − 3)/1.87083
    pop = core.tree_advantages(rewards, [4], unbiased=False)
    torch.testing.assert_close(pop, (rewards - 3) / 1.87083, rtol=1e-5, atol=1e-5)


def test_tree_advantages_zero_a_depth_of_equal_values():
    # values mean(1, 3) = mean(3, 1) = 2: std 0 < 1e-6 → zeros (never 0/δ); the leaves still differ
    adv = core.tree_advantages(torch.tensor([1.0, 3.0, 3.0, 1.0]), [2, 4])
    assert adv[:2].tolist() == [0.0, 0.0] and adv[2:].abs().min() > 0.8
    with pytest.raises(ValueError, match="a depth of 3 nodes does not divide the 4 leaves"):
        core.tree_advantages(torch.zeros(4), [3])


def test_tree_advantages_match_the_published_functions():
    # Written by parity/make_branch_grpo_oracle.py, running Fredreic1849/BranchGRPO's
    # compute_node_rewards_from_leaves + compute_hierarchical_advantages_by_depth on small trees.
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert ref["reference"].startswith("Fredreic1849/BranchGRPO@ffc3c902")
    for case in ref["cases"]:
        widths = core.tree_widths(case["num_steps"], case["split_points"], 2)
        ours = core.tree_advantages(torch.tensor(case["rewards"]), widths)  # depth 0 included: [Σ n_d]
        published = torch.tensor([a for depth in case["advantages_by_depth"] for a in depth])
        torch.testing.assert_close(ours, published, rtol=1e-5, atol=1e-6)


def test_rollout_is_a_tree_that_shares_prefixes_and_counts_its_forwards():
    model, cond, _ = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(config(strategy="branchgrpo", num_steps=5, branchgrpo={"branch_steps": [2, 0]}))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    st = rollout.states
    assert st.widths == [1, 2, 2, 4, 4, 4] and st.trained_steps == [0, 1, 2, 3, 4]
    assert [tuple(x.shape[:2]) for x in st.latents] == [(2, 1), (2, 2), (2, 2), (2, 4), (2, 4), (2, 4)]
    assert rollout.reward_shape == (2, 4) and rollout.final_prompt.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # one forward per node of depths 0..T−1: 1 + 2 + 2 + 4 + 4 = 13 per prompt
    assert rollout.nfe.sampling_forwards == 2 * 13
    # siblings of a branch step come from one parent (same mean) with different noises
    assert (st.latents[1][0, 0] - st.latents[1][0, 1]).abs().max() > 1e-3
    # an edge's old log-prob is the SDE density of its child given its parent
    x, child = st.latents[2][0, 1], st.latents[3][0, 3]  # node 1 of depth 2 → its second child
    v = model(x[None], rollout.sigmas[2].expand(1), cond[torch.tensor([0])])
    mean, std = core.sde_mean_std(x[None], v, rollout.sigmas[2], rollout.sigmas[3], 0.7, rollout.sigmas[1])
    torch.testing.assert_close(st.log_prob_old[2][0, 3], core.gaussian_log_prob(child[None], mean, std)[0])
    # the leaves are scored on the last step's x₀-prediction, x[T−1] − σ[T−1]·v
    x, v = st.latents[4][1, 2], model(st.latents[4][1, 2][None], rollout.sigmas[4].expand(1), cond[torch.tensor([1])])
    torch.testing.assert_close(rollout.final_latents[4 + 2], (x - rollout.sigmas[4] * v[0]))


def test_default_tree_is_the_published_uniform_split():
    strategy = build_strategy(config(strategy="branchgrpo"))  # T = 16, 4 rounds: k = 0, 4, 8, 12
    assert strategy.branch_steps == [0, 4, 8, 12] and strategy.leaves == 16
    assert sum(strategy.widths[:-1]) == 1 + 4 * 2 + 4 * 4 + 4 * 8 + 3 * 16 == 105  # sampling forwards per prompt


def _iteration(strategy, prompts=1):
    model, cond, reward = make_toy_problem(num_prompts=prompts, seed=0)
    rollout = strategy.rollout(model, cond, Draws(0, 0, tuple(range(prompts))), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    return model, rollout, rewards


def test_loss_terms_train_every_edge_once_with_the_childs_advantage():
    strategy = build_strategy(config(strategy="branchgrpo", num_steps=4, branchgrpo={"branch_steps": [0, 2]}))
    model, rollout, rewards = _iteration(strategy, prompts=2)
    advantages = strategy.advantages(rollout, rewards)
    # widths [1, 2, 2, 4, 4]: the advantage holds depths 1..4, 2 + 2 + 4 + 4 = 12 nodes per prompt
    assert advantages.values.shape == (2, 12)
    torch.testing.assert_close(advantages.values, core.tree_advantages(rewards[0], [2, 2, 4, 4]).clamp(-5, 5))
    terms = list(strategy.loss_terms(model, rollout, advantages))
    assert [t.stats.step_index for t in terms] == [0, 1, 2, 3]
    assert [t.stats.forwards for t in terms] == [2 * 1, 2 * 2, 2 * 2, 2 * 4]  # one per parent node
    assert [t.stats.num_ratios for t in terms] == [2 * 2, 2 * 2, 2 * 4, 2 * 4]  # one per edge: 24 in all
    assert [t.step_optimizer for t in terms] == [False, False, False, True]
    # the policy sampled: every ratio is 1, so each term is −mean(A)·(edges/24) and their sum −mean over all edges
    for t in terms:
        assert t.stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
    total = sum(t.loss for t in terms)
    torch.testing.assert_close(total.detach(), -advantages.values.mean(), rtol=1e-4, atol=1e-6)
    total.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_pruned_depths_are_sampled_but_not_trained_and_per_step_steps_after_each():
    cfg = config(
        strategy="branchgrpo",
        num_steps=4,
        optimizer_step="per_step",
        train_micro_batch=1,
        branchgrpo={"branch_steps": [0, 2], "pruned_depths": [2, 4]},
    )
    strategy = build_strategy(cfg)
    model, rollout, rewards = _iteration(strategy)
    assert rollout.states.trained_steps == [0, 2]  # the edges into depths 1 and 3
    terms = list(strategy.loss_terms(model, rollout, strategy.advantages(rollout, rewards)))
    # step 0: 1 parent; step 2: 2 parents, one row per term → 3 terms, stepping after each trained step
    assert [(t.stats.step_index, t.step_optimizer) for t in terms] == [(0, True), (2, False), (2, True)]
    assert sum(t.stats.num_ratios for t in terms) == 2 + 4


def _edge_config(edges_per_step, **extra):
    return config(
        strategy="branchgrpo",
        num_steps=4,
        branchgrpo={"branch_steps": [0, 2], "edges_per_step": edges_per_step},
        **extra,
    )


def test_published_edge_stepping_in_one_window_is_the_one_step_gradient_scaled_by_p_over_k():
    # widths [1, 2, 2, 4, 4]: E = 2 + 2 + 4 + 4 = 12 trained edges per tree, 2 prompts: 24 edges. The default sums to
    # the mean surrogate ΣA·r/(P·E); the published one divides each edge by k·E, so one window of k = 24 edges gives
    # P/k = 1/12 of the default's gradient — edge by edge, one forward row per edge instead of one per parent.
    default = build_strategy(config(strategy="branchgrpo", num_steps=4, branchgrpo={"branch_steps": [0, 2]}))
    model, rollout, rewards = _iteration(default, prompts=2)
    advantages = default.advantages(rollout, rewards)
    params = [p for p in model.parameters() if p.requires_grad]
    grads_ref = torch.autograd.grad(sum(t.loss for t in default.loss_terms(model, rollout, advantages)), params)
    terms = list(build_strategy(_edge_config(24)).loss_terms(model, rollout, advantages))
    assert [(t.stats.forwards, t.stats.num_ratios, t.step_optimizer) for t in terms] == [(24, 24, True)]
    grads = torch.autograd.grad(sum(t.loss for t in terms), params)
    assert any(g.abs().sum() > 0 for g in grads_ref)
    for g, ref in zip(grads, grads_ref):
        torch.testing.assert_close(g * 12, ref, rtol=1e-4, atol=1e-8)


def test_published_edge_stepping_steps_every_k_shuffled_edges_each_divided_by_k_times_the_tree():
    strategy = build_strategy(_edge_config(5, train_micro_batch=1))
    model, rollout, rewards = _iteration(strategy, prompts=2)
    advantages = strategy.advantages(rollout, rewards)
    terms = list(strategy.loss_terms(model, rollout, advantages))
    # 24 edges, one row per term; the optimiser steps after every 5th and after the last (windows 5,5,5,5,4)
    assert len(terms) == 24 and all(t.stats.forwards == 1 for t in terms)
    assert [n for n, t in enumerate(terms, 1) if t.step_optimizer] == [5, 10, 15, 20, 24]
    assert all(t.stats.step_index is None for t in terms)  # a window mixes steps
    # the sampling policy: every ratio is 1, so a term is −A_edge / (k·E): each edge once, with its child's advantage
    per_edge = sorted(float(-t.loss.detach() * 5 * 12) for t in terms)
    assert per_edge == pytest.approx(sorted(advantages.values.flatten().tolist()), abs=1e-5)
    # shuffled: the terms do not follow the depths; the order is the iteration's draw (same draws, same order)
    in_order = [float(-a) / 60 for a in advantages.values.flatten()]
    assert [float(t.loss.detach()) for t in terms] != pytest.approx(in_order, abs=1e-6)
    again = [float(t.loss.detach()) for t in strategy.loss_terms(model, rollout, advantages)]
    assert again == [float(t.loss.detach()) for t in terms]
    other = dataclasses.replace(rollout, draws=Draws(0, 1, (0, 1)))
    assert [float(t.loss.detach()) for t in strategy.loss_terms(model, other, advantages)] != again


def test_published_edge_stepping_is_refused_with_per_step_and_counts_as_several_steps():
    with pytest.raises(ConfigError) as err:
        _edge_config(12, optimizer_step="per_step")
    assert err.value.problems == [
        "optimizer_step='per_step': branchgrpo steps the optimiser every branchgrpo.edges_per_step = 12 edges: "
        "use per_iteration, or set branchgrpo.edges_per_step: null"
    ]
    cfg = _edge_config(12)
    assert cfg.settings.multi_step_setting(cfg) == ("branchgrpo.edges_per_step", 12)  # refused with several ranks


def test_a_prompt_with_a_nan_reward_is_dropped():
    strategy = build_strategy(config(strategy="branchgrpo", num_steps=3, branchgrpo={"branch_steps": [0]}))
    model, rollout, rewards = _iteration(strategy, prompts=2)
    rewards[0, 1, 0] = float("nan")
    advantages = strategy.advantages(rollout, rewards)
    assert advantages.valid.tolist() == [True, False] and advantages.dropped_groups == 1
    assert bool((advantages.values[1] == 0).all())
    terms = list(strategy.loss_terms(model, rollout, advantages))
    assert sum(t.stats.forwards for t in terms) == 1 + 2 + 2  # prompt 0's parents only


def test_config_errors_name_the_field_and_the_fix():
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", num_steps=4, branchgrpo={"branch_steps": [1, 5], "pruned_depths": [0]})
    assert err.value.problems == [  # every problem at once
        "branchgrpo.branch_steps=[1, 5]: steps [5] are outside the grid: each k must be in 0..3 (num_steps is 4)",
        "branchgrpo.pruned_depths=[0]: depths [0] have no incoming edge: each pruned depth must be in 1..4",
    ]
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", branchgrpo={"branch_steps": [0, 0], "branch_factor": 1})
    assert err.value.problems[0] == (
        "branchgrpo.branch_steps: [0, 0] repeats a step: list each branch step once, e.g. [0, 3, 6, 9]"
    )
    assert err.value.problems[1].startswith("branchgrpo.branch_factor=1: Input should be greater than or equal to 2")
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", num_steps=3)  # the uniform split needs 4 distinct steps
    assert any("split_rounds=4" in p and "≤ num_steps = 3" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", num_steps=2, branchgrpo={"branch_steps": [0], "pruned_depths": [1, 2]})
    assert any("every depth is pruned" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", branchgrpo={"branch_factor": 10})  # 10^4 leaves
    assert any("10^4 leaves per prompt" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        config(strategy="branchgrpo", g2rpo={"branch_factor": 2})
    assert any("branch_factor is a setting of strategy branchgrpo" in p for p in err.value.problems)
