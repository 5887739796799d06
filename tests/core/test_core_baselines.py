"""The baselines as their published code runs them: DanceGRPO's scored latent and trained steps, the
optimiser stepping and learning rate of DanceGRPO and MixGRPO, each pinned by a hand-checked case."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from g2rpo.config import load_config
from g2rpo.errors import ConfigError
from g2rpo.seeding import Draws
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.registry import build_strategy
from g2rpo.toy import make_toy_problem
from g2rpo.training.drivers import TorchDriver
from g2rpo.training.run_config import RunConfig

LATENT = (4, 4)
TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def config(**overrides) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, overrides=overrides)


def identity_velocity_toy(num_prompts: int):
    """The real toy model with its MLP's output layer zeroed: v(x, σ, c) = x exactly."""
    model, cond, reward = make_toy_problem(num_prompts=num_prompts, seed=0)
    with torch.no_grad():
        model.net[-1].weight.zero_()
        model.net[-1].bias.zero_()
        model.skip.fill_(1.0)
    return model, cond, reward


def test_dancegrpo_scores_the_x0_prediction_of_the_last_step():
    model, cond, _ = identity_velocity_toy(num_prompts=2)
    strategy = build_strategy(config(strategy="dancegrpo", num_steps=6, group_size=3))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    states = rollout.states.latents.reshape(6, 7, *LATENT)  # rows (p, g), states x[0..T]
    sigma = rollout.sigmas[5]  # σ[T−1]
    assert 0 < float(sigma) < 1
    # v = x, so x̂₀ = x[T−1] − σ[T−1]·v = (1 − σ[T−1])·x[T−1]
    torch.testing.assert_close(rollout.final_latents, (1 - sigma) * states[:, 5], rtol=1e-6, atol=1e-6)
    # ... which is not the last noisy sample x[T] that the project scored before
    assert (rollout.final_latents - states[:, 6]).abs().max() > 1e-3


def test_dancegrpo_scored_latent_matches_an_independent_forward_on_a_trained_like_model():
    model, cond, _ = make_toy_problem(num_prompts=1, seed=3)
    strategy = build_strategy(config(strategy="dancegrpo", num_steps=4, group_size=2))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    x_last = rollout.states.latents[0, :, 3]  # [G, L, C] the states at σ[T−1]
    sigma = rollout.sigmas[3]
    with torch.no_grad():
        v = model(x_last, sigma.expand(2), cond[torch.zeros(2, dtype=torch.long)])
    torch.testing.assert_close(rollout.final_latents, x_last - sigma * v)


def test_dancegrpo_trains_int_of_sixty_percent_of_the_first_t_minus_one_steps():
    model, cond, _ = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(config(strategy="dancegrpo", num_steps=16, group_size=12))
    assert strategy.trained_per_trajectory == 9  # int(0.6 · 15), the paper's T = 16
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    trained = rollout.states.trained_steps  # [P, G, S]
    assert trained.shape == (2, 12, 9)
    assert int(trained.min()) >= 0 and int(trained.max()) <= 14  # step 15 (the last) is never trained
    assert all(len(set(row)) == 9 for row in trained.reshape(-1, 9).tolist())
    # over many trajectories every one of the first 15 steps is drawn
    assert set(trained.flatten().tolist()) == set(range(15))


@pytest.mark.parametrize(
    ("name", "per_step", "slots"),
    [("dancegrpo", 4, 9), ("mixgrpo", 3, 4)],  # the published scripts' accumulation; DanceGRPO S = 9, MixGRPO W = 4
)
def test_baselines_step_the_optimiser_per_accumulation_of_trajectories(name, per_step, slots):
    model, cond, reward = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(config(strategy=name, num_steps=16, group_size=12))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    advantages = strategy.advantages(rollout, rewards)
    steps = 12 // per_step  # DanceGRPO 3 steps per iteration, MixGRPO 4
    terms = [t.detached() for t in strategy.loss_terms(model, rollout, advantages)]
    assert len(terms) == steps * slots
    assert [t.step_optimizer for t in terms] == ([False] * (slots - 1) + [True]) * steps
    assert all(t.stats.forwards == 2 * per_step for t in terms)  # both prompts' branches of the accumulation
    # At the first update every ratio is 1, so each term is −mean(A) over its rows / slots and an
    # accumulation sums to −mean of the advantages of branches [c·a, (c+1)·a) of both prompts.
    for c in range(steps):
        accumulation = terms[c * slots : (c + 1) * slots]
        expected = -float(advantages.values[:, c * per_step : (c + 1) * per_step].mean())
        assert sum(t.stats.loss for t in accumulation) == pytest.approx(expected, abs=1e-6)
        assert all(t.stats.ratio_mean == pytest.approx(1.0, abs=1e-5) for t in accumulation)


def test_trajectories_per_step_null_steps_once_and_a_partial_last_accumulation_steps_too():
    model, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    for per_step, flags in ((None, [False, False, True]), (2, [False, False, True] * 2 + [False, False, True])):
        strategy = build_strategy(
            config(strategy="dancegrpo", num_steps=6, group_size=5, dancegrpo={"trajectories_per_step": per_step})
        )
        assert strategy.trained_per_trajectory == 3  # int(0.6 · 5)
        rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
        rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
        advantages = strategy.advantages(rollout, rewards)
        terms = list(strategy.loss_terms(model, rollout, advantages))
        assert [t.step_optimizer for t in terms] == flags
        # branches per step: all 5 at once, or 2 + 2 + 1 (the script would drop the last; here it steps)
        assert [t.stats.forwards for t in terms] == ([5] * 3 if per_step is None else [2] * 6 + [1] * 3)


def test_per_step_stepping_and_an_accumulation_conflict_with_a_clear_error():
    with pytest.raises(ConfigError) as err:
        config(strategy="dancegrpo", optimizer_step="per_step")
    assert err.value.problems[0].startswith("optimizer_step='per_step': dancegrpo steps the optimiser every")
    assert "set dancegrpo.trajectories_per_step: null" in err.value.problems[0]
    ok = config(strategy="mixgrpo", optimizer_step="per_step", mixgrpo={"trajectories_per_step": None})
    assert ok.settings.multi_step_setting(ok) == ("optimizer_step", "per_step")
    assert config(strategy="dancegrpo").settings.multi_step_setting(config(strategy="dancegrpo")) == (
        "dancegrpo.trajectories_per_step",
        4,
    )
    small_group = config(strategy="dancegrpo", group_size=4)  # one accumulation holds the whole group
    assert small_group.settings.multi_step_setting(small_group) is None
    assert config().settings.multi_step_setting(config()) is None  # G²RPO: once per iteration (reference)


def test_each_strategy_trains_at_its_published_learning_rate_unless_train_sets_one():
    def run_config(*overrides):
        return load_config(RunConfig, TINY_CONFIG, ["train.learning_rate=null", *overrides])

    assert run_config().learning_rate == 2e-6  # G²RPO: the paper's
    assert run_config("algorithm.strategy=dancegrpo").learning_rate == 1e-5
    assert run_config("algorithm.strategy=mixgrpo").learning_rate == 1e-5
    assert run_config("algorithm.strategy=dancegrpo", "algorithm.dancegrpo.learning_rate=3e-5").learning_rate == 3e-5
    assert run_config("algorithm.strategy=dancegrpo", "train.learning_rate=1e-3").learning_rate == 1e-3
    module = torch.nn.Linear(2, 2)
    driver = TorchDriver(module, list(module.parameters()), run_config("algorithm.strategy=mixgrpo"))
    assert driver.learning_rate == 1e-5
