"""The shapes model: pretraining is reproducible, the result loads like FLUX.1-dev, a short VAE
pretraining already reconstructs the scenes better than random weights on the exact rewards, and
(slow) the fully pretrained model's samples beat a random-weight model's by a clear margin."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import FluxPipeline
from safetensors.torch import load_file

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import (
    ShapesPretraining,
    check_shapes_model,
    noisy_captions,
    pretrain_shapes,
    recoloured_scenes,
    sample_shapes,
    shapes_pipeline,
)
from g2rpo.models.tiny import TINY_MARKER
from g2rpo.rewards.shapes import IN_DOMAIN, MEASURES, scene_scores
from g2rpo.tasks.shapes import COLOURS, all_scenes, parse_prompt, render

QUICK = ShapesPretraining(vae_steps=2, vae_batch=4, flow_steps=2, flow_batch=4)
WEIGHTS = ("transformer/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors")


def mean_scores(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    scores = [scene_scores(image, prompt) for image, prompt in zip(images, prompts, strict=True)]
    return {name: sum(s[name] for s in scores) / len(scores) for name in MEASURES}


def test_pretraining_twice_gives_the_same_weights_and_loads_like_flux(tmp_path):
    first = pretrain_shapes(tmp_path / "a", QUICK)
    second = pretrain_shapes(tmp_path / "b", QUICK)
    untrained = shapes_pipeline(QUICK.seed)
    for name, module in zip(WEIGHTS, (untrained.transformer, untrained.vae), strict=True):
        a, b = load_file(first / name), load_file(second / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        initial = module.state_dict()
        assert any(not torch.equal(a[k], initial[k]) for k in a)  # the steps changed the weights
    marker = json.loads((first / TINY_MARKER).read_text())
    assert marker["task"] == "shapes" and marker["settings"]["flow_steps"] == 2
    pipe = FluxPipeline.from_pretrained(first, local_files_only=True)
    trained = load_file(first / WEIGHTS[1])
    assert torch.equal(pipe.vae.state_dict()["decoder.conv_out.weight"], trained["decoder.conv_out.weight"])
    # the latents' statistics set the VAE's scaling, so the transformer sees unit-variance latents
    assert (pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor) == (
        marker["latent_shift"],
        marker["latent_scale"],
    )
    assert marker["latent_scale"] != 0.3611
    # every word of the task is one T5 token, so no prompt is truncated
    longest = max((s.prompt for s in all_scenes()), key=len)
    assert len(pipe.tokenizer_2(longest).input_ids) <= 16
    with pytest.raises(G2RPOError, match="exists and is not an empty directory"):
        pretrain_shapes(first, QUICK)
    # --overwrite replaces the folder whole: its old manifest does not refuse the new one
    assert check_shapes_model(pretrain_shapes(first, QUICK, overwrite=True), QUICK) == first


def test_recoloured_scenes_are_the_same_scene_in_each_other_colour():
    scenes = all_scenes()
    recoloured = recoloured_scenes(scenes)
    assert recoloured.shape == (360, 3)
    # scene 0 is a small red circle at the top left on black; the order is (shape, colour, size, position,
    # background) with 2 sizes, 5 positions and 3 backgrounds, so the same scene in green, blue and yellow lies
    # 2·5·3 = 30 scenes further each
    assert recoloured[0].tolist() == [30, 60, 90]
    for i in (0, 100, 359):
        others = [scenes[j] for j in recoloured[i]]
        assert sorted(o.colour for o in others) == sorted(c for c in COLOURS if c != scenes[i].colour)
        assert all(o.prompt.replace(o.colour, scenes[i].colour) == scenes[i].prompt for o in others)


def test_noisy_captions_swap_the_colour_word_at_the_asked_rate():
    scenes = all_scenes()
    recoloured = recoloured_scenes(scenes)
    idx = torch.randint(0, 360, (20000,), generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(noisy_captions(idx, recoloured, 0.0, gen), idx)
    assert torch.equal(gen.get_state(), torch.Generator().manual_seed(0).get_state())  # p = 0 draws nothing
    always = noisy_captions(idx, recoloured, 1.0, gen)
    assert all(scenes[int(a)].colour != scenes[int(i)].colour for a, i in zip(always[:500], idx[:500], strict=True))
    captions = noisy_captions(idx, recoloured, 0.3, gen)
    swapped = captions != idx
    assert abs(swapped.float().mean().item() - 0.3) < 0.015  # 20 000 draws: σ ≈ 0.003
    # swapped captions name each of the other three colours about equally often
    counts = torch.bincount((captions[swapped] // 30) % 4, minlength=4).float() / swapped.sum()
    assert torch.all((counts - 0.25).abs() < 0.03), counts
    # the colour is the only word that changes
    for c, i in zip(captions[:200].tolist(), idx[:200].tolist(), strict=True):
        a, b = scenes[c], scenes[i]
        assert (a.shape, a.size, a.position, a.background) == (b.shape, b.size, b.position, b.background)


def test_a_short_vae_pretraining_reconstructs_scenes_better_than_random_weights(tmp_path):
    # 100 steps: with the shape's pixels weighted 10× the background is learned later than with a plain
    # MSE (30 steps moved it by 0.01 only; 100 steps: background 0.89 and shape 0.62 vs 0.50 and 0.06)
    settings = ShapesPretraining(vae_steps=100, vae_batch=8, flow_steps=1, flow_batch=4)
    out = pretrain_shapes(tmp_path / "short", settings)
    scenes = all_scenes()[::24]
    images = torch.stack([render(s) for s in scenes]) * 2 - 1
    prompts = [s.prompt for s in scenes]

    def reconstruct(vae):
        with torch.no_grad():
            return (vae.decode(vae.encode(images).latent_dist.mean).sample / 2 + 0.5).clamp(0, 1)

    trained = mean_scores(reconstruct(FluxPipeline.from_pretrained(out, local_files_only=True).vae), prompts)
    random = mean_scores(reconstruct(shapes_pipeline(0).vae), prompts)
    assert trained["shapes_background"] > random["shapes_background"] + 0.2, (trained, random)
    assert trained["shapes_shape"] > random["shapes_shape"] + 0.3, (trained, random)


@pytest.mark.slow
def test_pretrained_samples_beat_a_random_model_on_the_exact_rewards(tmp_path, capsys):
    out = tmp_path / "shapes"
    prompts_file = tmp_path / "prompts.txt"
    assert main(["model", "pretrain-shapes", "--output", str(out), "--prompts", str(prompts_file)]) == 0
    assert "wrote the shapes FluxPipeline (seed 0)" in capsys.readouterr().out
    prompts = prompts_file.read_text().splitlines()
    assert len(prompts) == 360 and all(parse_prompt(p) for p in prompts)
    held = prompts[::7]  # 52 prompts covering every shape, colour, size, position and background; fixed seed
    trained = mean_scores(sample_shapes(FluxPipeline.from_pretrained(out, local_files_only=True), held, seed=1), held)
    random = mean_scores(sample_shapes(shapes_pipeline(0), held, seed=1), held)
    print("pretrained", trained, "random", random)
    in_domain = sum(trained[n] - random[n] for n in IN_DOMAIN) / len(IN_DOMAIN)
    assert in_domain > 0.25, (trained, random)
    assert trained["shapes_background"] > random["shapes_background"] + 0.2, (trained, random)
