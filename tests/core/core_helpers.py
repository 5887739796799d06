"""A velocity model with a reference policy, for the KL tests of Flow-GRPO and DiffusionNFT.

Training gets its reference from LoRA (``FluxVelocity.reference_velocity`` disables the adapters);
these tests pair the toy policy with any frozen model instead, to set the KL to zero or not.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from g2rpo.strategies.base import Conditioning, VelocityModel


class WithReference:
    """``policy`` as a velocity model whose reference is ``reference`` (a frozen model)."""

    def __init__(self, policy: VelocityModel, reference: VelocityModel) -> None:
        self.policy, self.reference = policy, reference

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.policy(x, sigma, cond)

    @torch.no_grad()
    def reference_velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.reference(x, sigma, cond)

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The policy's parameters (what trains; DiffusionNFT copies the trainable ones as its old policy)."""
        return self.policy.named_parameters()
