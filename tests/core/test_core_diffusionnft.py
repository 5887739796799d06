"""DiffusionNFT: its loss, old-policy decay and advantage against the published code's outputs
(fixture), the loss and optimality probability against hand-worked values, the old policy, the
rollout and the loss on the real toy model, and its config errors."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from g2rpo import core
from g2rpo.config import load_config
from g2rpo.errors import ConfigError
from g2rpo.seeding import Draws
from g2rpo.strategies.base import NFTStates, StatefulStrategy
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.diffusionnft import old_policy_decay, trained_timesteps_per_sample
from g2rpo.strategies.registry import STRATEGIES, build_strategy
from g2rpo.toy import make_toy_problem
from g2rpo.training.run_config import RunConfig
from tests.core.core_helpers import WithReference

LATENT = (4, 4)
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "oracle" / "diffusion_nft_loss.json"


def config(**overrides) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, overrides={"strategy": "diffusionnft", **overrides})


def no_kl(**overrides) -> AlgorithmConfig:
    own = {"kl_beta": 0.0, **overrides.pop("diffusionnft", {})}
    return config(diffusionnft=own, **overrides)


# --------------------------------------------------------------------------- against the published code


def test_loss_matches_the_published_training_loop_on_tiny_tensors():
    # Written by parity/make_diffusion_nft_oracle.py, running the loss lines of NVlabs/DiffusionNFT's
    # train_nft_sd3.py (commit in the fixture) on [4, 2, 3, 2] latents at σ = 1, 0.75, 0.4, 0.05,
    # advantages −7, −1.5, 0.3, 6 (two beyond the clip 5), β = 1 and 0.1, KL weight 1e-4.
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert ref["reference"].startswith("NVlabs/DiffusionNFT@24af5554")
    x0, xt, sigma = torch.tensor(ref["x0"]), torch.tensor(ref["xt"]), torch.tensor(ref["t"])
    old, v_ref = torch.tensor(ref["old_prediction"]), torch.tensor(ref["ref_forward_prediction"])
    advantages = torch.tensor(ref["advantages"], dtype=torch.float32)
    clip = ref["adv_clip_max"]
    for case in ref["loss_cases"]:
        v = torch.tensor(ref["forward_prediction"]).requires_grad_(True)
        r = core.nft_optimality(advantages, clip)
        torch.testing.assert_close(r, torch.tensor(case["r"], dtype=torch.float32))
        per_sample = core.diffusion_nft_loss(v, old, xt, x0, sigma, r, case["beta"])  # [4]
        torch.testing.assert_close(
            per_sample, torch.tensor(case["ori_policy_loss"], dtype=torch.float32), rtol=1e-5, atol=0
        )
        policy = (clip * per_sample).mean()
        assert policy.item() == pytest.approx(case["policy_loss"], rel=1e-5)
        kl = ((v - v_ref) ** 2).mean(dim=(1, 2, 3))
        torch.testing.assert_close(kl, torch.tensor(case["kl_div_loss"], dtype=torch.float32), rtol=1e-5, atol=0)
        loss = policy + case["kl_beta"] * kl.mean()
        assert loss.item() == pytest.approx(case["loss"], rel=1e-5)
        loss.backward()  # the detached weights and old velocity: the same gradient as the published loop's
        torch.testing.assert_close(
            v.grad, torch.tensor(case["grad_forward_prediction"], dtype=torch.float32), rtol=1e-4, atol=1e-7
        )


def test_old_policy_decay_matches_the_published_schedules():
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))["decay"]
    # the script's decay_type 0, 1 (default) and 2 (OCR) as (flat, rate, max)
    for kind, (flat, rate, maximum) in {"0": (0, 0.0, 0.0), "1": (0, 0.001, 0.5), "2": (75, 0.0075, 0.999)}.items():
        ours = [old_policy_decay(step, flat, rate, maximum) for step in ref["steps"]]
        assert ours == pytest.approx(ref[kind], abs=1e-15), kind


def test_advantages_match_the_published_per_prompt_stat_tracker():
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))["stat_tracker"]
    rewards = torch.tensor(ref["rewards"]).reshape(1, 3, 3)  # [R=1, P=3, G=3], prompt-major as written
    for global_std in (True, False):
        expected = torch.tensor(ref[f"advantages_global_std_{str(global_std).lower()}"]).reshape(1, 3, 3)
        got = core.flow_grpo_advantages(rewards, 1e-4, global_std=global_std)
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- hand-worked values


def test_optimality_probability_hand_values():
    adv = torch.tensor([-10.0, -5.0, 0.0, 2.5, 5.0, 8.0])
    # r = clip(A, ±5)/10 + ½: −5 → 0, 0 → ½, 2.5 → ¾, ≥ 5 → 1
    torch.testing.assert_close(core.nft_optimality(adv, 5.0), torch.tensor([0.0, 0.0, 0.5, 0.75, 1.0, 1.0]))


def test_loss_and_gradient_hand_values():
    # One sample, two dims: x₀ = 0, ε = 2 at σ = ½ → x_t = 1; v_old = [2, 0], v_θ = [3, 2], β = ½, r = ¾.
    x0, x_t = torch.zeros(1, 2), torch.ones(1, 2)
    v_old = torch.tensor([[2.0, 0.0]])
    v = torch.tensor([[3.0, 2.0]], requires_grad=True)
    # v⁺ = ½·[2, 0] + ½·[3, 2] = [2.5, 1]; x̂₀⁺ = 1 − ½·v⁺ = [−0.25, 0.5]: mean e² = 0.15625, mean |e| = 0.375,
    #   ℓ⁺ = 0.416667. v⁻ = 1.5·[2, 0] − ½·[3, 2] = [1.5, −1]; x̂₀⁻ = [0.25, 1.5]: mean e² = 1.15625,
    #   mean |e| = 0.875, ℓ⁻ = 1.321429. loss = (¾·0.416667 + ¼·1.321429)/½ = 1.285714
    loss = core.diffusion_nft_loss(v, v_old, x_t, x0, 0.5, torch.tensor([0.75]), beta=0.5)
    torch.testing.assert_close(loss, torch.tensor([1.285714]), rtol=1e-6, atol=0)
    # d/dv_θ with the weights held fixed: ∂x̂₀⁺/∂v_θ = −σβ = −¼, ∂x̂₀⁻/∂v_θ = +¼, d mean e²/de = e (2 dims):
    #   ∂ℓ⁺ = −¼·[−0.25, 0.5]/0.375 = [0.166667, −0.333333], ∂ℓ⁻ = ¼·[0.25, 1.5]/0.875 = [0.071429, 0.428571],
    #   grad = (¾·∂ℓ⁺ + ¼·∂ℓ⁻)/½ = [0.285714, −0.285714]
    loss.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([[0.285714, -0.285714]]), rtol=1e-5, atol=0)


def test_at_the_old_policy_the_loss_pulls_toward_good_samples_and_pushes_from_bad_ones():
    gen = torch.Generator().manual_seed(1)
    x0, eps = torch.randn(3, 5, 2, generator=gen), torch.randn(3, 5, 2, generator=gen)
    sigma = torch.tensor([0.9, 0.5, 0.2])
    x_t = (1 - sigma)[:, None, None] * x0 + sigma[:, None, None] * eps
    v_old = torch.randn(3, 5, 2, generator=gen)
    target = eps - x0  # the flow-matching velocity
    for r, sign in ((1.0, -1), (0.0, 1)):
        v = v_old.clone().requires_grad_(True)
        core.diffusion_nft_loss(v, v_old, x_t, x0, sigma, torch.full((3,), r), beta=0.3).sum().backward()
        # the gradient step −grad moves v_θ toward the target at r = 1, away from it at r = 0
        along = (-v.grad * (target - v_old)).sum(dim=(1, 2))
        assert bool((sign * along < 0).all()), (r, along)
    v = v_old.clone().requires_grad_(True)
    core.diffusion_nft_loss(v, v_old, x_t, x0, sigma, torch.full((3,), 0.5), beta=0.3).sum().backward()
    assert v.grad.abs().max() < 1e-6  # r = ½: the positive and negative pulls cancel at v_θ = v_old


def test_old_policy_decay_and_trained_timesteps_hand_values():
    assert old_policy_decay(0, 0, 0.001, 0.5) == 0.0  # no step taken yet: θ_old ← θ
    assert old_policy_decay(300, 0, 0.001, 0.5) == pytest.approx(0.3)
    assert old_policy_decay(900, 0, 0.001, 0.5) == 0.5  # capped
    assert old_policy_decay(74, 75, 0.0075, 0.999) == 0.0 and old_policy_decay(85, 75, 0.0075, 0.999) == pytest.approx(
        0.075
    )
    assert trained_timesteps_per_sample(10, 0.99) == 9  # the published 10 steps: 9 of them per sample
    assert trained_timesteps_per_sample(6, 0.99) == 5 and trained_timesteps_per_sample(4, 0.01) == 1


# --------------------------------------------------------------------------- rollout, old policy, loss


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_rollout_samples_the_ode_with_the_old_policy_and_counts_every_forward():
    model, cond, _ = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(no_kl(num_steps=5, group_size=3))
    before = _params(model)
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    st = rollout.states
    assert isinstance(st, NFTStates)
    assert st.clean.shape == (2, 3, *LATENT) and st.steps.shape == (2, 3, 4)  # S = int(0.99·5) = 4
    assert st.noisy.shape == st.v_old.shape == (2, 3, 4, *LATENT) and st.v_ref is None
    # distinct grid timesteps of [0, T) per sample
    assert all(len(set(row.tolist())) == 4 and max(row.tolist()) < 5 for row in st.steps.reshape(-1, 4))
    # P·G·T ODE forwards + P·G·S old-policy forwards at the noised samples
    assert rollout.nfe.sampling_forwards == 2 * 3 * 5 + 2 * 3 * 4
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # θ back bit for bit
    torch.testing.assert_close(rollout.final_latents, st.clean.reshape(6, *LATENT))
    # the clean sample is the Euler ODE from the row's initial noise; x_t lies on its forward process
    x = Draws(0, 0, (0, 1)).normal(LATENT, "initial-noise", 1, 2)[None]
    with torch.no_grad():
        for i in range(5):
            x = core.ode_step(
                x,
                model(x, rollout.sigmas[i].expand(1), cond[torch.tensor([1])]),
                rollout.sigmas[i],
                rollout.sigmas[i + 1],
            )
    torch.testing.assert_close(x[0], st.clean[1, 2], rtol=1e-5, atol=1e-6)
    sigma = rollout.sigmas[st.steps[1, 2, 0]]
    eps = (st.noisy[1, 2, 0] - (1 - sigma) * st.clean[1, 2]) / sigma
    with torch.no_grad():
        v_old = model(st.noisy[1, 2, :1], sigma.expand(1), cond[torch.tensor([1])])
    torch.testing.assert_close(st.v_old[1, 2, :1], v_old)  # iteration 0: θ_old = θ
    assert abs(float(eps.std()) - 1.0) < 0.6  # ε is a fresh standard normal draw


def _train_one_iteration(model, strategy, cond, reward, iteration, lr=5e-2):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    rollout = strategy.rollout(model, cond, Draws(0, iteration, (0,)), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    advantages = strategy.advantages(rollout, rewards)
    terms = list(strategy.loss_terms(model, rollout, advantages))
    for term in terms:
        term.loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return rollout, advantages, terms


def test_the_old_policy_follows_theta_by_the_decay_schedule_and_samples_the_rollouts():
    model, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    # decay 0.001·steps from step 0 on, one step per iteration; a large rate to see it: d(n) = min(0.3·n, 0.5)
    strategy = build_strategy(no_kl(num_steps=4, group_size=3, diffusionnft={"old_decay_rate": 0.3}))
    assert isinstance(strategy, StatefulStrategy)
    _train_one_iteration(model, strategy, cond, reward, 0)
    old_0 = {n: t.clone() for n, t in strategy.old.tensors.items()}
    theta_1 = _params(model)
    assert any(not torch.equal(old_0[n], theta_1[n]) for n in old_0)  # θ moved, θ_old not yet
    rollout = strategy.rollout(model, cond, Draws(0, 1, (0,)), LATENT)
    for n, t in strategy.old.tensors.items():  # one step taken: d = 0.3
        torch.testing.assert_close(t, 0.3 * old_0[n] + 0.7 * theta_1[n])
    # the rollout used θ_old: its v_old is θ_old's velocity, not θ's
    probe = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in probe.named_parameters():
            p.copy_(strategy.old.tensors[n])
    st = rollout.states
    x, sigma, row_cond = st.noisy[0, 0], rollout.sigmas[st.steps[0, 0]], cond[torch.zeros(3, dtype=torch.long)]
    with torch.no_grad():
        torch.testing.assert_close(st.v_old[0, 0], probe(x, sigma, row_cond))
        assert (st.v_old[0, 0] - model(x, sigma, row_cond)).abs().max() > 1e-6
    # the same iteration again does not move it; going back is refused
    again = {n: t.clone() for n, t in strategy.old.tensors.items()}
    strategy.rollout(model, cond, Draws(0, 1, (0,)), LATENT)
    assert all(torch.equal(again[n], strategy.old.tensors[n]) for n in again)
    with pytest.raises(ValueError, match="iterations only go forward"):
        strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)


def test_a_strategy_loaded_from_the_state_dict_continues_the_same_trajectory():
    runs = {}
    for name in ("straight", "resumed"):
        model, cond, reward = make_toy_problem(num_prompts=1, seed=0)
        strategy = build_strategy(no_kl(num_steps=4, group_size=3, diffusionnft={"old_decay_rate": 0.2}))
        for iteration in range(4):
            if name == "resumed" and iteration == 2:
                state = copy.deepcopy(strategy.state_dict())
                strategy = build_strategy(strategy.config)
                strategy.load_state_dict(state)
            _train_one_iteration(model, strategy, cond, reward, iteration)
        runs[name] = (_params(model), strategy.state_dict())
    (theta_a, state_a), (theta_b, state_b) = runs["straight"], runs["resumed"]
    assert all(torch.equal(theta_a[n], theta_b[n]) for n in theta_a)
    assert state_a["iteration"] == state_b["iteration"] == 3
    assert all(torch.equal(state_a["old_policy"][n], state_b["old_policy"][n]) for n in state_a["old_policy"])


def test_loss_terms_average_the_published_loss_over_samples_and_timesteps():
    model, cond, reward = make_toy_problem(num_prompts=2, seed=0)
    strategy = build_strategy(no_kl(num_steps=4, group_size=3))
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0, 1)), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    advantages = strategy.advantages(rollout, rewards)
    terms = list(strategy.loss_terms(model, rollout, advantages))
    assert len(terms) == 3 and [t.step_optimizer for t in terms] == [False, False, True]  # S = 3 slots, one step
    assert sum(t.stats.forwards for t in terms) == 2 * 3 * 3  # P·G·S training forwards
    assert all(math.isnan(t.stats.clip_fraction) for t in terms)  # no importance ratio
    st = rollout.states
    r = core.nft_optimality(advantages.values, 5.0)  # [P, G]
    expected = []
    with torch.no_grad():
        for p in range(2):
            for g in range(3):
                sigma = rollout.sigmas[st.steps[p, g]]  # [S]
                v = model(st.noisy[p, g], sigma, cond[torch.full((3,), p)])
                x0 = st.clean[p, g].expand(3, *LATENT)
                expected.append(
                    5.0 * core.diffusion_nft_loss(v, st.v_old[p, g], st.noisy[p, g], x0, sigma, r[p, g].expand(3), 1.0)
                )
    torch.testing.assert_close(sum(t.loss for t in terms), torch.cat(expected).mean(), rtol=1e-5, atol=1e-7)


def test_trajectories_per_step_splits_the_samples_into_optimiser_steps():
    model, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    strategy = build_strategy(no_kl(num_steps=4, group_size=3, diffusionnft={"trajectories_per_step": 2}))
    assert strategy.settings.steps_per_iteration(3) == 2
    rollout = strategy.rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    terms = list(strategy.loss_terms(model, rollout, strategy.advantages(rollout, rewards)))
    assert [t.stats.forwards for t in terms] == [2, 2, 2, 1, 1, 1]  # samples {0, 1} then {2}, 3 slots each
    assert [t.step_optimizer for t in terms] == [False, False, True, False, False, True]


def test_kl_to_an_identical_reference_is_zero_and_adds_its_weight_otherwise():
    policy, cond, reward = make_toy_problem(num_prompts=1, seed=0)
    same = WithReference(policy, copy.deepcopy(policy))
    strategy = build_strategy(config(num_steps=4, group_size=3, diffusionnft={"kl_beta": 0.5}))
    rollout = strategy.rollout(same, cond, Draws(0, 0, (0,)), LATENT)
    assert rollout.nfe.sampling_forwards == 3 * 4 + 2 * 3 * 3  # ODE + old + reference forwards
    rewards = reward(rollout.final_latents, rollout.final_prompt).reshape(rollout.reward_layout(1))
    advantages = strategy.advantages(rollout, rewards)
    terms = list(strategy.loss_terms(same, rollout, advantages))
    assert all(t.stats.kl == 0.0 for t in terms)
    moved = copy.deepcopy(policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05)
    shifted = WithReference(moved, policy)
    with_kl = list(strategy.loss_terms(shifted, rollout, advantages))
    plain = build_strategy(no_kl(num_steps=4, group_size=3))
    without = list(plain.loss_terms(moved, rollout, advantages))
    for a, b in zip(with_kl, without, strict=True):
        assert a.stats.kl > 0  # each term is one slot of three: loss += ½·kl/3
        torch.testing.assert_close(a.loss - b.loss, torch.tensor(0.5 * a.stats.kl / 3), rtol=1e-5, atol=1e-7)
    with_kl[0].loss.backward()
    assert all(p.grad is None for p in policy.parameters())  # the reference gets no gradient
    with pytest.raises(ValueError, match="has no reference_velocity .* or set diffusionnft.kl_beta: 0"):
        strategy.rollout(policy, cond, Draws(0, 0, (0,)), LATENT)


def test_the_dpm_sampler_is_dpm_solver_2m():
    model, cond, _ = make_toy_problem(num_prompts=1, seed=0)
    rollout = build_strategy(no_kl(num_steps=4, group_size=2, diffusionnft={"sampler": "dpmpp_2m"})).rollout(
        model, cond, Draws(0, 0, (0,)), LATENT
    )
    x = Draws(0, 0, (0,)).normal(LATENT, "initial-noise", 0, 1)[None]
    x0_prev, sigma_prev, sig = None, None, rollout.sigmas
    with torch.no_grad():
        for i in range(4):
            v = model(x, sig[i].expand(1), cond[torch.tensor([0])])
            x, x0_prev = core.dpmpp_2m_step(x, v, sig[i], sig[i + 1], x0_prev, sigma_prev)
            sigma_prev = sig[i]
    torch.testing.assert_close(rollout.states.clean[0, 1], x[0])
    euler = build_strategy(no_kl(num_steps=4, group_size=2)).rollout(model, cond, Draws(0, 0, (0,)), LATENT)
    assert (euler.states.clean - rollout.states.clean).abs().max() > 1e-5


def test_only_diffusionnft_carries_state_across_iterations():
    stateful = {
        name for name, cls in STRATEGIES.items() if isinstance(cls(AlgorithmConfig(strategy=name)), StatefulStrategy)
    }
    assert stateful == {"diffusionnft"}


# --------------------------------------------------------------------------- config


def test_bad_diffusionnft_settings_name_the_field_and_the_fix():
    for bad in ({"beta": 0}, {"beta": -0.5}, {"train_fraction": 0}, {"old_decay_max": 1.5}, {"old_decay_rate": -1}):
        (field,) = bad
        with pytest.raises(ConfigError, match=f"diffusionnft.{field}"):
            config(diffusionnft=bad)
    with pytest.raises(ConfigError, match="diffusionnft.sampler"):
        config(diffusionnft={"sampler": "heun"})
    with pytest.raises(ConfigError) as err:
        config(old_decay_max=0.9)
    assert "write it as diffusionnft.old_decay_max" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config(optimizer_step="per_step")
    assert "diffusionnft trains on random timesteps" in str(err.value)
    tiny = ROOT / "configs" / "tiny-cpu.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, tiny, ["algorithm.strategy=diffusionnft"])
    assert "algorithm.diffusionnft.kl_beta=0.0001" in str(err.value) and "set train.lora.enabled=true" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(
            RunConfig,
            tiny,
            [
                "algorithm.strategy=diffusionnft",
                "train.lora.enabled=true",
                "deepspeed.enabled=true",
                "deepspeed.zero_stage=3",
            ],
        )
    assert "deepspeed.zero_stage=3: DiffusionNFT keeps a whole copy" in str(err.value)
    ok = load_config(
        RunConfig,
        tiny,
        ["algorithm.strategy=diffusionnft", "algorithm.diffusionnft.kl_beta=0", "train.learning_rate=null"],
    )
    assert ok.learning_rate == 3e-4
