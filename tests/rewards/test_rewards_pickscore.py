"""PickScore on a tiny transformers CLIPModel folder; its batched torch preprocessing against the
real CLIPImageProcessor (torchvision backend, transformers 5's default) and the PIL one (what the
model card ran under transformers 4)."""

from __future__ import annotations

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.pickscore import PickScore

PROMPTS = ["a cat sitting on a red chair", "a photo of a mountain at night"]


def _uint8_images(n, h, w, seed=0):
    return (torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed)) * 255).round().to(torch.uint8)


def _smooth_uint8_images(n, h, w, seed=0):
    """Smooth content (bicubic upsampling of a 6×6 grid), closer to generated images than noise."""
    coarse = torch.rand(n, 3, 6, 6, generator=torch.Generator().manual_seed(seed))
    fine = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1)
    return (fine * 255).round().to(torch.uint8)


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_preprocess_equals_clip_image_processor_at_the_model_size(tiny_pickscore, backend):
    from transformers import CLIPImageProcessor
    from transformers.models.clip import CLIPImageProcessorPil

    head = PickScore.from_pretrained_dir(tiny_pickscore["dir"])
    cls = CLIPImageProcessor if backend == "torchvision" else CLIPImageProcessorPil
    processor = cls.from_pretrained(str(tiny_pickscore["dir"]))
    pixels = _uint8_images(2, 32, 32)
    ours = head.preprocess(pixels.float() / 255.0)
    theirs = processor(images=list(pixels), return_tensors="pt").pixel_values
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("h", "w"), [(48, 40), (20, 36), (64, 80), (256, 256)])
def test_preprocess_after_a_real_resize_is_within_the_documented_bound(tiny_pickscore, h, w):
    """The processor resizes uint8 images (PIL-compatible bicubic, uint8 rounding between passes);
    the head resizes the float batch. On smooth content the difference measured 0.02–0.08 in
    normalised units (≈ 0.005–0.02 in pixel value; docs/rewards.md). Same shapes, same crop."""
    from transformers import CLIPImageProcessor

    head = PickScore.from_pretrained_dir(tiny_pickscore["dir"])
    processor = CLIPImageProcessor.from_pretrained(str(tiny_pickscore["dir"]))
    pixels = _smooth_uint8_images(2, h, w)
    ours = head.preprocess(pixels.float() / 255.0)
    theirs = processor(images=list(pixels), return_tensors="pt").pixel_values
    assert ours.shape == theirs.shape == (2, 3, 32, 32)
    assert float((ours - theirs).abs().max()) < 0.1
    assert float((ours - theirs).abs().mean()) < 0.01


def test_score_is_logit_scale_times_cosine(tiny_pickscore):
    head = PickScore.from_pretrained_dir(tiny_pickscore["dir"])
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    scores = head.score(images, PROMPTS)
    tokens = head.tokenizer(PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        out = head.model(
            input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, pixel_values=head.preprocess(images)
        )
    # CLIPModel's logits_per_image = exp(logit_scale) · cos: its diagonal pairs image i with prompt i
    torch.testing.assert_close(scores, torch.diagonal(out.logits_per_image), rtol=0, atol=1e-5)
    assert float(head.model.logit_scale.detach().exp()) > 1.0  # the scale is applied (CLIP init: 1/0.07)


def test_processor_dir_and_errors(tiny_pickscore, tmp_path):
    import shutil

    model_only = tmp_path / "model"
    model_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_pickscore["dir"] / name, model_only / name)
    with pytest.raises(G2RPOError, match="preprocessor_config.json"):
        PickScore.from_pretrained_dir(model_only)
    head = PickScore.from_pretrained_dir(model_only, processor_dir=tiny_pickscore["dir"])
    assert head.score(torch.rand(1, 3, 32, 32), ["a cat"]).shape == (1,)
    with pytest.raises(G2RPOError, match="pickscore.weights=.*does not exist"):
        PickScore.from_pretrained_dir(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(G2RPOError, match="no config.json"):
        PickScore.from_pretrained_dir(empty)


def test_wrong_keys_are_errors_not_random_initialisation(tiny_pickscore, tmp_path):
    """transformers would initialise a missing weight at random and drop an unexpected one with
    only a log line; the head refuses both, naming the keys. Position-id buffers that older
    checkpoints (PickScore_v1) carry are not weights and still load."""
    import shutil

    from safetensors.torch import load_file, save_file

    def variant(name, edit):
        folder = tmp_path / name
        shutil.copytree(tiny_pickscore["dir"], folder)
        state = load_file(str(folder / "model.safetensors"))
        edit(state)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    missing = variant("missing", lambda s: s.pop("vision_model.post_layernorm.weight"))
    with pytest.raises(G2RPOError, match=r"pickscore.weights=.*1 missing key\(s\): vision_model.post_layernorm.weight"):
        PickScore.from_pretrained_dir(missing)
    unexpected = variant("unexpected", lambda s: s.update({"visual_head.weight": torch.zeros(2)}))
    with pytest.raises(G2RPOError, match=r"1 unexpected key\(s\): visual_head.weight"):
        PickScore.from_pretrained_dir(unexpected)

    wrong_shape = variant("shape", lambda s: s.update({"vision_model.post_layernorm.weight": torch.ones(7)}))
    with pytest.raises(G2RPOError, match=r"pickscore.weights=.*cannot be loaded as a CLIPModel"):
        PickScore.from_pretrained_dir(wrong_shape)

    def with_position_ids(state):
        state["text_model.embeddings.position_ids"] = torch.arange(77)[None]

    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    older = PickScore.from_pretrained_dir(variant("position_ids", with_position_ids))
    assert torch.equal(
        older.score(images, ["a cat"]), PickScore.from_pretrained_dir(tiny_pickscore["dir"]).score(images, ["a cat"])
    )
