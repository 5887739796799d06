"""Flow-GRPO: its SDE step against the published function's outputs (fixture), its advantage and KL
against hand-worked values, the rollout and loss on the real toy model, and its config errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from g2rpo import core
from g2rpo.config import load_config
from g2rpo.errors import ConfigError
from g2rpo.seeding import Draws
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.flowgrpo import trained_steps_per_trajectory
from g2rpo.strategies.registry import build_strategy
from g2rpo.toy import make_toy_problem
from g2rpo.training.run_config import RunConfig
from tests.core.core_helpers import WithReference

LATENT = (4, 4)
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "oracle" / "flow_grpo_sde_step.json"


def config(**overrides) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, overrides=overrides)


def test_sde_step_and_log_prob_match_flow_grpos_published_function():
    # Written by parity/make_flow_grpo_oracle.py, running yifan123/flow_grpo's sde_step_with_logprob
    # (commit in the fixture) on diffusers' FlowMatchEulerDiscreteScheduler(shift=3), 4 steps.
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert ref["reference"].startswith("yifan123/flow_grpo@ac4c86e8")
    sigmas = torch.tensor(ref["sigmas"])  # [5]
    x, v = torch.tensor(ref["x"]), torch.tensor(ref["v"])  # [3, 2, 2, 2]
    for step in ref["steps"]:
        i = step["step"]
        mean, std = core.sde_mean_std(x, v, sigmas[i], sigmas[i + 1], ref["eta"], sigmas[1], "flow_grpo")
        sample = torch.tensor(step["prev_sample"])
        torch.testing.assert_close(mean, torch.tensor(step["mean"]), rtol=1e-5, atol=1e-6)
        # the published std_dev_t is s_σ; the step's std is s_σ·sqrt(σ − σ')
        s = core.sde_noise_scale(sigmas[i], ref["eta"], sigmas[1])
        torch.testing.assert_close(s.expand(3), torch.tensor(step["std"]), rtol=1e-6, atol=0)
        torch.testing.assert_close(std, s * torch.sqrt(sigmas[i] - sigmas[i + 1]))
        log_prob = core.gaussian_log_prob(sample, mean, std, "mean")
        torch.testing.assert_close(log_prob, torch.tensor(step["log_prob"]), rtol=1e-5, atol=1e-5)


def test_flow_grpo_advantages_hand_values():
    rewards = torch.tensor([[[1.0, 3.0], [2.0, 2.0]]])  # [R=1, P=2, G=2]
    # global std over all four rewards {1, 3, 2, 2}: mean 2, population var (1 + 1 + 0 + 0)/4 = 0.5,
    # std = 0.70711; prompt 0: mean 2 → (∓1)/(0.70711 + 1e-4) = ∓1.41401; prompt 1 is constant → 0
    adv = core.flow_grpo_advantages(rewards, 1e-4, global_std=True)
    torch.testing.assert_close(adv, torch.tensor([[[-1.41401, 1.41401], [0.0, 0.0]]]), rtol=1e-5, atol=1e-5)
    # the group's own population std: prompt 0 std = 1 → ∓1/(1 + 1e-4) = ∓0.99990
    adv = core.flow_grpo_advantages(rewards, 1e-4, global_std=False)
    torch.testing.assert_close(adv, torch.tensor([[[-0.99990, 0.99990], [0.0, 0.0]]]), rtol=1e-5, atol=1e-5)


def test_gaussian_mean_kl_hand_value():
    mean = torch.tensor([[1.0, 2.0], [0.0, 0.0]])  # [B=2, 2]
    mean_ref = torch.tensor([[0.0, 2.0], [0.5, -0.5]])
    std = torch.tensor([[0.5], [1.0]])  # [B, 1]
    # row 0: ((1)² + 0)/2 dims / (2·0.25) = 0.5 / 0.5 = 1.0; row 1: (0.25 + 0.25)/2 / (2·1) = 0.125
    torch.testing.assert_close(core.gaussian_mean_kl(mean, mean_ref, std), torch.tensor([1.0, 0.125]))


def test_trained_steps_are_the_first_int_f_t():
    assert trained_steps_per_trajectory(16, 0.99) == 15  # int(15.84): every step but the last
    assert trained_steps_per_trajectory(10, 0.99) == 9  # the published 10-step configs
    assert trained_steps_per_trajectory(6, 0.5) == 3
    assert trained_steps_per_trajectory(4, 0.01) == 1  # at least one


def test_rollout_is_an_sde_at_every_step_from_independent_noise_and_counts_its_forwards():
    model, cond, _ = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(config(strategy="flowgrpo", num_steps=5, group_size=3))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    st = rollout.states
    assert st.latents.shape == (2, 3, 6, *LATENT) and st.trained_steps.shape == (2, 3, 4)  # int(0.99·5) = 4
    assert st.trained_steps[0, 0].tolist() == [0, 1, 2, 3]
    assert bool(torch.isfinite(st.log_prob_old).all())  # every step is an SDE step
    assert (st.latents[0, 0, 0] - st.latents[0, 1, 0]).abs().max() > 1e-3  # independent initial noise
    torch.testing.assert_close(rollout.final_latents, st.latents[:, :, -1].reshape(6, *LATENT))  # x[T] scored
    assert rollout.nfe.sampling_forwards == 2 * 3 * 5  # P·G·T


def _iteration(model, strategy, cond, reward):
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    advantages = strategy.advantages(rollout, rewards)
    return rollout, advantages


def test_kl_is_zero_against_an_identical_reference_and_adds_beta_times_kl_otherwise():
    policy, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    same = WithReference(policy, copy.deepcopy(policy))
    cfg = config(strategy="flowgrpo", num_steps=4, group_size=3, flowgrpo={"kl_beta": 0.5})
    strategy = build_strategy(cfg)
    rollout, advantages = _iteration(same, strategy, cond, reward)
    terms = list(strategy.loss_terms(same, rollout, advantages))
    assert len(terms) == 3 and all(t.stats.kl == 0.0 for t in terms)  # S = 3 slots, one accumulation (G ≤ 6)
    without = list(
        build_strategy(config(strategy="flowgrpo", num_steps=4, group_size=3, flowgrpo={"kl_beta": 0.0})).loss_terms(
            policy, rollout, advantages
        )
    )
    for a, b in zip(terms, without, strict=True):
        torch.testing.assert_close(a.loss, b.loss)  # KL 0: the policy loss alone
    moved = copy.deepcopy(policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05)
    shifted = WithReference(moved, policy)
    terms = list(strategy.loss_terms(shifted, rollout, advantages))
    plain = list(
        build_strategy(config(strategy="flowgrpo", num_steps=4, group_size=3, flowgrpo={"kl_beta": 0.0})).loss_terms(
            moved, rollout, advantages
        )
    )
    for a, b in zip(terms, plain, strict=True):
        assert a.stats.kl > 0
        # the reference's forwards are counted (one per row the term trains), and only with β > 0
        assert a.stats.reference_forwards == a.stats.forwards > 0 and b.stats.reference_forwards == 0
        # each term is scaled by its share of the rows (here 1/3, one slot of three): loss += β·kl/3
        torch.testing.assert_close(a.loss - b.loss, torch.tensor(0.5 * a.stats.kl / 3), rtol=1e-5, atol=1e-7)
    terms[0].loss.backward()  # the KL term is differentiable through the policy only
    assert all(p.grad is None for p in policy.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in moved.parameters())


def test_kl_without_a_reference_is_refused_clearly():
    model, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    strategy = build_strategy(config(strategy="flowgrpo", num_steps=4, group_size=3))
    rollout, advantages = _iteration(model, strategy, cond, reward)
    with pytest.raises(ValueError, match="has no reference_velocity .* or set the strategy's kl_beta: 0"):
        next(strategy.loss_terms(model, rollout, advantages))


def test_a_dropped_prompt_is_left_out_of_the_batch_std():
    model, cond, _ = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(config(strategy="flowgrpo", num_steps=4, group_size=2))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    rewards = torch.tensor([[[0.0, 2.0], [1.0, float("nan")]]])
    adv = strategy.advantages(rollout, rewards)
    assert adv.valid.tolist() == [True, False] and adv.dropped_groups == 1
    # only {0, 2}: std 1 → ∓1/(1 + 1e-4)
    torch.testing.assert_close(adv.values, torch.tensor([[-0.9999, 0.9999], [0.0, 0.0]]), rtol=1e-5, atol=1e-5)


def test_bad_flowgrpo_settings_name_the_field_and_the_fix():
    with pytest.raises(ConfigError, match="flowgrpo.train_fraction"):
        config(strategy="flowgrpo", flowgrpo={"train_fraction": 1.5})
    with pytest.raises(ConfigError, match="flowgrpo.kl_beta"):
        config(strategy="flowgrpo", flowgrpo={"kl_beta": -1})
    with pytest.raises(ConfigError) as err:
        config(strategy="flowgrpo", kl_beta=0.1)
    assert "write it as flowgrpo.kl_beta" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config(strategy="flowgrpo", optimizer_step="per_step")
    assert "set flowgrpo.trajectories_per_step: null" in str(err.value)
    tiny = ROOT / "configs" / "tiny-cpu.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, tiny, ["algorithm.strategy=flowgrpo", "train.lora.enabled=false"])
    assert "algorithm.flowgrpo.kl_beta=0.04" in str(err.value) and "set train.lora.enabled=true" in str(err.value)
    ok = load_config(
        RunConfig, tiny, ["algorithm.strategy=flowgrpo", "algorithm.flowgrpo.kl_beta=0", "train.learning_rate=null"]
    )
    assert ok.learning_rate == 3e-4
