"""g2rpo.core against hand-worked values (derivations in the comments) and reference classes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from g2rpo import core, strides

# --------------------------------------------------------------------------- grids


@pytest.mark.parametrize(("num_steps", "seq_len"), [(16, 2025), (4, 16), (28, 4096), (50, 1024), (1, 256)])
def test_flux_sigmas_bit_equal_to_diffusers_flux_scheduler(num_steps, seq_len):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    # Flux.1-dev's scheduler config and FluxPipeline's own way of setting the timesteps.
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
        time_shift_type="exponential",
    )
    mu = calculate_shift(seq_len, 256, 4096, 0.5, 1.15)
    retrieve_timesteps(scheduler, num_steps, "cpu", sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    ours = core.flux_sigmas(num_steps, seq_len)
    assert ours.dtype == torch.float32 and ours.shape == (num_steps + 1,)
    assert torch.equal(ours, scheduler.sigmas)
    assert core.flux_mu(seq_len) == pytest.approx(mu)


def test_flux_sigmas_hand_value():
    # L = 256 → μ = 0.5; T = 2 → s = [1, 0.5]; σ = e^0.5/(e^0.5 + 1/s − 1) = [1, e^0.5/(e^0.5 + 1)]
    e = math.exp(0.5)
    assert core.flux_sigmas(2, 256).tolist() == pytest.approx([1.0, e / (e + 1), 0.0], abs=1e-7)


def test_static_shift_sigmas_hand_values():
    # t = [1, .75, .5, .25, 0], σ = 3t/(1 + 2t): 3/3, 2.25/2.5, 1.5/2, .75/1.5, 0
    assert core.static_shift_sigmas(4, 3.0).tolist() == pytest.approx([1.0, 0.9, 0.75, 0.5, 0.0], abs=1e-7)


# --------------------------------------------------------------------------- steps


def test_ode_step_hand_value_and_per_row_sigma():
    x = torch.tensor([[[1.0]], [[2.0]]])  # [2, 1, 1]
    v = torch.tensor([[[0.5]], [[-1.0]]])
    # row 0: 1 + (0.25 − 0.5)·0.5 = 0.875; row 1 (σ 0.9 → 0.6): 2 + (−0.3)·(−1) = 2.3
    out = core.ode_step(x, v, torch.tensor([0.5, 0.9]), torch.tensor([0.25, 0.6]))
    assert out.flatten().tolist() == pytest.approx([0.875, 2.3])


def test_dpmpp_2m_step_hand_values():
    # σ₋ = 0.8, σ = 0.5, σ' = 0.2: λ = log((1 − σ)/σ) = −log 4, 0, log 4, so h = h₋ = log 4 and
    # h/(2h₋) = ½. x = 1, v = 0.4: x̂₀ = 1 − 0.5·0.4 = 0.8; with x̂₀₋ = 0.6:
    # D = 0.8 + ½·(0.8 − 0.6) = 0.9; x' = (0.2/0.5)·1 + (1 − 0.4)·0.9 = 0.4 + 0.54 = 0.94
    # (Euler: 1 + (0.2 − 0.5)·0.4 = 0.88).
    x, v = torch.tensor([[1.0]]), torch.tensor([[0.4]])
    x_next, x0 = core.dpmpp_2m_step(x, v, 0.5, 0.2, torch.tensor([[0.6]]), 0.8)
    assert x_next.item() == pytest.approx(0.94) and x0.item() == pytest.approx(0.8)
    # No previous step: D = x̂₀, x' = 0.4·1 + 0.6·0.8 = 0.88 = Euler.
    assert core.dpmpp_2m_step(x, v, 0.5, 0.2)[0].item() == pytest.approx(0.88)
    # A step to σ' = 0 is first order (λ' = ∞): x' = D = x̂₀ = 0.8 whatever x̂₀₋ is, and finite.
    final, _ = core.dpmpp_2m_step(x, v, 0.5, 0.0, torch.tensor([[-7.0]]), 0.8)
    assert final.item() == pytest.approx(0.8)
    # Per-row σ: row 1 repeats the hand case, row 0 (σ' = 0) is x̂₀ = 2 − 0.25·1 = 1.75.
    rows, _ = core.dpmpp_2m_step(
        torch.tensor([[2.0], [1.0]]),
        torch.tensor([[1.0], [0.4]]),
        torch.tensor([0.25, 0.5]),
        torch.tensor([0.0, 0.2]),
        torch.tensor([[5.0], [0.6]]),
        torch.tensor([0.5, 0.8]),
    )
    assert rows.flatten().tolist() == pytest.approx([1.75, 0.94])
    with pytest.raises(ValueError, match="needs sigma_prev"):
        core.dpmpp_2m_step(x, v, 0.5, 0.2, torch.tensor([[0.6]]))


def _gaussian_data_flow(mean: float, std: float):
    """Data x₀ ~ N(m, s²) per element: the marginal velocity is linear in x and its ODE is exact.

    x_σ = (1 − σ)·x₀ + σ·ε has variance V(σ) = (1 − σ)²s² + σ², and E[ε − x₀ | x_σ] gives
    v(x, σ) = −m + (σ − (1 − σ)s²)/V(σ) · (x − (1 − σ)m). The flow keeps the standardised
    z = (x − (1 − σ)m)/sqrt(V) constant (d/dσ of (1 − σ)m + sqrt(V)·z is exactly v), so the
    exact solution from σ_a to σ_b is x_b = (1 − σ_b)m + sqrt(V_b/V_a)·(x_a − (1 − σ_a)m).
    """

    def variance(sigma):
        return (1 - sigma) ** 2 * std**2 + sigma**2

    def velocity(x, sigma):
        return -mean + (sigma - (1 - sigma) * std**2) / variance(sigma) * (x - (1 - sigma) * mean)

    def exact(x, sigma_a, sigma_b):
        return (1 - sigma_b) * mean + (variance(sigma_b) / variance(sigma_a)) ** 0.5 * (x - (1 - sigma_a) * mean)

    return velocity, exact


def _solve(velocity, x, sigmas, solver):
    previous = (None, None)
    for i in range(sigmas.shape[0] - 1):
        v = velocity(x, sigmas[i])
        if solver == "euler":
            x = core.ode_step(x, v, sigmas[i], sigmas[i + 1])
        else:
            x, x0 = core.dpmpp_2m_step(x, v, sigmas[i], sigmas[i + 1], *previous)
            previous = (x0, sigmas[i])
    return x


def test_dpmpp_2m_is_second_order_on_a_linear_velocity_field():
    velocity, exact = _gaussian_data_flow(mean=0.7, std=0.3)
    x = torch.tensor([[1.3], [-0.4], [0.05]], dtype=torch.float64)

    def error(sigmas, solver):
        return float((_solve(velocity, x, sigmas, solver) - exact(x, sigmas[0], sigmas[-1])).abs().max())

    # Order: from σ = 0.9 to 0.1 with steps uniform in λ = log((1 − σ)/σ) (where DPM-Solver's
    # analysis holds), doubling the steps halves Euler's error and quarters DPM-Solver++(2M)'s
    # (the asymptotic regime; below ~16 steps its error changes sign).
    def lambda_grid(n):
        lam = torch.linspace(math.log(0.1 / 0.9), math.log(0.9 / 0.1), n + 1, dtype=torch.float64)
        return torch.sigmoid(-lam)  # σ = 1/(1 + e^λ)

    for n in (32, 64):
        assert 1.8 < error(lambda_grid(n), "euler") / error(lambda_grid(2 * n), "euler") < 2.2
        assert error(lambda_grid(n), "dpmpp_2m") / error(lambda_grid(2 * n), "dpmpp_2m") > 3
    # In use: the whole finish from σ = 1 to 0 on Flux's grid, the last step (to σ = 0) first order.
    # At the same number of steps (= forwards) the second-order solver is measurably closer.
    flux_16, flux_32 = core.flux_sigmas(16, 256).double(), core.flux_sigmas(32, 256).double()
    assert error(flux_16, "dpmpp_2m") < 0.5 * error(flux_16, "euler")
    assert error(flux_32, "dpmpp_2m") < 0.1 * error(flux_32, "euler")


def test_sde_mean_matches_spec_formula_on_hand_picked_numbers():
    # x = 1, v = 0.5, σ = 0.5, σ' = 0.25, η = 0.7:
    #   s = 0.7·sqrt(0.5/0.5) = 0.7, s² = 0.49, h = 0.25
    #   μ = x − h·[v + s²/(2σ)·(x + (1−σ)·v)] = 1 − 0.25·[0.5 + 0.49·(1 + 0.25)] = 1 − 0.25·1.1125 = 0.721875
    #   std = s·sqrt(h) = 0.7·0.5 = 0.35;  x' = μ + std·ξ with ξ = 2 → 1.421875
    x = torch.ones(1, 1, 1)
    v = torch.full((1, 1, 1), 0.5)
    nxt, mean, std = core.sde_step(x, v, 0.5, 0.25, 0.7, torch.full((1, 1, 1), 2.0))
    assert mean.item() == pytest.approx(0.721875, abs=1e-6)
    assert std.item() == pytest.approx(0.35, abs=1e-6)
    assert nxt.item() == pytest.approx(1.421875, abs=1e-6)


def test_sde_step_at_sigma_one_is_finite_with_grid_substitute():
    # σ = 1, σ' = 0.9, σ[1] = 0.9 in the denominator: s = 0.7·sqrt(1/0.1), s² = 4.9, h = 0.1
    #   μ = 1 − 0.1·[0.5 + 4.9/2·(1 + 0·0.5)] = 1 − 0.1·2.95 = 0.705; std = 0.7·sqrt(10)·sqrt(0.1) = 0.7
    x, v = torch.ones(1, 1, 1), torch.full((1, 1, 1), 0.5)
    nxt, mean, std = core.sde_step(x, v, 1.0, 0.9, 0.7, torch.zeros(1, 1, 1), sigma_one_substitute=0.9)
    assert torch.isfinite(nxt).all()
    assert mean.item() == pytest.approx(0.705, abs=1e-6)
    assert std.item() == pytest.approx(0.7, abs=1e-6)
    # The issue's six-argument call is finite at σ = 1 too: the substitute defaults to σ' (= σ[1]
    # for the grid's first step), so it gives the same numbers.
    nxt6, mean6, std6 = core.sde_step(x, v, 1.0, 0.9, 0.7, torch.zeros(1, 1, 1))
    assert (nxt6.item(), mean6.item(), std6.item()) == (nxt.item(), mean.item(), std.item())
    # per-row σ with the first row at σ = 1: only that row uses σ' in the denominator
    #   row 1: σ = 0.5 → 0.25 is the hand example above, μ = 0.721875, std = 0.35
    x2, v2 = torch.ones(2, 1, 1), torch.full((2, 1, 1), 0.5)
    _, mean2, std2 = core.sde_step(
        x2, v2, torch.tensor([1.0, 0.5]), torch.tensor([0.9, 0.25]), 0.7, torch.zeros(2, 1, 1)
    )
    assert mean2.flatten().tolist() == pytest.approx([0.705, 0.721875], abs=1e-6)
    assert std2.flatten().tolist() == pytest.approx([0.7, 0.35], abs=1e-6)
    # the bare noise scale has no σ' to fall back on: at σ = 1 it asks for the substitute
    with pytest.raises(ValueError, match="sigma_one_substitute"):
        core.sde_noise_scale(1.0, 0.7)


def test_sde_dancegrpo_noise_form_matches_its_score_based_step():
    # DanceGRPO's step, x = 1, v = 0.5, σ = 0.8, σ' = 0.6 (dσ = −0.2), η = 0.7:
    #   x̂₀ = x − σ·v = 0.6; score = −(x − (1 − σ)·x̂₀)/σ² = −(1 − 0.12)/0.64 = −1.375
    #   μ = x + dσ·v + (−½η²·score)·dσ = 1 − 0.1 − 0.5·0.49·1.375·0.2 = 0.832625; std = η·sqrt(0.2)
    # = the spec's mean formula with s_σ = η: 1 − 0.2·[0.5 + 0.49/1.6·(1 + 0.2·0.5)] = 0.832625
    x, v = torch.ones(1, 1, 1), torch.full((1, 1, 1), 0.5)
    _, mean, std = core.sde_step(x, v, 0.8, 0.6, 0.7, torch.zeros(1, 1, 1), noise_form="dancegrpo")
    assert mean.item() == pytest.approx(0.832625, abs=1e-6)
    assert std.item() == pytest.approx(0.7 * math.sqrt(0.2), abs=1e-6)
    # finite at σ = 1 without a substitute: s_σ = η does not divide by 1 − σ
    nxt, _, _ = core.sde_step(x, v, 1.0, 0.9, 0.7, torch.ones(1, 1, 1), noise_form="dancegrpo")
    assert torch.isfinite(nxt).all()
    with pytest.raises(ValueError, match="noise_form"):
        core.sde_noise_scale(0.5, 0.7, noise_form="cps")


def test_sde_step_with_zero_eta_is_the_ode_step():
    gen = torch.Generator().manual_seed(0)
    x, v, noise = (torch.randn(3, 5, 4, generator=gen) for _ in range(3))
    sigma, sigma_next = torch.tensor([1.0, 0.7, 0.3]), torch.tensor([0.8, 0.4, 0.0])
    nxt, mean, std = core.sde_step(x, v, sigma, sigma_next, 0.0, noise, sigma_one_substitute=0.8)
    torch.testing.assert_close(mean, core.ode_step(x, v, sigma, sigma_next))
    torch.testing.assert_close(nxt, mean)
    assert torch.count_nonzero(std) == 0


# --------------------------------------------------------------------------- log-prob


def test_gaussian_log_prob_equals_torch_normal():
    gen = torch.Generator().manual_seed(1)
    mean = torch.randn(4, 6, 3, generator=gen)
    std = torch.tensor([0.1, 0.5, 1.0, 2.0]).reshape(4, 1, 1)
    sample = mean + std * torch.randn(4, 6, 3, generator=gen)
    reference = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(sample)  # [4, 6, 3]
    torch.testing.assert_close(core.gaussian_log_prob(sample, mean, std), reference.mean(dim=(1, 2)))
    torch.testing.assert_close(core.gaussian_log_prob(sample, mean, std, reduce="sum"), reference.sum(dim=(1, 2)))


def test_gaussian_log_prob_lower_under_shifted_mean():
    gen = torch.Generator().manual_seed(2)
    mean = torch.randn(8, 4, 4, generator=gen)
    sample = mean + 0.3 * torch.randn(8, 4, 4, generator=gen)
    # Drawn from N(mean, 0.3²) with noise e; moving the mean by 1 changes the mean log-prob by
    # −(1 − 2·mean(e))/(2·0.09) ≈ −5.6 ± 0.8 (mean(e) over 16 dims has std 0.075): always lower.
    assert (core.gaussian_log_prob(sample, mean + 1.0, 0.3) < core.gaussian_log_prob(sample, mean, 0.3)).all()


def test_gaussian_log_prob_broadcast_group_mean_and_batch_dims():
    gen = torch.Generator().manual_seed(3)
    mean = torch.randn(2, 1, 5, 3, generator=gen)  # one mean per group
    samples = torch.randn(2, 4, 5, 3, generator=gen)  # G = 4 samples per group
    lp = core.gaussian_log_prob(samples, mean, 0.5, batch_dims=2)  # [2, 4]
    one_by_one = torch.stack(
        [
            torch.stack([core.gaussian_log_prob(samples[p, g][None], mean[p], 0.5)[0] for g in range(4)])
            for p in range(2)
        ]
    )
    torch.testing.assert_close(lp, one_by_one)
    with pytest.raises(ValueError, match="reduce"):
        core.gaussian_log_prob(samples, mean, 0.5, reduce="max")


# --------------------------------------------------------------------------- stride schedules


@pytest.mark.parametrize(
    ("k", "stride", "expected"),
    [
        (0, 1, list(range(1, 17))),  # every index from k+1 = 1 to T = 16
        (0, 2, [1, 3, 5, 7, 9, 11, 13, 15, 16]),  # 2 does not divide the 15 remaining steps: 15 → 16 is short
        (0, 3, [1, 4, 7, 10, 13, 16]),  # 3 divides 15: lands on 16 without an extra step
        (0, 5, [1, 6, 11, 16]),
        (7, 3, [8, 11, 14, 16]),  # 8 remaining steps, 3 does not divide them
        (5, 4, [6, 10, 14, 16]),
        (3, 2, [4, 6, 8, 10, 12, 14, 16]),  # 12 remaining, 2 divides
        (14, 2, [15, 16]),
        (15, 3, [16]),  # branching at the last step: the branch already sits at σ = 0
        (2, 20, [3, 16]),  # stride larger than what remains: one step straight to 0
    ],
)
def test_stride_indices_hand_enumerated_for_T16(k, stride, expected):
    assert strides.stride_indices(16, k, stride) == expected


@pytest.mark.parametrize(
    ("k", "stride", "expected"),
    [
        # reference σ[:k+2] + σ[k+2::λ]; the ODE runs from index k+1 and the image is the
        # x₀-prediction x − σ·v at the last point but one (= an Euler step to σ = 0 from there)
        (0, 3, [1, 2, 5, 8, 11, 16]),  # points 1, 2, 5, 8, 11, 14: x₀ scored from 11
        (0, 2, [1, 2, 4, 6, 8, 10, 12, 14, 16]),  # points 1, 2, 4, …, 16: ends on T, nothing dropped but T
        (0, 1, list(range(1, 17))),  # stride 1: same as the default mode
        (13, 3, [14, 16]),  # points 14, 15: x₀ scored from 14
        (14, 2, [15, 16]),
        (15, 2, [16]),
    ],
)
def test_reference_mode_stride_indices_hand_enumerated_for_T16(k, stride, expected):
    assert strides.stride_indices(16, k, stride, mode="reference") == expected


def test_stride_schedule_returns_the_grid_sigmas_and_rejects_bad_values():
    sigmas = core.static_shift_sigmas(16)
    sched = core.stride_schedule(sigmas, 7, 3)
    assert sched.tolist() == sigmas[[8, 11, 14, 16]].tolist()
    assert sched[-1].item() == 0.0
    with pytest.raises(ValueError):
        strides.stride_indices(16, 16, 1)
    with pytest.raises(ValueError):
        strides.stride_indices(16, 0, 0)
    with pytest.raises(ValueError, match="mode"):
        strides.stride_indices(16, 0, 1, mode="nearest")


def test_thin_schedule_and_capped_stride_indices_hand_values():
    # n = 15 steps [1 … 16] thinned to 4: positions round(j·15/4) = round(0, 3.75, 7.5, 11.25, 15)
    # = 0, 4, 8, 11, 15 (halves up) → [1, 5, 9, 12, 16]
    assert strides.thin_schedule(list(range(1, 17)), 4) == [1, 5, 9, 12, 16]
    assert strides.stride_indices(16, 0, 1, max_steps=4) == [1, 5, 9, 12, 16]
    # λ = 2 from k = 0: [1, 3, …, 15, 16] (n = 8) → positions 0, 2, 4, 6, 8 → [1, 5, 9, 13, 16]
    assert strides.stride_indices(16, 0, 2, max_steps=4) == [1, 5, 9, 13, 16]
    # λ = 3 from k = 7: [8, 11, 14, 16] has 3 ≤ 4 steps: unchanged; a cap of 1 leaves [8, 16]
    assert strides.stride_indices(16, 7, 3, max_steps=4) == [8, 11, 14, 16]
    assert strides.stride_indices(16, 7, 3, max_steps=1) == [8, 16]
    # reference mode is thinned the same way: [1, 2, 5, 8, 11, 16] (n = 5) to 2 → positions 0, 3 (2.5 up), 5
    assert strides.stride_indices(16, 0, 3, mode="reference", max_steps=2) == [1, 8, 16]
    assert core.stride_schedule(core.static_shift_sigmas(16), 0, 1, max_steps=4).tolist() == (
        core.static_shift_sigmas(16)[[1, 5, 9, 12, 16]].tolist()
    )
    with pytest.raises(ValueError, match="max_steps must be ≥ 1"):
        strides.thin_schedule([1, 2, 3], 0)


def test_finish_forwards_shares_the_first_forward():
    # T = 16, k = 0, Λ = {1, 2, 3}: n = 15, 8, 5 steps; first forward shared → 1 + 14 + 7 + 4 = 26
    assert strides.finish_forwards(16, 0, [1, 2, 3]) == 26
    # k = 7: n = 8, 4, 3 → 1 + 7 + 3 + 2 = 13
    assert strides.finish_forwards(16, 7, [1, 2, 3]) == 13
    assert strides.finish_forwards(16, 15, [1, 2, 3]) == 0
    # reference mode, k = 0: n = 15, 8 ([1,2,4,…,16]), 5 ([1,2,5,8,11,16]) → 1 + 14 + 7 + 4 = 26
    assert strides.finish_forwards(16, 0, [1, 2, 3], mode="reference") == 26
    # reference mode, k = 13, λ = 3: [14, 16] → 1 step; λ = 1: [14, 15, 16] → 2; 1 + 1 + 0 = 2
    assert strides.finish_forwards(16, 13, [1, 3], mode="reference") == 2
    # capped at 4 steps, k = 0: n = 4, 4, 4 → 1 + 3·3 = 10; k = 7: n = 4, 4, 3 → 1 + 3 + 3 + 2 = 9
    assert strides.finish_forwards(16, 0, [1, 2, 3], max_steps=4) == 10
    assert strides.finish_forwards(16, 7, [1, 2, 3], max_steps=4) == 9


# --------------------------------------------------------------------------- advantages


def test_group_advantages_hand_value():
    # [1, 2, 3]: mean 2, unbiased std 1 → (R − 2)/(1 + 1e-8)
    adv = core.group_advantages(torch.tensor([1.0, 2.0, 3.0]))
    assert adv.tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    # biased std of [1, 2, 3] = sqrt(2/3) → ±1/sqrt(2/3) = ±1.2247
    biased = core.group_advantages(torch.tensor([1.0, 2.0, 3.0]), unbiased=False)
    assert biased.tolist() == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5)], abs=1e-5)


def test_group_advantages_all_equal_rewards_give_exact_zeros():
    # 0.1 is not representable: mean(0.1, 0.1, 0.1) can differ from 0.1 by rounding, which a plain
    # (R − mean)/(0 + 1e-8) would blow up. Zeros, never NaN.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [7.3, 7.3, 7.3], [1.0, 2.0, 4.0]])
    adv = core.group_advantages(rewards)
    assert torch.equal(adv[:2], torch.zeros(2, 3))
    assert torch.isfinite(adv).all() and adv[2].abs().sum() > 0


def _rewards_for(pattern):
    """Rewards whose group advantages are the given ±1/0 pattern (a − d, a, a + d ↦ −1, 0, 1)."""
    return torch.tensor(pattern, dtype=torch.float32)


def test_mix_advantages_two_reward_models_three_strides_hand_example():
    # rewards [R=2, J=3, G=3]; each row is (a−d, a, a+d) up to order, so its advantage is a ±1/0 pattern:
    rewards = torch.stack(
        [
            torch.stack([_rewards_for([1, 2, 3]), _rewards_for([3, 2, 1]), _rewards_for([10, 20, 30])]),  # r = 0
            torch.stack([_rewards_for([5, 5, 5]), _rewards_for([0, 4, 8]), _rewards_for([2, 1, 0])]),  # r = 1
        ]
    )
    adv = core.group_advantages(rewards)  # r0: [-1,0,1], [1,0,-1], [-1,0,1]; r1: [0,0,0], [-1,0,1], [1,0,-1]
    # w = [1, 0.5], α = [1, 1, 2]:
    #   branch 0: 1·(−1 + 1 − 2) + 0.5·(0 − 1 + 2) = −2 + 0.5 = −1.5
    #   branch 1: 0
    #   branch 2: 1·(1 − 1 + 2) + 0.5·(0 + 1 − 2) = 2 − 0.5 = 1.5
    mixed = core.mix_advantages(adv, stride_weights=[1.0, 1.0, 2.0], reward_weights=[1.0, 0.5], clip=5.0)
    assert mixed.tolist() == pytest.approx([-1.5, 0.0, 1.5], abs=1e-6)


def test_mix_advantages_clips_once_after_the_sum():
    # 2 reward models × 3 strides, each advantage (−1, 0, 1): every term is within ±5, the sum is ±6.
    adv = torch.tensor([-1.0, 0.0, 1.0]).expand(2, 3, 3)
    mixed = core.mix_advantages(adv, [1.0, 1.0, 1.0], [1.0, 1.0], clip=5.0)
    assert mixed.tolist() == [-5.0, 0.0, 5.0]  # clipped per term it would have stayed ±6
    # extra axes between J and G are kept: [R, J, P, K, G] → [P, K, G]
    wide = torch.randn(2, 3, 4, 5, 6)
    assert core.mix_advantages(wide, [1, 1, 1], [1, 1]).shape == (4, 5, 6)
    with pytest.raises(ValueError):
        core.mix_advantages(wide, [1, 1], [1, 1])


# --------------------------------------------------------------------------- clipped surrogate


def test_clipped_surrogate_hand_example():
    # torchtune-style table, ε = 0.2 (ratios r = exp(new − old)):
    #   r = 1.5, A = +2: max(−3.0, −1.2·2 = −2.4) = −2.4   (clipped: no gain beyond 1 + ε)
    #   r = 1.5, A = −2: max(+3.0, +2.4)        = +3.0     (unclipped)
    #   r = 0.5, A = +2: max(−1.0, −0.8·2 = −1.6) = −1.0   (unclipped)
    #   r = 0.5, A = −2: max(+1.0, +1.6)        = +1.6     (clipped)
    #   r = 1.0, A = +1: −1.0
    # loss = (−2.4 + 3 − 1 + 1.6 − 1)/5 = 0.04; clip fraction 4/5; ratio mean 1.0, max 1.5
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0])
    adv = torch.tensor([2.0, -2.0, 2.0, -2.0, 1.0])
    old = torch.zeros(5)
    new = torch.log(ratio).requires_grad_(True)
    loss, stats = core.clipped_surrogate(new, old, adv, 0.2)
    assert loss.item() == pytest.approx(0.04, abs=1e-6)
    assert stats["clip_fraction"].item() == pytest.approx(0.8)
    assert stats["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    loss.backward()
    # d/d log π of −A·r/5 = −A·r/5 where unclipped, 0 where clipped:
    #   [0, 2·1.5/5, −2·0.5/5, 0, −1/5] = [0, 0.6, −0.2, 0, −0.2]
    assert new.grad.tolist() == pytest.approx([0.0, 0.6, -0.2, 0.0, -0.2], abs=1e-6)
