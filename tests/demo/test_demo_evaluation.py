"""g2rpo.evaluation.sampling on the real tiny Flux: ODE samples = FluxPipeline's, scores = the reward's."""

from __future__ import annotations

import pytest
import torch

from g2rpo.core import flux_sigmas
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.sampling import (
    EvalResult,
    ode_sample,
    sample_and_score,
    save_before_after_grid,
    save_reward_curve,
)
from g2rpo.models.flux import FluxTextEncoder, FluxVelocity, decode_latents
from g2rpo.rewards.jpeg import JPEGCompressibility

pytestmark = pytest.mark.integration

PROMPTS = ["a photo of a cat", "a red car in the city"]
SEQ = 32  # the tiny T5 length
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pipe(tiny_flux_dir):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def velocity(pipe):
    return FluxVelocity(pipe.transformer, height=64, width=64, guidance=3.5)


@pytest.fixture(scope="module")
def cond(pipe):
    return FluxTextEncoder.from_pipeline(pipe, SEQ).encode(PROMPTS)


def test_demo_ode_sample_is_flux_pipeline_for_each_prompt_and_seed(pipe, velocity, cond):
    # Rows are prompt-major (p·S + s): p0/s11, p0/s12, p1/s11, p1/s12 — the pipeline given the same
    # prompts and one generator per image, seeded the same way, must give the same latents.
    seeds = [11, 12]
    expected = pipe(
        [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]],
        height=64,
        width=64,
        num_inference_steps=4,
        guidance_scale=3.5,
        max_sequence_length=SEQ,
        generator=[torch.Generator().manual_seed(s) for s in seeds * 2],
        output_type="latent",
    ).images  # [4, 16, 64]
    sigmas = flux_sigmas(4, velocity.latent_shape[0])
    got = ode_sample(velocity, cond, seeds, sigmas)
    assert got.shape == (4, 16, 64)
    assert torch.equal(got, expected)  # same batch of 4 rows, float32: bit for bit
    # micro-batching one row per call changes nothing but rounding
    torch.testing.assert_close(ode_sample(velocity, cond, seeds, sigmas, micro_batch=1), got, rtol=1e-5, atol=1e-5)


def test_demo_sample_and_score_scores_are_the_rewards_of_the_decoded_samples(pipe, velocity, cond):
    seeds = [0, 1, 2]
    sigmas = flux_sigmas(3, velocity.latent_shape[0])
    reward = JPEGCompressibility()
    result = sample_and_score(velocity, pipe.vae, cond, PROMPTS, seeds, {"jpeg": reward}, sigmas, reward_batch=2)
    assert result.images.shape == (2, 3, 3, 64, 64) and result.scores["jpeg"].shape == (2, 3)
    # recompute by hand: the same latents, decoded, scored image by image
    images = decode_latents(pipe.vae, ode_sample(velocity, cond, seeds, sigmas), 64, 64)
    expected = reward.score(images, [p for p in PROMPTS for _ in seeds]).reshape(2, 3)
    assert torch.equal(result.scores["jpeg"], expected)
    assert result.mean() == pytest.approx(float(expected.double().mean()), abs=1e-12)
    # deterministic: a second evaluation gives the same numbers
    again = sample_and_score(velocity, pipe.vae, cond, PROMPTS, seeds, {"jpeg": reward}, sigmas)
    assert torch.equal(again.scores["jpeg"], result.scores["jpeg"])
    # the registry's per-prompt record: one item per (prompt, seed), ids by position
    scores = result.eval_scores("tiny-prompts", None)
    assert scores.seeds == seeds and len(scores.items) == 6
    assert [(i.prompt_id, i.seed) for i in scores.items[:4]] == [("p0", 0), ("p0", 1), ("p0", 2), ("p1", 0)]
    assert scores.items[4].scores["jpeg"] == float(expected[1, 1])


def test_demo_evaluation_errors_name_the_fix(pipe, velocity, cond):
    sigmas = flux_sigmas(2, velocity.latent_shape[0])
    with pytest.raises(G2RPOError, match="seeds"):
        ode_sample(velocity, cond, [], sigmas)
    with pytest.raises(G2RPOError, match="sigmas"):
        ode_sample(velocity, cond, [0], sigmas[1:])
    with pytest.raises(G2RPOError, match="prompts"):
        sample_and_score(velocity, pipe.vae, cond, PROMPTS[:1], [0], {"jpeg": JPEGCompressibility()}, sigmas)
    with pytest.raises(G2RPOError, match="reward"):
        sample_and_score(velocity, pipe.vae, cond, PROMPTS, [0], {}, sigmas)


def _result(prompts, seeds, value):
    p, s = len(prompts), len(seeds)
    return EvalResult(list(prompts), list(seeds), torch.full((p, s, 3, 8, 8), 0.5), {"r": torch.full((p, s), value)})


def test_demo_grid_and_curve_are_pngs_and_refuse_unpaired_results(tmp_path):
    before, after = _result(["a", "b"], [0, 1], -7.0), _result(["a", "b"], [0, 1], -5.0)
    grid = save_before_after_grid(before, after, tmp_path / "grid.png")
    assert grid.read_bytes()[:8] == PNG
    curve = save_reward_curve([-7.2, -6.5, -6.0], tmp_path / "curve.png", before.mean(), after.mean(), title="t")
    assert curve.read_bytes()[:8] == PNG
    with pytest.raises(G2RPOError, match="same prompts and seeds"):
        save_before_after_grid(before, _result(["a", "b"], [0, 2], -5.0), tmp_path / "x.png")
    two = EvalResult(["a"], [0], torch.zeros(1, 1, 3, 8, 8), {"r": torch.zeros(1, 1), "q": torch.ones(1, 1)})
    with pytest.raises(G2RPOError, match="name one of the rewards"):
        two.mean()
    assert two.mean("q") == 1.0
