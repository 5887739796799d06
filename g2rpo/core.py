"""The sampler math of G²RPO: σ grids, ODE/SDE steps, log-probabilities, stride schedules,
advantages and the clipped surrogate (and the baselines' own pieces: Flow-GRPO's KL, DiffusionNFT's
negative-aware flow matching, BranchGRPO's tree widths and depth-wise tree advantages). Pure functions on tensors; imports torch
and the integer stride indices of :mod:`g2rpo.strides` only.

Conventions (``docs/algorithm.md`` §1): ``x_σ = (1 − σ)·x_0 + σ·ε``, σ = 1 is noise, σ = 0
is data, the velocity is ``v = ε − x_0``. A grid is a decreasing float32 tensor
``σ[0] = 1 > σ[1] > … > σ[T] = 0``; step i goes from σ[i] to σ[i+1]. Latents are packed
``[B, L, C]`` (any ``[B, ...]`` works); a per-row σ is a ``[B]`` tensor or a Python float.

Departures from the reference code (``bcmi/Granular-GRPO``):
- the reference's σ = 1 fix (``1 − σ`` replaced by ``1 − σ[1]``) is kept, but the value is passed
  in (``sigma_one_substitute``; by default the step's own σ', which is σ[1] for the step from
  σ[0] = 1) instead of being read from a global grid;
- :func:`stride_schedule` starts striding at σ[k+1] (the reference's ``σ[:k+2] + σ[k+2::λ]`` takes
  one stride-1 step first; available as ``mode="reference"``);
- :func:`group_advantages` returns exact zeros for a group whose rewards are all equal (the
  reference divides ~0 by δ = 1e-8, which float rounding can blow up).
"""

from __future__ import annotations

import math

import torch

from g2rpo.strides import stride_indices

__all__ = [
    "flux_mu",
    "flux_sigmas",
    "static_shift_sigmas",
    "ode_step",
    "data_prediction",
    "dpmpp_2m_step",
    "sde_noise_scale",
    "sde_mean_std",
    "sde_step",
    "gaussian_log_prob",
    "stride_schedule",
    "group_advantages",
    "mix_advantages",
    "clipped_surrogate",
    "flow_grpo_advantages",
    "gaussian_mean_kl",
    "nft_optimality",
    "diffusion_nft_loss",
    "tree_widths",
    "tree_advantages",
    "take_rows",
]

Sigma = float | torch.Tensor


# --------------------------------------------------------------------------- grids


def flux_mu(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """Flux's resolution-dependent shift: μ linear in the packed sequence length.

    μ = base_shift + (L − base_seq_len)·(max_shift − base_shift)/(max_seq_len − base_seq_len)
    (diffusers ``FluxPipeline``'s ``calculate_shift`` with Flux.1-dev's scheduler config).
    """
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def flux_sigmas(
    num_steps: int,
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> torch.Tensor:
    """Flux.1-dev's grid, ``[T+1]`` float32 from 1 to 0.

    s = linspace(1, 1/T, T); σ = e^μ / (e^μ + (1/s − 1)); then 0 appended — what diffusers'
    ``FlowMatchEulerDiscreteScheduler`` (dynamic shifting, exponential time shift) produces inside
    ``FluxPipeline`` for ``num_inference_steps = T`` at ``image_seq_len`` packed tokens. Computed in
    float32 like diffusers, so the values are bit-equal.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be ≥ 1, got {num_steps}")
    mu = flux_mu(image_seq_len, base_seq_len, max_seq_len, base_shift, max_shift)
    s = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64).to(torch.float32)  # [T]
    e_mu = torch.full_like(s, math.exp(mu))  # a tensor, not a scalar: `scalar / t` is t.reciprocal()·scalar
    shifted = e_mu / (e_mu + (torch.ones_like(s) / s - 1))  # [T]
    return torch.cat([shifted, torch.zeros(1)])  # [T+1]


def static_shift_sigmas(num_steps: int, shift: float = 3.0) -> torch.Tensor:
    """The reference code's grid, ``[T+1]`` float32: t = linspace(1, 0, T+1), σ = s·t / (1 + (s−1)·t)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be ≥ 1, got {num_steps}")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)  # [T+1]
    return (shift * t / (1 + (shift - 1) * t)).to(torch.float32)


# --------------------------------------------------------------------------- steps


def _rows(value: Sigma, like: torch.Tensor) -> torch.Tensor:
    """A scalar or ``[B]`` value shaped to broadcast over ``like`` ``[B, ...]``."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.ndim == 0:
        return t
    return t.reshape(t.shape[0], *([1] * (like.ndim - 1)))


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma: Sigma, sigma_next: Sigma) -> torch.Tensor:
    """Euler step of the probability-flow ODE: x' = x + (σ' − σ)·v.  ``[B, ...]`` → ``[B, ...]``."""
    return x + (_rows(sigma_next, x) - _rows(sigma, x)) * v


def data_prediction(x: torch.Tensor, v: torch.Tensor, sigma: Sigma) -> torch.Tensor:
    """The x₀-prediction of a velocity: x̂₀ = x − σ·v (exact for x = (1 − σ)·x₀ + σ·ε, v = ε − x₀).  ``[B, ...]``."""
    return x - _rows(sigma, x) * v


def _half_log_snr(sigma: torch.Tensor) -> torch.Tensor:
    """λ(σ) = log((1 − σ)/σ), DPM-Solver's time variable for x_σ = (1 − σ)·x₀ + σ·ε (−inf at σ = 1, inf at 0)."""
    return torch.log(1 - sigma) - torch.log(sigma)


def dpmpp_2m_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: Sigma,
    sigma_next: Sigma,
    x0_prev: torch.Tensor | None = None,
    sigma_prev: Sigma | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of DPM-Solver++(2M) (multistep, data prediction) for the flow-matching ODE.

    With α = 1 − σ, λ = log(α/σ), h = λ(σ') − λ(σ), h₋ = λ(σ) − λ(σ₋) and x̂₀ = x − σ·v::

        D  = x̂₀ + h/(2·h₋) · (x̂₀ − x̂₀₋)        (second order: x̂₀₋ from the previous step at σ₋)
        x' = (σ'/σ)·x + (1 − σ'/σ)·D             (= (σ'/σ)·x − α'·(e^{−h} − 1)·D)

    Without a previous step (``x0_prev`` None) and on a step to σ' = 0 (λ' = ∞; diffusers'
    ``lower_order_final``) D = x̂₀, which makes the step exactly Euler: x' = x + (σ' − σ)·v.
    ``x``, ``v``, ``x0_prev`` ``[B, ...]``; σ, σ', σ₋ scalars or ``[B]``. Returns ``(x', x̂₀)``;
    pass that x̂₀ (and σ) as ``x0_prev`` (and ``sigma_prev``) to the next step.
    """
    x0 = data_prediction(x, v, sigma)  # [B, ...]
    sig, sig_next = _rows(sigma, x), _rows(sigma_next, x)
    if x0_prev is None:
        d = x0
    else:
        if sigma_prev is None:
            raise ValueError("dpmpp_2m_step with x0_prev needs sigma_prev, the σ x0_prev was predicted at")
        sig_prev = _rows(sigma_prev, x)
        final = sig_next == 0
        # λ(0) = ∞ would make h/h₋ ∞ on a final step, whose coefficient is 0 anyway: evaluate λ elsewhere.
        lam, lam_next = _half_log_snr(sig), _half_log_snr(torch.where(final, sig, sig_next))
        ratio = torch.where(final, torch.zeros_like(lam), (lam_next - lam) / (2 * (lam - _half_log_snr(sig_prev))))
        d = x0 + ratio * (x0 - x0_prev)
    return sig_next / sig * x + (1 - sig_next / sig) * d, x0


def sde_noise_scale(
    sigma: Sigma, eta: float, sigma_one_substitute: Sigma | None = None, noise_form: str = "flow_grpo"
) -> torch.Tensor:
    """The SDE's noise scale s_σ.

    ``noise_form="flow_grpo"`` (docs/algorithm.md §1, default): s_σ = η·sqrt(σ / (1 − σ̃)), σ̃ = σ
    except where σ = 1, where σ̃ = ``sigma_one_substitute``. The reference code (and Flow-GRPO)
    substitute the grid's σ[1] there so the first step stays finite; pass ``sigmas[1]``. Without a
    substitute, σ = 1 raises ValueError.

    ``noise_form="dancegrpo"``: s_σ = η (DanceGRPO's original step: std η·sqrt(h) and the drift
    ``−½η²·score·dσ`` with score = −(x − (1−σ)·x̂₀)/σ², which is the same mean formula with s_σ = η).
    """
    sigma = torch.as_tensor(sigma, dtype=torch.float32)
    if noise_form == "dancegrpo":
        return torch.full_like(sigma, float(eta))
    if noise_form != "flow_grpo":
        raise ValueError(f"noise_form must be 'flow_grpo' or 'dancegrpo', got {noise_form!r}")
    at_one = sigma == 1
    if bool(at_one.any()):
        if sigma_one_substitute is None:
            raise ValueError("sde_noise_scale at σ = 1 needs sigma_one_substitute (the grid's σ[1]) to stay finite")
        denominator_sigma = torch.where(
            at_one, torch.as_tensor(sigma_one_substitute, dtype=sigma.dtype, device=sigma.device), sigma
        )
    else:
        denominator_sigma = sigma
    return eta * torch.sqrt(sigma / (1 - denominator_sigma))


def sde_mean_std(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: Sigma,
    sigma_next: Sigma,
    eta: float,
    sigma_one_substitute: Sigma | None = None,
    noise_form: str = "flow_grpo",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the SDE transition from σ to σ' (docs/algorithm.md §1), h = σ − σ' > 0:

        μ   = x − h·[ v + s_σ² / (2σ) · (x + (1 − σ)·v) ]
        std = s_σ·sqrt(h)

    with s_σ from :func:`sde_noise_scale`. ``x``, ``v`` ``[B, ...]``; σ, σ' scalars or ``[B]``.
    Returns μ ``[B, ...]`` and std broadcastable to it (``[]`` or ``[B, 1, ...]``).

    At σ = 1 the denominator of s_σ uses ``sigma_one_substitute``, by default σ' itself: on a grid
    the only step that starts at σ[0] = 1 goes to σ[1], which is what the reference code (and
    Flow-GRPO) substitute. Pass ``sigmas[1]`` explicitly for a step from σ = 1 to elsewhere.
    """
    if sigma_one_substitute is None:
        sigma_one_substitute = sigma_next
    s = _rows(sde_noise_scale(torch.as_tensor(sigma).to(x.device), eta, sigma_one_substitute, noise_form), x)
    sig = _rows(sigma, x)
    h = sig - _rows(sigma_next, x)
    mean = x - h * (v + s**2 / (2 * sig) * (x + (1 - sig) * v))
    std = s * torch.sqrt(h)
    return mean, std


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: Sigma,
    sigma_next: Sigma,
    eta: float,
    noise: torch.Tensor,
    sigma_one_substitute: Sigma | None = None,
    noise_form: str = "flow_grpo",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Euler–Maruyama step of the marginal-preserving reverse SDE (Flow-GRPO's form).

    x' = μ + std·ξ with (μ, std) from :func:`sde_mean_std` and ξ = ``noise`` ``[B, ...]``.
    Returns ``(x', μ, std)``. With η = 0, μ = x − h·v = :func:`ode_step` and std = 0.
    Finite at σ = 1: the denominator of s_σ then uses ``sigma_one_substitute``, by default
    σ' (= σ[1] for the grid's first step; see :func:`sde_mean_std`).
    """
    mean, std = sde_mean_std(x, v, sigma, sigma_next, eta, sigma_one_substitute, noise_form)
    return mean + std * noise, mean, std


def gaussian_log_prob(
    sample: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor | float,
    reduce: str = "mean",
    batch_dims: int = 1,
) -> torch.Tensor:
    """log N(sample; mean, std²), reduced over every dim after the first ``batch_dims``.

        log p = −(x − μ)² / (2 std²) − log std − ½·log 2π      (per element)

    ``reduce="mean"`` averages over the latent dims (reference code), ``"sum"`` gives the exact
    joint density. ``mean``/``std`` broadcast against ``sample`` (a ``[P, 1, L, C]`` mean serves a
    ``[P, G, L, C]`` sample: one mean for a whole group). Returns ``sample.shape[:batch_dims]``.
    """
    std = torch.as_tensor(std, dtype=sample.dtype, device=sample.device)
    per_element = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    per_element = per_element.expand(sample.shape) if per_element.shape != sample.shape else per_element
    dims = tuple(range(batch_dims, sample.ndim))
    if reduce == "mean":
        return per_element.mean(dim=dims)
    if reduce == "sum":
        return per_element.sum(dim=dims)
    raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")


# --------------------------------------------------------------------------- strides


def stride_schedule(
    sigmas: torch.Tensor, k: int, stride: int, mode: str = "to_zero", max_steps: int | None = None
) -> torch.Tensor:
    """σ values of the stride-λ finish from step k: ``sigmas[stride_indices(T, k, λ, mode, max_steps)]``
    (:func:`g2rpo.strides.stride_indices`).

    Starts at σ[k+1] (where the branch sits), ends at σ[T] = 0. ``[n + 1]`` for n finishing steps.
    """
    return sigmas[stride_indices(sigmas.shape[0] - 1, k, stride, mode, max_steps)]


# --------------------------------------------------------------------------- advantages and loss


def group_advantages(rewards: torch.Tensor, eps: float = 1e-8, unbiased: bool = True) -> torch.Tensor:
    """A = (R − mean_G R) / (std_G R + δ) over the last dim (the group). Same shape as ``rewards``.

    A group whose rewards are all equal gets exact zeros (never NaN, never rounding noise / δ).
    """
    mean = rewards.mean(dim=-1, keepdim=True)  # [..., 1]
    std = rewards.std(dim=-1, keepdim=True, unbiased=unbiased)  # [..., 1]
    adv = (rewards - mean) / (std + eps)
    constant = rewards.amax(dim=-1, keepdim=True) == rewards.amin(dim=-1, keepdim=True)  # [..., 1]
    return torch.where(constant, torch.zeros_like(adv), adv)


def mix_advantages(
    adv: torch.Tensor,
    stride_weights: torch.Tensor | list[float],
    reward_weights: torch.Tensor | list[float],
    clip: float = 5.0,
) -> torch.Tensor:
    """A = clip( Σ_r w_r Σ_j α_j A^{r,j}, −clip, clip ), clipped once after the sum (docs/algorithm.md §4).

    ``adv`` ``[R, J, ..., G]`` → ``[..., G]``. ``stride_weights`` α ``[J]``, ``reward_weights`` w ``[R]``.
    """
    alpha = torch.as_tensor(stride_weights, dtype=adv.dtype, device=adv.device)  # [J]
    w = torch.as_tensor(reward_weights, dtype=adv.dtype, device=adv.device)  # [R]
    if alpha.shape != (adv.shape[1],) or w.shape != (adv.shape[0],):
        raise ValueError(
            f"weights must be [R]={adv.shape[0]} and [J]={adv.shape[1]}, got {tuple(w.shape)} and {tuple(alpha.shape)}"
        )
    extra = [1] * (adv.ndim - 2)
    weighted = adv * w.reshape(-1, 1, *extra) * alpha.reshape(1, -1, *extra)  # [R, J, ..., G]
    return weighted.sum(dim=(0, 1)).clamp(-clip, clip)  # [..., G]


def clipped_surrogate(
    log_prob_new: torch.Tensor,
    log_prob_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate, as a loss to minimise (mean over elements):

        r = exp(log π_new − log π_old)
        loss = mean( max( −A·r, −A·clip(r, 1−ε, 1+ε) ) )

    Returns ``(loss, stats)``; stats (detached): ``clip_fraction`` (share of |r − 1| > ε),
    ``ratio_mean``, ``ratio_max``.
    """
    ratio = torch.exp(log_prob_new - log_prob_old)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = {
            "clip_fraction": ((ratio - 1.0).abs() > clip_range).float().mean(),
            "ratio_mean": ratio.mean(),
            "ratio_max": ratio.max(),
        }
    return loss, stats


def flow_grpo_advantages(rewards: torch.Tensor, eps: float = 1e-4, global_std: bool = True) -> torch.Tensor:
    """Flow-GRPO's advantage: A = (R − mean_G R) / (std + δ), rewards ``[..., P, G]`` → same shape.

    The mean is per group (last dim, one prompt's G samples). With ``global_std`` the std is the
    population std of every reward in the batch (all P·G, the published ``sample.global_std =
    True``), else the group's own population std (numpy's ``np.std``, ddof 0). δ = 1e-4 as published
    (``flow_grpo/stat_tracking.py``). A group whose rewards are all equal gets exact zeros.
    """
    mean = rewards.mean(dim=-1, keepdim=True)  # [..., P, 1]
    if global_std:
        std = rewards.flatten(-2).std(dim=-1, unbiased=False)[..., None, None]  # [..., 1, 1]
    else:
        std = rewards.std(dim=-1, keepdim=True, unbiased=False)  # [..., P, 1]
    adv = (rewards - mean) / (std + eps)
    constant = rewards.amax(dim=-1, keepdim=True) == rewards.amin(dim=-1, keepdim=True)  # [..., P, 1]
    return torch.where(constant, torch.zeros_like(adv), adv)


def gaussian_mean_kl(mean: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
    """KL( N(μ, s²) ‖ N(μ_ref, s²) ) of two Gaussians with one std, averaged over the latent dims:

        kl = mean_dims (μ − μ_ref)² / (2 s²)                 (Flow-GRPO's KL penalty per sample)

    ``mean``, ``mean_ref`` ``[B, ...]``; ``std`` broadcastable (``[]`` or ``[B, 1, ...]``). Returns ``[B]``.
    """
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    per_element = (mean - mean_ref) ** 2 / (2 * std**2)
    per_element = per_element.expand(mean.shape) if per_element.shape != mean.shape else per_element
    return per_element.mean(dim=tuple(range(1, mean.ndim)))


def nft_optimality(advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """DiffusionNFT's optimality probability of each sample from its advantage (same shape):

        r = clip(A, −c, c) / (2c) + ½            ∈ [0, 1]

    c is the advantage clip (the published ``adv_clip_max`` 5): A = 0 gives ½, A ≥ c gives 1.
    """
    return (advantages.clamp(-clip, clip) / (2 * clip) + 0.5).clamp(0.0, 1.0)


def _adaptive_mse(x0_pred: torch.Tensor, x0: torch.Tensor, floor: float) -> torch.Tensor:
    """mean (x̂₀ − x₀)² / sg(max(mean |x̂₀ − x₀|, floor)) per sample: ``[B, ...]`` → ``[B]``."""
    dims = tuple(range(1, x0.ndim))
    error = x0_pred - x0  # [B, ...]
    weight = error.detach().abs().mean(dim=dims).clamp_min(floor)  # [B], no grad
    return (error**2).mean(dim=dims) / weight


def diffusion_nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    sigma: Sigma,
    r: torch.Tensor,
    beta: float,
    weight_floor: float = 1e-5,
) -> torch.Tensor:
    """DiffusionNFT's negative-aware flow-matching loss per sample, on the forward process.

    x_t = (1 − σ)·x₀ + σ·ε is a noised clean sample, v_θ the policy's velocity there (with grad),
    v_old the old policy's (no grad), r the sample's optimality probability (:func:`nft_optimality`)::

        v⁺ = (1 − β)·v_old + β·v_θ                (the implicit positive policy)
        v⁻ = (1 + β)·v_old − β·v_θ                (the implicit negative policy)
        x̂₀^± = x_t − σ·v^±
        ℓ^± = mean (x̂₀^± − x₀)² / sg(max(mean |x̂₀^± − x₀|, 1e-5))     (adaptive weighting)
        loss = (r·ℓ⁺ + (1 − r)·ℓ⁻) / β

    Since x̂₀ − x₀ = σ·(ε − x₀ − v), ℓ is σ·mean (v − v_target)² / mean |v − v_target| with the
    flow-matching target v_target = ε − x₀: the paper's r‖v⁺ − v‖² + (1 − r)‖v⁻ − v‖², each
    term divided by its own (detached) mean absolute error. The 1/β keeps the gradient's scale
    independent of β (v_θ enters v^± with weight ±β).

    ``v_theta``, ``v_old``, ``x_t``, ``x0`` ``[B, ...]``; σ a float or ``[B]`` (> 0); ``r`` ``[B]``. Returns ``[B]``.
    """
    v_old = v_old.detach()
    positive = beta * v_theta + (1 - beta) * v_old  # [B, ...]
    negative = (1 + beta) * v_old - beta * v_theta  # [B, ...]
    loss_pos = _adaptive_mse(data_prediction(x_t, positive, sigma), x0, weight_floor)  # [B]
    loss_neg = _adaptive_mse(data_prediction(x_t, negative, sigma), x0, weight_floor)  # [B]
    return (r * loss_pos + (1 - r) * loss_neg) / beta


# --------------------------------------------------------------------------- branching trees


def tree_widths(num_steps: int, branch_steps: list[int], factor: int) -> list[int]:
    """Nodes at each depth of a BranchGRPO tree, ``[T+1]`` ints: depth i is the grid index of the state.

    One root (the prompt's initial noise) at depth 0; step i takes every node at depth i to one child
    at depth i+1, or to ``factor`` children when i is a branch step. So n_0 = 1 and
    n_{i+1} = n_i·(b if i ∈ branch_steps else 1); the leaves are n_T = b^|branch_steps|.
    E.g. T = 6, branch steps {0, 2}, b = 2 → [1, 2, 2, 4, 4, 4, 4].

    Nodes of a depth are numbered so that the children of node j are b·j … b·j + b − 1 (one child: j),
    hence the leaves under node j of depth i are the contiguous block j·(n_T/n_i) … (j+1)·(n_T/n_i) − 1.
    """
    if factor < 2:
        raise ValueError(f"factor must be ≥ 2, got {factor}")
    outside = [k for k in branch_steps if not 0 <= k < num_steps]
    if outside:
        raise ValueError(f"branch steps {outside} are outside the grid 0..{num_steps - 1}")
    widths = [1]
    for i in range(num_steps):
        widths.append(widths[-1] * (factor if i in branch_steps else 1))
    return widths


def tree_advantages(
    rewards: torch.Tensor,
    widths: list[int],
    eps: float = 1e-8,
    std_floor: float = 1e-6,
    unbiased: bool = True,
) -> torch.Tensor:
    """BranchGRPO's depth-wise tree advantages from the leaves' rewards, one tree per leading index.

    ``rewards`` ``[..., N]`` are the N leaves of each tree in the order of :func:`tree_widths` (node j
    of a depth of n nodes covers leaves j·N/n … (j+1)·N/n − 1). For each depth d listed in ``widths``
    (n_d nodes, n_d dividing N):

        V_j  = mean of the rewards of the leaves under node j          (the node's value)
        A_j  = (V_j − mean_d V) / (std_d V + δ)                         (normalised within the depth)

    with A = 0 for every node of a depth that has one node, or whose values' std (Bessel's
    correction unless ``unbiased`` is False) is below ``std_floor`` (the published 1e-6).
    Returns the depths' advantages concatenated in the order given: ``[..., Σ_d n_d]``.

    E.g. N = 4 leaves with rewards [1, 3, 2, 6] and widths [2, 4]: depth of 2 nodes V = [2, 4],
    std √2, A = ±1/√2; depth of 4 nodes, mean 3, std √(14/3) → A = (R − 3)/2.1602.
    """
    leaves = rewards.shape[-1]
    out = []
    for n in widths:
        if n < 1 or leaves % n:
            raise ValueError(f"a depth of {n} nodes does not divide the {leaves} leaves")
        values = rewards.reshape(*rewards.shape[:-1], n, leaves // n).mean(dim=-1)  # [..., n]
        if n == 1:
            out.append(torch.zeros_like(values))
            continue
        mean = values.mean(dim=-1, keepdim=True)  # [..., 1]
        std = values.std(dim=-1, keepdim=True, unbiased=unbiased)  # [..., 1]
        adv = (values - mean) / (std + eps)
        out.append(torch.where(std < std_floor, torch.zeros_like(adv), adv))
    return torch.cat(out, dim=-1)


# --------------------------------------------------------------------------- batch rows


def take_rows(values: torch.Tensor, index: torch.Tensor | slice) -> torch.Tensor:
    """``values[index]`` along dim 0, without a copy where one is not needed.

    A conditioning gathered per model row repeats its prompt's embeddings: with one prompt, G
    branches and several strides, ``values[index]`` would copy the same row hundreds of times (4 MiB
    each for FLUX.1-dev's 512 × 4096 bf16 T5 embeddings). So:

    - an integer ``index`` naming one row throughout → that row broadcast, ``values[i:i+1].expand``
      (stride 0 along dim 0: no new storage);
    - an integer ``index`` of consecutive rows ``a, a+1, …, b`` → the slice ``values[a:b+1]`` (a view);
    - a slice → ``values[index]`` (a view); anything else (several prompts, a permutation, a bool
      mask) → ``values[index]``, a gather that copies.

    The values are those of ``values[index]`` in every case; the views share storage with
    ``values``, so treat the result as read-only. A CUDA ``index`` is read once on the host.
    """
    if isinstance(index, slice):
        return values[index]
    index = index.to(values.device)
    rows = values.shape[0]
    if index.ndim != 1 or index.numel() == 0 or index.dtype in (torch.bool, torch.uint8) or index.is_floating_point():
        return values[index]
    first, last = int(index[0]), int(index[-1])
    if not (-rows <= first < rows and -rows <= last < rows):
        return values[index]  # out of range: let indexing raise its own error
    start = first % rows
    if bool((index == index[0]).all()):
        return values[start : start + 1].expand(index.numel(), *values.shape[1:])
    steps = torch.arange(index.numel(), device=index.device)
    if first >= 0 and bool((index == first + steps).all()):
        return values[first : first + index.numel()]
    return values[index]
