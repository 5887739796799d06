"""The Flux adapter behind the core's interfaces: a G²RPO iteration on the tiny real Flux.

rollout (no grad) → decode → a reward computed here → advantages → loss terms → backward. Checks
the contract the trainer relies on: the adapter is a ``VelocityModel``, ``FluxConditioning`` serves
the strategy's batch indexing, the first importance ratio is 1 (sampling and training forwards
agree), and the gradient reaches the transformer.
"""

from __future__ import annotations

import pytest
import torch

from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, decode_latents, timestep_mode_for
from g2rpo.seeding import Draws
from g2rpo.strategies.base import VelocityModel
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.registry import build_strategy
from g2rpo.strategies.settings import G2RPOSettings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("truncate", [False, True])
def test_models_g2rpo_iteration_on_tiny_flux(tiny_flux_dir, truncate):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.float32, local_files_only=True)
    prompts = ["a photo of a cat", "snow on the mountain"]
    cond = FluxTextEncoder.from_pipeline(pipe).encode(prompts)
    config = AlgorithmConfig(
        num_steps=4,
        group_size=2,
        truncate_timestep=truncate,
        g2rpo=G2RPOSettings(branch_steps=[0, 1], granularities=[1, 2]),
    )
    model = FluxVelocity(pipe.transformer, height=64, width=64, timestep_mode=timestep_mode_for(truncate))
    assert isinstance(model, VelocityModel)
    strategy = build_strategy(config)
    draws = Draws(run_seed=7, iteration=0, prompt_indices=(10, 11))
    rollout = strategy.rollout(model, cond, draws, latent_shape=model.latent_shape)
    assert rollout.reward_shape == (2, 2, 2, 2)  # [P, |M|, J, G]
    images = decode_latents(pipe.vae, rollout.final_latents, 64, 64, micro_batch=8)  # [16, 3, 64, 64]
    assert images.shape == (16, 3, 64, 64) and 0 <= images.min() and images.max() <= 1
    # a reward computed from the pixels: mean brightness (varies across branches of a group)
    rewards = images.mean(dim=(1, 2, 3)).reshape(1, *rollout.reward_shape)  # [R=1, P, K, J, G]
    advantages = strategy.advantages(rollout, rewards)
    assert advantages.values.abs().sum() > 0

    pipe.transformer.zero_grad()
    terms = []
    for term in strategy.loss_terms(model, rollout, advantages):
        term.loss.backward()
        terms.append(term.detached())
    assert terms
    # no update happened between sampling and training: every ratio is 1 to float tolerance
    for term in terms:
        assert term.stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
        assert term.stats.ratio_max == pytest.approx(1.0, abs=1e-5)
    grad = torch.cat([p.grad.reshape(-1) for p in pipe.transformer.parameters() if p.grad is not None])
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
