"""Input validation, non-finite reporting and the batched preprocessing shared by every head."""

from __future__ import annotations

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.rewards.base import (
    check_finite,
    non_finite_report,
    normalize,
    resize_longest_pad,
    resize_shortest_center_crop,
    validate_inputs,
)


def test_valid_input_passes_through_unchanged():
    images = torch.rand(2, 3, 8, 8)
    out, prompts = validate_inputs("r", images, ("a", "b"))
    assert out is images
    assert prompts == ["a", "b"]


def test_overshoot_within_tolerance_is_clamped_and_beyond_is_an_error():
    images = torch.full((1, 3, 4, 4), 0.5)
    images[0, 0, 0, 0] = 1.005  # bf16 rounding of a decoder output: inside the 1e-2 band
    images[0, 1, 0, 0] = -0.004
    out, _ = validate_inputs("r", images, ["a"])
    assert float(out.max()) == 1.0 and float(out.min()) == 0.0
    images[0, 0, 0, 0] = 1.2
    with pytest.raises(G2RPOError, match=r"r.images range.*\[0, 1\]"):
        validate_inputs("r", images, ["a"])


@pytest.mark.parametrize(
    ("images", "hint"),
    [
        (torch.rand(1, 3, 4, 4) * 2 - 1, r"\(x \+ 1\) / 2"),  # [-1, 1] decoder output
        (torch.rand(1, 3, 4, 4) * 255, "divide by 255"),  # [0, 255] pixels
    ],
)
def test_wrong_range_names_the_likely_fix(images, hint):
    images[0, 0, 0, 0] = images.min() - 0.6 if "x" in hint else 200.0
    with pytest.raises(G2RPOError, match=hint):
        validate_inputs("r", images, ["a"])


def test_non_float_and_non_tensor_images_are_errors():
    with pytest.raises(G2RPOError, match=r"dtype.*images.float\(\) / 255"):
        validate_inputs("r", torch.zeros(1, 3, 4, 4, dtype=torch.uint8), ["a"])
    with pytest.raises(G2RPOError, match="torch.Tensor"):
        validate_inputs("r", [[0.0]], ["a"])


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 8, 8, 3), (2, 1, 8, 8), (0, 3, 8, 8)])
def test_wrong_shapes_are_errors(shape):
    with pytest.raises(G2RPOError, match=r"r.images.shape"):
        validate_inputs("r", torch.zeros(shape), ["a"] * (shape[0] if len(shape) == 4 else 1))


def test_nan_pixels_are_an_error():
    images = torch.rand(3, 3, 4, 4)
    images[1, 2, 0, 0] = float("nan")
    with pytest.raises(G2RPOError, match="1 image"):
        validate_inputs("r", images, ["a", "b", "c"])


def test_prompt_errors():
    images = torch.rand(2, 3, 4, 4)
    with pytest.raises(G2RPOError, match="1 prompts for 2 images"):
        validate_inputs("r", images, ["a"])
    with pytest.raises(G2RPOError, match="list of 2 strings"):
        validate_inputs("r", images, "a cat")
    with pytest.raises(G2RPOError, match=r"r.prompts\[1\].*non-empty prompt"):
        validate_inputs("r", images, ["a", "   "])
    with pytest.raises(G2RPOError, match=r"prompts\[0\].*str"):
        validate_inputs("r", images, [3, "b"])
    # image-only heads accept empty prompts
    validate_inputs("r", images, ["", ""], needs_prompts=False)


def test_non_finite_report_names_reward_count_and_indices():
    scores = torch.tensor([0.1, float("nan"), 0.3, float("inf")])
    assert non_finite_report("hps_v21", scores[[0, 2]]) is None
    report = non_finite_report("hps_v21", scores)
    assert report == "reward 'hps_v21' returned NaN/inf for 2 of 4 image(s) (indices [1, 3])"
    with pytest.raises(G2RPOError, match="reward 'hps_v21' returned NaN/inf for 2 of 4"):
        check_finite("hps_v21", scores)
    ok = torch.tensor([1.0])
    assert check_finite("x", ok) is ok


def test_normalize_hand_worked():
    # (0.75 − 0.5) / 0.25 = 1; (0.75 − 0.25) / 0.5 = 1; (0.75 − 1) / 0.125 = −2
    images = torch.full((1, 3, 2, 2), 0.75)
    out = normalize(images, (0.5, 0.25, 1.0), (0.25, 0.5, 0.125))
    assert out[0, :, 0, 0].tolist() == [1.0, 1.0, -2.0]


def test_shortest_resize_is_identity_at_size_and_matches_per_image_torchvision():
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Resize

    images = torch.rand(3, 3, 16, 16)
    assert torch.equal(resize_shortest_center_crop(images, 16), images)
    images = torch.rand(3, 3, 20, 30)
    batched = resize_shortest_center_crop(images, 16)
    per_image = Compose([Resize(16, interpolation=InterpolationMode.BICUBIC, antialias=True), CenterCrop(16)])
    expected = torch.stack([per_image(img) for img in images])
    assert batched.shape == (3, 3, 16, 16)
    torch.testing.assert_close(batched, expected, rtol=0, atol=1e-6)


def test_longest_pad_letterboxes_like_hpsv2():
    # 8×32 at size 16: scale 16/32 = 0.5 → 4×16, padded to 16×16: pad_h = 12 → 6 rows on top,
    # 6 at the bottom; pad_w = 0.
    images = torch.rand(2, 3, 8, 32)
    out = resize_longest_pad(images, 16)
    assert out.shape == (2, 3, 16, 16)
    assert torch.all(out[:, :, :6] == 0) and torch.all(out[:, :, 10:] == 0)
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    inner = TF.resize(images, [4, 16], interpolation=InterpolationMode.BICUBIC, antialias=True)
    torch.testing.assert_close(out[:, :, 6:10], inner, rtol=0, atol=0)
    # odd padding: 11×16 at size 16 → no resize (scale 1), pad_h = 5 → ⌊5/2⌋ = 2 on top, 3 at the bottom
    odd = resize_longest_pad(torch.ones(1, 3, 11, 16), 16)
    assert odd[0, 0, :, 0].tolist() == [0.0] * 2 + [1.0] * 11 + [0.0] * 3
