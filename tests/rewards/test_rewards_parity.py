"""Parity of the project's HPS-v2.1 and ImageReward heads with the reference packages.

The golden fixtures in ``tests/fixtures/parity/`` were made by ``make parity``
(``parity/make_parity.sh``): tiny random weights saved in the official file layouts
(``HPS_v2.1_compressed.pt``, ``ImageReward.pt``), PNG images, prompts, and the scores the
``hpsv2`` 1.2.0 and ``image-reward`` 1.5 packages' own code gave for them (docs/parity.md). These
tests load the same files with :class:`g2rpo.rewards.hps.HPSv21` and
:class:`g2rpo.rewards.image_reward.ImageReward` and compare, without the reference packages.

- ``native``: images at the model's input resolution, so the references' resize/crop are the
  identity; scored here as one batch; must agree to :data:`PARITY_TOLERANCE`.
- ``resized``: images at another size, scored one at a time. hpsv2 resizes a float tensor with
  torchvision's kernel, the same as the head, so a square and a non-square (letterboxed) image
  must agree to :data:`PARITY_TOLERANCE` as well; ImageReward resizes a uint8 PIL image, which the head's float
  torch resize matches only to :data:`PIL_RESIZE_TOLERANCE`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.parity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
# Float32 scores of O(1) from two implementations of the same graph (attention kernels differ).
PARITY_TOLERANCE = 1e-5
# PIL bicubic on uint8 vs torchvision antialiased bicubic on float: measured 2.2e-4 at 256→224
# (square downscale) and 2.6e-4 at 200×300→224 (upscale + crop) on these fixtures, 2.9e-3 on an
# earlier seed's images; PIL also rounds the resized image to uint8 (±0.5/255 per pixel).
PIL_RESIZE_TOLERANCE = 1e-2


def read_fixture(name: str) -> tuple[Path, dict, dict]:
    folder = FIXTURES / name
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))
    prompts = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    return folder, expected, prompts


def load_png(path: Path) -> torch.Tensor:
    """A PNG as a float ``[1, 3, H, W]`` tensor in [0, 1] (what the decoder hands the rewards)."""
    import numpy as np
    from PIL import Image

    pixels = np.array(Image.open(path).convert("RGB"))  # [H, W, 3] uint8
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div(255.0).unsqueeze(0)


def native_batch(folder: Path, expected: dict) -> torch.Tensor:
    return torch.cat([load_png(folder / image) for image in expected["native"]["images"]])  # [B, 3, H, W]


@pytest.fixture(scope="module")
def hps():
    from g2rpo.rewards.hps import HPSv21

    folder, expected, prompts = read_fixture("hps_v21")
    head = HPSv21.from_checkpoint(folder / expected["checkpoint"], open_clip_config=folder / "open_clip_config.json")
    return head, folder, expected, prompts


@pytest.fixture(scope="module")
def image_reward():
    from g2rpo.rewards.image_reward import ImageReward

    folder, expected, prompts = read_fixture("image_reward")
    head = ImageReward.from_checkpoint(
        folder / expected["checkpoint"],
        med_config=folder / "med_config.json",
        vision_config=folder / "vision_config.json",
        tokenizer_dir=folder / "tokenizer",
    )
    return head, folder, expected, prompts


def test_hps_v21_native_batch_matches_hpsv2(hps):
    head, folder, expected, prompts = hps
    ours = head.score(native_batch(folder, expected), prompts["native"])
    reference = torch.tensor(expected["native"]["scores"])
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() <= PARITY_TOLERANCE, (ours.tolist(), reference.tolist())


def test_hps_v21_tokens_match_hpsv2(hps):
    head, _, expected, prompts = hps
    ours = [[t for t in row if t != 0] for row in head.tokenizer(prompts["native"]).tolist()]
    assert ours == expected["token_ids"]


def test_hps_v21_square_resize_matches_hpsv2(hps):
    # hpsv2 resizes the float tensor (ToTensor, then Resize) with the head's torchvision kernel.
    head, folder, expected, prompts = hps
    image, prompt, score = expected["resized"]["images"][0], prompts["resized"][0], expected["resized"]["scores"][0]
    assert "96x96" in image
    assert abs(head.score(load_png(folder / image), [prompt]).item() - score) <= PARITY_TOLERANCE


def test_hps_v21_non_square_resize_matches_hpsv2(hps):
    # hpsv2 builds its model with light_augmentation=True: preprocess_val is ResizeMaxSize (longer
    # side to the image size, zero padding), not a centre crop; before the head reproduced it the
    # difference on this 48×80 image was 7.4e-2.
    head, folder, expected, prompts = hps
    image, prompt, score = expected["resized"]["images"][1], prompts["resized"][1], expected["resized"]["scores"][1]
    assert "48x80" in image
    assert abs(head.score(load_png(folder / image), [prompt]).item() - score) <= PARITY_TOLERANCE


def test_image_reward_native_batch_matches_image_reward_package(image_reward):
    head, folder, expected, prompts = image_reward
    ours = head.score(native_batch(folder, expected), prompts["native"])
    reference = torch.tensor(expected["native"]["scores"])
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() <= PARITY_TOLERANCE, (ours.tolist(), reference.tolist())


def test_image_reward_tokens_match_image_reward_package(image_reward):
    head, _, expected, prompts = image_reward
    ours = head.tokenizer(prompts["native"], padding="max_length", truncation=True, max_length=35).input_ids
    assert ours == expected["token_ids"]


def test_image_reward_resize_within_pil_tolerance(image_reward):
    head, folder, expected, prompts = image_reward
    for image, prompt, score in zip(
        expected["resized"]["images"], prompts["resized"], expected["resized"]["scores"], strict=True
    ):
        ours = head.score(load_png(folder / image), [prompt]).item()
        assert abs(ours - score) <= PIL_RESIZE_TOLERANCE, (image, ours, score)


@pytest.mark.parametrize("reward", ["hps_v21", "image_reward"])
def test_parity_detects_a_tensor_left_unloaded(reward, hps, image_reward):
    """The fixtures discriminate: a final LayerNorm gain left at its default of 1 (what a dropped
    or mis-mapped key leaves behind) moves the scores far beyond the tolerance."""
    head, folder, expected, prompts = hps if reward == "hps_v21" else image_reward
    gain = head.model.visual.ln_post.weight if reward == "hps_v21" else head.net.vision.post_layernorm.weight
    saved = gain.detach().clone()
    try:
        with torch.no_grad():
            gain.fill_(1.0)
        ours = head.score(native_batch(folder, expected), prompts["native"])
    finally:
        with torch.no_grad():
            gain.copy_(saved)
    reference = torch.tensor(expected["native"]["scores"])
    assert (ours - reference).abs().max().item() > 100 * PARITY_TOLERANCE


REPO = Path(__file__).resolve().parents[2]
GENERATORS = {
    "hps_v21": ("parity/.venv-hpsv2", "parity/make_hps_v21.py"),
    "image_reward": ("parity/.venv-imagereward", "parity/make_image_reward.py"),
}


@pytest.mark.parity_env
@pytest.mark.parametrize("reward", sorted(GENERATORS))
def test_committed_fixtures_regenerate_identically(reward, tmp_path):
    """With the reference virtualenvs (``make parity``), the generator reproduces the committed
    weights and images bit for bit and the golden scores to float precision: the fixtures are
    what the packages' code gives."""
    import os
    import subprocess

    venv, script = GENERATORS[reward]
    python = REPO / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{venv} not built; run `make parity`")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HPS_ROOT": str(tmp_path / "hpsv2"),
        "PYTHONWARNINGS": "ignore",
    }
    out = tmp_path / reward
    subprocess.run([str(python), script, str(out)], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    committed = FIXTURES / reward
    fresh, golden = (json.loads((d / "expected.json").read_text(encoding="utf-8")) for d in (out, committed))
    for key in ("token_ids", "seed", "versions"):
        assert fresh[key] == golden[key], key
    for group in ("native", "resized"):
        assert fresh[group]["images"] == golden[group]["images"]
        # Thread count changes float summation order (measured 1.1e-6 on the 200×300 image).
        assert fresh[group]["scores"] == pytest.approx(golden[group]["scores"], abs=1e-5, rel=0)
    assert (out / fresh["checkpoint"]).read_bytes() == (committed / golden["checkpoint"]).read_bytes()
    for image in golden["native"]["images"] + golden["resized"]["images"]:
        assert (out / image).read_bytes() == (committed / image).read_bytes(), image
