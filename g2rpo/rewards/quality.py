"""Weight-free no-reference image statistics: sharpness (variance of the Laplacian) and
total variation. Both are batched torch, exact, and need no prompt.

Sharpness (Pech-Pacheco et al. 2000, "Diatom autofocusing in brightfield microscopy"; the
standard no-reference blur measure): with luma Y = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601)
and the 4-neighbour Laplacian ∇²Y (kernel [[0, 1, 0], [1, −4, 1], [0, 1, 0]], valid positions
only), the score is Var(∇²Y) over the image. Blurred images score low; note that noise also
scores high, so use it as a guard against blur rather than as a quality target.

Total variation (anisotropic, l1, as ``piq.total_variation(norm_type='l1')`` divided by the
number of differences): the mean absolute difference between horizontally and vertically
adjacent pixel values, over all channels, negated so that *smoother* images score higher:

    r(x) = − (Σ|x[:, :, 1:] − x[:, :, :-1]| + Σ|x[:, 1:, :] − x[:, :-1, :]|) / (C (H(W−1) + (H−1)W)).

It penalises noise and high-frequency artefacts and rewards flat images: a regulariser.
"""

from __future__ import annotations

import torch

from g2rpo.errors import G2RPOError, problem
from g2rpo.rewards.base import RewardModel

__all__ = ["Sharpness", "TotalVariation", "laplacian_variance", "mean_total_variation"]

_LUMA = (0.299, 0.587, 0.114)


def laplacian_variance(images: torch.Tensor) -> torch.Tensor:
    """Var(∇² luma) per image; ``images`` ``[B, 3, H, W]`` with H, W ≥ 3 → ``[B]``."""
    w = torch.as_tensor(_LUMA, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    y = (images * w).sum(dim=1)  # [B, H, W]
    # the 3×3 kernel written as shifted slices (no im2col: cheaper than conv2d on CPU)
    lap = y[:, :-2, 1:-1] + y[:, 2:, 1:-1] + y[:, 1:-1, :-2] + y[:, 1:-1, 2:] - 4.0 * y[:, 1:-1, 1:-1]  # [B, H-2, W-2]
    return lap.flatten(1).var(dim=1, unbiased=False)  # [B]


def mean_total_variation(images: torch.Tensor) -> torch.Tensor:
    """Mean absolute neighbour difference per image, ``[B, C, H, W]`` → ``[B]``."""
    dw = (images[..., :, 1:] - images[..., :, :-1]).abs().flatten(1)  # [B, C·H·(W−1)]
    dh = (images[..., 1:, :] - images[..., :-1, :]).abs().flatten(1)  # [B, C·(H−1)·W]
    return (dw.sum(dim=1) + dh.sum(dim=1)) / (dw.shape[1] + dh.shape[1])


class Sharpness(RewardModel):
    """Variance of the Laplacian of luma (higher = sharper)."""

    name = "sharpness"
    needs_prompts = False

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        if min(images.shape[-2:]) < 3:
            raise G2RPOError(problem("sharpness.images.shape", tuple(images.shape), "images need H, W >= 3"))
        return laplacian_variance(images.float())


class TotalVariation(RewardModel):
    """Negative mean total variation (higher = smoother)."""

    name = "total_variation"
    needs_prompts = False

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return -mean_total_variation(images.float())
