"""HPS-v2.1, CLIP score and the aesthetic head on tiny open_clip models in the published layouts.

The reference computations here go through open_clip's own entry points (``model(image, text)``
with ``output_dict``, as hpsv2 scores; ``create_model_from_pretrained('local-dir:...')`` and its
PIL transform, as the G²RPO scripts compute the CLIP score), on the same files the heads load.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.clip_score import CLIPScore
from g2rpo.rewards.hps import HPSv21

PROMPTS = ["a cat sitting on a red chair", "a photo of a mountain at night", "oil painting of a dog"]


def _images(n: int, h: int = 32, w: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- HPS-v2.1


def test_hps_loads_the_published_layout_strictly(tiny_hps):
    head = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"])
    saved = torch.load(tiny_hps["checkpoint"], weights_only=True)["state_dict"]
    loaded = head.model.state_dict()
    assert set(saved) == set(loaded)
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)


def test_hps_score_is_open_clip_forward_cosine(tiny_hps):
    import open_clip

    head = HPSv21.from_checkpoint(
        tiny_hps["checkpoint"], open_clip_config=json.loads(tiny_hps["open_clip_config"].read_text())
    )
    images = _images(3)
    scores = head.score(images, PROMPTS)
    # hpsv2: model(image, text) returns unit-normalised features (a dict there, a tuple without
    # output_dict); score = diag(I Tᵀ)
    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        image_features, text_features, _ = head.model((images - mean) / std, head.tokenizer(PROMPTS))
    expected = torch.diagonal(image_features @ text_features.T)
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-6)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    assert torch.all(scores.abs() <= 1.0 + 1e-6)  # a cosine
    assert scores.std() > 0  # distinct inputs give distinct scores


def test_hps_batched_equals_one_at_a_time_and_non_square_is_letterboxed(tiny_hps):
    head = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"])
    images = _images(3, 24, 48, seed=1)
    batched = head.score(images, PROMPTS)
    single = torch.cat([head.score(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(batched, single, rtol=0, atol=1e-6)
    # the letterbox: a 24×48 image becomes 16×32 inside zero (pre-normalisation) rows 8..24
    x = head.preprocess(images)
    black = (torch.zeros(3) - torch.tensor(head.preprocess_cfg["mean"])) / torch.tensor(head.preprocess_cfg["std"])
    torch.testing.assert_close(x[0, :, 0, 0], black)
    assert x.shape == (3, 3, 32, 32)


def test_hps_bf16_runs_close_to_fp32(tiny_hps):
    fp32 = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"])
    bf16 = HPSv21.from_checkpoint(
        tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"], dtype=torch.bfloat16
    )
    images = _images(3)
    a, b = fp32.score(images, PROMPTS), bf16.score(images, PROMPTS)
    assert b.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=3e-2)


def test_hps_bare_state_dict_is_accepted(tiny_hps, tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(torch.load(tiny_hps["checkpoint"], weights_only=True)["state_dict"], bare)
    a = HPSv21.from_checkpoint(bare, open_clip_config=tiny_hps["open_clip_config"]).score(_images(1), PROMPTS[:1])
    b = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"]).score(
        _images(1), PROMPTS[:1]
    )
    assert torch.equal(a, b)


def test_hps_wrong_keys_are_listed(tiny_hps, tmp_path):
    state = torch.load(tiny_hps["checkpoint"], weights_only=True)["state_dict"]
    state["visual.extra_head.weight"] = torch.zeros(2)
    del state["logit_scale"]
    bad = tmp_path / "bad.pt"
    torch.save({"state_dict": state}, bad)
    with pytest.raises(G2RPOError) as err:
        HPSv21.from_checkpoint(bad, open_clip_config=tiny_hps["open_clip_config"])
    message = str(err.value)
    assert "1 missing key(s): logit_scale" in message
    assert "1 unexpected key(s): visual.extra_head.weight" in message


def test_hps_wrong_architecture_is_a_shape_error(tiny_hps):
    cfg = json.loads(tiny_hps["open_clip_config"].read_text())
    cfg["model_cfg"]["embed_dim"] = 8
    with pytest.raises(G2RPOError, match=r"wrong shape.*check `arch` / `open_clip_config`"):
        HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=cfg)


def test_hps_missing_file_and_pickled_object(tmp_path, tiny_hps):
    with pytest.raises(G2RPOError, match=r"hps_v21.weights=.*does not exist; point it at HPS_v2.1_compressed.pt"):
        HPSv21.from_checkpoint(tmp_path / "nope.pt", open_clip_config=tiny_hps["open_clip_config"])
    pickled = tmp_path / "pickled.pt"
    torch.save({"state_dict": torch.nn.Linear(2, 2)}, pickled)  # a module, not tensors: weights_only refuses
    with pytest.raises(G2RPOError, match="tensors-only torch checkpoint"):
        HPSv21.from_checkpoint(pickled, open_clip_config=tiny_hps["open_clip_config"])


def test_hps_unknown_arch_is_an_error(tiny_hps):
    with pytest.raises(G2RPOError, match="not an open_clip built-in architecture"):
        HPSv21.from_checkpoint(tiny_hps["checkpoint"], arch="ViT-Q-99")


def test_hps_rejects_bad_input(tiny_hps):
    head = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"])
    with pytest.raises(G2RPOError, match="non-empty prompt"):
        head.score(_images(1), [""])
    with pytest.raises(G2RPOError, match="2 prompts for 1 images"):
        head.score(_images(1), ["a", "b"])


# --------------------------------------------------------------------------- CLIP score


def test_clip_score_matches_open_clip_local_dir_pipeline(tiny_clip_dir):
    """The reference scripts' path: create_model_from_pretrained('local-dir:...') + its PIL
    transform + the normalised-feature dot product. At the model's resolution the resize is the
    identity, so only uint8 quantisation (done here on the input) separates the two."""
    import open_clip
    from PIL import Image

    head = CLIPScore.from_local_dir(tiny_clip_dir["dir"])
    pixels = (torch.rand(3, 32, 32, 3, generator=torch.Generator().manual_seed(3)) * 255).round().to(torch.uint8)
    images = pixels.permute(0, 3, 1, 2).float() / 255.0
    scores = head.score(images, PROMPTS)

    model, preprocess = open_clip.create_model_from_pretrained(f"local-dir:{tiny_clip_dir['dir']}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{tiny_clip_dir['dir']}")
    model.eval()
    expected = []
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            x = preprocess(Image.fromarray(pixels[i].numpy())).unsqueeze(0)
            f_img = torch.nn.functional.normalize(model.encode_image(x), dim=-1)
            f_txt = torch.nn.functional.normalize(model.encode_text(tokenizer([prompt])), dim=-1)
            expected.append((f_img @ f_txt.T)[0, 0])
    torch.testing.assert_close(scores, torch.stack(expected), rtol=0, atol=1e-5)


def test_clip_from_checkpoint_equals_from_local_dir(tiny_clip_dir):
    a = CLIPScore.from_local_dir(tiny_clip_dir["dir"]).score(_images(2), PROMPTS[:2])
    b = CLIPScore.from_checkpoint(
        tiny_clip_dir["weights"], arch="tiny", open_clip_config=tiny_clip_dir["open_clip_config"]
    ).score(_images(2), PROMPTS[:2])
    assert torch.equal(a, b)


def test_clip_squash_preprocess_cfg_is_honoured(tmp_path):
    from g2rpo.rewards.tiny import write_tiny_open_clip_dir

    paths = write_tiny_open_clip_dir(tmp_path / "squash", preprocess_cfg={"resize_mode": "squash"})
    head = CLIPScore.from_local_dir(paths["dir"])
    assert head.preprocess_cfg["resize_mode"] == "squash"
    # a 16×64 image squashed to 32×32 keeps its full content: its left and right halves differ
    images = torch.zeros(1, 3, 16, 64)
    images[..., 32:] = 1.0
    from g2rpo.rewards.openclip_loading import open_clip_preprocess

    x = open_clip_preprocess(images, head.preprocess_cfg)
    assert x.shape == (1, 3, 32, 32)
    assert float(x[0, 0, :, 0].mean()) < 0 < float(x[0, 0, :, -1].mean())


def test_clip_folder_without_weights_is_an_error(tmp_path, tiny_clip_dir):
    folder = tmp_path / "noweights"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(tiny_clip_dir["open_clip_config"].read_text())
    with pytest.raises(G2RPOError, match="holds no weights"):
        CLIPScore.from_local_dir(folder)


# --------------------------------------------------------------------------- aesthetic


def test_aesthetic_is_the_mlp_of_the_normalised_image_embedding(tiny_aesthetic):
    from g2rpo.rewards.aesthetic import Aesthetic

    head = Aesthetic.from_files(tiny_aesthetic["mlp"], clip_dir=tiny_aesthetic["clip_dir"])
    images = _images(2)
    scores = head.score(images, ["", ""])  # the prompt is unused
    state = torch.load(tiny_aesthetic["mlp"], weights_only=True)
    from g2rpo.rewards.openclip_loading import open_clip_preprocess

    with torch.no_grad():
        e = head.clip.model.encode_image(open_clip_preprocess(images, head.clip.preprocess_cfg))
        e = e / e.norm(dim=-1, keepdim=True)
        h = e
        for i in (0, 2, 4, 6, 7):  # Linear layers of the published MLP; dropouts are inactive
            h = h @ state[f"layers.{i}.weight"].T + state[f"layers.{i}.bias"]
    torch.testing.assert_close(scores, h.squeeze(-1), rtol=0, atol=1e-6)


def test_aesthetic_mlp_width_must_match_backbone(tiny_aesthetic, tmp_path):
    from g2rpo.rewards.aesthetic import Aesthetic, AestheticMLP

    wrong = tmp_path / "mlp768.pth"
    torch.save(AestheticMLP(768).state_dict(), wrong)
    with pytest.raises(G2RPOError, match="pair the MLP with its CLIP backbone"):
        Aesthetic.from_files(wrong, clip_dir=tiny_aesthetic["clip_dir"])


@pytest.mark.slow
def test_full_size_vit_h_14_hps_loads_and_scores(tmp_path):
    """ViT-H-14 at full size with random weights (≈ 1 B parameters; minutes on 2 CPU cores)."""
    import open_clip

    model = open_clip.create_model("ViT-H-14", pretrained=None)
    checkpoint = tmp_path / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, checkpoint)
    del model
    head = HPSv21.from_checkpoint(checkpoint)
    assert len(head.model.state_dict()) == 686  # the tensor count of hpsv2 1.2.0's bundled ViT-H-14
    scores = head.score(torch.rand(2, 3, 256, 320), PROMPTS[:2])
    assert scores.shape == (2,) and bool(torch.isfinite(scores).all())
    assert np.all(np.abs(scores.numpy()) <= 1.0)


def test_grad_flag_backpropagates_into_the_images_only(tiny_hps):
    head = HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"])
    images = _images(2, 40, 40).requires_grad_(True)
    assert not head.score(images, PROMPTS[:2]).requires_grad  # default: no graph
    scores = head.score(images, PROMPTS[:2], grad=True)
    scores.sum().backward()
    assert images.grad is not None and float(images.grad.abs().sum()) > 0
    assert all(p.grad is None for p in head.model.parameters())  # the reward model stays frozen
