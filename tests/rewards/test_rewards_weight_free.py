"""Weight-free heads: JPEG compressibility, sharpness (Laplacian variance), total variation."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from g2rpo.rewards.jpeg import JPEGCompressibility
from g2rpo.rewards.quality import Sharpness, TotalVariation, laplacian_variance, mean_total_variation


def test_jpeg_is_negative_bits_per_pixel_of_pil_quality_95():
    from PIL import Image

    images = torch.rand(2, 3, 24, 40, generator=torch.Generator().manual_seed(0))
    images[1] = 0.5  # flat grey
    scores = JPEGCompressibility().score(images, ["", ""])
    for i in range(2):
        array = (images[i].permute(1, 2, 0).numpy() * 255.0).round().astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=95)
        assert float(scores[i]) == pytest.approx(-8.0 * len(buffer.getvalue()) / (24 * 40), rel=1e-6)
    assert scores[1] > scores[0]  # flat compresses better than noise


def test_jpeg_is_deterministic_and_batch_independent():
    images = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    head = JPEGCompressibility()
    batched = head.score(images, ["a", "b", "c"])
    assert torch.equal(batched, head.score(images, ["a", "b", "c"]))
    assert torch.equal(batched[1:2], head.score(images[1:2], ["b"]))


def test_laplacian_variance_hand_worked():
    # A single white pixel (value 1 in every channel → luma 0.299+0.587+0.114 = 1) at the centre
    # of a 5×5 black image. The valid 3×3 Laplacian map (centres at rows/cols 1..3) is
    #   [[0, 1, 0], [1, -4, 1], [0, 1, 0]]  → mean 0, E[L²] = (4·1 + 16)/9 = 20/9.
    images = torch.zeros(1, 3, 5, 5)
    images[0, :, 2, 2] = 1.0
    assert float(laplacian_variance(images)[0]) == pytest.approx(20 / 9, rel=1e-6)
    assert float(Sharpness().score(torch.full((1, 3, 8, 8), 0.3), [""])[0]) == pytest.approx(0.0, abs=1e-12)


def test_sharpness_ranks_blur_below_the_original():
    sharp = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    blurred = torch.nn.functional.avg_pool2d(sharp, 3, stride=1, padding=1)
    scores = Sharpness().score(torch.cat([sharp, blurred]), ["", ""])
    assert scores[0] > scores[1]


def test_total_variation_hand_worked_and_equal_to_piq():
    # 1 channel-equivalent check: a 2×2 image [[0, 1], [0, 1]] in all 3 channels.
    # horizontal |Δ| = 1 + 1 per channel, vertical |Δ| = 0; differences counted:
    # C·(H·(W−1) + (H−1)·W) = 3·(2 + 2) = 12 → mean TV = 3·2 / 12 = 0.5, score −0.5.
    images = torch.tensor([[0.0, 1.0], [0.0, 1.0]]).expand(1, 3, 2, 2).clone()
    assert float(TotalVariation().score(images, [""])[0]) == pytest.approx(-0.5)
    import piq

    x = torch.rand(2, 3, 9, 13, generator=torch.Generator().manual_seed(3))
    count = 3 * (9 * 12 + 8 * 13)
    torch.testing.assert_close(
        mean_total_variation(x), piq.total_variation(x, reduction="none", norm_type="l1") / count
    )


def test_weight_free_heads_accept_empty_prompts_but_still_check_lengths():
    from g2rpo.errors import G2RPOError

    for head in (JPEGCompressibility(), Sharpness(), TotalVariation()):
        assert head.score(torch.rand(2, 3, 8, 8), ["", ""]).shape == (2,)
        with pytest.raises(G2RPOError, match="1 prompts for 2 images"):
            head.score(torch.rand(2, 3, 8, 8), [""])
