"""The grid indices of G²RPO's stride finishes: integer arithmetic on step indices, no tensors.

A branch made at grid step k is finished with the ODE at every stride λ ∈ Λ (docs/algorithm.md §4);
these functions say which grid indices each finish visits and how many model forwards the finishes
of one branch cost. They live apart from :mod:`g2rpo.core` (which turns the indices into σ values,
:func:`g2rpo.core.stride_schedule`) because the ``algorithm.g2rpo`` config section checks its
strides with them, and the config imports no torch.
"""

from __future__ import annotations

__all__ = ["stride_indices", "thin_schedule", "finish_forwards"]


def stride_indices(
    num_steps: int, k: int, stride: int, mode: str = "to_zero", max_steps: int | None = None
) -> list[int]:
    """Grid indices a stride-λ finish visits after branching at step k (docs/algorithm.md §4).

    ``mode="to_zero"`` (default): ``k+1, k+1+λ, k+1+2λ, …`` (all < T) and then T.
    E.g. T=16, k=0, λ=3 → [1, 4, 7, 10, 13, 16].

    ``mode="reference"``: the reference code's ``σ[:k+2] + σ[k+2::λ]`` — one stride-1 step first
    (k+1 → k+2), then every λ-th index. It scores the x₀-prediction ``x − σ·v`` at the last point
    but one, which is exactly an Euler step to σ = 0 from there, so the indices are the reference
    points with the last one replaced by T. E.g. T=16, k=0, λ=3: reference points 1, 2, 5, 8, 11, 14,
    x₀ scored from 11 → [1, 2, 5, 8, 11, 16].

    ``max_steps`` n (compute-efficient finishing, beyond the paper): a schedule of more than n steps
    is thinned to n by :func:`thin_schedule` (first and last point kept).
    """
    if stride < 1:
        raise ValueError(f"stride must be ≥ 1, got {stride}")
    if not 0 <= k < num_steps:
        raise ValueError(f"k must be in 0..{num_steps - 1}, got {k}")
    if mode == "to_zero":
        points = list(range(k + 1, num_steps, stride)) + [num_steps]
    elif mode == "reference":
        points = [k + 1] + list(range(k + 2, num_steps + 1, stride))
        points = points[:-1] + [num_steps]
    else:
        raise ValueError(f"mode must be 'to_zero' or 'reference', got {mode!r}")
    return points if max_steps is None else thin_schedule(points, max_steps)


def thin_schedule(points: list[int], max_steps: int) -> list[int]:
    """At most ``max_steps`` steps along ``points`` (n + 1 grid indices for n steps): keep positions
    ``round(j·n / max_steps)``, j = 0 … max_steps (halves rounded up), so the first and the last
    point stay and the kept steps are as even as the points allow. Fewer steps are returned as is.

    E.g. the stride-1 finish from k = 0 on T = 16, [1, 2, …, 16] (n = 15), thinned to 4 steps:
    positions round(0, 3.75, 7.5, 11.25, 15) = 0, 4, 8, 11, 15 → [1, 5, 9, 12, 16].
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be ≥ 1, got {max_steps}")
    n = len(points) - 1
    if n <= max_steps:
        return list(points)
    return [points[(2 * j * n + max_steps) // (2 * max_steps)] for j in range(max_steps + 1)]


def finish_forwards(
    num_steps: int, k: int, strides: list[int], mode: str = "to_zero", max_steps: int | None = None
) -> int:
    """Model forwards to finish one branch from step k at every stride, sharing the first forward.

    A stride-λ finish takes n_λ steps (``len(stride_indices) − 1``; ceil((T − k − 1)/λ) in the
    default mode, at most ``max_steps``); all strides start from the same state at σ[k+1], so their
    first velocity is computed once: 1 + Σ_λ (n_λ − 1) (0 when k + 1 = T). The solver does not
    change the count: DPM-Solver++(2M) reuses the previous step's x₀-prediction.
    """
    if k + 1 == num_steps:
        return 0
    return 1 + sum(len(stride_indices(num_steps, k, lam, mode, max_steps)) - 2 for lam in strides)
