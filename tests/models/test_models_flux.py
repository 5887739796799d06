"""The Flux velocity adapter on the real tiny diffusers classes.

The anchor is the exact-reproduction test: the project's own ODE loop (``g2rpo.core.flux_sigmas`` +
``g2rpo.core.ode_step`` over :class:`FluxVelocity`) gives bit for bit the latents of
``FluxPipeline(..., output_type="latent")`` for the same seed in float32.
"""

from __future__ import annotations

import pytest
import torch

from g2rpo.core import flux_sigmas, ode_step
from g2rpo.errors import G2RPOError
from g2rpo.models.flux import (
    FluxConditioning,
    FluxTextEncoder,
    FluxVelocity,
    decode_latents,
    image_ids,
    initial_noise,
    latent_grid,
    pack_latents,
    packed_shape,
    round_timestep,
    unpack_latents,
)

pytestmark = pytest.mark.integration

PROMPTS = ["a photo of a cat", "a red car in the city at night"]
SEQ = 32  # the tiny T5 length


@pytest.fixture(scope="module")
def pipe(tiny_flux_dir):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def cond(pipe) -> FluxConditioning:
    return FluxTextEncoder.from_pipeline(pipe, SEQ).encode(PROMPTS)


# --------------------------------------------------------------------------- latent layout


def test_models_pack_hand_worked_and_round_trip():
    # One channel, 2×4 latent [[0,1,2,3],[4,5,6,7]]: token 0 is the left 2×2 patch (0,1,4,5),
    # token 1 the right one (2,3,6,7), channels ordered (c, dy, dx).
    lat = torch.arange(8.0).reshape(1, 1, 2, 4)
    packed = pack_latents(lat)
    assert packed.tolist() == [[[0.0, 1.0, 4.0, 5.0], [2.0, 3.0, 6.0, 7.0]]]
    assert torch.equal(unpack_latents(packed, 2, 4), lat)

    x = torch.randn(3, 16, 8, 12)
    assert torch.equal(unpack_latents(pack_latents(x), 8, 12), x)


def test_models_pack_and_ids_match_the_pipeline():
    from diffusers import FluxPipeline

    x = torch.randn(2, 16, 8, 6)
    assert torch.equal(pack_latents(x), FluxPipeline._pack_latents(x, 2, 16, 8, 6))
    assert torch.equal(image_ids(8, 6), FluxPipeline._prepare_latent_image_ids(2, 4, 3, "cpu", torch.float32))
    # ids of a 4×6 latent: tokens (i, j) row-major over a 2×3 grid
    assert image_ids(4, 6)[:, 1:].tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


def test_models_latent_geometry():
    assert latent_grid(64, 64) == (8, 8)
    assert packed_shape(64, 64) == (16, 64)  # (64/16)² tokens of 4·16 channels
    assert packed_shape(1024, 1024) == (4096, 64)
    assert packed_shape(720, 720) == (2025, 64)  # the reference code's 720×720: 45² tokens
    with pytest.raises(G2RPOError, match="height=65"):
        latent_grid(65, 64)


def test_models_initial_noise_is_the_pipeline_draw():
    # One generator: a [B, 16, 8, 8] draw packed; a list: one [1, 16, 8, 8] draw each.
    g = torch.Generator().manual_seed(5)
    noise = initial_noise(torch.Generator().manual_seed(5), 64, 64, batch_size=2)
    expected = pack_latents(torch.randn(2, 16, 8, 8, generator=g))
    assert torch.equal(noise, expected)
    assert noise.dtype == torch.float32 and noise.shape == (2, 16, 64)
    per_image = initial_noise([torch.Generator().manual_seed(s) for s in (1, 2)], 64, 64)
    assert torch.equal(per_image[1:], initial_noise(torch.Generator().manual_seed(2), 64, 64))


# --------------------------------------------------------------------------- conditioning


def test_models_conditioning_indexing_and_repeat():
    seq = torch.arange(3 * 2 * 4.0).reshape(3, 2, 4)
    pooled = torch.arange(3 * 5.0).reshape(3, 5)
    c = FluxConditioning(seq, pooled)
    assert len(c) == 3 and c.sequence_length == 2

    picked = c[torch.tensor([2, 0, 2])]
    assert torch.equal(picked.prompt_embeds, seq[[2, 0, 2]])
    assert torch.equal(picked.pooled_prompt_embeds, pooled[[2, 0, 2]])
    assert torch.equal(c[1:].pooled_prompt_embeds, pooled[1:])
    assert len(c[1]) == 1 and torch.equal(c[-1].pooled_prompt_embeds, pooled[2:])

    rep = c.repeat_interleave(2)  # rows a, a, b, b, c, c
    assert len(rep) == 6
    assert torch.equal(rep.pooled_prompt_embeds[:, 0], torch.tensor([0.0, 0.0, 5.0, 5.0, 10.0, 10.0]))
    assert torch.equal(FluxConditioning.cat([c[:1], c[1:]]).prompt_embeds, seq)

    from g2rpo.strategies.base import Conditioning

    assert isinstance(c, Conditioning)
    with pytest.raises(G2RPOError, match="batch size differs"):
        FluxConditioning(seq, pooled[:2])
    with pytest.raises(G2RPOError, match=r"prompt_embeds.shape"):
        FluxConditioning(seq[0], pooled)


def test_models_text_encoder_matches_pipeline(pipe, cond):
    # FluxPipeline.__call__ encodes under no_grad; with autograd on, T5 takes another kernel path
    # (differences ~2e-6), so compare like with like.
    with torch.no_grad():
        seq, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None, max_sequence_length=SEQ)
    assert cond.prompt_embeds.shape == (2, SEQ, 32) and cond.pooled_prompt_embeds.shape == (2, 32)
    assert torch.equal(cond.prompt_embeds, seq)
    assert torch.equal(cond.pooled_prompt_embeds, pooled)
    # the two prompts differ, so the embeddings do (guards against a constant encoder)
    assert not torch.equal(cond.pooled_prompt_embeds[0], cond.pooled_prompt_embeds[1])


# --------------------------------------------------------------------------- the adapter


def test_models_round_timestep_hand_worked():
    sigma = torch.tensor([0.7777, 1.0])
    # pipeline mode, bf16: σ·1000 = 777.7 → bf16 (spacing 4 in [512, 1024)) = 776; 776/1000 in bf16
    # (spacing 2⁻⁸ in [0.5, 1)): 0.776 → 199/256 = 0.77734375. 1000 is exact → 1.0.
    t = round_timestep(sigma, torch.bfloat16, "pipeline")
    assert t.dtype == torch.bfloat16 and t.float().tolist() == [0.77734375, 1.0]
    # truncate mode: int(777.7)/1000 = 0.777, then float32
    t = round_timestep(sigma, torch.float32, "truncate")
    assert t.tolist() == [torch.tensor(0.777).item(), 1.0]
    # σ = 0.82606 (step 1 of Flux's 4-step grid at 16 tokens): pipeline: 826.06 → bf16 828 (spacing 4)
    # → 0.828 → bf16 212/256 = 0.828125; raw: 0.82606 → bf16 211/256 = 0.82421875 (211.47 rounds down)
    s1 = torch.tensor([0.8260643482208252])
    assert round_timestep(s1, torch.bfloat16, "pipeline").float().item() == 0.828125
    assert round_timestep(s1, torch.bfloat16, "raw").float().item() == 0.82421875
    with pytest.raises(G2RPOError, match="timestep_mode"):
        round_timestep(sigma, torch.float32, "nearest")


def test_models_adapter_shapes_and_dtypes(pipe, cond):
    model = FluxVelocity(pipe.transformer, height=64, width=64)
    assert model.latent_shape == (16, 64)
    x = torch.randn(2, 16, 64)
    v = model(x, torch.tensor([1.0, 0.5]), cond)
    assert v.shape == (2, 16, 64) and v.dtype == torch.float32
    assert v.abs().sum() > 0
    # rows at different σ are independent of their batch mates
    v0 = model(x[:1], torch.tensor([1.0]), cond[:1])
    torch.testing.assert_close(v[:1], v0, rtol=1e-5, atol=1e-6)

    with pytest.raises(G2RPOError, match="x.shape"):
        model(torch.randn(2, 15, 64), torch.ones(2), cond)
    with pytest.raises(G2RPOError, match="sigma.shape"):
        model(x, torch.ones(3), cond)
    with pytest.raises(G2RPOError, match="len\\(cond\\)"):
        model(x, torch.ones(2), cond[:1])
    with pytest.raises(G2RPOError, match="guidance"):
        FluxVelocity(pipe.transformer, height=64, width=64, guidance=None)


def test_models_adapter_bf16_matches_pipeline_call(tiny_flux_dir):
    """In bf16, the adapter feeds the transformer exactly what FluxPipeline feeds it."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.bfloat16, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    seen = []
    hook = pipe.transformer.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append((kwargs, out[0])), with_kwargs=True
    )
    pipe(
        PROMPTS[0],
        height=64,
        width=64,
        num_inference_steps=4,
        max_sequence_length=SEQ,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
    )
    hook.remove()
    model = FluxVelocity(pipe.transformer, height=64, width=64, guidance=3.5)
    assert model.dtype == torch.bfloat16
    cond_bf16 = FluxConditioning(seen[0][0]["encoder_hidden_states"], seen[0][0]["pooled_projections"])
    sigmas = pipe.scheduler.sigmas
    for i, (kwargs, out) in enumerate(seen):
        x = kwargs["hidden_states"].float()  # bf16 → float32 is exact
        with torch.no_grad():
            v = model(x, sigmas[i : i + 1], cond_bf16)
        assert torch.equal(v, out.float()), f"step {i}"
    # σ cast straight to bf16 (not rounded at the scale of 1000) gives another velocity: with 4 steps
    # σ[1] = 0.82606 feeds 828/1000 the pipeline way but 824/1000 cast directly
    with torch.no_grad():
        raw = [
            pipe.transformer(**{**kw, "timestep": sigmas[i : i + 1].to(torch.bfloat16)})[0]
            for i, (kw, _) in enumerate(seen)
        ]
    assert any(not torch.equal(r, out) for r, (_, out) in zip(raw, seen))


@pytest.mark.parametrize("steps", [1, 4])
def test_models_ode_loop_reproduces_flux_pipeline_exactly(pipe, cond, steps):
    gens = [torch.Generator().manual_seed(s) for s in (11, 12)]
    expected = pipe(
        PROMPTS,
        height=64,
        width=64,
        num_inference_steps=steps,
        guidance_scale=3.5,
        max_sequence_length=SEQ,
        generator=gens,
        output_type="latent",
    ).images  # [2, 16, 64] packed, float32

    model = FluxVelocity(pipe.transformer, height=64, width=64, guidance=3.5)
    x = initial_noise([torch.Generator().manual_seed(s) for s in (11, 12)], 64, 64)  # [2, 16, 64]
    sigmas = flux_sigmas(steps, image_seq_len=model.latent_shape[0])  # [T+1]
    assert torch.equal(sigmas, pipe.scheduler.sigmas)
    with torch.no_grad():
        for i in range(steps):
            v = model(x, sigmas[i].expand(2), cond)
            x = ode_step(x, v, sigmas[i], sigmas[i + 1])
    assert x.dtype == torch.float32
    assert torch.equal(x, expected)
    # the guidance embedding is live: another scale gives another velocity
    x0 = initial_noise([torch.Generator().manual_seed(s) for s in (11, 12)], 64, 64)
    other = FluxVelocity(pipe.transformer, height=64, width=64, guidance=1.0)
    with torch.no_grad():
        assert not torch.equal(other(x0, sigmas[0].expand(2), cond), model(x0, sigmas[0].expand(2), cond))


def test_models_gradient_checkpointing_same_gradients(pipe, cond):
    import copy

    transformer = copy.deepcopy(pipe.transformer)
    x = torch.randn(2, 16, 64)
    sigma = torch.tensor([0.9, 0.3])
    grads = []
    for checkpointing in (False, True):
        model = FluxVelocity(transformer, height=64, width=64, gradient_checkpointing=checkpointing)
        assert transformer.gradient_checkpointing is checkpointing
        transformer.zero_grad()
        model(x, sigma, cond).square().mean().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in transformer.parameters() if p.grad is not None]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------- decoding


def test_models_decode_range_and_pipeline_agreement(pipe, cond):
    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    images = pipe(
        PROMPTS,
        height=64,
        width=64,
        num_inference_steps=2,
        max_sequence_length=SEQ,
        generator=gens,
        output_type="pt",
    ).images  # [2, 3, 64, 64] in [0, 1]
    latents = pipe(
        PROMPTS,
        height=64,
        width=64,
        num_inference_steps=2,
        max_sequence_length=SEQ,
        generator=[torch.Generator().manual_seed(s) for s in (3, 4)],
        output_type="latent",
    ).images
    ours = decode_latents(pipe.vae, latents, 64, 64, micro_batch=2)  # one call, as the pipeline
    assert ours.shape == (2, 3, 64, 64) and ours.dtype == torch.float32
    assert 0.0 <= ours.min() and ours.max() <= 1.0
    assert ours.std() > 0
    torch.testing.assert_close(ours, images, rtol=0, atol=1e-7)
    # micro-batches of one: the same images up to convolution batch effects (~3e-6 measured)
    torch.testing.assert_close(decode_latents(pipe.vae, latents, 64, 64, micro_batch=1), ours, rtol=0, atol=2e-5)
    # far-out latents saturate: the clamp keeps images in [0, 1]
    loud = decode_latents(pipe.vae, latents * 1e3, 64, 64)
    assert loud.min() >= 0 and loud.max() <= 1


def test_models_reference_velocity_is_the_base_with_lora_disabled(tiny_flux_dir, cond):
    from diffusers import FluxPipeline

    from g2rpo.training.drivers import apply_lora
    from g2rpo.training.run_config import LoraSection

    transformer = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.float32, local_files_only=True).transformer
    base = FluxVelocity(transformer, height=64, width=64)
    x, sigma = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.4])
    with pytest.raises(G2RPOError, match="train.lora.enabled=False: a KL penalty to the reference policy needs LoRA"):
        base.reference_velocity(x, sigma, cond)
    with torch.no_grad():
        v_base = base(x, sigma, cond)
    apply_lora(transformer, LoraSection(enabled=True, rank=2, alpha=2.0, target_modules=["to_q", "to_v"]), seed=0)
    with torch.no_grad():  # peft starts B at 0: move the adapters so the policy leaves its base
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    model = FluxVelocity(transformer, height=64, width=64)
    with torch.no_grad():
        v_policy = model(x, sigma, cond)
    v_ref = model.reference_velocity(x, sigma, cond)
    torch.testing.assert_close(v_ref, v_base, rtol=1e-5, atol=1e-6)
    assert (v_policy - v_base).abs().max() > 1e-4
    torch.testing.assert_close(model(x, sigma, cond).detach(), v_policy)  # adapters are back on afterwards
