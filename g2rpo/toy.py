"""A small real velocity model and an exactly computable reward, for tests and the interim demo.

:class:`ToyVelocityModel` is a per-token MLP over packed latents ``[B, L, C]``, conditioned on σ
(sin/cos features) and on a prompt embedding; it implements the velocity-model protocol of
:mod:`g2rpo.strategies.base` (float32 in, float32 out). :class:`ToyConditioning` implements the
conditioning protocol over a ``[P, D]`` embedding tensor.

:class:`ToyReward` scores final latents directly (no decoder): each prompt p has a target
``[L, C]``, and ``r(x₀) = −mean((x₀ − target_p)²)``, so the best reward is 0 and any sample's
reward is computed exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from g2rpo.core import take_rows

__all__ = ["ToyConditioning", "ToyVelocityModel", "ToyReward", "make_toy_problem"]


@dataclass
class ToyConditioning:
    """Prompt embeddings ``[P, D]``: indexable, repeatable, sized along the batch.

    Rows are taken with :func:`g2rpo.core.take_rows` (one repeated prompt is a broadcast view, no
    copy), as :class:`g2rpo.models.flux.FluxConditioning` does.
    """

    embeddings: torch.Tensor  # [P, D]

    def __len__(self) -> int:
        return self.embeddings.shape[0]

    def __getitem__(self, index: torch.Tensor | slice) -> ToyConditioning:
        return ToyConditioning(take_rows(self.embeddings, index))

    def repeat_interleave(self, repeats: int) -> ToyConditioning:
        return self[torch.arange(len(self)).repeat_interleave(repeats)]

    def to(self, device: torch.device | str) -> ToyConditioning:
        return ToyConditioning(self.embeddings.to(device))


class ToyVelocityModel(nn.Module):
    """v(x, σ, c) = x·a + MLP([x_token, features(σ), c]) per token; ``[B, L, C]`` → ``[B, L, C]``.

    The skip term makes the untrained model a plausible flow (v ≈ x is exact at σ = 1 for data
    concentrated at 0); the MLP is what training changes.
    """

    def __init__(self, channels: int = 4, cond_dim: int = 8, hidden: int = 64, sigma_features: int = 8):
        super().__init__()
        self.sigma_features = sigma_features
        self.net = nn.Sequential(
            nn.Linear(channels + 2 * sigma_features + cond_dim, hidden),
            nn.SiLU(),
            nn.Linear(hidden, hidden),
            nn.SiLU(),
            nn.Linear(hidden, channels),
        )
        self.skip = nn.Parameter(torch.ones(channels))

    def _sigma_embedding(self, sigma: torch.Tensor) -> torch.Tensor:
        freqs = torch.arange(1, self.sigma_features + 1, device=sigma.device, dtype=torch.float32)  # [F]
        angles = sigma.float()[:, None] * freqs[None, :] * math.pi  # [B, F]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)  # [B, 2F]

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: ToyConditioning) -> torch.Tensor:
        b, length, _ = x.shape
        if sigma.shape != (b,) or len(cond) != b:
            raise ValueError(f"batch mismatch: x {tuple(x.shape)}, sigma {tuple(sigma.shape)}, cond {len(cond)}")
        features = torch.cat(
            [
                x,
                self._sigma_embedding(sigma)[:, None, :].expand(b, length, -1),
                cond.embeddings.float()[:, None, :].expand(b, length, -1),
            ],
            dim=-1,
        )  # [B, L, C + 2F + D]
        return x * self.skip + self.net(features)


class ToyReward:
    """r(x₀ | prompt p) = −mean over [L, C] of (x₀ − target_p)²; one value per latent."""

    def __init__(self, targets: torch.Tensor):
        self.targets = targets  # [P, L, C]

    def __call__(self, latents: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """``latents`` ``[N, L, C]``, ``prompt`` ``[N]`` batch positions → rewards ``[N]``."""
        target = self.targets.to(latents.device)[prompt.to(latents.device)]  # [N, L, C]
        return -((latents - target) ** 2).mean(dim=(1, 2))


def make_toy_problem(
    num_prompts: int = 4,
    tokens: int = 4,
    channels: int = 4,
    cond_dim: int = 8,
    hidden: int = 64,
    seed: int = 0,
) -> tuple[ToyVelocityModel, ToyConditioning, ToyReward]:
    """A seeded toy model, ``num_prompts`` prompt embeddings and their reward targets."""
    gen = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = ToyVelocityModel(channels, cond_dim, hidden)
    finally:
        torch.random.set_rng_state(torch_state)
    cond = ToyConditioning(torch.randn(num_prompts, cond_dim, generator=gen))
    targets = 0.5 * torch.randn(num_prompts, tokens, channels, generator=gen)
    return model, cond, ToyReward(targets)
