"""Conditionings take repeated rows as views, and rollouts do not change for it.

``g2rpo.core.take_rows`` returns a broadcast view when an index names one row throughout and a
slice view for consecutive rows; the values are always those of fancy indexing. The rollouts of
every strategy, on the tiny real Flux and on the toy model, are compared bit for bit against the
same rollout with a conditioning that indexes the way the project did before (a copy per gather).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from g2rpo.core import take_rows
from g2rpo.models.flux import FluxConditioning, FluxTextEncoder, FluxVelocity
from g2rpo.seeding import Draws
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.registry import build_strategy
from g2rpo.strategies.settings import DiffusionNFTSettings, G2RPOSettings
from g2rpo.toy import ToyConditioning, make_toy_problem


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_take_rows_views_where_rows_repeat_and_copies_otherwise():
    values = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3)
    cases = {
        "one row repeated": (torch.tensor([2, 2, 2, 2, 2]), True),
        "one row, negative": (torch.tensor([-1, -1]), True),
        "consecutive rows": (torch.tensor([1, 2, 3]), True),
        "two runs": (torch.tensor([0, 0, 1, 1]), False),
        "permutation": (torch.tensor([3, 1, 0]), False),
    }
    for name, (index, view) in cases.items():
        got = take_rows(values, index)
        assert torch.equal(got, values[index]), name
        assert _shares_storage(got, values) is view, name
    broadcast = take_rows(values, torch.zeros(288, dtype=torch.long))
    assert broadcast.shape == (288, 3) and broadcast.stride(0) == 0  # no new storage for 288 rows
    assert _shares_storage(take_rows(values, slice(1, 3)), values)
    mask = torch.tensor([True, False, True, False])
    assert torch.equal(take_rows(values, mask), values[mask])
    with pytest.raises(IndexError):
        take_rows(values, torch.tensor([4, 4]))


def test_flux_conditioning_repeated_prompt_is_a_broadcast_view():
    seq, pooled = torch.randn(2, 5, 8).to(torch.bfloat16), torch.randn(2, 3).to(torch.bfloat16)
    cond = FluxConditioning(seq, pooled)
    rows = cond[torch.ones(288, dtype=torch.long)]
    assert torch.equal(rows.prompt_embeds, seq[[1] * 288]) and torch.equal(rows.pooled_prompt_embeds, pooled[[1] * 288])
    assert _shares_storage(rows.prompt_embeds, seq) and _shares_storage(rows.pooled_prompt_embeds, pooled)
    assert rows.prompt_embeds.stride(0) == 0
    one = cond[:1].repeat_interleave(12)
    assert _shares_storage(one.prompt_embeds, seq) and torch.equal(one.prompt_embeds, seq[:1].repeat(12, 1, 1))
    both = cond.repeat_interleave(2)  # rows of two prompts: a copy, values as before
    assert torch.equal(both.prompt_embeds, seq.repeat_interleave(2, dim=0)) and not _shares_storage(
        both.prompt_embeds, seq
    )
    toy = ToyConditioning(torch.randn(3, 4))
    assert _shares_storage(toy[torch.tensor([2, 2, 2])].embeddings, toy.embeddings)


@dataclass(frozen=True)
class CopyingFluxConditioning(FluxConditioning):
    """The previous ``FluxConditioning`` indexing: fancy indexing, a copy for every LongTensor."""

    def __getitem__(self, index):  # noqa: ANN001
        if isinstance(index, torch.Tensor):
            index = index.to(self.prompt_embeds.device)
        return CopyingFluxConditioning(self.prompt_embeds[index], self.pooled_prompt_embeds[index])

    def repeat_interleave(self, repeats: int) -> CopyingFluxConditioning:
        return CopyingFluxConditioning(
            self.prompt_embeds.repeat_interleave(repeats, dim=0),
            self.pooled_prompt_embeds.repeat_interleave(repeats, dim=0),
        )


@dataclass
class CopyingToyConditioning(ToyConditioning):
    def __getitem__(self, index):  # noqa: ANN001
        return CopyingToyConditioning(self.embeddings[index])

    def repeat_interleave(self, repeats: int) -> CopyingToyConditioning:
        return CopyingToyConditioning(self.embeddings.repeat_interleave(repeats, dim=0))


class Recording:
    """The model, noting whether any call got a broadcast (stride-0) conditioning."""

    def __init__(self, model, embeddings_of):
        self.model, self.embeddings_of, self.broadcast_calls = model, embeddings_of, 0

    def __call__(self, x, sigma, cond):
        embeddings = self.embeddings_of(cond)
        self.broadcast_calls += int(embeddings.shape[0] > 1 and embeddings.stride(0) == 0)
        return self.model(x, sigma, cond)

    def named_parameters(self):
        return self.model.named_parameters()  # DiffusionNFT swaps its old policy into these


def _assert_same_rollout(strategy, model, cond, old_cond, draws, latent_shape, embeddings_of, views: bool | None):
    new_model = Recording(model, embeddings_of)
    new = strategy.rollout(new_model, cond, draws, latent_shape)
    old = strategy.rollout(model, old_cond, draws, latent_shape)
    if views is not None:  # the view path ran, so the comparison means something
        assert (new_model.broadcast_calls > 0) is views
    assert torch.equal(new.final_latents, old.final_latents)
    for name in ("log_prob_old", "branches", "latents", "clean", "noisy", "v_old"):
        if hasattr(new.states, name):
            # rtol = atol = 0: bit for bit, NaN (MixGRPO's ODE steps) where NaN
            torch.testing.assert_close(
                getattr(new.states, name), getattr(old.states, name), rtol=0, atol=0, equal_nan=True
            )


STRATEGIES = {
    "g2rpo": {"g2rpo": G2RPOSettings(branch_steps=[0, 1], granularities=[1, 2])},
    "dancegrpo": {},
    "mixgrpo": {},
    "flowgrpo": {},
    "diffusionnft": {"diffusionnft": DiffusionNFTSettings(kl_beta=0.0)},
}


@pytest.mark.integration
@pytest.mark.parametrize("num_prompts", [1, 2])
def test_rollouts_on_tiny_flux_are_bit_identical_with_views(tiny_flux_dir, num_prompts):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dir, dtype=torch.float32, local_files_only=True)
    cond = FluxTextEncoder.from_pipeline(pipe).encode(["a photo of a cat", "snow on the mountain"][:num_prompts])
    old_cond = CopyingFluxConditioning(cond.prompt_embeds, cond.pooled_prompt_embeds)
    model = FluxVelocity(pipe.transformer, height=64, width=64)
    draws = Draws(run_seed=7, iteration=0, prompt_indices=tuple(range(num_prompts)))
    for name in ("g2rpo", "dancegrpo"):
        config = AlgorithmConfig(strategy=name, num_steps=4, group_size=3, micro_batch=5, **STRATEGIES[name])
        # two prompts: a call with rows of both still gathers (a copy); G²RPO's packed calls may hold one
        # prompt's rows (a view) or both, DanceGRPO's always both — the values are the same either way
        _assert_same_rollout(
            build_strategy(config),
            model,
            cond,
            old_cond,
            draws,
            model.latent_shape,
            lambda c: c.prompt_embeds,
            views=True if num_prompts == 1 else (None if name == "g2rpo" else False),
        )


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_rollouts_on_the_toy_model_are_bit_identical_with_views(name):
    model, cond, _ = make_toy_problem(num_prompts=1)
    config = AlgorithmConfig(strategy=name, num_steps=6, group_size=4, micro_batch=7, **STRATEGIES[name])
    old_cond = CopyingToyConditioning(cond.embeddings)
    draws = Draws(run_seed=3, iteration=2, prompt_indices=(5,))
    _assert_same_rollout(build_strategy(config), model, cond, old_cond, draws, (4, 4), lambda c: c.embeddings, True)


@pytest.mark.integration
def test_memory_benchmark_runs_and_views_do_not_raise_the_peak(tmp_path):
    from benchmarks import memory

    out = tmp_path / "memory.json"
    # 1 MiB per text row: the before-case's gathers (288 rows at most) stand far above allocator noise
    argv = ["--size", "64", "--seq", "256", "--dim", "2048", "--pooled", "8", "--velocities", "reads"]
    assert memory.main([*argv, "--micro-batches", "512", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    (case,) = result["cases"]
    before, after = case["before"], case["after"]
    # one prompt, G=12, M = 8 steps, Λ = {1, 2, 3}: every model call gathers its rows — the copying
    # indexing copies each time, the views never; the largest call holds all 8·3·12 finishing rows
    assert before["gathers_copied"] == before["model_calls"] and after["gathers_copied"] == 0
    assert max(before["gathered_rows"]) == 8 * 3 * 12 and before["gathered_rows"][:1] == [1]
    row_bytes = 256 * 2048 * 2 + 8 * 2
    assert before["copied_bytes_largest"] == 288 * row_bytes
    assert before["copied_bytes_total"] == row_bytes * sum(before["gathered_rows"]) == row_bytes * 1892
    assert before["sampling_forwards"] == after["sampling_forwards"] == 1892  # the paper's count per prompt
    assert after["peak_bytes"] < before["peak_bytes"]
    assert before["peak_bytes"] >= before["copied_bytes_largest"]


@pytest.mark.slow  # ~40 s: two subprocesses build FLUX.1-dev's VAE architecture
@pytest.mark.integration
def test_decode_benchmark_runs_and_writes_its_fields(tmp_path):
    from benchmarks import decode

    out = tmp_path / "decode.json"
    argv = ["--images", "4", "--micro-batches", "1", "2", "4", "8", "--repeats", "1", "--models", "tiny", "flux-vae"]
    argv += ["--flux-size", "16", "--flux-images", "2", "--flux-memory-size", "32", "--output", str(out)]
    assert decode.main(argv) == 0
    result = json.loads(out.read_text())
    tiny, flux = result["timings"]["tiny"], result["timings"]["flux-vae"]
    assert [row["micro_batch"] for row in tiny["rows"]] == [1, 2, 4]  # never more than the images decoded
    assert [row["micro_batch"] for row in flux["rows"]] == [1, 2]
    for row in tiny["rows"] + flux["rows"]:
        assert 0 < row["min"] <= row["seconds_per_image"] <= row["max"] and row["vs_fastest"] >= 1
    assert min(row["vs_fastest"] for row in tiny["rows"]) == 1
    memory = result["flux_vae_memory"]
    assert memory["size"] == 32 and memory["peak_bytes_2_images"] > 0
    scale = (memory["target_size"] / 32) ** 2 / 2
    assert memory["per_image_bytes_bf16_at_target_estimate"] == pytest.approx(memory["per_image_bytes_float32"] * scale)
